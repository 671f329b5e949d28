"""Capture files -> numpy columns, one row per TCP segment: the front of the file format (pcapfile.py) and
its decoder (reader_native.py, on the _cpcap kernel; tests/decode_twin.py is its numpy twin).

``read_capture`` gives a whole file's columns; ``stream_capture`` hands its rows on chunk by chunk (a
``CaptureChunk`` per decoded chunk of the file) instead of keeping them, so a capture of any size is read
in bounded memory. A file that is not a capture at all, or
whose record structure is broken, is a one-line DiagError.

scapy is deliberately not imported here: it costs about a second to import, which is half the time budget
of a two-million-packet analysis. The few packets that need option dissection (SYNs) are parsed by
``pcapfile.parse_tcp_options``, a TLV walk over the option bytes.
"""

from __future__ import annotations

import gzip
import io
import os
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Protocol

import numpy as np

from diag.capture import native, pcapfile, reader_native
from diag.capture.pcapfile import (
    GZIP_MAGIC,
    MAX_RECORD_BYTES,
    PCAP_MAGICS,
    PCAPNG_SHB,
    CaptureChunk,
    ReadResult,
    _Prefixed,
)
from diag.errors import DiagError


def read_capture(path: str | os.PathLike[str], first_frame: int = 1,
                 decoder: Callable[[int], RecordDecoder] | None = None) -> ReadResult:
    """Read a pcap/pcapng (optionally gzip) file into TCP columns. Frame numbers start at first_frame.

    The file is read front to back once, never sought: a pipe (``<(zcat x)``, /dev/stdin) works too. The
    records are decoded by the _cpcap kernel, or by decoder(first_frame) where given (the tests' twin).
    """
    return _read_capture(Path(path), first_frame, decoder=decoder)


def stream_capture(path: str | os.PathLike[str], consume: Callable[[CaptureChunk], None],
                   first_frame: int = 1, details: bool = True) -> ReadResult:
    """Read a capture as read_capture does, handing its TCP rows to consume chunk by chunk instead of keeping
    them: the memory is one chunk's columns (reused) whatever the capture's size.

    The file (pcap, pcapng, gzip of either, or a pipe) is read front to back once. consume is called once per
    decoded chunk that holds TCP rows (never with zero rows), in file order; the chunks' columns concatenated
    are read_capture's columns. The result is read_capture's in every field but ``columns`` and ``syns``,
    which are empty (each chunk holds its own SYNs). A broken file raises read_capture's DiagError at the same point of the read (after the
    chunks before it were consumed); what consume raises is raised as it is. details=False leaves the SYNs
    and endpoints out of the chunks and the result (a later read of the same file needs neither).
    """
    try:
        return _read_capture(Path(path), first_frame, consume, details=details)
    except reader_native.ConsumerFailed as failed:
        raise failed.error from None


class RecordDecoder(Protocol):
    """What decodes a file's records after its 4-byte magic, and gives the ReadResult."""

    def pcap(self, handle: IO[bytes], magic: bytes, path: Path) -> None: ...

    def pcapng(self, handle: IO[bytes], magic: bytes, path: Path) -> None: ...

    def finish(self, file_format: str) -> ReadResult: ...


def _read_capture(p: Path, first_frame: int, consume: Callable[[CaptureChunk], None] | None = None,
                  decoder: Callable[[int], RecordDecoder] | None = None, details: bool = True) -> ReadResult:
    try:
        raw = p.open("rb")
    except FileNotFoundError:
        raise DiagError(f"no capture file at {p}") from None
    except IsADirectoryError:
        raise DiagError(f"{p} is a directory; give capture files (.pcap, .pcapng, .pcap.gz)") from None
    except OSError as exc:
        raise DiagError(f"cannot open capture file {p}: {exc.strerror}") from None
    with raw:
        try:
            head = raw.read(4)
            # The 4 bytes read are handed back first; the buffered reader turns short reads (pipes) into full ones.
            source: IO[bytes] = io.BufferedReader(_Prefixed(head, raw), buffer_size=1 << 16)
            if head[:2] == GZIP_MAGIC:
                handle: IO[bytes] = gzip.GzipFile(fileobj=source, mode="rb")
                gz = True
            else:
                handle = source
                gz = False
            builder: RecordDecoder
            if decoder is not None:
                builder = decoder(first_frame)
            else:
                # Streaming: columns for the largest chunk (a chunk and the record carried into it), reused.
                rows = (reader_native.row_bound(raw, gz) if consume is None
                        else (pcapfile.CHUNK_BYTES + MAX_RECORD_BYTES + 16) // reader_native.MIN_ROW_FILE_BYTES + 1)
                builder = reader_native.NativeBuilder(native.require("_cpcap"), first_frame, rows, consume, details)
            magic = handle.read(4)
            if not magic:
                raise DiagError(f"{p} is empty; was the capture stopped before any packet arrived?")
            fmt = _read_format(handle, magic, builder, p)
        except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
            raise DiagError(f"{p}: cannot read compressed data ({exc}); the file is damaged") from None
        except OSError as exc:
            raise DiagError(f"{p}: cannot read ({exc.strerror or exc}); the file or device is damaged") from None
        return _linktypes_checked(builder.finish(fmt + (".gz" if gz else "")), p)


def _linktypes_checked(result: ReadResult, p: Path) -> ReadResult:
    """Both formats alike: a file with no packet of a link type diag reads is refused; a pcapng that mixes keeps
    the rest and says in words what it skipped."""
    prefix = pcapfile.UNSUPPORTED_LINKTYPE_PREFIX
    skipped = {int(key[len(prefix):]): n for key, n in result.skipped.items() if key.startswith(prefix)}
    if skipped and sum(skipped.values()) >= result.frames:
        raise pcapfile.unsupported_linktype_error(p, sorted(skipped))
    result.warnings += [f"{p}: {n} packets of {pcapfile.linktype_name(lt)} skipped (not supported)"
                        for lt, n in sorted(skipped.items())]
    return result


def _read_format(handle: IO[bytes], magic: bytes, builder: RecordDecoder, p: Path) -> str:
    """The records after the 4-byte magic into builder; -> "pcap" or "pcapng"."""
    if magic in PCAP_MAGICS:
        builder.pcap(handle, magic, p)
        return "pcap"
    if magic == PCAPNG_SHB:
        builder.pcapng(handle, magic, p)
        return "pcapng"
    raise DiagError(f"{p} is not a pcap or pcapng file (magic {magic.hex()}); "
                    "capture with tcpdump -w or give .pcap/.pcapng/.pcap.gz")


def read_files(paths: Sequence[str | os.PathLike[str]]
               ) -> tuple[dict[str, np.ndarray], list[tuple[str, int]], list[ReadResult]]:
    """Every file's columns merged into one table (file order) with one endpoint numbering."""
    results: list[ReadResult] = []
    frame = 1
    for path in paths:
        result = read_capture(path, first_frame=frame)
        frame += result.frames
        results.append(result)
    if len(results) == 1:  # one file: its endpoint ids and columns are already final (no copy)
        cols, endpoints = results[0].columns, list(results[0].endpoints)
    else:
        cols, endpoints = _merge(results)
    return cols, endpoints, results


def _merge(results: list[ReadResult]) -> tuple[dict[str, np.ndarray], list[tuple[str, int]]]:
    """Several files -> one column set with shared endpoint ids, in time order (mergecap semantics)."""
    # Merge endpoints across files by (address, port).
    ids: dict[tuple[str, int], int] = {}
    parts: dict[str, list[np.ndarray]] = {name: [] for name in results[0].columns}
    for result in results:
        remap = np.array([ids.setdefault(ep, len(ids)) for ep in result.endpoints] or [0], dtype=np.int32)
        for name, column in result.columns.items():
            if name in ("src", "dst"):
                column = remap[column] if column.size else column
            parts[name].append(column)
    endpoints = list(ids)  # dicts keep insertion order, which is id order
    cols = {name: np.concatenate(values) for name, values in parts.items()}
    del parts
    order = np.argsort(cols["ts_ns"], kind="stable")  # one stream in time order (stable for equal stamps)
    return {name: values[order] for name, values in cols.items()}, endpoints

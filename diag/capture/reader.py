"""Capture files -> numpy columns, one row per TCP segment: the front of the file format (pcapfile.py) and
its two decoders (reader_native.py: the _cpcap kernel; decode.py: its numpy twin, where the kernel is not
built or DIAG_NATIVE=0).

``read_capture`` gives a whole file's columns; ``stream_capture`` hands its rows on chunk by chunk (a
``CaptureChunk`` per decoded chunk of the file) instead of keeping them, so a capture of any size is read
in bounded memory (it needs the kernel: ``streaming_available()``). A file that is not a capture at all, or
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
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import IO

from diag.capture import native, pcapfile, reader_native
from diag.capture.decode import _ColumnBuilder, _read_pcap, _read_pcapng
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


def read_capture(path: str | os.PathLike[str], first_frame: int = 1) -> ReadResult:
    """Read a pcap/pcapng (optionally gzip) file into TCP columns. Frame numbers start at first_frame.

    The file is read front to back once, never sought: a pipe (``<(zcat x)``, /dev/stdin) works too.
    The C kernel (diag.capture._cpcap) does the per-record work when it is built, unless DIAG_NATIVE=0;
    DIAG_NATIVE=check reads a regular file with both and raises AssertionError where they differ (for
    tests and fuzzing; a pipe cannot be read twice and is read by the kernel alone).
    """
    kernel = native.kernel("_cpcap")
    if kernel is None or os.environ.get(native.DISABLE_ENV) != "check" or not Path(path).is_file():
        return _read_capture(Path(path), first_frame, kernel)
    outcomes: list[ReadResult | str] = []
    for engine in (kernel, None):
        try:
            outcomes.append(_read_capture(Path(path), first_frame, engine))
        except DiagError as exc:
            outcomes.append(str(exc))
    fast, twin = outcomes
    if isinstance(fast, str) or isinstance(twin, str):
        if fast != twin:
            raise AssertionError(f"_cpcap and its numpy twin differ on {path}: {fast!r:.300} vs {twin!r:.300}")
        raise DiagError(str(fast))
    differ = reader_native.differences(fast, twin)
    if differ:
        raise AssertionError(f"_cpcap and its numpy twin differ on {path} in {', '.join(differ)}")
    return fast


def streaming_available() -> bool:
    """Whether stream_capture can run here: the C reader kernel is built and not disabled (DIAG_NATIVE=0)."""
    return native.kernel("_cpcap") is not None


def stream_capture(path: str | os.PathLike[str], consume: Callable[[CaptureChunk], None],
                   first_frame: int = 1) -> ReadResult:
    """Read a capture as read_capture does, handing its TCP rows to consume chunk by chunk instead of keeping
    them: the memory is one chunk's columns (reused) whatever the capture's size.

    The file (pcap, pcapng, gzip of either, or a pipe) is read front to back once. consume is called once per
    decoded chunk that holds TCP rows (never with zero rows), in file order; the chunks' columns concatenated
    are read_capture's columns. The result is read_capture's in every field but ``columns``, which are
    zero-length. A broken file raises read_capture's DiagError at the same point of the read (after the
    chunks before it were consumed); what consume raises is raised as it is. Needs the C kernel: without it
    (see streaming_available) a RuntimeError. DIAG_NATIVE=check does not apply to streaming.
    """
    kernel = native.kernel("_cpcap")
    if kernel is None:
        raise RuntimeError("streaming needs the _cpcap kernel")
    try:
        return _read_capture(Path(path), first_frame, kernel, consume)
    except reader_native.ConsumerFailed as failed:
        raise failed.error from None


def _read_capture(p: Path, first_frame: int, kernel: ModuleType | None,
                  consume: Callable[[CaptureChunk], None] | None = None) -> ReadResult:
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
            builder: _ColumnBuilder | reader_native.NativeBuilder
            if kernel is None:  # the numpy twin
                builder = _ColumnBuilder(first_frame)
            else:
                # Streaming: columns for the largest chunk (a chunk and the record carried into it), reused.
                rows = (reader_native.row_bound(raw, gz) if consume is None
                        else (pcapfile.CHUNK_BYTES + MAX_RECORD_BYTES + 16) // reader_native.MIN_ROW_FILE_BYTES + 1)
                builder = reader_native.NativeBuilder(kernel, first_frame, rows, consume)
            magic = handle.read(4)
            if not magic:
                raise DiagError(f"{p} is empty; was the capture stopped before any packet arrived?")
            fmt = _read_format(handle, magic, builder, p)
        except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
            raise DiagError(f"{p}: cannot read compressed data ({exc}); the file is damaged") from None
        except OSError as exc:
            raise DiagError(f"{p}: cannot read ({exc.strerror or exc}); the file or device is damaged") from None
        return builder.finish(fmt + (".gz" if gz else ""))


def _read_format(handle: IO[bytes], magic: bytes, builder: _ColumnBuilder | reader_native.NativeBuilder,
                 p: Path, pcap_chunk_bytes: int | None = None) -> str:
    """The records after the 4-byte magic into builder, by the twin or the kernel; -> "pcap" or "pcapng".

    pcap_chunk_bytes: the pcap readers' chunk (and so their buffers') size, if not CHUNK_BYTES."""
    if magic in PCAP_MAGICS:
        if isinstance(builder, _ColumnBuilder):
            _read_pcap(handle, magic, builder, p, pcap_chunk_bytes)
        else:
            reader_native.read_pcap(handle, magic, builder, p, pcap_chunk_bytes)
        return "pcap"
    if magic == PCAPNG_SHB:
        if isinstance(builder, _ColumnBuilder):
            _read_pcapng(handle, magic, builder, p)
        else:
            reader_native.read_pcapng(handle, magic, builder, p)
        return "pcapng"
    raise DiagError(f"{p} is not a pcap or pcapng file (magic {magic.hex()}); "
                    "capture with tcpdump -w or give .pcap/.pcapng/.pcap.gz")

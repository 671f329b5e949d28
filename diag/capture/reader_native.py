"""The reader on its C kernel (diag/capture/_cpcap.c): the same ReadResult as the numpy twin, faster.

``read_capture`` and ``stream_capture`` decode every file here. The file
is read in the twin's chunks (CHUNK_BYTES, the unfinished last record carried to the next chunk), and each
chunk is one kernel call that walks its records and decodes every one straight into the output columns -
the twin's dtypes, allocated once for the whole file from an upper bound on its TCP rows (a row needs 56
bytes of file: a 16-byte record header and 40 bytes of IP and TCP headers) and trimmed at the end, so the
read's memory is the columns plus two chunk buffers. The kernel releases the GIL: while it decodes chunk k,
this thread reads chunk k+1 into the other buffer.

Streaming (``reader.stream_capture``): the same read with a ``consume`` callback. The columns are then sized
for one chunk; after each decoded chunk its rows are handed to ``consume`` as a ``pcapfile.CaptureChunk`` and the
Decoder is rewound (the next chunk is written from row 0 again, frames and endpoint ids carry on), so the
read's memory no longer grows with the capture.

What stays in Python: file headers, pcapng section headers and interface descriptions (the kernel stops at
them), error messages (built from the block or record the kernel stopped at, word for word the twin's),
endpoint addresses as text, and SynInfo objects. Endpoint ids are numbered in order of first appearance
(the twin numbers them differently; ids never reach the JSON: connections are numbered by first appearance
and hosts sorted by address).
"""

from __future__ import annotations

import os
import socket
import stat
import struct
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType
from typing import IO

import numpy as np

from diag.capture import pcapfile
from diag.capture.pcapfile import (
    COLUMN_DTYPES,
    MAX_RECORD_BYTES,
    PCAP_MAGICS,
    PCAPNG_SHB,
    SUPPORTED_LINKTYPES,
    CaptureChunk,
    ReadResult,
    SynInfo,
    _chunks,
    _Interface,
    _read_into,
    block_header,
    interface_description,
    pcap_header,
    section_byte_order,
)
from diag.errors import DiagError

# The least file bytes one TCP row takes: a pcap record header (16) + IPv4 and TCP headers (40); pcapng's
# smallest packet block holding them (simple: 16 + 40) is as large.
MIN_ROW_FILE_BYTES = 56
# The kernel's skip counts, in the order the twin first counts them (this order is that of `skipped`'s keys).
SKIP_ORDER = ("non_ip", "truncated_headers", "bad_header_length", "fragment", "ipv6_extension_headers",
              "non_tcp", "truncated_headers", "bad_header_length", "tunnel_too_deep")
# pcapng_blocks statuses (_cpcap.c).
NG_END, NG_INCOMPLETE, NG_PYTHON, NG_BAD_LENGTH, NG_INCONSISTENT, NG_TIMESTAMP, NG_SIMPLE_FIRST, NG_TABLE_FULL = range(8)
# ts_ns = ticks * num (0), ticks // den (1), (ticks * num) >> den (2), 0 (3): the forms _tsresol gives.
TS_MUL, TS_DIV, TS_SHIFT, TS_ZERO = range(4)
_INTERFACE = struct.Struct("=qqQqQq")
_SYN_ROW = np.dtype([("row", "=i8"), ("mss", "=i4"), ("wscale", "=i4"), ("sack_permitted", "=i4"),
                     ("timestamps", "=i4")])


def row_bound(raw: IO[bytes], gz: bool) -> int:
    """An upper bound on the TCP rows of the file behind raw (0 if unknown: a pipe), to size the columns.

    Only the rows written are ever touched, so the bound costs address space, not memory. A gzip file's
    size is taken from its trailer (the size mod 2^32 of the last member); the columns grow if it is short.
    """
    try:
        info = os.fstat(raw.fileno())
    except (OSError, AttributeError, ValueError):
        return 0
    if not stat.S_ISREG(info.st_mode):
        return 0
    size = info.st_size
    if gz:
        try:
            trailer = os.pread(raw.fileno(), 4, size - 4) if size >= 4 else b""
        except OSError:
            trailer = b""
        size = max(size, int.from_bytes(trailer, "little")) if len(trailer) == 4 else size
    return size // MIN_ROW_FILE_BYTES + 1


class ConsumerFailed(Exception):
    """What a stream's consume raised, carried past the reader's handlers (which turn OSError and EOFError
    into the file's DiagError) to stream_capture, which raises it again."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(repr(error))
        self.error = error


class NativeBuilder:
    """The kernel's Decoder and the columns it writes into, plus what the twin's _ColumnBuilder keeps.

    With ``consume`` it streams: the columns hold one chunk's rows, which flush() hands on before the Decoder
    is rewound; the SYNs and endpoints are collected as they are flushed.
    """

    def __init__(self, kernel: ModuleType, first_frame: int, rows: int,
                 consume: Callable[[CaptureChunk], None] | None = None, details: bool = True) -> None:
        self.kernel = kernel
        self.consume = consume
        self.details = details  # streaming: the SYNs and endpoints too (a later pass over a file needs neither)
        self.rows_flushed = 0  # streaming: the global row index of the columns' row 0
        self.streamed_endpoints: list[tuple[str, int]] = []
        self.decoder = kernel.Decoder(first_frame)
        try:
            self.columns = {name: np.empty(rows, dtype=dtype) for name, dtype in COLUMN_DTYPES.items()}
        except MemoryError:  # the bound is more address space than the system grants: grow as a pipe does
            rows = 0
            self.columns = {name: np.empty(0, dtype=dtype) for name, dtype in COLUMN_DTYPES.items()}
        self.capacity = rows
        self.skipped: dict[str, int] = {}
        self.linktypes: set[int] = set()
        self.snaplen = 0
        self.warnings: list[str] = []

    @property
    def frames(self) -> int:
        return int(self.decoder.frames)

    def pcap(self, handle: IO[bytes], magic: bytes, path: Path) -> None:
        read_pcap(handle, magic, self, path)

    def pcapng(self, handle: IO[bytes], magic: bytes, path: Path) -> None:
        read_pcapng(handle, magic, self, path)

    def skip(self, reason: str, count: int) -> None:
        if count:
            self.skipped[reason] = self.skipped.get(reason, 0) + int(count)

    def count(self, counts: tuple[int, ...]) -> None:
        for reason, n in zip(SKIP_ORDER, counts, strict=True):
            self.skip(reason, n)

    def reserve(self, rows: int) -> list[np.ndarray]:
        """The columns, with room for `rows` more (grown in place: realloc, no second copy kept).

        Call only while no kernel call is writing into them."""
        need = int(self.decoder.rows) + rows
        if need > self.capacity:
            # Streaming sizes the columns for one chunk: exactly what it needs, no doubling.
            self.capacity = need if self.consume is not None else max(need, self.capacity * 2)
            for column in self.columns.values():
                column.resize(self.capacity, refcheck=False)
        return list(self.columns.values())

    def flush(self) -> None:
        """Streaming: hand the rows decoded since the last flush to consume, then rewind the Decoder so the
        next chunk reuses the columns. Call only between kernel calls; without consume, nothing to do."""
        if self.consume is None:
            return
        rows = int(self.decoder.rows)
        if not rows:  # no call for a chunk without TCP rows (its frames and skips are counted all the same)
            return
        syns = self._syns() if self.details else []  # in this chunk only: kept, they would grow with the file
        if self.details:
            self.streamed_endpoints += _endpoints(self.decoder.endpoint_keys(len(self.streamed_endpoints)))
        chunk = CaptureChunk({name: column[:rows] for name, column in self.columns.items()}, syns,
                             self.rows_flushed, self.streamed_endpoints)
        try:
            self.consume(chunk)
        except Exception as exc:
            raise ConsumerFailed(exc) from exc
        self.rows_flushed += rows
        self.decoder.rewind()

    def finish(self, file_format: str) -> ReadResult:
        if self.consume is not None:
            self.flush()  # every chunk was flushed as it was decoded; this is only a safeguard
            if self.details:
                self.streamed_endpoints += _endpoints(self.decoder.endpoint_keys(len(self.streamed_endpoints)))
            empty = {name: np.zeros(0, dtype=dtype) for name, dtype in COLUMN_DTYPES.items()}
            self.columns = empty  # the chunk columns are no longer needed: return their memory
            return ReadResult(empty, self.streamed_endpoints, [], self.frames, self.skipped,
                              sorted(self.linktypes), self.snaplen, file_format, self.warnings)
        rows = int(self.decoder.rows)
        for column in self.columns.values():
            if column.size != rows:
                column.resize(rows, refcheck=False)  # the unused tail was never touched: this only returns it
        return ReadResult(self.columns, _endpoints(self.decoder.endpoint_keys()), self._syns(), self.frames,
                          self.skipped, sorted(self.linktypes), self.snaplen, file_format, self.warnings)

    def _syns(self) -> list[SynInfo]:
        """The SYN rows the Decoder noted (since the last rewind), as SynInfo."""
        table = np.frombuffer(self.decoder.syn_rows(), dtype=_SYN_ROW)
        if not table.size:
            return []
        rows = table["row"]
        cols = self.columns
        return [
            SynInfo(frame=frame, ts_ns=ts_ns, src=src, dst=dst, flags=flags, mss=None if mss < 0 else mss,
                    wscale=None if wscale < 0 else wscale, sack_permitted=bool(sack), timestamps=bool(ts))
            for frame, ts_ns, src, dst, flags, mss, wscale, sack, ts in zip(
                cols["frame"][rows].tolist(), cols["ts_ns"][rows].tolist(), cols["src"][rows].tolist(),
                cols["dst"][rows].tolist(), cols["flags"][rows].tolist(), table["mss"].tolist(),
                table["wscale"].tolist(), table["sack_permitted"].tolist(), table["timestamps"].tolist(),
                strict=True)
        ]


def _endpoints(keys: bytes) -> list[tuple[str, int]]:
    """The kernel's endpoint keys (id order) -> (address, port), the address as ipaddress writes it."""
    import ipaddress

    size = 19
    out: list[tuple[str, int]] = []
    for at in range(0, len(keys), size):
        key = keys[at:at + size]
        port = int.from_bytes(key[17:19], "big")
        if key[0] == 4:
            out.append((socket.inet_ntoa(key[1:5]), port))  # dotted quad: the same text as IPv4Address
        else:
            out.append((str(ipaddress.IPv6Address(key[1:17])), port))
    return out


# --- pcap -------------------------------------------------------------------------------------------------

def read_pcap(handle: IO[bytes], magic: bytes, builder: NativeBuilder, path: Path,
              chunk_bytes: int | None = None) -> None:
    """pcap records through the kernel, chunk by chunk (chunk_bytes, default pcapfile.CHUNK_BYTES); reading
    chunk k+1 overlaps decoding chunk k."""
    endian, ns_per_tick = PCAP_MAGICS[magic]
    snaplen, linktype, limit = pcap_header(handle, magic, path)
    builder.snaplen = snaplen
    decoder = builder.decoder
    big = endian == ">"
    # Each buffer keeps `room` bytes in front of its chunk for the unfinished record of the chunk before.
    room = limit + 16
    stores = [bytearray(room + (pcapfile.CHUNK_BYTES if chunk_bytes is None else chunk_bytes)) for _ in range(2)]
    start = room
    with memoryview(stores[0]) as view:
        got = _read_into(handle, view[room:])
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="diag-decode") as pool:
        turn = 0
        while got:
            store, following = stores[turn % 2], stores[(turn + 1) % 2]
            stop = room + got
            columns = builder.reserve((stop - start) // MIN_ROW_FILE_BYTES + 1)
            job = pool.submit(decoder.pcap_chunk, store, start, stop, big, ns_per_tick, limit, linktype, columns)
            try:
                with memoryview(following) as view:
                    got = _read_into(handle, view[room:])
            finally:
                end, records, counts, bad_caplen = job.result()
            if bad_caplen >= 0:
                raise DiagError(f"{path}: record {decoder.record_index + 1} claims {bad_caplen} "
                                f"bytes (snaplen {snaplen}); the file is corrupt")
            if records:
                builder.linktypes.add(linktype)
                builder.count(counts)
            builder.flush()
            tail = stop - end
            following[room - tail:room] = store[end:stop]
            start = room - tail
            turn += 1
    tail = room - start
    if tail:
        builder.skip("truncated_record", 1)
        builder.warnings.append(f"{path}: the last record is cut short ({tail} bytes); "
                                "the capture was probably killed while writing - it was skipped")


# --- pcapng -----------------------------------------------------------------------------------------------


def _interface_table(interfaces: list[_Interface]) -> bytes:
    """Interfaces as the kernel reads them: link type, snaplen and the exact ticks -> ns arithmetic."""
    parts = []
    for iface in interfaces:
        num, den = iface.ns_num, iface.ns_den
        if den == 1:
            kind, value = TS_MUL, 0
        elif num == 1:
            kind, value = (TS_DIV, den) if den < 1 << 64 else (TS_ZERO, 0)  # ticks < 2^64: the quotient is 0
        elif den & (den - 1) == 0:
            kind, value = TS_SHIFT, den.bit_length() - 1
        else:  # _tsresol gives only the three forms above
            raise ValueError(f"if_tsresol {num}/{den} has no kernel form")
        parts.append(_INTERFACE.pack(iface.linktype, iface.snaplen, num, kind, value, 0))
    return b"".join(parts)


def read_pcapng(handle: IO[bytes], magic: bytes, builder: NativeBuilder, path: Path) -> None:
    """pcapng blocks in the twin's chunks: the kernel walks packet blocks into a table (offset, caplen, ts_ns,
    link type, original length) and decodes it; section headers and interface descriptions are read here, as the twin does."""
    kernel = builder.kernel
    interfaces: list[_Interface] = []
    interface_table = b""
    endian = "<"
    carry = b""
    consumed = 0  # file offset of buf[0], for messages
    # Room for every packet block a chunk can hold (the smallest is 16 bytes); rows are written only as found.
    table = [np.empty((pcapfile.CHUNK_BYTES + MAX_RECORD_BYTES + 64) // 16 + 1, dtype=np.int64)
             for _ in range(5)]
    for data in _chunks(handle, magic):
        buf = carry + data if carry else data
        file_offset = consumed - len(carry)
        consumed += len(data)
        n = len(buf)
        off = used = 0
        while True:
            status, off, used = kernel.pcapng_blocks(buf, off, endian == ">", interface_table, table, used)
            if status in (NG_END, NG_INCOMPLETE):
                break
            if status == NG_TABLE_FULL:
                table = [np.concatenate([column, np.empty_like(column)]) for column in table]
                continue
            if status != NG_PYTHON:
                raise _block_error(status, buf, off, endian, interfaces, file_offset + off, path)
            # A section header or an interface description, read as the twin reads it.
            if buf[off:off + 4] == PCAPNG_SHB:
                endian = section_byte_order(buf[off + 8:off + 12], path)
                interfaces = []
                interface_table = b""
            btype, blen = block_header(buf, off, endian, file_offset + off, path)
            if off + blen > n:
                break
            if btype == 1:  # interface description
                interfaces.append(interface_description(buf, off, blen, endian))
                interface_table = _interface_table(interfaces)
                builder.snaplen = max(builder.snaplen, interfaces[-1].snaplen)
            off += blen
        carry = buf[off:]
        if used:
            _decode_table(builder, buf, [column[:used] for column in table])
            builder.flush()
    if carry:
        builder.skip("truncated_record", 1)
        builder.warnings.append(f"{path}: the last block is cut short ({len(carry)} bytes); it was skipped")


def _decode_table(builder: NativeBuilder, buf: bytes, table: list[np.ndarray]) -> None:
    """Decode a chunk's packet blocks one link type at a time, link types ascending, as the twin does
    (so with several link types in one chunk the frame numbers follow that order, not the file's)."""
    offsets, caplens, stamps, linktypes, origs = table
    if (linktypes == linktypes[0]).all():
        groups: list[tuple[int, np.ndarray | None]] = [(int(linktypes[0]), None)]
    else:
        groups = [(int(linktype), linktypes == linktype) for linktype in np.unique(linktypes)]
    for linktype, pick in groups:
        count = linktypes.size if pick is None else int(np.count_nonzero(pick))
        if linktype not in SUPPORTED_LINKTYPES:
            builder.skip(f"unsupported_linktype_{linktype}", count)
            builder.decoder.skip_frames(count)
            continue
        rows = ((offsets, caplens, stamps, origs) if pick is None
                else (offsets[pick], caplens[pick], stamps[pick], origs[pick]))
        columns = builder.reserve(count)
        counts = builder.decoder.decode_rows(buf, *rows, count, linktype, columns)
        builder.linktypes.add(linktype)
        builder.count(counts)


def _block_error(status: int, buf: bytes, off: int, endian: str, interfaces: list[_Interface], at: int,
                 path: Path) -> DiagError:
    """The twin's message for the broken block the kernel stopped at."""
    if status == NG_BAD_LENGTH:
        _btype, blen = struct.unpack_from(endian + "II", buf, off)
        return DiagError(f"{path}: pcapng block at byte {at} has a bad length {blen}; corrupt file")
    if status == NG_INCONSISTENT:
        return DiagError(f"{path}: pcapng packet block at byte {at} is inconsistent; corrupt file")
    if status == NG_TIMESTAMP:
        btype = struct.unpack_from(endian + "I", buf, off)[0]
        if btype == 6:
            iface_id, ts_hi, ts_lo = struct.unpack_from(endian + "III", buf, off + 8)
        else:
            iface_id, _drops, ts_hi, ts_lo = struct.unpack_from(endian + "HHII", buf, off + 8)
        iface = interfaces[iface_id]
        ts_ns = ((ts_hi << 32) | ts_lo) * iface.ns_num // iface.ns_den
        return DiagError(f"{path}: pcapng packet block at byte {at} has a timestamp "
                         f"beyond the year 2262 ({ts_ns} ns); corrupt file or wrong if_tsresol")
    if status == NG_SIMPLE_FIRST:
        return DiagError(f"{path}: pcapng simple packet before any interface; corrupt file")
    return DiagError(f"{path}: the pcapng reader stopped at byte {at} with status {status}; report this file")

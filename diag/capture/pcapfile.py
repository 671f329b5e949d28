"""Capture file formats: pcap (micro- or nanosecond stamps, either byte order) and pcapng, both optionally
gzip-compressed. Their headers and blocks, the link types diag reads, and what a read gives: ReadResult (a
whole file's columns), CaptureChunk (one chunk's), SynInfo. The decoders (decode.py: numpy; reader_native.py:
the _cpcap kernel) build on this module, and reader.py is their front.
"""

from __future__ import annotations

import io
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np

from diag.errors import DiagError

CHUNK_BYTES = 8 << 20
# The most any single record may claim; bigger means the record structure is corrupt.
MAX_RECORD_BYTES = 1 << 20
# The smallest valid pcapng block of each type: header + fixed fields + trailing length.
MIN_BLOCK_BYTES = {0x0A0D0D0A: 28, 1: 20, 2: 32, 3: 16, 5: 28, 6: 32}
# Packet times are int64 nanoseconds since the epoch (as numpy's datetime64[ns]): up to the year 2262.
MAX_TIMESTAMP_NS = (1 << 63) - 1
COLUMN_BYTES_PER_PACKET = 8 + 4 + 4 + 4 + 4 + 4 + 2 + 1 + 4 + 4 + 1 + 8 + 1  # the COLUMN_DTYPES, in order

# TCP flag bits (the low byte of the TCP flags field).
FIN, SYN, RST, PSH, ACK, URG, ECE, CWR = 0x01, 0x02, 0x04, 0x08, 0x10, 0x20, 0x40, 0x80

LINKTYPE_NULL = 0
LINKTYPE_ETHERNET = 1
LINKTYPE_RAW = 101
LINKTYPE_RAW_BSD = 12
LINKTYPE_RAW_BSD14 = 14
LINKTYPE_LOOP = 108
LINKTYPE_LINUX_SLL = 113
LINKTYPE_IPV4 = 228
LINKTYPE_IPV6 = 229
LINKTYPE_LINUX_SLL2 = 276
SUPPORTED_LINKTYPES = {
    LINKTYPE_NULL: "BSD loopback", LINKTYPE_ETHERNET: "Ethernet", LINKTYPE_RAW: "raw IP",
    LINKTYPE_RAW_BSD: "raw IP", LINKTYPE_RAW_BSD14: "raw IP", LINKTYPE_LOOP: "OpenBSD loopback",
    LINKTYPE_LINUX_SLL: "Linux cooked (SLL)", LINKTYPE_IPV4: "raw IPv4", LINKTYPE_IPV6: "raw IPv6",
    LINKTYPE_LINUX_SLL2: "Linux cooked v2 (SLL2)",
}
# Link types diag does not read, as tcpdump names them (a refusal names the type in words).
OTHER_LINKTYPES = {9: "PPP", 104: "Cisco HDLC", 105: "802.11", 119: "802.11 with Prism header", 127: "802.11 radiotap",
                   143: "DOCSIS", 147: "user-defined (DLT_USER0)", 163: "802.11 with AVS header", 187: "Bluetooth HCI H4",
                   189: "USB (Linux)", 195: "IEEE 802.15.4", 220: "USB (Linux, memory-mapped)", 227: "CAN (SocketCAN)"}
LINKTYPE_MASK = 0x03FFFFFF  # libpcap's LT_LINKTYPE: the upper bits carry the FCS length (0x04000001: Ethernet + FCS)
UNSUPPORTED_LINKTYPE_PREFIX = "unsupported_linktype_"
SKIP_WORDS = {"tunnel_too_deep": "tunnel_too_deep (a tunnel inside the third one diag follows)"}  # key -> words


def linktype_name(linktype: int) -> str:
    """'link type 127 (802.11 radiotap)'."""
    name = SUPPORTED_LINKTYPES.get(linktype) or OTHER_LINKTYPES.get(linktype)
    return f"link type {linktype}" + (f" ({name})" if name else "")


def unsupported_linktype_error(path: Path | str, linktypes: list[int]) -> DiagError:
    """The one refusal of both formats for a file with no packet of a link type diag reads."""
    return DiagError(f"{path}: {', '.join(map(linktype_name, linktypes))} is not supported; diag reads "
                     f"{', '.join(sorted(set(SUPPORTED_LINKTYPES.values())))} (capture the IP interface)")

PCAP_MAGICS = {
    b"\xd4\xc3\xb2\xa1": ("<", 1000), b"\xa1\xb2\xc3\xd4": (">", 1000),
    b"\x4d\x3c\xb2\xa1": ("<", 1), b"\xa1\xb2\x3c\x4d": (">", 1),
}
PCAPNG_SHB = b"\x0a\x0d\x0d\x0a"
GZIP_MAGIC = b"\x1f\x8b"

COLUMN_DTYPES: dict[str, Any] = {
    "ts_ns": np.int64, "src": np.int32, "dst": np.int32, "seq": np.uint32, "ack": np.uint32,
    "plen": np.int32, "win": np.uint16, "flags": np.uint8, "tsval": np.uint32, "tsecr": np.uint32,
    "has_ts": np.bool_, "frame": np.int64, "tunnel": np.uint8,
}
# The tunnel column's bits: the encapsulations a TCP packet was decoded from (VXLAN on UDP port 4789, Geneve
# on 6081, GRE version 0 with IP or Ethernet inside, IP in IP), 0 for none; names as the JSON writes them.
TUNNELS = {1: "vxlan", 2: "geneve", 4: "gre", 8: "ip-in-ip"}


@dataclass(slots=True)
class SynInfo:
    """What a SYN told us: the options that shape the rest of the connection."""

    frame: int
    ts_ns: int
    src: int
    dst: int
    flags: int
    mss: int | None
    wscale: int | None
    sack_permitted: bool
    timestamps: bool


@dataclass
class ReadResult:
    """Columns (name -> numpy array, one row per TCP packet, file order) plus what was skipped and why.

    ``src``/``dst`` are endpoint ids; ``endpoints[i]`` is the (address, port) of id i.
    """

    columns: dict[str, np.ndarray]
    endpoints: list[tuple[str, int]]
    syns: list[SynInfo]
    frames: int
    skipped: dict[str, int]
    linktypes: list[int]
    snaplen: int
    file_format: str
    warnings: list[str] = field(default_factory=list)

    @property
    def packets(self) -> int:
        return int(self.columns["ts_ns"].size)


@dataclass
class CaptureChunk:
    """The TCP rows of one decoded chunk of a capture, as stream_capture hands them to its consume callback.

    ``columns`` are COLUMN_DTYPES arrays (one row per TCP packet, file order) that view the reader's reused
    column buffers: they are valid only during the callback (copy what must outlive it). The concatenation of
    every chunk's columns is read_capture's columns, endpoint ids included. ``syns`` are the SYNs among these
    rows, as read_capture gives them; ``first_row`` is the global (0-based) row index of row 0; ``endpoints``
    is every endpoint numbered so far in id order - the reader's own list, which only grows (a prefix read
    now stays valid), so it must not be modified.
    """

    columns: dict[str, np.ndarray]
    syns: list[SynInfo]
    first_row: int
    endpoints: list[tuple[str, int]]

    @property
    def rows(self) -> int:
        return int(self.columns["ts_ns"].size)


class _Prefixed(io.RawIOBase):
    """``head`` then the rest of ``stream``: lets the format be sniffed without seeking (pipes)."""

    def __init__(self, head: bytes, stream: IO[bytes]) -> None:
        super().__init__()
        self._head = head
        self._stream = stream

    def readable(self) -> bool:
        return True

    def readinto(self, target: Any) -> int:
        view = memoryview(target).cast("B")
        if self._head:
            n = min(len(view), len(self._head))
            view[:n] = self._head[:n]
            self._head = self._head[n:]
            return n
        return self._stream.readinto(view)  # type: ignore[attr-defined]


def _chunks(handle: IO[bytes], first: bytes = b"") -> Iterator[bytes]:
    if first:
        yield first
    while True:
        data = handle.read(CHUNK_BYTES)
        if not data:
            return
        yield data


def pcap_header(handle: IO[bytes], magic: bytes, path: Path) -> tuple[int, int, int]:
    """The rest of a pcap file header -> (snaplen, link type, the most bytes a record may claim)."""
    endian = PCAP_MAGICS[magic][0]
    rest = handle.read(20)
    if len(rest) < 20:
        raise DiagError(f"{path}: pcap header is truncated ({4 + len(rest)} of 24 bytes)")
    _major, _minor, _zone, _sigfigs, snaplen, linktype_field = struct.unpack(endian + "HHiIII", rest)
    linktype = linktype_field & LINKTYPE_MASK
    if linktype not in SUPPORTED_LINKTYPES:
        raise unsupported_linktype_error(path, [linktype])
    limit = max(snaplen, 65535 + 64) + 64
    return snaplen, linktype, min(limit, MAX_RECORD_BYTES)


def cut_after(fd: int, cut_ns: int) -> int | None:
    """Truncate the classic pcap open on ``fd`` before its first record stamped after ``cut_ns`` (epoch ns):
    a live capture that ran on past the moment its window closed keeps only that window. Returns the records
    kept, or None where the file is not a classic pcap (left as it is). Records are in capture
    order, so everything from the first late one on is cut; a record cut short at the end (a capture killed
    mid-write) stays, as a reader reports it."""
    header = os.pread(fd, 24, 0)
    if len(header) < 24 or header[:4] not in PCAP_MAGICS:
        return None
    endian, ns_per_tick = PCAP_MAGICS[header[:4]]
    record = struct.Struct(endian + "III")
    size = os.fstat(fd).st_size
    kept, offset = 0, 24
    chunk_start, chunk = offset, b""
    while offset + 16 <= size:
        at = offset - chunk_start
        if at + 16 > len(chunk):
            chunk_start, chunk = offset, os.pread(fd, CHUNK_BYTES, offset)
            at = 0
            if len(chunk) < 16:
                break
        seconds, fraction, captured = record.unpack_from(chunk, at)
        if seconds * 1_000_000_000 + fraction * ns_per_tick > cut_ns:
            os.ftruncate(fd, offset)
            return kept
        if captured > MAX_RECORD_BYTES:
            break       # not a record boundary: leave the file to the reader, which says where it breaks
        kept += 1
        offset += 16 + captured
    return kept


def _read_into(handle: IO[bytes], target: memoryview) -> int:
    """Fill target from handle (several reads if the stream returns short ones); 0 at the end."""
    total = 0
    while total < len(target):
        got = handle.readinto(target[total:])  # type: ignore[attr-defined]
        if not got:
            break
        total += got
    return total


@dataclass
class _Interface:
    linktype: int
    snaplen: int
    ns_num: int     # timestamp units -> ns: ts * ns_num // ns_den
    ns_den: int


def section_byte_order(bom: bytes, path: Path) -> str:
    """'<' or '>' from a pcapng section header's byte-order mark (both readers: the same error)."""
    if bom == b"\x4d\x3c\x2b\x1a":
        return "<"
    if bom == b"\x1a\x2b\x3c\x4d":
        return ">"
    raise DiagError(f"{path}: pcapng section header has a bad byte-order mark; corrupt file")


def block_header(buf: bytes, off: int, endian: str, at: int, path: Path) -> tuple[int, int]:
    """(type, total length) of the pcapng block at buf[off] (file offset at), its length checked."""
    btype, blen = struct.unpack_from(endian + "II", buf, off)
    if blen < MIN_BLOCK_BYTES.get(btype, 12) or blen % 4 or blen > MAX_RECORD_BYTES + 64:
        raise DiagError(f"{path}: pcapng block at byte {at} has a bad length {blen}; corrupt file")
    return btype, blen


def interface_description(buf: bytes, off: int, blen: int, endian: str) -> _Interface:
    """The interface description block at buf[off]: link type, snaplen and time resolution."""
    linktype, _reserved, snaplen = struct.unpack_from(endian + "HHI", buf, off + 8)
    num, den = _tsresol(buf, off + 16, off + blen - 4, endian)
    return _Interface(linktype, snaplen, num, den)


def _tsresol(buf: bytes, start: int, end: int, endian: str) -> tuple[int, int]:
    """if_tsresol option -> (num, den) so that ns = ticks * num // den. Default: microseconds."""
    off = start
    while off + 4 <= end:
        code, length = struct.unpack_from(endian + "HH", buf, off)
        if code == 0:
            break
        if code == 9 and length >= 1:
            value = buf[off + 4]
            exponent = value & 0x7F
            if value & 0x80:
                return 1_000_000_000, 1 << exponent
            if exponent <= 9:
                return 10 ** (9 - exponent), 1
            return 1, 10 ** (exponent - 9)
        off += 4 + ((length + 3) & ~3)
    return 1000, 1


def parse_tcp_options(data: bytes) -> dict[str, Any]:
    """TLV walk over TCP option bytes; stops quietly at the first malformed option."""
    out: dict[str, Any] = {}
    off = 0
    while off < len(data):
        kind = data[off]
        if kind == 0:
            break
        if kind == 1:
            off += 1
            continue
        if off + 1 >= len(data):
            break
        length = data[off + 1]
        if length < 2 or off + length > len(data):
            break
        body = data[off + 2:off + length]
        if kind == 2 and length == 4:
            out["mss"] = int.from_bytes(body, "big")
        elif kind == 3 and length == 3:
            out["wscale"] = min(body[0], 14)  # RFC 7323: larger shifts are treated as 14
        elif kind == 4:
            out["sack_permitted"] = True
        elif kind == 8 and length == 10:
            out["tsval"] = int.from_bytes(body[:4], "big")
            out["tsecr"] = int.from_bytes(body[4:], "big")
        off += length
    return out

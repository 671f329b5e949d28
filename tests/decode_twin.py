"""The numpy twin of the _cpcap kernel (diag/capture/reader_native.py): capture records -> TCP columns, the
tests' independent reference for the kernel (read_capture below; tests/native_helpers.assert_twins).

pcap record offsets are found with numpy (_PcapWalker; a record-by-record walk only as the fallback),
pcapng blocks by a tight loop that only finds where each block starts; everything else - link layers,
IPv4/IPv6, TCP header fields and the timestamp option - is decoded with vectorized numpy over a whole
chunk of records at once, so the only memory that grows with the capture is the output columns
(COLUMN_BYTES_PER_PACKET a packet). Packets that cannot be a complete TCP header are counted in
``ReadResult.skipped`` under a reason (non_ip, non_tcp, fragment, truncated_headers, ...).
"""

from __future__ import annotations

import itertools
import struct
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import IO

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from diag.capture import pcapfile
from diag.capture.pcapfile import (
    COLUMN_DTYPES,
    LINKTYPE_ETHERNET,
    LINKTYPE_IPV4,
    LINKTYPE_IPV6,
    LINKTYPE_LINUX_SLL,
    LINKTYPE_LINUX_SLL2,
    LINKTYPE_LOOP,
    LINKTYPE_NULL,
    MAX_TIMESTAMP_NS,
    PCAP_MAGICS,
    PCAPNG_SHB,
    SUPPORTED_LINKTYPES,
    SYN,
    ReadResult,
    SynInfo,
    _chunks,
    _Interface,
    _read_into,
    block_header,
    interface_description,
    parse_tcp_options,
    pcap_header,
    section_byte_order,
)
from diag.errors import DiagError

# Bytes from the network header copied into the per-chunk IP matrix (the IPv6 header; IPv4 fields are within it).
DECODE_WIDTH = 40
# Bytes from the TCP header copied into the TCP matrix: the header and a timestamp option after two NOPs.
TCP_WIDTH = 32
# The vectorized record finder assumes the records of one chunk span less than this (else: walked).
CHUNK_SPAN_S = 1 << 16
# The vectorized record finder gives up (and walks) when more than 1 byte in this many is a candidate.
MAX_CANDIDATE_SHARE = 8
# Zero bytes kept after a chunk's data so fixed-width rows of the last records never need a padded copy.
GATHER_PAD = 128
# Bytes needed to decide the link layer (Ethernet with two VLAN tags, SLL2).
LINK_WIDTH = 24


def _read_pcap(handle: IO[bytes], magic: bytes, builder: _ColumnBuilder, path: Path,
               chunk_bytes: int | None = None) -> None:
    """pcap records into builder, in chunks of chunk_bytes (default CHUNK_BYTES)."""
    chunk = pcapfile.CHUNK_BYTES if chunk_bytes is None else chunk_bytes
    endian, ns_per_tick = PCAP_MAGICS[magic]
    snaplen, linktype, limit = pcap_header(handle, magic, path)
    builder.snaplen = snaplen
    walker = _PcapWalker(endian, ns_per_tick, limit, snaplen, path)
    # Two buffers in turn, and a decoder thread: while the decoder turns chunk k into columns, this
    # thread reads chunk k+1 and finds its records (numpy releases the GIL in the bulk work, so on two
    # cores the two stages overlap). The decoder runs chunks in file order, so frame numbers and endpoint
    # ids come out as in a sequential read. Reusing the buffers spares a fresh multi-MB allocation (and
    # its page faults) per chunk; everything kept from a chunk is copied out of it by the decoder.
    # GATHER_PAD zero bytes after the data let the decoder read fixed-width rows past the last record.
    stores = [bytearray(chunk + limit + 16 + GATHER_PAD) for _ in range(2)]
    pending: list[Future[None] | None] = [None, None]
    tail = b""  # the unfinished last record of the previous chunk, moved to the front of the next
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="diag-decode") as decoder:
        for turn in itertools.count():
            slot = turn % 2
            job = pending[slot]
            if job is not None:
                pending[slot] = None
                job.result()  # the decoder is done with this buffer (and raises what it raised)
            store = stores[slot]
            carry = len(tail)
            store[:carry] = tail
            with memoryview(store) as view:
                got = _read_into(handle, view[carry:carry + chunk])
            if not got:
                break
            n = carry + got
            store[n:n + GATHER_PAD] = bytes(GATHER_PAD)
            padded = np.frombuffer(store, dtype=np.uint8, count=n + GATHER_PAD)
            with memoryview(store) as view:
                starts, header = walker.records(view[:n], padded[:n])
            end = int(starts[-1] + 16 + header[-1, 2]) if starts.size else 0
            if starts.size:
                ts_ns = (header[:, 0].astype(np.int64) * 1_000_000_000
                         + header[:, 1].astype(np.int64) * ns_per_tick)
                pending[slot] = decoder.submit(builder.add, padded, starts + 16,
                                               header[:, 2].astype(np.int64), ts_ns, linktype,
                                               header[:, 3].astype(np.int64))
            tail = bytes(store[end:n])
        for job in pending:
            if job is not None:
                job.result()
    if tail:
        builder.skip("truncated_record", 1)
        builder.warnings.append(f"{path}: the last record is cut short ({len(tail)} bytes); "
                                "the capture was probably killed while writing - it was skipped")


class _PcapWalker:
    """Finds where each pcap record of a chunk starts, without a Python step per record.

    A record's length is in its own header, so the offsets form a chain. Rather than walk it in Python
    (~0.4 us a record, the largest single cost of a big capture), every byte equal to the top byte of the
    first record's ts_sec is taken as a possible header (that byte changes every 194 days), the plausible
    ones (caplen within limits, caplen <= orig_len, fraction < 1 s) are kept, and the chain from the chunk's
    first record is followed through them by pointer doubling in numpy. Whenever that chain does not end
    exactly where the chunk's complete records end (the top byte changed, or the file is corrupt) the chunk
    is walked record by record instead, which also produces the exact error for a corrupt record.
    """

    def __init__(self, endian: str, ns_per_tick: int, limit: int, snaplen: int, path: Path) -> None:
        self.endian, self.limit, self.snaplen, self.path = endian, limit, snaplen, path
        self.u32 = np.dtype(endian + "u4")
        self.ticks_per_s = 1_000_000_000 // ns_per_tick
        self.unpack_header = struct.Struct(endian + "IIII").unpack_from
        self.record_index = 0

    def records(self, buf: bytes, arr: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(record start offsets, [ts_sec, ts_frac, caplen, orig_len] rows) of the complete records in buf."""
        found = self._vectorized(buf, arr) if len(buf) >= 16 else None
        if found is None:
            found = self._walk(buf)
        self.record_index += int(found[0].size)
        return found

    def _headers32(self, arr: np.ndarray, starts: np.ndarray) -> np.ndarray:
        """[ts_sec, ts_frac, caplen, orig_len] rows as native uint32 (a byte swap only for a foreign order)."""
        rows = _gather(arr, starts, 16).view(self.u32)
        return rows if self.u32.isnative else rows.astype(np.uint32)

    def _vectorized(self, buf: bytes, arr: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        n = arr.size
        top_at = 0 if self.endian == ">" else 3
        cand = np.flatnonzero(arr[top_at:n - 15 + top_at] == buf[top_at])
        if cand.size == 0 or cand[0] != 0:
            return None
        # A record takes at least 16 bytes, so more candidates than n / MAX_CANDIDATE_SHARE means the byte is
        # everywhere (zeros, a clock near 1970): the candidate matrices would take ~50 bytes per byte of
        # the chunk (a 64 MB pcap of zeros peaked at 1.2 GB). Walk such a chunk instead.
        if cand.size > n // MAX_CANDIDATE_SHARE:
            return None
        # Header fields stay 32-bit while the candidates are screened (most chunks keep every one of
        # them); only the kept rows are widened to int64.
        head = self._headers32(arr, cand)
        caplen, orig = head[:, 2], head[:, 3]
        # Records of one chunk lie within hours of each other; a true record that fails this test only
        # ends the chain early, and the chunk is then walked record by record.
        near = np.abs(head[:, 0].astype(np.int64) - int(head[0, 0])) < CHUNK_SPAN_S
        plausible = ((caplen <= self.limit) & (caplen <= orig) & (head[:, 1] < self.ticks_per_s)
                     & (cand + 16 + caplen <= n) & near)
        if not plausible[0]:
            return None
        if plausible.all():
            head = head.astype(np.int64)
        else:
            cand, head = cand[plausible], head[plausible].astype(np.int64)
        nxt = cand + 16 + head[:, 2]
        count = cand.size
        if count == 1 or (nxt[:-1] == cand[1:]).all():
            chain = None  # no false candidate: the common case, checked in one pass
        else:
            index = np.searchsorted(cand, nxt)
            hit = index < count
            hit[hit] = cand[index[hit]] == nxt[hit]
            jump = np.append(np.where(hit, index, count), count)  # count: the end of the chain
            chain = np.zeros(1, dtype=np.int64)
            step = jump
            while chain[-1] != count:
                chain = np.concatenate([chain, step[chain]])
                step = step[step]
            chain = chain[chain < count]
        end = int(nxt[-1] if chain is None else nxt[chain[-1]])
        if n - end >= 16:
            # The chain must stop only at an incomplete (but sane) last record of the chunk.
            caplen_next = self.unpack_header(buf, end)[2]
            if caplen_next > self.limit or end + 16 + caplen_next <= n:
                return None
        return (cand, head) if chain is None else (cand[chain], head[chain])

    def _walk(self, buf: bytes) -> tuple[np.ndarray, np.ndarray]:
        n = len(buf)
        offsets: list[int] = []
        headers: list[tuple[int, int, int, int]] = []
        off = 0
        while off + 16 <= n:
            header = self.unpack_header(buf, off)
            caplen = header[2]
            if caplen > self.limit:
                raise DiagError(f"{self.path}: record {self.record_index + len(offsets) + 1} claims {caplen} "
                                f"bytes (snaplen {self.snaplen}); the file is corrupt")
            if off + 16 + caplen > n:
                break
            offsets.append(off)
            headers.append(header)
            off += 16 + caplen
        return (np.asarray(offsets, dtype=np.int64),
                np.asarray(headers, dtype=np.int64).reshape(-1, 4))


def _read_pcapng(handle: IO[bytes], magic: bytes, builder: _ColumnBuilder, path: Path) -> None:
    """Walk pcapng blocks. Interfaces (and their link types and time resolutions) are per section."""
    interfaces: list[_Interface] = []
    endian = "<"
    carry = b""
    consumed = 0  # file offset of buf[0], for messages
    for data in _chunks(handle, magic):
        buf = carry + data if carry else data
        file_offset = consumed - len(carry)
        consumed += len(data)
        n = len(buf)
        off = 0
        # Per chunk: (packet data offset, caplen, ts_ns, linktype, original length) for the decode step.
        rows: list[tuple[int, int, int, int, int]] = []
        while off + 12 <= n:
            block_type = buf[off:off + 4]
            if block_type == PCAPNG_SHB:
                bom = buf[off + 8:off + 12]
                if len(bom) < 4:
                    break
                endian = section_byte_order(bom, path)
                interfaces = []
            btype, blen = block_header(buf, off, endian, file_offset + off, path)
            if off + blen > n:
                break
            if btype == 1:  # interface description
                interfaces.append(interface_description(buf, off, blen, endian))
                builder.snaplen = max(builder.snaplen, interfaces[-1].snaplen)
            elif btype in (6, 2):  # enhanced packet / obsolete packet
                if btype == 6:
                    iface_id, ts_hi, ts_lo, caplen, orig_len = struct.unpack_from(endian + "IIIII", buf, off + 8)
                else:
                    iface_id, _drops, ts_hi, ts_lo, caplen, orig_len = struct.unpack_from(endian + "HHIIII", buf,
                                                                                          off + 8)
                if iface_id >= len(interfaces) or 32 + caplen > blen:
                    raise DiagError(f"{path}: pcapng packet block at byte {file_offset + off} is inconsistent; "
                                    "corrupt file")
                iface = interfaces[iface_id]
                ts_ns = ((ts_hi << 32) | ts_lo) * iface.ns_num // iface.ns_den
                if ts_ns > MAX_TIMESTAMP_NS:
                    raise DiagError(f"{path}: pcapng packet block at byte {file_offset + off} has a timestamp "
                                    f"beyond the year 2262 ({ts_ns} ns); corrupt file or wrong if_tsresol")
                rows.append((off + 28, caplen, ts_ns, iface.linktype, orig_len))
            elif btype == 3:  # simple packet: interface 0, no timestamp
                if not interfaces:
                    raise DiagError(f"{path}: pcapng simple packet before any interface; corrupt file")
                (orig_len,) = struct.unpack_from(endian + "I", buf, off + 8)
                caplen = min(orig_len, blen - 16, interfaces[0].snaplen or orig_len)
                rows.append((off + 12, caplen, 0, interfaces[0].linktype, orig_len))
            off += blen
        carry = buf[off:]
        if not rows:
            continue
        arr = np.frombuffer(buf, dtype=np.uint8)
        table = np.asarray(rows, dtype=np.int64)
        for linktype in np.unique(table[:, 3]):
            lt = int(linktype)
            pick = table[table[:, 3] == lt]
            if lt not in SUPPORTED_LINKTYPES:
                builder.skip(f"unsupported_linktype_{lt}", int(pick.shape[0]))
                builder.frames += int(pick.shape[0])
                continue
            builder.add(arr, pick[:, 0], pick[:, 1], pick[:, 2], lt, pick[:, 4])
    if carry:
        builder.skip("truncated_record", 1)
        builder.warnings.append(f"{path}: the last block is cut short ({len(carry)} bytes); it was skipped")


# --- vectorized decoding ----------------------------------------------------------------------------


def _gather(arr: np.ndarray, starts: np.ndarray, width: int) -> np.ndarray:
    """rows x width matrix of the bytes at starts[i] + 0..width-1 (zero past the end of the buffer).

    Rows are copied whole out of a sliding-window view (one memcpy-like copy per row), not byte by byte.
    """
    # A start can lie past the end: the TCP header of a short last packet of a pcapng chunk (its row is
    # skipped later, but it is gathered with the others).
    end = max(int(starts.max()) + width if starts.size else 0, width)
    if end > arr.size:
        arr = np.concatenate([arr, np.zeros(end - arr.size, dtype=np.uint8)])
    return sliding_window_view(arr, width)[starts]


_BIG_ENDIAN = {1: np.dtype(np.uint8), 2: np.dtype(">u2"), 4: np.dtype(">u4")}


def _be(mat: np.ndarray, pos: int, nbytes: int) -> np.ndarray:
    """Big-endian unsigned integer of nbytes (1, 2 or 4) at column pos of each row, in its narrow dtype."""
    if nbytes == 1:
        return mat[:, pos]
    if pos % nbytes == 0 and mat.shape[1] % nbytes == 0 and mat.flags.c_contiguous:
        return mat.view(_BIG_ENDIAN[nbytes])[:, pos // nbytes]  # aligned: a strided view, no copy
    return np.ascontiguousarray(mat[:, pos:pos + nbytes]).view(_BIG_ENDIAN[nbytes]).ravel()


def _field(mat: np.ndarray, pos: np.ndarray | int, nbytes: int) -> np.ndarray:
    """Big-endian unsigned integer of nbytes at column pos (scalar or per row) of each row."""
    if isinstance(pos, (int, np.integer)):
        if nbytes in _BIG_ENDIAN:
            return _be(mat, int(pos), nbytes).astype(np.uint64)
        out = mat[:, pos].astype(np.uint64)
        for k in range(1, nbytes):
            out = (out << np.uint64(8)) | mat[:, pos + k].astype(np.uint64)
        return out
    rows = np.arange(mat.shape[0])
    pos = np.minimum(pos, mat.shape[1] - nbytes)
    out = mat[rows, pos].astype(np.uint64)
    for k in range(1, nbytes):
        out = (out << np.uint64(8)) | mat[rows, pos + k].astype(np.uint64)
    return out


# The kernel's skip counters (reader_native.SKIP_ORDER): a chunk's counts are added in this order, so the
# order of `skipped`'s keys is the kernel's.
SKIP_SLOTS = ("non_ip", "truncated_headers", "bad_header_length", "fragment", "ipv6_extension_headers",
              "non_tcp", "truncated_headers", "bad_header_length", "tunnel_too_deep")
(SLOT_NON_IP, SLOT_SHORT_IP, SLOT_BAD_IHL, SLOT_FRAGMENT, SLOT_IPV6_EXT, SLOT_NON_TCP, SLOT_SHORT_TCP, SLOT_BAD_THL,
 SLOT_TUNNEL_TOO_DEEP) = range(9)
IPV6_EXTENSIONS = (0, 43, 60, 51, 50, 135, 139, 140)
MAX_TUNNEL_DEPTH = 3
VXLAN_PORT, GENEVE_PORT = 4789, 6081
TUNNEL_BITS = {"vxlan": 1, "geneve": 2, "gre": 4, "ip-in-ip": 8}
_VLAN_TYPES = (0x8100, 0x88A8, 0x9100)


def _ip_layer(arr: np.ndarray, start: np.ndarray, version: np.ndarray, rem: np.ndarray, reported: np.ndarray,
              slots: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One IP header per row at start (rem bytes captured from there, reported on the wire): counts the rows
    skipped (short, bad IHL, fragment, IPv6 extension headers) and gives (kept, next protocol, its offset
    from start, IP total length). An IPv4 total length of 0 (a TSO/GSO super-segment) is the reported length;
    an IPv6 payload length of 0 is a hop-by-hop Jumbo Payload option's length when there is one."""
    n = start.size
    mat = _gather(arr, start, DECODE_WIDTH + 2)
    v4 = version == 4
    short = rem < np.where(v4, 20, 40)
    ihl = (mat[:, 0] & 0x0F).astype(np.int64) * 4
    proto = np.where(v4, mat[:, 9], mat[:, 6]).astype(np.int64)
    l4 = np.where(v4, ihl, 40)
    total4 = _field(mat, 2, 2).astype(np.int64)
    total4 = np.where(total4 == 0, reported, total4)
    payload6 = _field(mat, 4, 2).astype(np.int64)
    jumbo = np.full(n, -1, dtype=np.int64)
    for k in np.flatnonzero(~v4 & ~short & (proto == 0)).tolist():  # hop-by-hop options (rare): walked
        at, left = int(start[k]), int(rem[k])
        length = (int(arr[at + 41]) + 1) * 8 if left >= 42 else 0
        if not length or left < 40 + length:
            short[k] = True
            continue
        jumbo[k] = _jumbo(bytes(arr[at + 42:at + 40 + length]))
        proto[k], l4[k] = int(arr[at + 40]), 40 + length
    total6 = np.where(payload6 != 0, payload6 + 40, np.where(jumbo >= 0, jumbo + 40, 40))
    keep = ~short
    slots[SLOT_SHORT_IP] += int(np.count_nonzero(short))
    bad_ihl = keep & v4 & (ihl < 20)
    slots[SLOT_BAD_IHL] += int(np.count_nonzero(bad_ihl))
    keep &= ~bad_ihl
    fragment = keep & np.where(v4, (_field(mat, 6, 2).astype(np.int64) & 0x3FFF) != 0, proto == 44)
    slots[SLOT_FRAGMENT] += int(np.count_nonzero(fragment))
    keep &= ~fragment
    extension = keep & ~v4 & np.isin(proto, IPV6_EXTENSIONS)
    slots[SLOT_IPV6_EXT] += int(np.count_nonzero(extension))
    keep &= ~extension
    return keep, proto, l4, np.minimum(np.where(v4, total4, total6), reported)  # no more than on the wire


def _jumbo(options: bytes) -> int:
    """The Jumbo Payload option's value among hop-by-hop option TLVs (RFC 2675); -1 without one."""
    at = 0
    while at < len(options):
        if options[at] == 0:  # Pad1
            at += 1
            continue
        if at + 1 >= len(options) or at + 2 + options[at + 1] > len(options):
            return -1
        if options[at] == 0xC2 and options[at + 1] == 4:
            return int.from_bytes(options[at + 2:at + 6], "big")
        at += 2 + options[at + 1]
    return -1


def _tunnel_inner(arr: np.ndarray, ip: int, rem: int, l4: int, proto: int) -> tuple[int, int, int]:
    """What one tunnel packet carries: (its TUNNEL_BITS bit, the inner IP header's offset from the outer one,
    its version); (0, 0, 0) when it is not a tunnel or carries no IP, (-1, 0, 0) when the capture ends inside
    the tunnel's or the inner link's headers. UDP: VXLAN (4789) or Geneve (6081), the lower port tried first;
    Geneve of any version (as tshark); GRE version 0 without source routing; IP in IP."""
    data = bytes(arr[ip + l4:ip + rem])

    def ethernet(at: int) -> tuple[int, int]:  # (IP offset in data or -1 truncated, version or 0)
        if len(data) - at < 14:
            return -1, 0
        etype, off = int.from_bytes(data[at + 12:at + 14], "big"), 14
        for _tag in range(2):
            if etype not in _VLAN_TYPES:
                break
            if len(data) - at < off + 4:
                return -1, 0
            etype, off = int.from_bytes(data[at + off + 2:at + off + 4], "big"), off + 4
        return at + off, {0x0800: 4, 0x86DD: 6}.get(etype, 0)

    def by_type(kind: int, ptype: int, at: int) -> tuple[int, int, int]:
        if ptype == 0x6558:
            inner_at, version = ethernet(at)
        else:
            inner_at, version = at, {0x0800: 4, 0x86DD: 6}.get(ptype, 0)
        if inner_at < 0:
            return -1, 0, 0
        return (kind, l4 + inner_at, version) if version else (0, 0, 0)

    if proto in (4, 41):
        return TUNNEL_BITS["ip-in-ip"], l4, 4 if proto == 4 else 6
    if proto == 17:
        if len(data) < 4:
            return 0, 0, 0
        ports = sorted((int.from_bytes(data[0:2], "big"), int.from_bytes(data[2:4], "big")))
        port = next((p for p in ports if p in (VXLAN_PORT, GENEVE_PORT)), 0)
        if not port:
            return 0, 0, 0
        if len(data) < 16:
            return -1, 0, 0
        if port == VXLAN_PORT:
            return by_type(TUNNEL_BITS["vxlan"], 0x6558, 16)
        header = 16 + (data[8] & 0x3F) * 4
        if len(data) < header:
            return -1, 0, 0
        return by_type(TUNNEL_BITS["geneve"], int.from_bytes(data[10:12], "big"), header)
    if proto == 47:
        if len(data) < 4:
            return -1, 0, 0
        flags = int.from_bytes(data[0:2], "big")
        if flags & 0x7 or flags & 0x4000:
            return 0, 0, 0
        header = 4 + 4 * sum(1 for bit in (0x8000, 0x2000, 0x1000) if flags & bit)
        if len(data) < header:
            return -1, 0, 0
        return by_type(TUNNEL_BITS["gre"], int.from_bytes(data[2:4], "big"), header)
    return 0, 0, 0


class _ColumnBuilder:
    """Accumulates decoded chunks and assigns endpoint ids across chunks."""

    def __init__(self, first_frame: int) -> None:
        self.parts: dict[str, list[np.ndarray]] = {name: [] for name in COLUMN_DTYPES}
        self.endpoint_ids: dict[bytes, int] = {}
        # Sorted IPv4 endpoint keys seen so far and their ids (see _v4_ids).
        self.v4_known: tuple[np.ndarray, np.ndarray] = (np.zeros(0, np.uint64), np.zeros(0, np.int32))
        self.endpoints: list[tuple[str, int]] = []
        self.syns: list[SynInfo] = []
        self.frames = 0
        self.first_frame = first_frame
        self.skipped: dict[str, int] = {}
        self.linktypes: set[int] = set()
        self.snaplen = 0
        self.warnings: list[str] = []

    def skip(self, reason: str, count: int) -> None:
        if count:
            self.skipped[reason] = self.skipped.get(reason, 0) + int(count)

    def add(self, arr: np.ndarray, starts: np.ndarray, caplen: np.ndarray, ts_ns: np.ndarray,
            linktype: int, orig_len: np.ndarray | None = None) -> None:
        """Decode records of one link type: starts/caplen into arr, orig_len their lengths on the wire."""
        count = int(starts.size)
        frame = self.first_frame + self.frames + np.arange(count, dtype=np.int64)
        self.frames += count
        self.linktypes.add(linktype)
        slots = np.zeros(len(SKIP_SLOTS), dtype=np.int64)  # counted per slot, added in the kernel's order
        self._decode(arr, starts, caplen, ts_ns, linktype, caplen if orig_len is None else orig_len, frame, slots)
        for reason, n in zip(SKIP_SLOTS, slots.tolist(), strict=True):
            self.skip(reason, n)

    def _decode(self, arr: np.ndarray, starts: np.ndarray, caplen: np.ndarray, ts_ns: np.ndarray, linktype: int,
                orig_len: np.ndarray, frame: np.ndarray, slots: np.ndarray) -> None:
        mat = _gather(arr, starts, LINK_WIDTH)
        net, ip_version = self._link(mat, caplen, linktype)
        ok = ip_version > 0
        slots[SLOT_NON_IP] += int(np.count_nonzero(~ok))
        if not ok.any():
            return
        rows = np.flatnonzero(ok)
        ip_start = starts[rows] + net[rows]          # each record's current IP header (offset into arr)
        version = ip_version[rows]
        end = starts[rows] + caplen[rows]            # where its captured bytes end
        wire_end = starts[rows] + np.maximum(orig_len[rows], caplen[rows])  # where it ends on the wire
        tunnel = np.zeros(rows.size, dtype=np.uint8)
        found: list[tuple[np.ndarray, ...]] = []     # the TCP rows of each layer
        for depth in range(MAX_TUNNEL_DEPTH + 1):
            if not rows.size:
                break
            keep, proto, l4, total = _ip_layer(arr, ip_start, version, end - ip_start, wire_end - ip_start, slots)
            tcp = keep & (proto == 6)
            found.append((rows[tcp], ip_start[tcp], l4[tcp], total[tcp], version[tcp] == 4, tunnel[tcp],
                          (end - ip_start)[tcp]))
            other = np.flatnonzero(keep & (proto != 6))
            inner = [_tunnel_inner(arr, int(ip_start[k]), int(end[k] - ip_start[k]), int(l4[k]), int(proto[k]))
                     for k in other.tolist()]
            kinds = np.array([kind for kind, _, _ in inner], dtype=np.int64).reshape(-1)
            if depth == MAX_TUNNEL_DEPTH:  # a tunnel inside the deepest one followed: "tunnel_too_deep"
                slots[SLOT_TUNNEL_TOO_DEEP] += int(np.count_nonzero(kinds > 0))
                slots[SLOT_NON_TCP] += int(np.count_nonzero(kinds <= 0))
                break
            slots[SLOT_NON_TCP] += int(np.count_nonzero(kinds == 0))
            slots[SLOT_SHORT_IP] += int(np.count_nonzero(kinds < 0))
            go = kinds > 0
            moved = np.array([offset for _, offset, _ in inner], dtype=np.int64).reshape(-1)[go]
            inner_version = np.array([v for _, _, v in inner], dtype=np.int64).reshape(-1)[go]
            other = other[go]
            rows, version = rows[other], inner_version
            ip_start, end, wire_end = ip_start[other] + moved, end[other], wire_end[other]
            tunnel = tunnel[other] | kinds[go].astype(np.uint8)
        if not found:
            return
        order = np.argsort(np.concatenate([part[0] for part in found]), kind="stable")  # record order again
        net_start, tcp_off, ip_total, v4, tunnels, caplen = (np.concatenate([part[i] for part in found])[order]
                                                             for i in range(1, 7))
        record = np.concatenate([part[0] for part in found])[order]
        ts_ns, frame = ts_ns[record], frame[record]
        mat = _gather(arr, net_start, DECODE_WIDTH)
        keep = np.ones(record.size, dtype=bool)
        short_tcp = caplen < tcp_off + 20
        slots[SLOT_SHORT_TCP] += int(np.count_nonzero(short_tcp))
        keep &= ~short_tcp
        tmat = _gather(arr, net_start + tcp_off, TCP_WIDTH)  # every TCP field at a fixed column
        thl = (tmat[:, 12] >> 4).astype(np.int64) * 4
        bad_len = keep & ((thl < 20) | (ip_total < tcp_off + thl))
        slots[SLOT_BAD_THL] += int(np.count_nonzero(bad_len))
        keep &= ~bad_len
        if not keep.any():
            return
        all_kept = bool(keep.all())
        sel = slice(None) if all_kept else np.flatnonzero(keep)
        mat, tmat, caplen, ts_ns, frame = mat[sel], tmat[sel], caplen[sel], ts_ns[sel], frame[sel]
        v4, tcp_off, thl, ip_total = v4[sel], tcp_off[sel], thl[sel], ip_total[sel]
        net_start, tunnels = net_start[sel], tunnels[sel]
        src, dst = self._endpoint_ids(arr, net_start, mat, tmat, v4)
        flags = tmat[:, 13]
        tsval, tsecr, has_ts = _timestamps(tmat, tcp_off, thl, caplen)
        out = {
            "ts_ns": ts_ns, "src": src, "dst": dst,
            "seq": _be(tmat, 4, 4), "ack": _be(tmat, 8, 4),
            "plen": ip_total - tcp_off - thl, "win": _be(tmat, 14, 2),
            "flags": flags, "tsval": tsval, "tsecr": tsecr, "has_ts": has_ts, "frame": frame,
            "tunnel": tunnels,
        }
        for name, dtype in COLUMN_DTYPES.items():
            column = np.asarray(out[name]).astype(dtype, copy=False)
            # A view would keep its whole chunk matrix (or the reused read buffer) alive: keep a copy.
            self.parts[name].append(column.copy() if column.base is not None else column)
        syn_rows = np.flatnonzero(flags & SYN)
        for row in syn_rows:
            start = int(net_start[row] + tcp_off[row])
            length = min(int(thl[row]), int(caplen[row] - tcp_off[row]))
            options = parse_tcp_options(bytes(arr[start + 20:start + max(length, 20)]))
            self.syns.append(SynInfo(
                frame=int(frame[row]), ts_ns=int(ts_ns[row]), src=int(src[row]), dst=int(dst[row]),
                flags=int(flags[row]), mss=options.get("mss"), wscale=options.get("wscale"),
                sack_permitted=bool(options.get("sack_permitted")), timestamps="tsval" in options,
            ))

    @staticmethod
    def _link(mat: np.ndarray, caplen: np.ndarray, linktype: int) -> tuple[np.ndarray, np.ndarray]:
        """Per row: offset of the network header and IP version (0 = not IP)."""
        n = mat.shape[0]
        if linktype == LINKTYPE_ETHERNET:
            etype = _field(mat, 12, 2).astype(np.int64)
            net = np.full(n, 14, dtype=np.int64)
            for _tag in range(2):  # VLAN, QinQ
                tagged = (etype == 0x8100) | (etype == 0x88A8) | (etype == 0x9100)
                if not tagged.any():
                    break
                etype = np.where(tagged, _field(mat, net + 2, 2).astype(np.int64), etype)
                net = np.where(tagged, net + 4, net)
            version = np.where(etype == 0x0800, 4, np.where(etype == 0x86DD, 6, 0))
        elif linktype == LINKTYPE_LINUX_SLL:
            etype = _field(mat, 14, 2).astype(np.int64)
            net = np.full(n, 16, dtype=np.int64)
            version = np.where(etype == 0x0800, 4, np.where(etype == 0x86DD, 6, 0))
        elif linktype == LINKTYPE_LINUX_SLL2:
            etype = _field(mat, 0, 2).astype(np.int64)
            net = np.full(n, 20, dtype=np.int64)
            version = np.where(etype == 0x0800, 4, np.where(etype == 0x86DD, 6, 0))
        elif linktype in (LINKTYPE_NULL, LINKTYPE_LOOP):
            family_be = _field(mat, 0, 4).astype(np.int64)
            family_le = (mat[:, 0].astype(np.int64) | (mat[:, 1].astype(np.int64) << 8)
                         | (mat[:, 2].astype(np.int64) << 16) | (mat[:, 3].astype(np.int64) << 24))
            family = family_be if linktype == LINKTYPE_LOOP else np.where(family_be < 256, family_be, family_le)
            net = np.full(n, 4, dtype=np.int64)
            version = np.where(family == 2, 4, np.where(np.isin(family, (10, 24, 28, 30)), 6, 0))
        else:  # raw IP flavours
            net = np.zeros(n, dtype=np.int64)
            nibble = (mat[:, 0] >> 4).astype(np.int64)
            version = np.where(nibble == 4, 4, np.where(nibble == 6, 6, 0))
            if linktype == LINKTYPE_IPV4:
                version = np.where(version == 4, 4, 0)
            elif linktype == LINKTYPE_IPV6:
                version = np.where(version == 6, 6, 0)
        version = np.where(caplen > net, version, 0)
        # The IP version nibble must agree with what the link layer announced.
        return net, version

    def _endpoint_ids(self, arr: np.ndarray, net_start: np.ndarray, mat: np.ndarray, tmat: np.ndarray,
                      v4: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        n = mat.shape[0]
        src = np.empty(n, dtype=np.int32)
        dst = np.empty(n, dtype=np.int32)
        sport = _be(tmat, 0, 2).astype(np.uint64)
        dport = _be(tmat, 2, 2).astype(np.uint64)
        if v4.all():
            for addr_pos, port, out in ((12, sport, src), (16, dport, dst)):
                key = (_be(mat, addr_pos, 4).astype(np.uint64) << np.uint64(16)) | port
                out[:] = self._v4_ids(key)
            return src, dst
        if v4.any():
            rows = np.flatnonzero(v4)
            for addr_pos, port, out in ((12, sport, src), (16, dport, dst)):
                key = (_field(mat[rows], addr_pos, 4) << np.uint64(16)) | port[rows]
                uniq, inverse = np.unique(key, return_inverse=True)
                ids = np.array([self._endpoint_id(b"4" + int(k).to_bytes(6, "big")) for k in uniq],
                               dtype=np.int32)
                out[rows] = ids[inverse.ravel()]
        if (~v4).any():
            rows = np.flatnonzero(~v4)
            for addr_pos, port, out in ((8, sport, src), (24, dport, dst)):
                addr = _gather(arr, net_start[rows] + addr_pos, 16)
                key = np.concatenate([addr, port[rows].astype(">u2").view(np.uint8).reshape(-1, 2)], axis=1)
                keyv = np.ascontiguousarray(key).view(np.dtype((np.void, 18))).ravel()
                uniq, inverse = np.unique(keyv, return_inverse=True)
                ids = np.array([self._endpoint_id(b"6" + bytes(k)) for k in uniq], dtype=np.int32)
                out[rows] = ids[inverse.ravel()]
        return src, dst

    def _v4_ids(self, key: np.ndarray) -> np.ndarray:
        """Endpoint ids of IPv4 (address << 16 | port) keys: a lookup in the sorted keys seen so far, so
        a chunk with no new endpoint (nearly all of them) costs a binary search per packet, not a sort."""
        known, ids = self.v4_known
        if 0 < known.size <= 4:  # a few endpoints (a lab's flows): a compare per known key beats a search
            out = np.full(key.size, -1, dtype=np.int32)
            for known_key, known_id in zip(known.tolist(), ids.tolist(), strict=True):
                np.copyto(out, np.int32(known_id), where=key == known_key)
            if int(out.min(initial=0)) >= 0:
                return out
        if known.size:
            pos = np.minimum(np.searchsorted(known, key), known.size - 1)
            if bool((known[pos] == key).all()):
                return ids[pos]
        uniq = np.unique(key)
        new_ids = np.array([self._endpoint_id(b"4" + int(k).to_bytes(6, "big")) for k in uniq], dtype=np.int32)
        merged = np.union1d(known, uniq)
        merged_ids = np.empty(merged.size, dtype=np.int32)
        merged_ids[np.searchsorted(merged, known)] = ids
        merged_ids[np.searchsorted(merged, uniq)] = new_ids
        self.v4_known = (merged, merged_ids)
        return merged_ids[np.searchsorted(merged, key)]

    def _endpoint_id(self, key: bytes) -> int:
        found = self.endpoint_ids.get(key)
        if found is not None:
            return found
        import ipaddress

        if key[:1] == b"4":
            address = str(ipaddress.IPv4Address(key[1:5]))
            port = int.from_bytes(key[5:7], "big")
        else:
            address = str(ipaddress.IPv6Address(key[1:17]))
            port = int.from_bytes(key[17:19], "big")
        new_id = len(self.endpoints)
        self.endpoint_ids[key] = new_id
        self.endpoints.append((address, port))
        return new_id

    def pcap(self, handle: IO[bytes], magic: bytes, path: Path) -> None:
        _read_pcap(handle, magic, self, path)

    def pcapng(self, handle: IO[bytes], magic: bytes, path: Path) -> None:
        _read_pcapng(handle, magic, self, path)

    def finish(self, file_format: str) -> ReadResult:
        columns = {
            name: (np.concatenate(parts) if parts else np.zeros(0, dtype=COLUMN_DTYPES[name]))
            for name, parts in self.parts.items()
        }
        return ReadResult(columns, self.endpoints, self.syns, self.frames, self.skipped,
                          sorted(self.linktypes), self.snaplen, file_format, self.warnings)


def _timestamps(tmat: np.ndarray, tcp_off: np.ndarray, thl: np.ndarray,
                caplen: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """TCP timestamp option in the two layouts stacks use: NOP NOP TS (Linux, BSD) or TS first.

    tmat rows start at the TCP header, so the option sits at fixed columns.
    """
    n = tmat.shape[0]
    tsval = np.zeros(n, dtype=np.uint32)
    tsecr = np.zeros(n, dtype=np.uint32)
    has = np.zeros(n, dtype=bool)
    for lead in (2, 0):
        fits = (thl >= 20 + lead + 10) & (caplen >= tcp_off + 20 + lead + 10)
        match = ~has & fits & (tmat[:, 20 + lead] == 8) & (tmat[:, 21 + lead] == 10)
        if lead:
            match &= (tmat[:, 20] == 1) & (tmat[:, 21] == 1)
        if match.all():  # every packet in this layout (the usual case): no merge with the other one
            return (_be(tmat, 22 + lead, 4).astype(np.uint32), _be(tmat, 26 + lead, 4).astype(np.uint32),
                    match)
        if match.any():
            tsval = np.where(match, _be(tmat, 22 + lead, 4), tsval)
            tsecr = np.where(match, _be(tmat, 26 + lead, 4), tsecr)
            has |= match
    return tsval, tsecr, has


def read_capture(path: str | Path, first_frame: int = 1) -> ReadResult:
    """reader.read_capture with this twin decoding the records."""
    from diag.capture import reader

    return reader.read_capture(path, first_frame, decoder=_ColumnBuilder)

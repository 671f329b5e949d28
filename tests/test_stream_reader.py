"""stream_capture against read_capture: the chunks' columns concatenated are read_capture's columns, and
everything else of the ReadResult (SYNs, skip counts and their key order, warnings, frames, link types,
snaplen, format, endpoints) and every error text are the same.

Each capture is read with pcapfile.CHUNK_BYTES patched small (4 KiB and 64 KiB) so that it arrives in many
chunks, records and blocks carried across chunk ends. Without the C kernel these tests skip with the reason,
except under CI (CI set), where they fail, as tests/test_native_pcap.py does.
"""

from __future__ import annotations

import gzip
import os
import random
import shutil
import struct
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from capture_helpers import LINK_HEADERS, loopback_capture, synthetic_flow, write_pcap
from native_helpers import claim_caplen, need_kernels, pcapng_capture

from bench.fuzz_analyze import mutate, seed_corpus
from diag.capture import pcapfile, reader
from diag.capture.reader_native import MIN_ROW_FILE_BYTES
from diag.errors import DiagError

# computes in this process: may run beside an `alone` test (tests/conftest.py)
pytestmark = pytest.mark.in_process

# The largest record or block the test captures hold (a frame of synthetic_flow plus headers), with room.
LARGEST_RECORD = 2048


@pytest.fixture(autouse=True)
def _need_kernel() -> None:
    need_kernels("_cpcap")


@pytest.fixture(params=[4096, 65536], ids=["chunk-4KiB", "chunk-64KiB"])
def chunk_bytes(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setattr(pcapfile, "CHUNK_BYTES", request.param)
    return int(request.param)


@dataclass
class Streamed:
    """What the consume callback saw, copied out of the reused buffers."""

    columns: dict[str, list[np.ndarray]] = field(default_factory=lambda: {name: [] for name in pcapfile.COLUMN_DTYPES})
    syns: list[pcapfile.SynInfo] = field(default_factory=list)
    first_rows: list[int] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    buffers: set[int] = field(default_factory=set)  # address of each chunk's ts_ns buffer
    buffer_rows: int = 0  # the most rows a chunk column buffer had room for
    endpoints_seen: list[list[tuple[str, int]]] = field(default_factory=list)

    def consume(self, chunk: pcapfile.CaptureChunk) -> None:
        assert chunk.rows > 0
        for name, dtype in pcapfile.COLUMN_DTYPES.items():
            column = chunk.columns[name]
            assert column.dtype == np.dtype(dtype) and column.ndim == 1 and column.size == chunk.rows
            self.columns[name].append(column.copy())
        # Every id in the chunk indexes the endpoints known so far.
        assert int(max(chunk.columns["src"].max(), chunk.columns["dst"].max())) < len(chunk.endpoints)
        self.syns += chunk.syns
        assert [s.frame for s in chunk.syns] == [
            int(f) for f in chunk.columns["frame"][chunk.columns["flags"] & pcapfile.SYN != 0]]
        self.first_rows.append(chunk.first_row)
        self.sizes.append(chunk.rows)
        base = chunk.columns["ts_ns"].base
        assert base is not None  # a view of the reader's buffer, not a copy per chunk
        self.buffers.add(base.__array_interface__["data"][0])
        self.buffer_rows = max(self.buffer_rows, base.size)
        self.endpoints_seen.append(list(chunk.endpoints))

    def concatenated(self, name: str) -> np.ndarray:
        parts = self.columns[name]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=pcapfile.COLUMN_DTYPES[name])


def stream_and_compare(path: Path, first_frame: int = 1) -> tuple[pcapfile.ReadResult | str, Streamed]:
    """Read path both ways (the kernel's read_capture and stream_capture) and hold them to each other; returns
    read_capture's result (or its DiagError text) and what the stream's consumer saw."""
    try:
        full: pcapfile.ReadResult | str = reader.read_capture(path, first_frame=first_frame)
    except DiagError as exc:
        full = str(exc)
    seen = Streamed()
    try:
        streamed: pcapfile.ReadResult | str = reader.stream_capture(path, seen.consume, first_frame=first_frame)
    except DiagError as exc:
        streamed = str(exc)
    if isinstance(full, str) or isinstance(streamed, str):
        assert full == streamed, (full, streamed)
        return full, seen
    for name, dtype in pcapfile.COLUMN_DTYPES.items():
        assert streamed.columns[name].dtype == np.dtype(dtype) and streamed.columns[name].size == 0
        assert np.array_equal(seen.concatenated(name), full.columns[name]), name
    assert seen.syns == full.syns and streamed.syns == []  # each chunk's own SYNs: none kept for the result
    assert list(streamed.skipped.items()) == list(full.skipped.items())  # key order too: it reaches the JSON
    for name in ("endpoints", "frames", "linktypes", "snaplen", "file_format", "warnings"):
        assert getattr(streamed, name) == getattr(full, name), name
    # Chunks follow each other without a gap; each is at most what one chunk of the file can hold.
    assert seen.first_rows == [sum(seen.sizes[:i]) for i in range(len(seen.sizes))]
    most = (pcapfile.CHUNK_BYTES + LARGEST_RECORD) // MIN_ROW_FILE_BYTES + 1
    assert max(seen.sizes, default=0) <= most, (seen.sizes, most)
    # The column buffers are sized for one chunk (and the record carried into it), whatever the file's size.
    assert seen.buffer_rows <= (pcapfile.CHUNK_BYTES + pcapfile.MAX_RECORD_BYTES + 16) // MIN_ROW_FILE_BYTES + 1
    # The endpoint list only grows: what a chunk saw is a prefix of the final list.
    for known in seen.endpoints_seen:
        assert streamed.endpoints[:len(known)] == known
    return full, seen


def many_flows(count: int, ipv6_every: int = 3) -> list[tuple[float, bytes]]:
    """count copies of synthetic_flow, each on its own client port (so endpoints keep appearing across
    chunks), every ipv6_every-th over IPv6; (time, IP packet)."""
    flows = {v6: synthetic_flow(v6) for v6 in (False, True)}
    out = []
    for k in range(count):
        v6 = k % ipv6_every == ipv6_every - 1
        tcp_at = 40 if v6 else 20
        port = struct.pack(">H", 20000 + k)
        for t, ip in flows[v6]:
            packet = bytearray(ip)
            sport = struct.unpack_from(">H", packet, tcp_at)[0]
            if sport == 40000:  # the client's side: its source port
                packet[tcp_at:tcp_at + 2] = port
            else:
                packet[tcp_at + 2:tcp_at + 4] = port
            out.append((t + k * 0.01, bytes(packet)))
    return out


def ethernet(frames: list[tuple[float, bytes]]) -> list[tuple[float, bytes]]:
    return [(t, LINK_HEADERS[1](ip, ip[0] >> 4 == 6)) for t, ip in frames]


# --- pcap ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("nanosecond,big_endian", [(False, False), (True, False), (False, True), (True, True)])
def test_pcap_byte_orders_and_units(tmp_path: Path, chunk_bytes: int, nanosecond: bool, big_endian: bool) -> None:
    frames = ethernet(many_flows(120))
    pcap = write_pcap(tmp_path / "f.pcap", frames, 1, nanosecond=nanosecond, big_endian=big_endian)
    full, seen = stream_and_compare(pcap)
    assert not isinstance(full, str)
    assert full.packets == len(frames) and len(full.syns) == 240 and len(full.endpoints) == 122
    assert len(seen.sizes) > 10 and len(seen.buffers) == 1  # many chunks, one reused buffer


@pytest.mark.parametrize("snaplen", [60, 74, 65535])
def test_pcap_snaplen_and_skips(tmp_path: Path, chunk_bytes: int, snaplen: int) -> None:
    """Packets cut by the snaplen (skipped as truncated headers, or kept without the timestamp option), and
    packets that are not TCP, in among the rows."""
    frames = ethernet(many_flows(60))
    odd = [b"\x02" * 12 + b"\x08\x06" + bytes(28), LINK_HEADERS[1](bytes(frames[5][1][14:34]), False)]
    frames = [(t, odd[i % 2] if i % 17 == 3 else frame) for i, (t, frame) in enumerate(frames)]
    pcap = write_pcap(tmp_path / "s.pcap", frames, 1, snaplen=snaplen)
    full, _seen = stream_and_compare(pcap)
    assert not isinstance(full, str) and full.skipped


def test_truncated_last_record(tmp_path: Path, chunk_bytes: int) -> None:
    good = write_pcap(tmp_path / "g.pcap", ethernet(many_flows(40)), 1).read_bytes()
    path = tmp_path / "cut.pcap"
    warned = 0
    for cut in (1, 15, 16, 17, 60, 100, 1000, len(good) // 2 + 3):
        path.write_bytes(good[:len(good) - cut])
        full, _seen = stream_and_compare(path)
        assert not isinstance(full, str)
        warned += any("cut short" in warning for warning in full.warnings)
    assert warned >= 7


def test_corrupt_record_gives_the_same_error(tmp_path: Path, chunk_bytes: int) -> None:
    frames = ethernet(many_flows(40))
    good = write_pcap(tmp_path / "g.pcap", frames, 1).read_bytes()
    path = tmp_path / "bad.pcap"
    for record, claim in ((0, 50_000_000), (len(frames) // 2, 65535 + 129), (len(frames) - 1, (1 << 20) + 1)):
        path.write_bytes(claim_caplen(good, record, claim))
        full, seen = stream_and_compare(path)
        assert isinstance(full, str) and f"record {record + 1} claims {claim} bytes" in full, full
        # Rows handed on before the error are rows of the records before the corrupt one.
        assert sum(seen.sizes) <= record
    for head in (b"", b"\xd4\xc3\xb2\xa1\x02\x00", b"nonsense!", good[:24]):
        path.write_bytes(head)
        stream_and_compare(path)


def test_first_frame(tmp_path: Path, chunk_bytes: int) -> None:
    pcap = write_pcap(tmp_path / "f.pcap", ethernet(many_flows(30)), 1)
    full, _seen = stream_and_compare(pcap, first_frame=5000)
    assert not isinstance(full, str) and int(full.columns["frame"][0]) == 5000


# --- pcapng, gzip, pipes -----------------------------------------------------------------------------------------


def test_pcapng_interfaces_and_link_types(tmp_path: Path, chunk_bytes: int) -> None:
    """Two sections of opposite byte order, interfaces of four link types (one unsupported) and time
    resolutions, simple and custom blocks, all interleaved: the kernel decodes each chunk's packets one link
    type at a time, so chunks differ from file order; their concatenation must still be read_capture's."""
    links = [(1, LINK_HEADERS[1]), (113, LINK_HEADERS[113]), (101, LINK_HEADERS[101]), (147, LINK_HEADERS[1])]
    sections = []
    for endian, resolution in (("<", 6), (">", 0x80 | 20)):
        packets = []
        for i, (_t, ip) in enumerate(many_flows(40)):
            iface = i % len(links)
            packets.append((iface, 1_000_000 + 1000 * i, links[iface][1](ip, ip[0] >> 4 == 6), i % 29 == 4))
            if i % 50 == 7:
                packets.append((-1, 0, b"custom block", False))
        sections.append((endian, [(linktype, resolution) for linktype, _ in links], packets))
    path = tmp_path / "f.pcapng"
    path.write_bytes(pcapng_capture(sections))
    full, seen = stream_and_compare(path)
    assert not isinstance(full, str)
    assert full.linktypes == [1, 101, 113] and full.skipped.get("unsupported_linktype_147", 0) > 0
    assert len(seen.sizes) > 10


def test_pcapng_corrupt_block(tmp_path: Path, chunk_bytes: int) -> None:
    packets = [(0, 1000 + i, LINK_HEADERS[1](ip, ip[0] >> 4 == 6), False) for i, (_t, ip) in enumerate(many_flows(30))]
    good = pcapng_capture([("<", [(1, -1)], packets)])
    at = 0
    while at < len(good) * 2 // 3:  # to the first block past two thirds of the file (an enhanced packet block)
        at += struct.unpack_from("<I", good, at + 4)[0]
    for value, expect in ((7, "bad length"), (0xFFFF, "bad length")):
        bad = bytearray(good)
        struct.pack_into("<I", bad, at + 4, value)
        path = tmp_path / "bad.pcapng"
        path.write_bytes(bytes(bad))
        full, _seen = stream_and_compare(path)
        assert isinstance(full, str) and expect in full, full


def test_gzip(tmp_path: Path, chunk_bytes: int) -> None:
    frames = ethernet(many_flows(60))
    pcap = write_pcap(tmp_path / "f.pcap", frames, 1, nanosecond=True)
    gz = tmp_path / "f.pcap.gz"
    gz.write_bytes(gzip.compress(pcap.read_bytes()))
    full, _seen = stream_and_compare(gz)
    assert not isinstance(full, str) and full.file_format == "pcap.gz" and full.packets == len(frames)
    ng = tmp_path / "f.pcapng.gz"
    ng.write_bytes(gzip.compress(pcapng_capture([("<", [(1, 9)], [(0, 10**9 * i, f, False)
                                                                  for i, (_t, f) in enumerate(frames)])])))
    full, _seen = stream_and_compare(ng)
    assert not isinstance(full, str) and full.file_format == "pcapng.gz" and full.packets == len(frames)
    damaged = tmp_path / "d.pcap.gz"
    data = gz.read_bytes()
    damaged.write_bytes(data[:len(data) // 2] + bytes(64) + data[len(data) // 2 + 64:])
    full, _seen = stream_and_compare(damaged)
    assert isinstance(full, str), full  # the same error (the damaged deflate data, or what it decodes to)


def test_a_pipe(tmp_path: Path, chunk_bytes: int) -> None:
    frames = ethernet(many_flows(60))
    data = write_pcap(tmp_path / "f.pcap", frames, 1).read_bytes()
    full = reader.read_capture(tmp_path / "f.pcap")
    seen = Streamed()
    readable, writable = os.pipe()
    writer = threading.Thread(target=lambda: (os.write(writable, data), os.close(writable)))
    writer.start()
    try:
        streamed = reader.stream_capture(f"/dev/fd/{readable}", seen.consume)
    finally:
        writer.join()
        os.close(readable)
    assert np.array_equal(seen.concatenated("seq"), full.columns["seq"])
    assert np.array_equal(seen.concatenated("src"), full.columns["src"])
    assert seen.syns == full.syns and streamed.endpoints == full.endpoints and streamed.frames == full.frames


def test_fuzz_seed_corpus_and_mutations(tmp_path: Path, chunk_bytes: int) -> None:
    """Every link type, pcapng with several sections and interfaces, gzip; then the fuzzer's mutations
    (lengths, timestamps, splices, cuts, damaged gzip): the same result or the same error."""
    seeds = seed_corpus()
    for seed in seeds:
        path = tmp_path / seed.name
        path.write_bytes(seed.data)
        full, _seen = stream_and_compare(path)
        assert not isinstance(full, str) and full.packets >= 20, seed.name
    path = tmp_path / "m.pcap"
    errors = 0
    for case in range(150):
        data, _names = mutate(random.Random(f"stream:{case}"), seeds)
        path.write_bytes(data)
        errors += isinstance(stream_and_compare(path)[0], str)
    assert 0 < errors < 150


def test_real_tcpdump_capture(tmp_path: Path, chunk_bytes: int) -> None:
    """tcpdump on loopback (IPv4 and IPv6 transfers), as pcap, gzip and pcapng (editcap, if installed)."""
    pcap = tmp_path / "lo.pcap"
    # Loopback segments are up to 64 KiB (cut to 96 bytes): megabytes make a file of several small chunks.
    info = loopback_capture(pcap, 96, ("127.0.0.1", 4_000_000, 200_000), ("::1", 3_000_000, 0))
    gz = tmp_path / "lo.pcap.gz"
    gz.write_bytes(gzip.compress(pcap.read_bytes()))
    paths = [pcap, gz]
    if shutil.which("editcap"):
        subprocess.run(["editcap", "-F", "pcapng", str(pcap), str(tmp_path / "lo.pcapng")], check=True,
                       capture_output=True)
        paths.append(tmp_path / "lo.pcapng")
    for path in paths:
        full, seen = stream_and_compare(path)
        assert not isinstance(full, str) and full.packets == info.packets and len(full.syns) == 4
        assert len(seen.sizes) > 1 or chunk_bytes > 4096


# --- the API around it -----------------------------------------------------------------------------------------


def test_needs_the_kernel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from diag.capture import native

    pcap = write_pcap(tmp_path / "f.pcap", ethernet(many_flows(2)), 1)
    monkeypatch.setattr(native, "kernel", lambda name: None)
    with pytest.raises(DiagError, match="_cpcap is not built"):
        reader.stream_capture(pcap, lambda chunk: None)


def test_what_consume_raises_is_raised_as_it_is(tmp_path: Path, chunk_bytes: int) -> None:
    """An OSError of the consumer is not the file's read error (which the reader turns into a DiagError)."""
    pcap = write_pcap(tmp_path / "f.pcap", ethernet(many_flows(40)), 1)
    calls = []

    def consume(chunk: pcapfile.CaptureChunk) -> None:
        calls.append(chunk.first_row)
        if len(calls) == 3:
            raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space left") as caught:
        reader.stream_capture(pcap, consume)
    assert not isinstance(caught.value, DiagError) and len(calls) == 3

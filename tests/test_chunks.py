"""The analysis of a capture read in file chunks against the same analysis of it as one chunk in memory
(diag/capture/source.py: FileChunks vs OneChunk): the same JSON, byte for byte, on captures built here
(several connections interleaved, both directions, turns, control frames, bursty senders, handshakes with
window scaling and timestamps, IPv6, record phases, odd --bin/--idle-gap, --no-series, timestamps stepping
back) and on real loopback traffic; files whose chunks cannot be analyzed exactly fall back to one chunk with
one line on stderr.

Every chunked run reads the file in 4 KiB chunks, so each pass crosses hundreds of chunk boundaries, and keeps
16 segment ends a direction in memory (the rest go to the TCP state's temporary file); a case that is meant
to be read in chunks asserts that it was (no Fallback), so a Fallback cannot hide a difference. Without the C
kernels these tests skip with the reason, except under CI (CI set).
"""

from __future__ import annotations

import contextlib
import gzip
import itertools
import json
import os
import random
import socket
import struct
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from capture_helpers import LINK_HEADERS, need_tools, synthetic_flow, write_pcap
from native_helpers import need_kernels
from test_turns import MSS, Flow, _bursty, _gloo_like_turn

from diag.capture import analysis, native, pcapfile, reader, source, turns
from diag.capture.document import DEFAULT_BIN_S, IDLE_GAP_S, MAX_BINS
from diag.capture.turns import CONTROL_MAX_BYTES
from diag.errors import DiagError
from diag.records import Record, RecordWriter
from tests.common import need_root, run_diag

# computes in this process: may run beside an `alone` test (tests/conftest.py)
pytestmark = pytest.mark.in_process

CHUNK = 4096
SPILL = 16  # segment ends a direction keeps in memory
T0_NS = 1_700_000_000 * 10**9


@pytest.fixture(autouse=True)
def _need_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    need_kernels(*native.KERNELS)


# --- captures built byte by byte (scapy is too slow for the large ones) ----------------------------------------


def _options(mss: int | None = None, wscale: int | None = None, ts: tuple[int, int] | None = None) -> bytes:
    out = b""
    if mss is not None:
        out += struct.pack("!BBH", 2, 4, mss)
    if wscale is not None:
        out += struct.pack("!BBBB", 1, 3, 3, wscale)  # NOP + window scale
    if ts is not None:
        out += struct.pack("!BBBBII", 1, 1, 8, 10, ts[0], ts[1])
    return out


def tcp_packet(src: str, dst: str, sport: int, dport: int, flags: int, seq: int, ack: int, win: int, payload: int,
               options: bytes = b"") -> bytes:
    """An IPv4 or IPv6 packet (raw IP, link type 101) carrying one TCP segment; checksums are not checked."""
    import ipaddress

    tcp = struct.pack("!HHIIBBHHH", sport, dport, seq % (1 << 32), ack % (1 << 32), (5 + len(options) // 4) << 4,
                      flags, win, 0, 0) + options + b"p" * payload
    if ":" in src:
        return (struct.pack("!IHBB", 6 << 28, len(tcp), 6, 64) + ipaddress.IPv6Address(src).packed
                + ipaddress.IPv6Address(dst).packed + tcp)
    return (struct.pack("!BBHHHBBH", 0x45, 0, 20 + len(tcp), 0, 0x4000, 64, 6, 0) + ipaddress.IPv4Address(src).packed
            + ipaddress.IPv4Address(dst).packed + tcp)


FIN, SYN, RST, PSH, ACK = 0x01, 0x02, 0x04, 0x08, 0x10


@dataclass
class Conn:
    """One TCP connection: side "A" (the client, a) and side "B"; packets are (time ns, order, IP bytes).

    Each side carries TCP timestamps (so both RTT kinds have samples) and a window that breathes."""

    a: str
    b: str
    sport: int
    dport: int
    packets: list[tuple[int, int, bytes]]
    seq: dict[str, int] = field(default_factory=lambda: {"A": 7_000, "B": 4_294_000_000})  # B's wraps
    acked: dict[str, int] = field(default_factory=dict)
    tsval: dict[str, int] = field(default_factory=lambda: {"A": 1000, "B": 90_000})
    heard: dict[str, int] = field(default_factory=lambda: {"A": 0, "B": 0})
    timestamps: bool = True

    def _send(self, t_ns: int, side: str, flags: int, seq: int, ack: int, payload: int, win: int,
              options: bytes | None = None) -> None:
        src, dst, sport, dport = ((self.a, self.b, self.sport, self.dport) if side == "A"
                                  else (self.b, self.a, self.dport, self.sport))
        peer = "B" if side == "A" else "A"
        if options is None and self.timestamps:
            self.tsval[side] += 1
            options = _options(ts=(self.tsval[side], self.heard[side]))
            self.heard[peer] = self.tsval[side]
        self.packets.append((t_ns, len(self.packets), tcp_packet(src, dst, sport, dport, flags, seq, ack, win,
                                                                 payload, options or b"")))

    def handshake(self, t_ns: int, rtt_ns: int = 40_000, mss: int = MSS, wscale: int | None = 7) -> None:
        seq_a, seq_b = self.seq["A"], self.seq["B"]
        ts = (self.tsval["A"], 0) if self.timestamps else None
        self._send(t_ns, "A", SYN, seq_a, 0, 0, 64240, _options(mss, wscale, ts))
        ts = (self.tsval["B"], self.tsval["A"]) if self.timestamps else None
        self.heard["A"] = self.tsval["B"]
        self.heard["B"] = self.tsval["A"]
        self._send(t_ns + rtt_ns // 2, "B", SYN | ACK, seq_b, seq_a + 1, 0, 65160, _options(mss, wscale, ts))
        self.seq = {"A": seq_a + 1, "B": seq_b + 1}
        self.acked = {"A": seq_b + 1, "B": seq_a + 1}
        self._send(t_ns + rtt_ns, "A", ACK, self.seq["A"], self.acked["A"], 0, 502)

    def data(self, t_ns: int, side: str, payload: int, ack_after_ns: int | None = 20_000, win: int = 509,
             resend: bool = False) -> None:
        """A segment (resend: the previous one again, a retransmission) and, ack_after_ns later, the peer's ACK."""
        if not self.acked:
            self.acked = {"A": self.seq["B"], "B": self.seq["A"]}
        peer = "B" if side == "A" else "A"
        seq = self.seq[side] - payload if resend else self.seq[side]
        self._send(t_ns, side, PSH | ACK, seq, self.acked[side], payload, win)
        if not resend:
            self.seq[side] += payload
        if ack_after_ns is not None:
            self.acked[peer] = self.seq[side]
            self._send(t_ns + ack_after_ns, peer, ACK, self.seq[peer], self.acked[peer], 0, win)

    def close(self, t_ns: int) -> None:
        self._send(t_ns, "A", FIN | ACK, self.seq["A"], self.acked.get("A", 0), 0, 502)
        self._send(t_ns + 20_000, "B", FIN | ACK, self.seq["B"], self.seq["A"] + 1, 0, 509)
        self._send(t_ns + 40_000, "A", ACK, self.seq["A"] + 1, self.seq["B"] + 1, 0, 502)


class Capture:
    """Several connections' packets merged in time order, written as a nanosecond pcap."""

    def __init__(self) -> None:
        self.conns: list[Conn] = []
        self.extra: list[tuple[int, int, bytes]] = []

    def conn(self, a: str, b: str, sport: int, dport: int, timestamps: bool = True) -> Conn:
        conn = Conn(a, b, sport, dport, [], timestamps=timestamps)
        self.conns.append(conn)
        return conn

    def frames(self) -> list[tuple[int, bytes]]:
        merged = [(t, k, i, data) for k, conn in enumerate(self.conns) for t, i, data in conn.packets]
        merged += [(t, len(self.conns), i, data) for t, i, data in self.extra]
        merged.sort(key=lambda p: (p[0], p[1], p[2]))
        return [(t, data) for t, _k, _i, data in merged]


def write_ns_pcap(path: Path, frames: Sequence[tuple[int, bytes]], snaplen: int = 65535, linktype: int = 101) -> Path:
    with path.open("wb") as f:
        f.write(struct.pack("<IHHiIII", 0xA1B23C4D, 2, 4, 0, 0, snaplen, linktype))
        for t_ns, data in frames:
            caplen = min(len(data), snaplen)
            f.write(struct.pack("<IIII", t_ns // 10**9, t_ns % 10**9, caplen, len(data)) + data[:caplen])
    return path


def swap_neighbour_times(frames: list[tuple[int, bytes]], rows: Sequence[int]) -> list[tuple[int, bytes]]:
    """Rows i and i+1 keep their file order but trade timestamps: the capture steps back there (tcpdump on
    several CPUs does so by microseconds)."""
    out = list(frames)
    for i in rows:
        (t0, d0), (t1, d1) = out[i], out[i + 1]
        out[i], out[i + 1] = (t1, d0), (t0, d1)
    return out


# --- scenarios ---------------------------------------------------------------------------------------------


def turns_conn(capture: Capture, a: str, b: str, sport: int, start_ns: int, rounds: int, segments: int,
               spacing_ns: int, rng: random.Random, gloo: bool = True) -> int:
    """gloo-like turns on one connection: 48-byte notices from B, A's burst, B's burst starting inside A's
    (a handoff), both bursts interleaved with small control frames, a retransmission now and then."""
    conn = capture.conn(a, b, sport, 5000 + sport % 7)
    conn.handshake(start_ns)
    t = start_ns + 200_000
    for _round in range(rounds):
        if gloo:
            for k in range(4):
                conn.data(t + k * 10_000, "B", 48, ack_after_ns=None)
        t += 300_000
        for i in range(segments):
            conn.data(t + i * spacing_ns, "A", MSS, win=400 + (i * 37) % 200)
            if i % 40 == 17:  # a control frame in the bulk; every other one exactly the largest control size
                size = CONTROL_MAX_BYTES if i % 80 == 17 else 48
                conn.data(t + i * spacing_ns + 3_000, "A", size, ack_after_ns=None)
            if i % 97 == 50:
                conn.data(t + i * spacing_ns + 5_000, "A", MSS, resend=True)         # a retransmission
        follower = t + (segments // 2) * spacing_ns + 50_000 + rng.randrange(0, 30_000)
        for i in range(segments):
            conn.data(follower + i * spacing_ns, "B", MSS if i % 50 else 700)
        t = follower + segments * spacing_ns + 2_000_000 + rng.randrange(0, 3_000_000)
    conn.close(t)
    return t + 100_000


def bursty_conn(capture: Capture, a: str, b: str, sport: int, start_ns: int, bursts: int) -> int:
    """tbf-like both ways at once: 8 frames at wire speed every 3 ms (gaps above the 2 ms idle gap), so the
    run gap adapts to the cadence."""
    conn = capture.conn(a, b, sport, 6000, timestamps=False)
    conn.handshake(start_ns, wscale=None)
    x = _bursty(0, 3000, bursts)
    y = _bursty(1300, 3000, bursts)
    events = sorted([(t, "A") for t in x] + [(t, "B") for t in y])
    for t_us, side in events:
        conn.data(start_ns + 500_000 + t_us * 1000, side, MSS, ack_after_ns=40_000)
    end = start_ns + 500_000 + max(x[-1], y[-1]) * 1000 + 200_000
    conn.close(end)
    return end + 100_000


def multi_capture(rounds: int = 3, segments: int = 120, seed: int = 5) -> Capture:
    """Four connections at once, interleaved: two IPv4 gloo-like (sharing host 10.1.0.1, so hosts overlap
    across connections), one IPv6 ping-pong without SYNs, one bursty two-way; plus a UDP datagram (no TCP)."""
    rng = random.Random(seed)
    capture = Capture()
    turns_conn(capture, "10.1.0.1", "10.1.0.2", 41000, T0_NS, rounds, segments, 90_000, rng)
    turns_conn(capture, "10.1.0.3", "10.1.0.1", 41001, T0_NS + 1_234_567, rounds, segments, 70_000, rng)
    pp = capture.conn("fd00::1", "fd00::2", 42000, 7000)
    t = T0_NS + 700_000
    for block in range(4 * rounds):
        side = "A" if block % 2 == 0 else "B"
        for i in range(segments // 2):
            pp.data(t + i * 60_000, side, MSS)
        # every third turn at the very instant the other side's run ends (a closed interval: inside it)
        t += (segments // 2 - 1) * 60_000 + (0 if block % 3 == 0 else 150_000)
    bursty_conn(capture, "10.2.0.1", "10.2.0.2", 43000, T0_NS + 300_000, bursts=20 * rounds)
    udp = struct.pack("!BBHHHBBH", 0x45, 0, 36, 0, 0, 64, 17, 0) + bytes([10, 3, 0, 1, 10, 3, 0, 2]) + b"\0" * 16
    capture.extra.append((T0_NS + 5_000_000, 0, udp))
    return capture


def _record(windows: list[list[int]], op: str = "all_gather", with_iterations: bool = True) -> Record:
    return Record(backend="gloo", algo="default", op=op, world_size=2, size_bytes=1 << 20, total_bytes=2 << 20,
                  volume_bytes=1 << 20, dtype="float32", count=1 << 18, iters=len(windows), warmup=1,
                  times_s=[0.001] * len(windows), time_s=0.001, min_s=0.001, max_s=0.001, mean_s=0.001,
                  p95_s=0.001, stdev_s=0.0, algbw_Bps=1.0, busbw_Bps=1.0, nwrong=0, t_start_ns=windows[0][0],
                  t_end_ns=windows[-1][1], iter_windows_ns=windows if with_iterations else [], run_id="r1")


def write_records(path: Path, frames: Sequence[tuple[int, bytes]]) -> Path:
    """Phases that cut the capture in many ways: iterations that split connections mid-burst, overlapping
    records, a record without iteration windows, one that starts before the capture, one with no packet."""
    times = sorted(t for t, _ in frames)
    first, last = times[0], times[-1]
    span = last - first
    cuts = [first + span * k // 7 for k in range(8)]
    with RecordWriter(path) as writer:
        writer.start("r1", env={}, spec={})
        writer.record(_record([[cuts[k], cuts[k + 1] - 1] for k in range(7)]))
        writer.record(_record([[first + span // 3, first + span // 2]], op="broadcast"))
        writer.record(_record([[first - 10**9, first + span // 10]], op="reduce", with_iterations=False))
        writer.record(_record([[last + 10**9, last + 2 * 10**9]], op="barrier"))
        middle = times[len(times) // 2]
        writer.record(_record([[middle, middle]], op="one_instant"))
        writer.end("r1", "ok")
    return path


# --- the comparison ------------------------------------------------------------------------------------------


def first_difference(a: Any, b: Any, path: str = "") -> str | None:
    """The JSON path where a and b first differ (values compared as their JSON text), else None."""
    if isinstance(a, dict) and isinstance(b, dict):
        if list(a) != list(b):
            return f"{path or '/'} (keys {list(a)} vs {list(b)})"
        return next((f for key in a if (f := first_difference(a[key], b[key], f"{path}/{key}"))), None)
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return f"{path} (length {len(a)} vs {len(b)})"
        return next((f for i, (x, y) in enumerate(zip(a, b, strict=True))
                     if (f := first_difference(x, y, f"{path}[{i}]"))), None)
    return None if json.dumps(a) == json.dumps(b) else f"{path} ({json.dumps(a)[:80]} vs {json.dumps(b)[:80]})"


@dataclass
class Streamed:
    result: dict[str, Any]
    chunks: int  # chunks of Pass.COUNTS


def streamed(path: Path, records: Sequence[Path] | None, bin_s: float, idle_gap_s: float, with_series: bool,
             monkeypatch: pytest.MonkeyPatch, chunk_bytes: int = CHUNK, kept: bool = False) -> Streamed:
    """The analysis of FileChunks in chunks of chunk_bytes, each pass reading the file (kept: the first pass
    keeps the chunks and the others replay them; a Fallback propagates), counting the first pass's chunks."""
    counts: list[int] = []
    real = source.stream_capture

    def counting(p: Any, consume: Any, *args: Any, **kwargs: Any) -> pcapfile.ReadResult:
        counts.append(0)

        def count(chunk: pcapfile.CaptureChunk) -> None:
            counts[-1] += 1
            consume(chunk)

        return real(p, count, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(pcapfile, "CHUNK_BYTES", chunk_bytes)
        if not kept:
            patch.setattr(source, "CACHE_BYTES", 0)  # every pass reads the file again, as a big file's passes do
        patch.setattr(source, "stream_capture", counting)
        result = analysis.Analysis(source.FileChunks(path), records, bin_s, idle_gap_s, with_series,
                                   SPILL).run().to_json()
    return Streamed(result, counts[0] if counts else 0)


def in_memory(path: Path, records: Sequence[Path] | None, bin_s: float, idle_gap_s: float, with_series: bool,
              monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    del monkeypatch
    return analysis.Analysis(source.OneChunk([path]), records, bin_s, idle_gap_s, with_series).run().to_json()


def assert_same(path: Path, monkeypatch: pytest.MonkeyPatch, records: Sequence[Path] | None = None,
                bin_s: float = DEFAULT_BIN_S, idle_gap_s: float = IDLE_GAP_S, with_series: bool = True,
                min_chunks: int | None = None, chunk_sizes: Sequence[int] = (CHUNK,)) -> dict[str, Any]:
    """The chunked JSON (no Fallback allowed; the chunks read every pass, and kept in memory and replayed) is
    the one-chunk JSON's text, and analyze_files (chunks of the default size) gives it too. min_chunks: the first pass read at least this many chunks of the first size
    (default: the file's size over twice the chunk size)."""
    expected = in_memory(path, records, bin_s, idle_gap_s, with_series, monkeypatch)
    for chunk_bytes, kept in [(chunk_sizes[0], True), *((size, False) for size in chunk_sizes)]:
        got = streamed(path, records, bin_s, idle_gap_s, with_series, monkeypatch, chunk_bytes, kept)
        if json.dumps(got.result) != json.dumps(expected):    # where they differ (the walk is the slow part)
            how = "kept" if kept else "read every pass"
            pytest.fail(f"{path} in {chunk_bytes}-byte chunks ({how}): differs from one chunk at "
                        f"{first_difference(expected, got.result)}")
        least = path.stat().st_size // (2 * chunk_bytes) if min_chunks is None else min_chunks
        if chunk_bytes == chunk_sizes[0]:
            assert got.chunks >= least, f"{path}: only {got.chunks} chunks of {chunk_bytes} bytes"
    assert json.dumps(analysis.analyze_files([path], records, bin_s, idle_gap_s, with_series)) == json.dumps(expected)
    return expected


# --- 1. chunks and one chunk agree ----------------------------------------------------------------------------------


def test_multi_connection_with_phases(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Four connections interleaved (IPv4, IPv6, turns, ping-pong, bursty, control frames, a retransmission,
    window scaling and timestamps), cut into record phases: read in 4 KiB chunks (~3 packets each)."""
    frames = multi_capture().frames()
    pcap = write_ns_pcap(tmp_path / "multi.pcap", frames, snaplen=200)
    records = write_records(tmp_path / "run.jsonl", frames)
    out = assert_same(pcap, monkeypatch, [records], min_chunks=100)
    # the capture is what it means to be: every feature the streamed passes aggregate is present
    assert len(out["connections"]) == 4 and len(out["phases"]) == 11
    assert {c["a"].startswith("[") for c in out["connections"]} == {True, False}
    assert any(c["turns"]["handoff_count"] > 0 for c in out["connections"])
    assert any(c["turns"]["control_frames"]["b->a"]["count"] > 0 for c in out["connections"])
    assert any(d["retransmissions"] > 0 for c in out["connections"] for d in c["directions"].values())
    assert any(d["rtt_ms"]["n"] and d["ts_rtt_ms"]["n"] for c in out["connections"] for d in c["directions"].values())
    assert any(c["run_gap_s"]["a->b"] > IDLE_GAP_S for c in out["connections"])  # the bursty one adapts
    assert any(c["directions"]["a->b"]["window"]["scale"] == 7 for c in out["connections"])
    assert [ph["packets"] for ph in out["phases"] if ph["phase"]["op"] == "barrier"] == [0]
    assert out["files"][0]["skipped"]  # the UDP datagram


@pytest.mark.parametrize(("bin_s", "idle_gap_s", "with_series"),
                         [(0.0037, 0.0005, True), (0.25, 0.05, False), (2e-6, 0.002, True)],
                         ids=["odd-bin-short-idle", "no-series-long-idle-gzip", "tiny-bin-max-bins"])
def test_parameters(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bin_s: float, idle_gap_s: float,
                    with_series: bool) -> None:
    frames = multi_capture(rounds=1, segments=60, seed=11).frames()
    pcap = write_ns_pcap(tmp_path / "p.pcap", frames, snaplen=96)
    if not with_series:  # and gzip-compressed: the chunks are of the uncompressed stream
        packed = tmp_path / "p.pcap.gz"
        packed.write_bytes(gzip.compress(pcap.read_bytes()))
        pcap = packed
    # 20,000 bins a direction and phase would make the JSON huge: the tiny bin without phases
    records = None if bin_s == 2e-6 else [write_records(tmp_path / "run.jsonl", frames)]
    out = assert_same(pcap, monkeypatch, records, bin_s, idle_gap_s, with_series)
    series = [d.get("throughput") for c in out["connections"] for d in c["directions"].values()]
    assert all(s is not None for s in series) if with_series else all(s is None for s in series)
    if bin_s == 2e-6:
        assert max(len(s["Bps"]) for s in series) == MAX_BINS  # re-binned coarser


@pytest.mark.parametrize("builder", ["gloo", "ping-pong", "both-ways", "ring", "slow-reaction"])
def test_turn_scenarios(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, builder: str) -> None:
    """test_turns.py's flows (microsecond pcap, no SYNs), each with a phase over its middle."""
    flow = _gloo_like_turn() if builder == "gloo" else Flow()
    if builder == "ping-pong":
        t = 1000
        for block in range(6):
            for i in range(50):
                flow.data(t + i * 100, "A" if block % 2 == 0 else "B", MSS)
            t += 49 * 100 + 100
    elif builder == "both-ways":
        for i in range(200):
            flow.data(1000 + i * 100, "A", MSS)
            flow.data(1030 + i * 100, "B", MSS)
    elif builder == "ring":
        for i in range(400):
            flow.data(1000 + i * 100, "A", MSS)
            if i % 50 == 49:
                flow.data(1000 + i * 100 + 60, "B", 48, ack_after_us=None)
    elif builder == "slow-reaction":
        for i in range(400):
            flow.data(1000 + i * 100, "A", MSS)
        for i in range(400):
            flow.data(1000 + 399 * 100 + 800 + i * 100, "B", MSS)
    frames = flow.frames()
    pcap = write_pcap(tmp_path / "flow.pcap", frames, 101)
    ns = [(round(t * 1e6) * 1000, data) for t, data in frames]
    records = write_records(tmp_path / "run.jsonl", ns)
    out = assert_same(pcap, monkeypatch, [records])
    assert out["connections"][0]["turns"]["handoff_count"] == {"gloo": 1, "ping-pong": 5, "both-ways": 0,
                                                               "ring": 0, "slow-reaction": 1}[builder]


@pytest.mark.parametrize("ipv6", [False, True], ids=["ipv4", "ipv6"])
def test_synthetic_flow_handshake_and_losses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ipv6: bool) -> None:
    """A handshake, a lost segment, dup ACKs, a fast retransmission, a zero window (Ethernet, microseconds),
    in chunks smaller than one record too."""
    frames = [(t, LINK_HEADERS[1](ip, ipv6)) for t, ip in synthetic_flow(ipv6)]
    pcap = write_pcap(tmp_path / "s.pcap", frames, 1)
    out = assert_same(pcap, monkeypatch, min_chunks=8, chunk_sizes=(300, CHUNK))
    assert out["connections"][0]["directions"]["b->a"]["dup_acks"] == 4


@pytest.mark.slow
def test_large_capture_many_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """~21k packets, snaplen 80 (headers only): ~600 chunks of 4 KiB, so every stream is split hundreds of times,
    the turn lookups' tails (256 elements) roll over many times, and eleven phases cut it too."""
    frames = multi_capture(rounds=3, segments=520, seed=3).frames()
    pcap = write_ns_pcap(tmp_path / "large.pcap", frames, snaplen=80)
    records = write_records(tmp_path / "run.jsonl", frames)
    assert len(frames) > 20_000
    out = assert_same(pcap, monkeypatch, [records], min_chunks=pcap.stat().st_size // CHUNK)
    assert sum(c["turns"]["handoff_count"] for ph in out["phases"] for c in ph["connections"]) > 10


def test_timestamps_stepping_back_a_little(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Neighbouring packets trade timestamps here and there (a few microseconds back): streamed exactly."""
    frames = multi_capture(rounds=1, segments=150, seed=8).frames()
    rng = random.Random(2)
    rows = sorted(rng.sample(range(10, len(frames) - 10, 2), 25))
    stepped = swap_neighbour_times(frames, rows)
    pcap = write_ns_pcap(tmp_path / "stepped.pcap", stepped, snaplen=120)
    assert sum(b[0] < a[0] for a, b in itertools.pairwise(stepped)) > 10
    records = write_records(tmp_path / "run.jsonl", stepped)
    assert_same(pcap, monkeypatch, [records])


def _exactly_after(prev_ns: int, gap_s: float) -> int | None:
    """A time (ns) whose float seconds, as the analyzer computes them (int64 / 1e9), are exactly gap_s after
    prev_ns's (None where double rounding skips that value)."""
    prev_s = np.float64(prev_ns) / 1e9
    guess = prev_ns + round(gap_s * 1e9)
    for t_ns in sorted(range(guess - 2_000, guess + 2_000, 16), key=lambda t: abs(t - guess)):
        if np.float64(t_ns) / 1e9 - prev_s == gap_s:
            return t_ns
    return None


def test_gaps_exactly_the_idle_gap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A silence exactly --idle-gap long (in the float seconds the analyzer compares) joins a busy run; only
    a longer one ends it."""
    idle_gap_s = 2**-9
    capture = Capture()
    conn = capture.conn("10.6.0.1", "10.6.0.2", 4321, 80, timestamps=False)
    times = [T0_NS]
    while len(times) < 16:
        exact = _exactly_after(times[-1], idle_gap_s) if len(times) % 3 else None
        times.append(exact if exact is not None else times[-1] + 3_000_000)
    for t in times:
        conn.data(t, "A", MSS, ack_after_ns=None)
        conn.data(t + 7, "B", MSS, ack_after_ns=None)
    gaps = np.diff(np.array(times, dtype=np.int64) / 1e9)
    assert np.count_nonzero(gaps == idle_gap_s) >= 5
    pcap = write_ns_pcap(tmp_path / "gaps.pcap", capture.frames())
    out = assert_same(pcap, monkeypatch, idle_gap_s=idle_gap_s, min_chunks=4, chunk_sizes=(256, CHUNK))
    assert out["connections"][0]["directions"]["a->b"]["idle_gaps"]["count"] == np.count_nonzero(gaps > idle_gap_s)


def test_handshake_in_one_instant(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SYN, SYN-ACK and ACK stamped alike: the handshake RTT is 0 (the ACK at the SYN's time completes it), so
    the out-of-order threshold is the 3 ms default, and a segment 1.5 ms late is out of order."""
    a, b = ("10.6.0.1", 40000), ("10.6.0.2", 80)
    syn = _options(1460, 7, None)
    packets = [(T0_NS, tcp_packet(*a[:1], *b[:1], a[1], b[1], SYN, 100, 0, 64240, 0, syn)),
               (T0_NS, tcp_packet(*b[:1], *a[:1], b[1], a[1], SYN | ACK, 900, 101, 65160, 0, syn)),
               (T0_NS, tcp_packet(*a[:1], *b[:1], a[1], b[1], ACK, 101, 901, 502, 0)),
               (T0_NS + 1_000_000, tcp_packet(*a[:1], *b[:1], a[1], b[1], PSH | ACK, 101 + 1000, 901, 502, 1000)),
               (T0_NS + 1_020_000, tcp_packet(*b[:1], *a[:1], b[1], a[1], ACK, 901, 101, 509, 0)),
               (T0_NS + 2_500_000, tcp_packet(*a[:1], *b[:1], a[1], b[1], PSH | ACK, 101, 901, 502, 1000)),
               (T0_NS + 2_520_000, tcp_packet(*b[:1], *a[:1], b[1], a[1], ACK, 901, 2101, 509, 0))]
    pcap = write_ns_pcap(tmp_path / "instant.pcap", packets)
    out = assert_same(pcap, monkeypatch, chunk_sizes=(128, CHUNK), min_chunks=3)
    sent = out["connections"][0]["directions"]["a->b"]
    assert (sent["out_of_order"], sent["retransmissions"]) == (1, 0)


def test_control_frame_stamped_back_at_the_lookup_tail(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A 48-byte frame written to the file long after its time (12 ms back), in the silence between two of
    its sender's bursts: its own-burst lookup lands at the first element the streamed search still holds
    (turns.Searcher keeps the last TAIL of them), so the element before it comes from what was dropped.
    Exact: the capture steps back, but not where the bulk data does."""
    capture = Capture()
    conn = capture.conn("10.6.0.1", "10.6.0.2", 4322, 80, timestamps=False)
    first, second = 300, turns.Searcher.TAIL
    for i in range(first):
        conn.data(T0_NS + i * 10_000, "B", MSS, ack_after_ns=None)
    later = T0_NS + 23_000_000
    for i in range(second):
        conn.data(later + i * 10_000, "B", MSS, ack_after_ns=None)
    end = later + second * 10_000
    for i in range(200):  # the peer's pure ACKs: chunks with no bulk data between the bursts and the frame
        conn.data(end + i * 10_000, "A", 0, ack_after_ns=None)
    conn.data(T0_NS + 13_000_000, "B", 48, ack_after_ns=None)  # 13 ms: 10 ms after the first burst
    for i in range(30):
        conn.data(end + 3_000_000 + i * 10_000, "A", MSS, ack_after_ns=None)
    pcap = write_ns_pcap(tmp_path / "late-frame.pcap", [(t_ns, data) for t_ns, _i, data in conn.packets])
    out = assert_same(pcap, monkeypatch, chunk_sizes=(CHUNK, 1 << 20))
    frames = out["connections"][0]["turns"]["control_frames"]["a->b"]
    assert frames["count"] == 1 and frames["after_own_burst"] == 0


@pytest.mark.slow
def test_more_endpoints_than_the_dense_pair_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """1,133 short connections between 2,163 endpoints: past 2,048 endpoints both paths number the pairs
    without the dense table (connections.ConnectionIds switches to its dict in the middle of the file), in
    order of first appearance also where a chunk brings several new ones whose pair keys sort otherwise."""
    capture = Capture()
    for k in range(1030):
        conn = capture.conn(f"10.{8 + k % 2}.{k // 250}.{k % 250 + 1}", f"10.30.{k // 250}.{k % 250 + 1}",
                            20000 + k, 80 + k % 3, timestamps=k % 2 == 0)
        start = T0_NS + (k * 37_000) % 5_000_000
        if k % 3:
            conn.handshake(start)
        conn.data(start + 100_000, "A", 500)
        conn.data(start + 150_000, "B", MSS if k % 5 else 48)
        if k % 10 == 9:  # a new client of an older server: its pair sorts before pairs first seen earlier
            older = k - 5
            cross = capture.conn(f"10.{8 + k % 2}.{k // 250}.{k % 250 + 1}",
                                 f"10.30.{older // 250}.{older % 250 + 1}", 30000 + k, 80 + older % 3)
            cross.data(start + 170_000, "A", 300)
    pcap = write_ns_pcap(tmp_path / "many.pcap", capture.frames(), snaplen=96)
    out = assert_same(pcap, monkeypatch, with_series=False, chunk_sizes=(1 << 16,))  # slow
    assert len(out["connections"]) == 1133 and len(out["hosts"]) == 2060


@pytest.mark.parametrize("kind", ["one-packet", "one-syn", "no-tcp", "empty"])
def test_tiny_captures(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    capture = Capture()
    conn = capture.conn("10.5.0.1", "10.5.0.2", 1234, 80)
    if kind == "one-packet":
        conn.data(T0_NS, "A", 100, ack_after_ns=None)
    elif kind == "one-syn":
        conn._send(T0_NS, "A", SYN, 1, 0, 0, 1000, _options(1460, 7, (5, 0)))
    frames = capture.frames()
    if kind == "no-tcp":
        udp = struct.pack("!BBHHHBBH", 0x45, 0, 36, 0, 0, 64, 17, 0) + bytes([10, 3, 0, 1, 10, 3, 0, 2]) + b"\0" * 16
        frames = [(T0_NS + k, udp) for k in range(3)]
    pcap = write_ns_pcap(tmp_path / "tiny.pcap", frames)
    records = write_records(tmp_path / "run.jsonl", frames or [(T0_NS, b"")])
    out = assert_same(pcap, monkeypatch, [records], min_chunks=1 if frames and kind != "no-tcp" else 0)
    assert out["capture"]["packets"] == {"one-packet": 1, "one-syn": 1, "no-tcp": 0, "empty": 0}[kind]


def test_first_difference_names_the_path() -> None:
    assert first_difference({"a": [1, {"b": 2}]}, {"a": [1, {"b": 2.0}]}) == "/a[1]/b (2 vs 2.0)"
    assert first_difference({"a": 1, "b": 2}, {"b": 2, "a": 1}) is not None  # key order is the JSON's
    assert first_difference([1, 2], [1, 2, 3]) == " (length 2 vs 3)"


# --- real traffic --------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _capturing(pcap: Path, port_filter: str, snaplen: int) -> Iterator[None]:
    from diag.capture import start_capture

    handle = start_capture(pcap, "lo", port_filter, snaplen)
    try:
        yield
    finally:
        handle.stop()


BLOCK_BYTES = 100_000  # one "message" of the loopback exchange, after a 48-byte notice
PIECE_BYTES = 2_000    # written at a time, with TCP_NODELAY


def _exchange(sock: socket.socket, blocks: int, peer_blocks: int) -> None:
    """Send blocks messages (a 48-byte notice, then BLOCK_BYTES; a short pause after each) while reading the
    peer's peer_blocks: both directions of the connection at once."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.settimeout(30)
    expect = peer_blocks * (48 + BLOCK_BYTES)

    def receive() -> None:
        got = 0
        while got < expect:
            data = sock.recv(1 << 20)
            if not data:
                break
            got += len(data)

    receiver = threading.Thread(target=receive)
    receiver.start()
    for _ in range(blocks):
        sock.sendall(b"n" * 48)
        for _ in range(BLOCK_BYTES // PIECE_BYTES):  # small writes: segments of lo's GSO stay small
            sock.sendall(b"d" * PIECE_BYTES)
        time.sleep(0.003)
    receiver.join(30)
    sock.shutdown(socket.SHUT_WR)


def loopback_connections(pcap: Path, snaplen: int) -> None:
    """tcpdump on lo while three connections (two IPv4, one IPv6; MSS clamped to 1000 bytes so that a
    message is many segments) exchange messages both ways at once."""
    need_root()
    need_tools("tcpdump")
    jobs = [("127.0.0.1", socket.AF_INET, 6, 4), ("127.0.0.1", socket.AF_INET, 3, 7), ("::1", socket.AF_INET6, 5, 5)]
    listeners = []
    for address, family, _, _ in jobs:
        listener = socket.socket(family, socket.SOCK_STREAM)
        listener.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, 1000)
        listener.bind((address, 0))
        listener.listen(1)
        listener.settimeout(30)
        listeners.append(listener)
    errors: list[BaseException] = []

    def side(make: Any, blocks: int, peer_blocks: int) -> None:
        try:
            with make() as sock:
                _exchange(sock, blocks, peer_blocks)
        except BaseException as exc:  # reported below, in the test's thread
            errors.append(exc)

    def client(address: str, family: int, port: int) -> socket.socket:
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, 1000)
        sock.connect((address, port))
        return sock

    ports = [listener.getsockname()[1] for listener in listeners]
    with _capturing(pcap, " or ".join(f"tcp port {p}" for p in ports), snaplen):
        threads = []
        for (address, family, ab, ba), listener, port in zip(jobs, listeners, ports, strict=True):
            threads.append(threading.Thread(target=side, args=(lambda lst=listener: lst.accept()[0], ba, ab)))
            threads.append(threading.Thread(target=side, args=(
                lambda a=address, f=family, p=port: client(a, f, p), ab, ba)))
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    for listener in listeners:
        listener.close()
    assert not errors, errors


@pytest.mark.root
@pytest.mark.parametrize("snaplen", [128, 65535])
def test_loopback_traffic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, snaplen: int) -> None:
    """Real tcpdump captures of connections running at once: the same JSON streamed (records of 64 KiB
    segments are larger than a 4 KiB chunk with the full snaplen)."""
    pcap = tmp_path / "lo.pcap"
    loopback_connections(pcap, snaplen)
    rows: list[int] = []
    reader.stream_capture(pcap, lambda chunk: rows.extend(chunk.columns["ts_ns"].tolist()))
    frames = [(t, b"") for t in rows]
    records = write_records(tmp_path / "run.jsonl", frames)
    try:
        # lo's GSO: records up to 64 KiB with the full snaplen
        out = assert_same(pcap, monkeypatch, [records], min_chunks=40)
    except source.Fallback as why:  # tcpdump on several CPUs can step back
        analysis.analyze_files([pcap], [records])
        pytest.skip(f"this capture cannot be read in chunks exactly ({why})")
    assert len(out["connections"]) == 3


# --- 2. captures whose clock steps back: no fallback ----------------------------------------------------------------------------


def many_steps_back(path: Path) -> Path:
    """One bulk stream whose data packets step back thousands of times (before issue 21 past 4,096 the chunked
    analysis gave up and analyzed the file as one chunk)."""
    capture = Capture()
    conn = capture.conn("10.7.0.1", "10.7.0.2", 5555, 80, timestamps=False)
    conn.handshake(T0_NS)
    for i in range(2 * 4300):
        conn.data(T0_NS + 1_000_000 + i * 10_000, "A", MSS, ack_after_ns=None)
    frames = capture.frames()
    data_rows = list(range(3, len(frames) - 1, 2))  # (data i, data i+1) pairs trade times
    return write_ns_pcap(path, swap_neighbour_times(frames, data_rows), snaplen=64)


def runs_out_of_order(path: Path) -> Path:
    """A stream whose busy run starts before the previous run's start: after a 7 ms silence a packet, then one
    stamped 10 ms before it (the same run: the time went back), then one 5 ms after that (a new run, which
    starts before the previous one). The bytes inside the other stream's runs are found by a binary search
    over those starts, in chunks and in one chunk alike: no fallback. Written in the order sent."""
    capture = Capture()
    conn = capture.conn("10.7.0.1", "10.7.0.2", 5556, 80, timestamps=False)
    conn.handshake(T0_NS)
    t = T0_NS + 1_000_000
    for i in range(30):
        conn.data(t + i * 100_000, "A", MSS)
        conn.data(t + i * 100_000 + 30_000, "B", MSS)
    late = t + 10_000_000
    for back_ns in (0, 10_000_000, 5_000_000):
        conn.data(late - back_ns, "A", MSS)
    return write_ns_pcap(path, [(t_ns, data) for t_ns, _i, data in conn.packets])


def lookup_in_a_step_back(path: Path) -> Path:
    """One bulk packet of B's 1,000 (the middle one, where a binary search looks first) stamped 4 ms back, and
    A's 48-byte frame inside that step: a search over the unsorted times would answer what no prefix gives;
    over their running maximum (the definition) the answer does not depend on the chunks."""
    capture = Capture()
    conn = capture.conn("10.7.0.1", "10.7.0.2", 5557, 80, timestamps=False)
    for i in range(1000):
        conn.data(T0_NS + i * 10_000, "B", MSS, ack_after_ns=None)
    conn.data(T0_NS + 10_000_000, "A", MSS, ack_after_ns=None)
    conn.data(T0_NS + 1_500_000, "A", 48, ack_after_ns=None)
    frames = capture.frames()
    middle = next(k for k, (t_ns, _) in enumerate(frames) if t_ns == T0_NS + 500 * 10_000)
    frames[middle] = (T0_NS + 1_000_000 + 5_000, frames[middle][1])
    return write_ns_pcap(path, frames)


@pytest.mark.parametrize("build", [many_steps_back, lookup_in_a_step_back], ids=["many-steps-back",
                                                                          "lookup-in-a-step-back"])
def test_steps_back_are_analyzed_in_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, build: Any) -> None:
    pcap = build(tmp_path / "back.pcap")
    expected = assert_same(pcap, monkeypatch, min_chunks=1)
    chunked = run_diag("analyze", str(pcap), "--json")
    assert chunked.returncode == 0 and chunked.stderr == "", chunked.stderr  # no fallback line
    assert json.loads(chunked.stdout) == expected
    assert expected["capture"]["packets"] > 0


def test_runs_out_of_order_in_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert_same(runs_out_of_order(tmp_path / "back.pcap"), monkeypatch, min_chunks=1)


# --- 3. the command line -------------------------------------------------------------------------------------


def test_cli_chunks_and_plot_print_the_same(tmp_path: Path) -> None:
    """One file is read in chunks; with --plot it is one chunk in memory (the plots draw every packet): the
    same JSON, and no fallback line."""
    frames = multi_capture(rounds=1, segments=100, seed=21).frames()
    pcap = write_ns_pcap(tmp_path / "multi.pcap", frames, snaplen=128)
    records = write_records(tmp_path / "run.jsonl", frames)
    args = ("analyze", str(pcap), "--records", str(records), "--json", "--bin", "0.003")
    chunked = run_diag(*args)
    assert chunked.returncode == 0 and chunked.stderr == "", chunked.stderr
    assert len(json.loads(chunked.stdout)["phases"]) == 11
    plots = tmp_path / "plots"
    plotted = run_diag(*args, "--plot", str(plots))
    assert plotted.returncode == 0, plotted.stderr
    assert plotted.stdout == chunked.stdout
    assert len(list(plots.glob("*.png"))) >= 4
    assert "analyzed in memory" not in plotted.stderr  # --plot is one chunk by choice, not a fallback


# --- 4. which source ---------------------------------------------------------------------------------------


def test_which_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks for one regular file with both kernels; one chunk for several files, a pipe, --plot."""
    pcap = write_pcap(tmp_path / "s.pcap", [(t, LINK_HEADERS[1](ip, False)) for t, ip in synthetic_flow()], 1)
    other = write_pcap(tmp_path / "t.pcap", [(t, LINK_HEADERS[1](ip, False)) for t, ip in synthetic_flow()], 1)
    fifo = tmp_path / "pipe.pcap"
    os.mkfifo(fifo)
    assert analysis.chunked([pcap]) and analysis.chunked([str(pcap)])
    assert not analysis.chunked([pcap, other])
    assert not analysis.chunked([fifo])
    assert not analysis.chunked([tmp_path / "missing.pcap"])
    with monkeypatch.context() as patch:
        patch.setattr(native, "kernel", lambda name: None)  # no kernels: nothing to feed in chunks
        assert not analysis.chunked([pcap])
    sources: list[str] = []
    real = analysis.Analysis.__init__
    monkeypatch.setattr(analysis.Analysis, "__init__",
                        lambda self, src, *a: sources.append(type(src).__name__) or real(self, src, *a))
    chunked_out, packets = analysis.analyze([pcap], keep_sequence=False)
    assert sources == ["FileChunks"] and packets is None
    one_out, packets = analysis.analyze([pcap], keep_sequence=True)
    assert sources == ["FileChunks", "OneChunk"] and packets is not None
    assert json.dumps(chunked_out.to_json()) == json.dumps(one_out.to_json())


def test_unwritable_tmpdir_is_a_one_line_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The TCP state's old segment ends go to $TMPDIR (a file read every pass); where that cannot be written,
    the analysis stops with a DiagError (one line from the CLI) that says to set TMPDIR."""
    pcap = write_pcap(tmp_path / "s.pcap", [(t, LINK_HEADERS[1](ip, False)) for t, ip in synthetic_flow()], 1)
    monkeypatch.setattr(source, "CACHE_BYTES", 0)  # a file too big to keep: its state spills
    monkeypatch.setenv("TMPDIR", str(tmp_path / "missing"))
    with pytest.raises(DiagError, match="set TMPDIR"):
        analysis.analyze([pcap], keep_sequence=False, spill_window=2)


def test_small_files_are_decoded_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Below CACHE_BYTES the first read keeps its chunks and every later pass replays them: the file is read
    once. Above it every pass reads the file again (the handshakes' pass stops early); the same JSON."""
    frames = multi_capture(rounds=1, segments=60, seed=3).frames()
    pcap = write_ns_pcap(tmp_path / "multi.pcap", frames, snaplen=128)
    reads: list[int] = []
    real = source.stream_capture
    monkeypatch.setattr(source, "stream_capture", lambda *a, **k: reads.append(1) or real(*a, **k))
    monkeypatch.setattr(pcapfile, "CHUNK_BYTES", CHUNK)
    kept = analysis.Analysis(source.FileChunks(pcap), None, DEFAULT_BIN_S, IDLE_GAP_S, True).run().to_json()
    assert len(reads) == 1 and pcap.stat().st_size > 8 * CHUNK
    reads.clear()
    monkeypatch.setattr(source, "CACHE_BYTES", 3 * CHUNK)  # the file's rows would not fit: read every pass
    reread = analysis.Analysis(source.FileChunks(pcap), None, DEFAULT_BIN_S, IDLE_GAP_S, True).run().to_json()
    assert len(reads) == 5
    assert json.dumps(kept) == json.dumps(reread)

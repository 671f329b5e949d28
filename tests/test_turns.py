"""Turn analysis, cadence-adapted duplex overlap and the capture point, on pcaps built with scapy (exact
numbers) and on a real tbf-shaped namespace pair (both directions at once on one socket vs ping-pong)."""

from __future__ import annotations

import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from capture_helpers import netns_pair, tc, write_pcap

from diag.capture.analysis import analyze_files
from diag.capture.busy import BusyRuns, DataStream, coverage
from diag.capture.busy import duplex as streams_duplex
from diag.capture.document import IDLE_GAP_S
from tests.capture_helpers import packet_table

MSS = 1448
T0 = 1_700_000_000.0
US = 1e-6


TCP_SEQ, TCP_CHECKSUM = 20 + 4, 20 + 16     # offsets in an IPv4 packet with a 20-byte header


class Flow:
    """Packets of one TCP connection A <-> B (raw IP pcap), each side acking the other's data 20 us later."""

    def __init__(self, a: str = "10.9.0.1", b: str = "10.9.0.2", sport: int = 40000, dport: int = 5000) -> None:
        self.ends = {"A": (a, b, sport, dport), "B": (b, a, dport, sport)}
        self.seq = {"A": 1000, "B": 500_000}
        self.packets: list[tuple[int, str, int, int]] = []   # (time us, sender, seq, payload)
        self._templates: dict[tuple[str, int], bytes] = {}

    def data(self, t_us: int, side: str, payload: int, ack_after_us: int | None = 20) -> None:
        self.packets.append((t_us, side, self.seq[side], payload))
        self.seq[side] += payload
        if ack_after_us is not None:
            self.packets.append((t_us + ack_after_us, "B" if side == "A" else "A", -1, self.seq[side]))

    def frames(self) -> list[tuple[float, bytes]]:
        acked = {"A": 500_000, "B": 1000}   # what each side last acknowledged of the other
        sent = {"A": 1000, "B": 500_000}    # each side's next sequence number at the time
        out = []
        for t_us, side, seq, value in sorted(self.packets, key=lambda p: p[0]):
            if seq < 0:  # a pure ACK of the other side's data up to value
                acked[side] = value
                frame = self._frame(side, 0, sent[side], value)
            else:
                sent[side] = max(sent[side], seq + value)
                frame = self._frame(side, value, seq, acked[side])
            out.append((T0 + t_us * US, frame))
        return out

    def _frame(self, side: str, payload: int, seq: int, ack: int) -> bytes:
        """scapy builds one packet per side and payload size; each frame is that template with its own seq
        and ack, the TCP checksum updated for them (RFC 1624): thousands of frames in milliseconds."""
        key = (side, payload)
        if key not in self._templates:
            from scapy.layers.inet import IP, TCP
            from scapy.packet import Raw

            src, dst, sport, dport = self.ends[side]
            pkt = IP(src=src, dst=dst) / TCP(sport=sport, dport=dport, flags="PA" if payload else "A", seq=0, ack=0,
                                             window=5000)
            self._templates[key] = bytes(pkt / Raw(b"d" * payload) if payload else pkt)
        frame = bytearray(self._templates[key])
        fields = struct.pack("!II", seq & 0xFFFFFFFF, ack & 0xFFFFFFFF)
        total = ~struct.unpack_from("!H", frame, TCP_CHECKSUM)[0] & 0xFFFF    # HC' = ~(~HC + ~m + m')
        for i in range(0, 8, 2):
            total += (~int.from_bytes(frame[TCP_SEQ + i:TCP_SEQ + i + 2], "big") & 0xFFFF) + \
                int.from_bytes(fields[i:i + 2], "big")
        while total >> 16:
            total = (total & 0xFFFF) + (total >> 16)
        frame[TCP_SEQ:TCP_SEQ + 8] = fields
        struct.pack_into("!H", frame, TCP_CHECKSUM, ~total & 0xFFFF)
        return bytes(frame)


def _analyze(tmp_path: Path, frames: list[tuple[float, bytes]], name: str = "flow.pcap") -> dict:
    return analyze_files([write_pcap(tmp_path / name, frames, 101)], with_series=False)


def _gloo_like_turn() -> Flow:
    """B posts four 48-byte notices; A sends 200 segments alone; B starts 50 us after A's 100th segment (the
    end of A's first message) and both send until A ends; B finishes alone."""
    flow = Flow()
    for k in range(4):
        flow.data(k * 10, "B", 48, ack_after_us=None)
    for i in range(200):
        flow.data(1000 + i * 100, "A", MSS)
    b_start = 1000 + 99 * 100 + 50
    for i in range(200):
        flow.data(b_start + i * 100, "B", MSS)
    return flow



def busy_intervals(ts_s: np.ndarray, gap_s: float) -> tuple[np.ndarray, np.ndarray]:
    runs = BusyRuns(gap_s)
    runs.add(ts_s)
    return runs.arrays()


def duplex(ts_x: np.ndarray, bytes_x: np.ndarray, ts_y: np.ndarray, bytes_y: np.ndarray,
           idle_gap_s: float) -> dict:
    """busy.duplex of two streams given whole (one chunk), through every pass a DataStream takes."""
    x, y = DataStream(idle_gap_s), DataStream(idle_gap_s)
    pairs = ((x, ts_x, bytes_x), (y, ts_y, bytes_y))
    for stream, ts, nbytes in pairs:
        stream.count(ts, nbytes)
        stream.plan()
        stream.collect_gaps(ts, nbytes)
        stream.settle_gap()
        stream.add_runs(ts)
        stream.settle_runs()
    x.add_overlap(ts_x, bytes_x, y)
    y.add_overlap(ts_y, bytes_y, x)
    return streams_duplex(x, y)


def test_gloo_like_turn_exact_numbers(tmp_path: Path) -> None:
    conn = _analyze(tmp_path, _gloo_like_turn().frames())["connections"][0]
    turns = conn["turns"]
    assert conn["a"] == "10.9.0.2:5000"   # B sent the first packet: B is side a, A's data is "b->a"
    # microseconds. A direction is busy until its sender has the ACK of its last segment (in flight): the ACK
    # passes 20 us after the segment, and the round trip from the capture point to the sender and back (the
    # other direction's data -> ACK time here) is 20 us more.
    in_flight = 20 + 20
    a_end, b_start, b_end = 20_900 + in_flight, 10_950, 30_850 + in_flight
    both = (a_end - b_start) * US
    a_alone = (b_start - 1000) * US
    b_alone = (b_end - a_end + 30 + 20) * US      # B's notices (never ACKed) form a run of their own: 30 us + 20
    either = both + a_alone + b_alone
    assert turns["both_s"] == pytest.approx(both, abs=1e-6)
    assert turns["one_way_s"]["b->a"] == pytest.approx(a_alone, abs=1e-6)
    assert turns["one_way_s"]["a->b"] == pytest.approx(b_alone, abs=1e-6)
    assert conn["duplex_overlap"] == pytest.approx(both / either, abs=2e-5)   # float seconds of 1.7e9
    assert turns["leader"] == "b->a"
    assert turns["leader_only_fraction"] == pytest.approx(a_alone / either, abs=2e-5)
    assert turns["follower_only_fraction"] == pytest.approx(b_alone / either, abs=2e-5)
    assert turns["span_s"] == pytest.approx((b_end - in_flight) * US, abs=1e-6)   # first to last data packet
    # one handoff: B waited for A's first 100 segments; A's 100th segment is the trigger, 50 us = 2.5 RTTs
    assert turns["handoff_count"] == 1 and turns["turn_taking"] is True
    event = turns["handoffs"][0]
    assert event["from"] == "b->a"
    assert event["delay_s"] == pytest.approx(50 * US, abs=1e-6)
    assert event["delay_rtt"] == pytest.approx(2.5, abs=0.05)
    assert event["trigger_offset_bytes"] == 100 * MSS
    assert event["trigger_offset_fraction"] == pytest.approx(0.5)
    assert event["burst_bytes"] == 100 * MSS
    assert event["sender_continues"] is True
    assert event["follower_silence_s"] == pytest.approx(b_start * US, abs=1e-6)
    # B's four notices: gloo preambles, not after B's own burst, A's data 1 ms later (median)
    frames = turns["control_frames"]
    assert frames["a->b"] == {"count": 4, "preamble_multiples": 4, "after_own_burst": 0,
                              "peer_data_next_ms": pytest.approx(0.985, abs=1e-3)}
    assert frames["b->a"]["count"] == 0


def test_both_directions_at_once_is_no_turn(tmp_path: Path) -> None:
    flow = Flow()
    for i in range(200):
        flow.data(1000 + i * 100, "A", MSS)
        flow.data(1030 + i * 100, "B", MSS)
    turns = _analyze(tmp_path, flow.frames())["connections"][0]["turns"]
    assert turns["handoff_count"] == 0 and turns["turn_taking"] is False
    assert turns["both_fraction"] > 0.99


def test_ring_connection_one_way_is_no_turn(tmp_path: Path) -> None:
    """A ring at N>=3: one direction carries the data, the other only notices (one per 50 segments)."""
    flow = Flow()
    for i in range(400):
        flow.data(1000 + i * 100, "A", MSS)
        if i % 50 == 49:
            flow.data(1000 + i * 100 + 60, "B", 48, ack_after_us=None)
    turns = _analyze(tmp_path, flow.frames())["connections"][0]["turns"]
    assert turns["handoff_count"] == 0 and turns["turn_taking"] is False
    # each notice is in flight until its sender could have an ACK (none comes here): a round trip (20 us);
    # seven of them fall inside A's data, the eighth after A's last segment was acknowledged
    assert turns["leader"] == "a->b" and turns["leader_only_fraction"] == pytest.approx(1.0, abs=0.01)
    assert turns["both_s"] == pytest.approx(7 * 20 * US, abs=1e-6)
    # the notices sit in the middle of the peer's data, not after an own burst
    assert turns["control_frames"]["b->a"]["count"] == 8
    assert turns["control_frames"]["b->a"]["after_own_burst"] == 0


def test_ping_pong_handoffs_each_way(tmp_path: Path) -> None:
    """Half duplex: each side sends a 50-segment block only after the peer's block ended (100 us later)."""
    flow = Flow()
    t = 1000
    for block in range(6):
        side = "A" if block % 2 == 0 else "B"
        for i in range(50):
            flow.data(t + i * 100, side, MSS)
        t += 49 * 100 + 100
    conn = _analyze(tmp_path, flow.frames())["connections"][0]
    turns = conn["turns"]
    assert turns["handoff_count"] == 5
    assert {e["from"] for e in turns["handoffs"]} == {"a->b", "b->a"}
    assert all(e["delay_s"] == pytest.approx(100 * US, abs=1e-6) and not e["sender_continues"]
               for e in turns["handoffs"])
    assert conn["duplex_overlap"] == 0.0


def test_super_segment_ping_pong_keeps_a_short_run_gap(tmp_path: Path) -> None:
    """A sender-side capture with GSO: each 64 KiB message is one 65,160-byte super-segment and a 376-byte
    tail, 5 ms apart per turn. Counted per packet, the gaps between them were the ping-pong's period and the
    run gap rose to 50 ms, joining the turns (0.42); counted per wire segment the turns stay apart."""
    flow = Flow()
    t = 1000
    for block in range(40):
        side = "A" if block % 2 == 0 else "B"
        flow.data(t, side, 65160)
        flow.data(t + 5000, side, 376)
        t += 5000 + 500
    conn = _analyze(tmp_path, flow.frames())["connections"][0]
    assert max(conn["run_gap_s"].values()) < 0.01, conn["run_gap_s"]
    assert conn["duplex_overlap"] < 0.05, conn["duplex_overlap"]


@pytest.mark.parametrize(("reaction_us", "handoffs"), [(5_000, 1), (2_000, 1), (40_000, 0)])
def test_slow_reaction_after_a_long_wait(tmp_path: Path, reaction_us: int, handoffs: int) -> None:
    """A follower that waited for the leader's whole 400 ms message reacts 2 or 5 ms late (a loaded host):
    still a handoff (2% of its silence); 40 ms late it is not tied to the leader's packet any more."""
    flow = Flow()
    for i in range(4000):
        flow.data(1000 + i * 100, "A", MSS)
    start = 1000 + 3999 * 100 + reaction_us
    for i in range(4000):
        flow.data(start + i * 100, "B", MSS)
    turns = _analyze(tmp_path, flow.frames())["connections"][0]["turns"]
    assert turns["handoff_count"] == handoffs
    assert turns["both_s"] == 0.0


def _bursty(start_us: int, period_us: int, bursts: int, per_burst: int = 8, spacing_us: int = 10) -> list[int]:
    """tbf-like: a bucket of per_burst frames at veth speed, then a wait for tokens."""
    return [start_us + k * period_us + i * spacing_us for k in range(bursts) for i in range(per_burst)]


def test_micro_bursty_two_way_reads_as_overlap() -> None:
    """Both directions busy for 300 ms, each in bursts every 3 ms (gaps > the 2 ms idle gap): the fixed gap
    sees mostly silence, the cadence-adapted run sees the two directions overlap."""
    rng = np.random.default_rng(1)
    x = np.array(_bursty(0, 3000, 100), dtype=np.float64) * US
    y = np.array(_bursty(1300, 3000, 100), dtype=np.float64) * US + rng.uniform(0, 200e-6, 800)
    y.sort()
    sizes = np.full(800, float(MSS))
    fixed_both, fixed_either = coverage([busy_intervals(x, IDLE_GAP_S), busy_intervals(y, IDLE_GAP_S)])
    assert fixed_both / fixed_either < 0.2
    result = duplex(x, sizes, y, sizes, IDLE_GAP_S)
    assert result["duplex_overlap"] >= 0.95
    assert result["x_gap_s"] == pytest.approx(3 * (3000 - 70) * US, rel=1e-6)


def test_micro_bursty_half_duplex_reads_low() -> None:
    """Blocks of ten bursts (30 ms) in turns: the cadence (3 ms) stays far below a turn, so turns show."""
    x_times, y_times = [], []
    for block in range(10):
        target = x_times if block % 2 == 0 else y_times
        target.extend(_bursty(block * 31_000, 3000, 10))
    x, y = np.array(x_times) * US, np.array(y_times) * US
    result = duplex(x, np.full(x.size, float(MSS)), y, np.full(y.size, float(MSS)), IDLE_GAP_S)
    assert result["duplex_overlap"] == 0.0
    assert result["active_s"] > 0.25


def test_capture_point_marks_hosts_seen_one_way(tmp_path: Path) -> None:
    """A capture on h0's NIC in a ring: h1 -> h0 and h0 -> h2. Only h0's NIC is observed."""
    frames = []
    into = Flow("10.9.0.2", "10.9.0.1", 40001, 5001)
    out_of = Flow("10.9.0.1", "10.9.0.3", 40002, 5002)
    for i in range(100):
        into.data(1000 + i * 100, "A", MSS)
        out_of.data(1050 + i * 100, "A", MSS)
    frames = sorted(into.frames() + out_of.frames(), key=lambda f: f[0])
    result = _analyze(tmp_path, frames)
    assert result["capture_point"] == ["10.9.0.1"]
    hosts = {h["address"]: h for h in result["hosts"]}
    assert hosts["10.9.0.1"]["nic_observed"] is True and hosts["10.9.0.1"]["duplex_overlap"] > 0.9
    for address in ("10.9.0.2", "10.9.0.3"):
        assert hosts[address]["nic_observed"] is False and hosts[address]["duplex_overlap"] is None
        assert hosts[address]["seen_traffic_overlap"] == 0.0
    # a two-host capture: both ends are the capture point
    two = _analyze(tmp_path, into.frames(), "two.pcap")
    assert two["capture_point"] == ["10.9.0.1", "10.9.0.2"]
    assert all(h["nic_observed"] for h in two["hosts"])


# --- a real shaped link -----------------------------------------------------------------------------

PEER = textwrap.dedent("""
    import socket, sys, threading, time
    role, host, port, mode, nbytes, block = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5]), int(sys.argv[6])
    PERIOD_S = 0.003
    if role == "server":
        srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        srv.bind((host, port)); srv.listen(1); print("ready", flush=True)
        srv.settimeout(20); s, _ = srv.accept()
    else:
        s = socket.create_connection((host, port), timeout=20)
    s.settimeout(20)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    # buffers that hold the whole transfer: the kernel, not a descheduled Python thread, paces the wire
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20); s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    def receive(total):
        got = 0
        while got < total:
            d = s.recv(min(1 << 20, total - got))
            if not d: raise SystemExit("peer closed")
            got += len(d)
    def drain():
        while s.recv(1 << 20):
            pass
    if mode == "both":   # both directions at once on this one socket, each written in bursts of `block`
        # for the same second from the connection on (not the same count of bursts: a side whose sleeps run
        # long on a busy machine would send alone at the end, and that tail is rightly not overlap)
        until = time.monotonic() + nbytes / block * (PERIOD_S + 0.001)
        t = threading.Thread(target=drain); t.start()
        while time.monotonic() < until:   # a burst, then PERIOD_S of silence from this side
            s.sendall(b"x" * block)
            time.sleep(PERIOD_S)
        s.shutdown(socket.SHUT_WR)
        t.join()
    else:                # ping-pong: a block, then wait for the peer's block
        for k in range(nbytes // block):
            if (k % 2 == 0) == (role == "client"):
                s.sendall(b"x" * block)
            else:
                receive(block)
    s.close()
""")


def _shaped_exchange(pair, tmp_path: Path, mode: str, nbytes: int, block: int) -> dict:
    from diag.capture import start_capture

    pcap = tmp_path / f"{mode}.pcap"
    port = 47000 + (hash(mode) % 1000)
    handle = start_capture(pcap, pair.dev_a, "tcp", 128, netns=pair.a)
    try:
        server = subprocess.Popen(["ip", "netns", "exec", pair.b, sys.executable, "-c", PEER, "server", pair.addr_b,
                                   str(port), mode, str(nbytes), str(block)], stdout=subprocess.PIPE, text=True)
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        subprocess.run(["ip", "netns", "exec", pair.a, sys.executable, "-c", PEER, "client", pair.addr_b, str(port),
                        mode, str(nbytes), str(block)], check=True, timeout=30)
        assert server.wait(30) == 0
    finally:
        handle.stop()
    return analyze_files([pcap], with_series=False)


@pytest.mark.alone
def test_shaped_link_two_way_overlaps_and_ping_pong_does_not(tmp_path: Path) -> None:
    """tbf at 100 Mbit/s both ways. Both sides write 16 KiB, then sleep 3 ms, on one socket for 1 s: each
    burst leaves in ~1.5 ms, then the direction is silent >= 3 ms -- longer than the 2 ms idle gap, so the
    fixed gap reads the two directions as mostly apart (measured 0.03-0.26). They move data at once the whole time and must read as
    overlapping. A ping-pong of 256 KiB blocks on the same link must read as turns."""
    with netns_pair("tu") as pair:
        for ns, dev in ((pair.a, pair.dev_a), (pair.b, pair.dev_b)):
            tc(ns, "qdisc", "replace", "dev", dev, "root", "tbf", "rate", "100mbit", "burst", "12304",
               "limit", "200000")
        both = _shaped_exchange(pair, tmp_path, "both", 250 * 16384, 16384)
        pingpong = _shaped_exchange(pair, tmp_path, "pingpong", 4 * 256 * 1024, 256 * 1024)
    conn = max(both["connections"], key=lambda c: c["active_s"])
    gaps = conn["run_gap_s"]
    assert min(gaps.values()) > IDLE_GAP_S, gaps   # the bursts' cadence was longer than the fixed gap
    assert conn["duplex_overlap"] >= 0.8, conn["duplex_overlap"]
    assert conn["turns"]["handoff_count"] == 0
    packets = packet_table([tmp_path / "both.pcap"])
    data = packets.cols["plen"] > 0
    fixed = [busy_intervals(packets.cols["ts_ns"][data & (packets.state.direction == d)] / 1e9, IDLE_GAP_S)
             for d in (0, 1)]
    fixed_both, fixed_either = coverage(fixed)
    assert fixed_both / fixed_either < conn["duplex_overlap"] - 0.2   # what the fixed 2 ms gap read
    conn = max(pingpong["connections"], key=lambda c: c["active_s"])
    assert conn["duplex_overlap"] < 0.2, conn["duplex_overlap"]
    assert conn["turns"]["handoff_count"] == 3   # 4 blocks in turns


def test_small_mss_flow_has_no_control_frames(tmp_path: Path) -> None:
    """188-byte segments are the data of a flow with a tiny MSS, not notices: no control frames, and the
    ping-pong of its blocks still reads as handoffs."""
    flow = Flow()
    t = 1000
    for block in range(4):
        side = "A" if block % 2 == 0 else "B"
        for i in range(400):
            flow.data(t + i * 20, side, 188)
        t += 399 * 20 + 100
    turns = _analyze(tmp_path, flow.frames())["connections"][0]["turns"]
    assert turns["control_frames"]["a->b"]["count"] == 0 and turns["control_frames"]["b->a"]["count"] == 0
    assert turns["bulk_bytes"] == {"a->b": 800 * 188, "b->a": 800 * 188}
    assert turns["handoff_count"] == 3

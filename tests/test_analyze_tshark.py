"""Agreement with tshark on real traffic captured by tcpdump: loopback, a lossy tbf bottleneck in a namespace
pair (retransmissions, duplicate ACKs), a slow reader with a small receive buffer (zero windows), one
connection carrying bulk both ways through a lossy router captured on one end's link (also with packets the
kernel dropped from the capture), and a capture started mid-stream; plus scapy-built captures for the rules
that decide those cases, with exact known answers.

Per direction: packets and payload bytes exactly; every tshark verdict in STATE_FLAGS exactly, frame by frame
(docs/analyzer.md: Wireshark 4.0's tcp_analyze_sequence_number, check by check).
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
from capture_helpers import (
    TSHARK_FLAGS,
    bulk_transfer,
    diag_directions,
    duplex_transfer,
    flagged_frames,
    loopback_capture,
    need_tools,
    netns_pair,
    routed_path,
    tc,
    tshark_directions,
)

from diag.capture import analyze_files, start_capture

# diag PacketState attribute for each per-direction counter compared frame by frame.
STATE_FLAGS = {"retransmissions": "retransmission", "fast_retransmissions": "fast_retransmission",
               "spurious_retransmissions": "spurious_retransmission", "out_of_order": "out_of_order",
               "lost_segments": "lost_segment", "dup_acks": "dup_ack", "zero_windows": "zero_window",
               "window_full": "window_full"}


@pytest.fixture(autouse=True)
def both_engines(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every analysis here runs the C kernel (diag.capture._ctcp) and its numpy twin and fails where their
    arrays differ (DIAG_NATIVE=check); where the kernel is not built, the twin runs alone."""
    monkeypatch.setenv("DIAG_NATIVE", "check")


def assert_agrees_with_tshark(pcap: Path) -> dict:
    result = analyze_files([pcap])
    theirs = tshark_directions(pcap)
    ours = diag_directions(result)
    assert set(theirs) == set(ours)
    for key, t in theirs.items():
        assert ours[key]["packets"] == t["packets"], key
        assert ours[key]["payload_bytes"] == t["payload_bytes"], key
        for name in STATE_FLAGS:
            assert ours[key][name] == len(t[name]), (key, name)
    for name, attribute in STATE_FLAGS.items():
        tshark_frames = sorted(f for t in theirs.values() for f in t[name])  # type: ignore[attr-defined]
        assert flagged_frames(pcap, attribute) == tshark_frames, name
    assert TSHARK_FLAGS  # the compared set is documented in capture_helpers
    return result


def test_loopback_bidirectional(tmp_path: Path) -> None:
    need_tools("tshark")
    pcap = tmp_path / "lo.pcap"
    info = loopback_capture(pcap, 128, ("127.0.0.1", 4_000_000, 1_000_000))
    assert info.kernel_dropped == 0 and info.tool == "tcpdump"
    result = assert_agrees_with_tshark(pcap)
    conn = result["connections"][0]
    # Unique bytes are exact; the total may include retransmissions (seen on the shared loopback under load:
    # b->a carried 1,095,232 payload bytes for 1,000,000 sent, and tshark agreed).
    for label, sent in (("a->b", 4_000_000), ("b->a", 1_000_000)):
        assert conn["directions"][label]["unique_payload_bytes"] == sent, label
        assert conn["directions"][label]["payload_bytes"] >= sent, label
    assert conn["directions"]["a->b"]["window"]["scale"] is not None


@pytest.mark.slow
def test_lossy_bottleneck_retransmissions_and_dup_acks(tmp_path: Path) -> None:
    need_tools("tcpdump", "tshark", "ethtool")
    pcap = tmp_path / "tbf.pcap"
    with netns_pair("tb") as pair:
        subprocess.run(["ip", "netns", "exec", pair.a, "ethtool", "-K", pair.dev_a, "tso", "off", "gso", "off"],
                       capture_output=True, timeout=20)
        tc(pair.a, "qdisc", "add", "dev", pair.dev_a, "root", "tbf", "rate", "100mbit", "burst", "16kb",
           "limit", "15000")
        handle = start_capture(pcap, pair.dev_b, "tcp", 128, netns=pair.b)
        try:
            bulk_transfer((pair.addr_b, 0), (pair.addr_b, 47001), 2_000_000, server_ns=pair.b, client_ns=pair.a)
        finally:
            handle.stop()
    result = assert_agrees_with_tshark(pcap)
    ours = diag_directions(result)
    sender = ours[(f"{pair.addr_a}:{result['connections'][0]['a'].split(':')[1]}", f"{pair.addr_b}:47001")]
    assert sender["retransmissions"] > 0
    assert sum(d["dup_acks"] for d in ours.values()) > 0


@pytest.mark.slow
def test_slow_reader_zero_windows(tmp_path: Path) -> None:
    need_tools("tcpdump", "tshark")
    pcap = tmp_path / "zw.pcap"
    with netns_pair("zw") as pair:
        handle = start_capture(pcap, pair.dev_b, "tcp", 128, netns=pair.b)
        try:
            bulk_transfer((pair.addr_b, 0), (pair.addr_b, 47002), 150_000, server_ns=pair.b, client_ns=pair.a,
                          server_rcvbuf=2048, read_delay_s=0.005)
        finally:
            handle.stop()
    result = assert_agrees_with_tshark(pcap)
    assert sum(d["zero_windows"] for d in diag_directions(result).values()) > 0


def test_out_of_order_threshold_is_measured_from_the_clients_syn(tmp_path: Path) -> None:
    """Wireshark's handshake RTT (ts_first_rtt) runs from the SYN, not the SYN-ACK, to the first ACK.

    Built so the difference decides: SYN at 0, SYN-ACK at 18 us, ACK at 30 us; a segment that fills a hole
    26 us after the highest segment is out-of-order for tshark (26 < 30) but would be a retransmission with
    a threshold taken from the SYN-ACK (26 > 12). Found by a lossy capture in CI.
    """
    need_tools("tshark")
    from scapy.all import IP, TCP, Ether, wrpcap

    a, b, sport, dport = "10.61.0.1", "10.61.0.2", 40000, 5000
    t0 = 1_700_000_000.0
    packets = []

    def add(dt_us: float, pkt) -> None:
        pkt.time = t0 + dt_us * 1e-6
        packets.append(pkt)

    def data(seq: int, dt_us: float) -> None:
        add(dt_us, Ether() / IP(src=a, dst=b) / TCP(sport=sport, dport=dport, flags="A", seq=seq, ack=1001)
            / (b"x" * 100))

    add(0, Ether() / IP(src=a, dst=b) / TCP(sport=sport, dport=dport, flags="S", seq=0))
    add(18, Ether() / IP(src=b, dst=a) / TCP(sport=dport, dport=sport, flags="SA", seq=1000, ack=1))
    add(30, Ether() / IP(src=a, dst=b) / TCP(sport=sport, dport=dport, flags="A", seq=1, ack=1001))
    data(1, 100)
    data(201, 110)      # 101..201 is missing
    data(101, 136)      # fills the hole 26 us after the highest segment
    pcap = tmp_path / "ooo.pcap"
    wrpcap(str(pcap), packets)
    result = assert_agrees_with_tshark(pcap)
    forward = diag_directions(result)[(f"{a}:{sport}", f"{b}:{dport}")]
    assert forward["retransmissions"] == 0 and forward["out_of_order"] == 1


# --- one connection, bulk both ways, through a lossy router; and a capture that starts mid-stream --------


def _capture_duplex(pcap: Path, tag: str, nbytes: int, reverse_bytes: int, mid_stream: bool,
                    rate: str = "50mbit", capture_buffer_kib: int | None = None) -> tuple[str, int]:
    """Bulk both ways on one connection a <-> b through r's tbf queues, captured on a's link.

    mid_stream: tcpdump starts 0.3 s after the connection is up (no SYN in the capture).
    capture_buffer_kib: a tiny capture buffer makes the kernel drop packets from the capture.
    Returns (a's address, packets the kernel dropped from the capture). Agreement with tshark holds with
    drops too (tshark sees the same holes); only exact byte counts need a complete capture.
    """
    need_tools("tcpdump", "tshark")
    handles = []

    def start() -> None:
        handles.append(start_capture(pcap, path.dev_a, "tcp", 128, netns=path.a, buffer_kib=capture_buffer_kib))

    def start_later() -> None:
        time.sleep(0.3)
        start()

    with routed_path(tag, rate=rate) as path:
        try:
            if not mid_stream:
                start()
            received = duplex_transfer(path, 47003, nbytes, reverse_bytes,
                                       after_connect=start_later if mid_stream else None)
        finally:
            infos = [handle.stop() for handle in handles]
    assert received == (nbytes, reverse_bytes)
    assert len(infos) == 1 and infos[0].kernel_dropped is not None
    return path.addr_a, infos[0].kernel_dropped


def _one_connection(result: dict, addr_a: str) -> tuple[dict, dict]:
    """(a's sending direction, b's sending direction) of the capture's one connection."""
    assert len(result["connections"]) == 1
    conn = result["connections"][0]
    if conn["a"].split(":")[0] == addr_a:
        return conn["directions"]["a->b"], conn["directions"]["b->a"]
    return conn["directions"]["b->a"], conn["directions"]["a->b"]


@pytest.mark.slow
def test_duplex_bulk_through_a_lossy_router_captured_at_one_end(tmp_path: Path) -> None:
    """a's data is captured before r's queue (drops show as a retransmission of a captured segment), b's
    after it (drops are holes: 'previous segment not captured', then a retransmission below nextseq)."""
    pcap = tmp_path / "duplex.pcap"
    addr_a, dropped = _capture_duplex(pcap, "dx", 3_000_000, 3_000_000, mid_stream=False)
    result = assert_agrees_with_tshark(pcap)
    from_a, from_b = _one_connection(result, addr_a)
    if not dropped:
        assert from_a["unique_payload_bytes"] == 3_000_000 and from_b["unique_payload_bytes"] == 3_000_000
    assert from_a["retransmissions"] > 0 and from_b["retransmissions"] > 0
    assert from_b["lost_segments"] > 0  # b's losses happen before the capture point
    assert result["connections"][0]["duplex_overlap"] > 0


@pytest.mark.slow
def test_capture_started_mid_stream(tmp_path: Path) -> None:
    """No SYN: the window scale is unknown, yet duplicate ACKs are found by raw window values (as tshark)."""
    pcap = tmp_path / "mid.pcap"
    addr_a, _ = _capture_duplex(pcap, "md", 10_000_000, 2_000_000, mid_stream=True)
    result = assert_agrees_with_tshark(pcap)
    from_a, from_b = _one_connection(result, addr_a)
    assert from_a["window"]["scale"] is None and from_b["window"]["scale"] is None
    assert from_b["dup_acks"] > 0
    assert from_a["retransmissions"] + from_a["out_of_order"] > 0


@pytest.mark.slow
def test_duplex_capture_missing_packets_the_peers_received(tmp_path: Path) -> None:
    """A capture the kernel dropped packets from: ACKs of data never captured ("ACKed unseen segment"),
    holes in both directions; tshark's verdicts still agree frame by frame (it sees the same holes)."""
    pcap = tmp_path / "dropped.pcap"
    _, dropped = _capture_duplex(pcap, "dp", 8_000_000, 8_000_000, mid_stream=False, rate="400mbit",
                                 capture_buffer_kib=8)
    result = assert_agrees_with_tshark(pcap)
    assert result["capture"]["flagged"] == (dropped > 0)


# --- scapy-built captures: the rules that decide the two cases above, with exact answers ---------------

SCAPY_A, SCAPY_B, PORT_A, PORT_B = "10.62.0.1", "10.62.0.2", 40000, 5000


def _scapy_pcap(path: Path, steps: list[tuple[float, str, str, int, int, int, int]], options: dict | None = None
                ) -> Path:
    """steps: (microseconds after the previous packet, sender "a"/"b", flags, seq, ack, raw window, payload)."""
    from scapy.all import IP, TCP, Ether, wrpcap

    packets = []
    t = 1_700_000_000.0
    for dt_us, sender, flags, seq, ack, window, payload in steps:
        t += dt_us * 1e-6
        src, dst, sport, dport = ((SCAPY_A, SCAPY_B, PORT_A, PORT_B) if sender == "a"
                                  else (SCAPY_B, SCAPY_A, PORT_B, PORT_A))
        tcp = TCP(sport=sport, dport=dport, flags=flags, seq=seq % (1 << 32), ack=ack % (1 << 32), window=window,
                  options=(options or {}).get(flags, []))
        packet = Ether() / IP(src=src, dst=dst) / tcp / (b"x" * payload)
        packet.time = t
        packets.append(packet)
    wrpcap(str(path), packets)
    return path


def _duplex_rules_pcap(path: Path) -> Path:
    """Both sides send data; b's data is lost before the capture point (as behind a queue)."""
    a, b = 1000, 50000
    return _scapy_pcap(path, [
        (0, "a", "S", a, 0, 64000, 0),                 # 1
        (20, "b", "SA", b, a + 1, 64000, 0),           # 2
        (20, "a", "A", a + 1, b + 1, 500, 0),          # 3
        (100, "a", "A", a + 1, b + 1, 500, 1000),      # 4  a data [1, 1001)
        (10, "a", "A", a + 2001, b + 1, 500, 1000),    # 5  a's [1001, 2001) missing: lost segment
        (10, "b", "A", b + 1, a + 1001, 500, 1000),    # 6  b data, ACKs a's first segment
        (10, "b", "A", b + 1001, a + 1001, 500, 0),    # 7  pure ACK after b's own data, same ack/window: dup #1
        (10, "b", "A", b + 1001, a + 1001, 500, 1000),  # 8  data with the same ack: neither a dup nor a reset
        (10, "b", "A", b + 3001, a + 1001, 500, 0),    # 9  b's [2001, 3001) missing: the pure ACK is a lost
                                                        #    segment and moves b's nextseq to 3001
        (10, "b", "A", b + 3001, a + 1001, 500, 0),    # 10 dup #2 (seq == the ACK-moved nextseq)
        (10, "a", "A", a + 1001, b + 2001, 500, 1000),  # 11 fast retransmission: 2 dups ACKing its seq
        (10, "b", "A", b + 2001, a + 3001, 500, 1000),  # 12 below the ACK-moved nextseq: retransmission
        (5000, "a", "A", a + 1, b + 3001, 500, 1000),  # 13 data b already ACKed: spurious, checked first
        (10, "b", "A", b + 3001, a + 3001, 500, 0),    # 14 pure ACK after b's data with the same ack: dup
    ], options={"S": [("MSS", 1000), ("WScale", 7)], "SA": [("MSS", 1000), ("WScale", 7)]})


def _mid_stream_rules_pcap(path: Path) -> Path:
    """No handshake: window scale unknown; keep-alives and zero-window probes."""
    a, b = 3_000_000_000, 7_000
    return _scapy_pcap(path, [
        (0, "b", "A", b, a, 300, 0),                   # 1  b's first packet (a pure ACK) sets its nextseq
        (10, "a", "A", a, b, 1000, 1000),              # 2
        (10, "a", "A", a + 2000, b, 1000, 1000),       # 3  lost segment
        (10, "b", "A", b, a + 1000, 300, 0),           # 4
        (10, "b", "A", b, a + 1000, 300, 0),           # 5  dup #1: raw window 300 == 300
        (10, "b", "A", b, a + 1000, 301, 0),           # 6  window update: not a dup, the count goes on
        (10, "b", "A", b, a + 1000, 301, 0),           # 7  dup #2
        (10, "a", "A", a + 1000, b, 1000, 1000),       # 8  fast retransmission
        (10, "b", "A", b, a + 3000, 301, 0),           # 9
        (100_000, "a", "A", a + 2999, b, 1000, 0),     # 10 keep-alive (seq = nextseq - 1)
        (10, "b", "A", b, a + 3000, 301, 0),           # 11 keep-alive ACK: not a dup
        (100_000, "a", "A", a + 2999, b, 1000, 1),     # 12 1-byte keep-alive: not a retransmission
        (10, "b", "A", b, a + 3000, 0, 0),             # 13 zero window
        (10, "a", "A", a + 3000, b, 1000, 1),          # 14 zero-window probe: does not move nextseq
        (10, "b", "A", b, a + 3000, 0, 0),             # 15 zero window (the probe's ACK)
        (200_000, "a", "A", a + 3000, b, 1000, 1),     # 16 the probe again: not a retransmission
        (10, "b", "A", b, a + 3000, 300, 0),           # 17 window opens
        (10, "a", "A", a + 3000, b, 1000, 1000),       # 18 data from the probed byte on: new, not resent
        (10, "b", "A", b, a + 4000, 300, 0),           # 19
    ])


def _acked_unseen_rules_pcap(path: Path) -> Path:
    """a ACKs b's data that the capture never saw (as after kernel drops): tshark sets b's duplicate-ACK
    counter to -1 in an unsigned field, so it reads as >= 2 until b's next duplicate ACK or ACK change."""
    a, b = 5000, 90000
    return _scapy_pcap(path, [
        (0, "a", "A", a, b, 500, 1000),                # 1
        (10, "a", "A", a + 2000, b, 500, 1000),        # 2  lost segment: a's [1000, 2000) missing
        (10, "b", "A", b, a + 1000, 500, 1000),        # 3
        (10, "b", "A", b + 1000, a + 1000, 500, 0),    # 4  dup #1
        (4000, "a", "A", a + 3000, b + 2000, 500, 0),  # 5  ACKs b's 2000, beyond all of b captured: reset
        (10, "a", "A", a + 1000, b + 2000, 500, 1000),  # 6  fast retransmission on one duplicate: the reset
        (10, "b", "A", b + 1500, a + 1000, 500, 0),    # 7  lost segment; b's contiguous data still ends at 1000
        (10, "b", "A", b + 1500, a + 1000, 500, 0),    # 8  dup, counted 1 after the reset
        (10, "a", "A", a + 1000, b + 2000, 500, 1000),  # 9  beyond b's nextseq, but b's contiguous end lagged:
                                                        #    it catches up (no reset); 1 dup: not fast
        (10, "a", "A", a + 1000, b + 2000, 500, 1000),  # 10 now the ACK resets again: fast
    ])


# Known answers (frame numbers), worked out from Wireshark 4.0's rules by hand (comments above).
SCAPY_EXPECTED = {
    "duplex": {"retransmission": [11, 12, 13], "fast_retransmission": [11], "spurious_retransmission": [13],
               "out_of_order": [], "lost_segment": [5, 9], "dup_ack": [7, 10, 14], "zero_window": [],
               "window_full": []},
    "mid_stream": {"retransmission": [8], "fast_retransmission": [8], "spurious_retransmission": [],
                   "out_of_order": [], "lost_segment": [3], "dup_ack": [5, 7], "zero_window": [13, 15],
                   "window_full": []},
    "acked_unseen": {"retransmission": [6, 9, 10], "fast_retransmission": [6, 10], "spurious_retransmission": [],
                     "out_of_order": [], "lost_segment": [2, 7], "dup_ack": [4, 8], "zero_window": [],
                     "window_full": []},
}
SCAPY_BUILDERS = {"duplex": _duplex_rules_pcap, "mid_stream": _mid_stream_rules_pcap,
                  "acked_unseen": _acked_unseen_rules_pcap}


@pytest.mark.parametrize("name", sorted(SCAPY_BUILDERS))
def test_sequence_rules_exact(tmp_path: Path, name: str) -> None:
    pcap = SCAPY_BUILDERS[name](tmp_path / f"{name}.pcap")
    for attribute, frames in SCAPY_EXPECTED[name].items():
        assert flagged_frames(pcap, attribute) == frames, attribute


@pytest.mark.parametrize("name", sorted(SCAPY_BUILDERS))
def test_sequence_rules_agree_with_tshark(tmp_path: Path, name: str) -> None:
    need_tools("tshark")
    assert_agrees_with_tshark(SCAPY_BUILDERS[name](tmp_path / f"{name}.pcap"))

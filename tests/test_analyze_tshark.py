"""Agreement with tshark on real traffic captured by tcpdump: loopback, a lossy tbf bottleneck in a namespace
pair (retransmissions, duplicate ACKs), a slow reader with a small receive buffer (zero windows).

Per direction: packets and payload bytes exactly; retransmissions, fast retransmissions, duplicate ACKs,
zero windows and window-full exactly, frame by frame (docs/analyzer.md: where the definitions match).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from capture_helpers import (
    TSHARK_FLAGS,
    bulk_transfer,
    diag_directions,
    flagged_frames,
    free_port,
    need_root,
    need_tools,
    netns_pair,
    tc,
    tshark_directions,
)

from diag.capture import analyze_files, start_capture

# diag PacketState attribute for each per-direction counter compared frame by frame.
STATE_FLAGS = {"retransmissions": "retransmission", "fast_retransmissions": "fast_retransmission",
               "dup_acks": "dup_ack", "zero_windows": "zero_window", "window_full": "window_full"}


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
    need_root()
    need_tools("tcpdump", "tshark")
    port = free_port()
    pcap = tmp_path / "lo.pcap"
    handle = start_capture(pcap, "lo", f"tcp port {port}", 128)
    try:
        bulk_transfer(("127.0.0.1", 0), ("127.0.0.1", port), 4_000_000, reverse_bytes=1_000_000)
    finally:
        info = handle.stop()
    assert info.kernel_dropped == 0 and info.tool == "tcpdump"
    result = assert_agrees_with_tshark(pcap)
    conn = result["connections"][0]
    assert conn["directions"]["a->b"]["payload_bytes"] == 4_000_000
    assert conn["directions"]["b->a"]["payload_bytes"] == 1_000_000
    assert conn["directions"]["a->b"]["unique_payload_bytes"] == 4_000_000
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

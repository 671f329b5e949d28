"""Live capture: tcpdump on loopback and inside a namespace, scapy fallback, the capture.json sidecar, CLI."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from capture_helpers import bulk_transfer, loopback_capture, need_tools, netns_pair, tshark_directions

from diag.capture import CaptureInfo, analyze_files, start_capture
from diag.errors import DiagError
from tests.common import free_port, need_root


def test_tcpdump_capture_writes_sidecar_and_counts(tmp_path: Path) -> None:
    pcap = tmp_path / "c.pcap"
    info = loopback_capture(pcap, 96, ("127.0.0.1", 200_000, 0))
    assert isinstance(info, CaptureInfo)
    meta = json.loads((tmp_path / "c.pcap.capture.json").read_text())
    for key in ("iface", "snaplen", "filter", "start_ns", "stop_ns", "kernel_dropped", "packets", "tool", "host"):
        assert key in meta
    assert meta["iface"] == "lo" and meta["snaplen"] == 96 and meta["tool"] == "tcpdump"
    assert meta["kernel_dropped"] == 0 and meta["start_ns"] < meta["stop_ns"]
    result = analyze_files([pcap])
    assert result["capture"]["packets"] == info.packets
    assert result["capture"]["kernel_dropped"] == 0 and result["capture"]["flagged"] is False
    assert result["files"][0]["snaplen"] == 96
    conn = result["connections"][0]
    # every byte once (a loopback segment dropped under load is sent again: payload_bytes counts it twice)
    assert conn["directions"]["a->b"]["unique_payload_bytes"] == 200_000 <= conn["directions"]["a->b"]["payload_bytes"]
    assert meta["start_ns"] / 1e9 <= conn["directions"]["a->b"]["first_ts"] <= meta["stop_ns"] / 1e9


def test_a_capture_cut_to_its_window_keeps_exactly_the_window(tmp_path: Path) -> None:
    """A batched tcpdump (as every node runs it) stopped past the window's end, after the next transfer has
    started, keeps only the window: a's bytes, none of b's, its metadata counting what it kept and ending at
    the cut. Batched, tcpdump would have written nothing of a had it been stopped at the cut."""
    import time

    need_root()
    need_tools("tcpdump")
    port = free_port()
    pcap = tmp_path / "window.pcap"
    handle = start_capture(pcap, "lo", f"tcp port {port}", 128, immediate=False)
    bulk_transfer(("127.0.0.1", 0), ("127.0.0.1", port), 300_000)
    cut_ns = time.time_ns()
    bulk_transfer(("127.0.0.1", 0), ("127.0.0.1", port), 700_000)
    time.sleep(1.1)     # the block holding both retires (diag.inplace.node.BLOCK_RETIRE_S)
    info = handle.stop(cut_ns=cut_ns)
    result = analyze_files([pcap])
    # a's bytes, each once (beside the parallel suite a loopback segment was once sent twice: 314875 in all)
    sent = sorted(c["directions"]["a->b"]["unique_payload_bytes"] for c in result["connections"])
    assert sent == [300_000], sent
    assert info.stop_ns == cut_ns and info.packets == result["capture"]["packets"] > 0
    meta = json.loads((tmp_path / "window.pcap.capture.json").read_text())
    assert meta["stop_ns"] == cut_ns and meta["packets"] == info.packets
    assert max(c["directions"]["a->b"]["last_ts"] for c in result["connections"]) <= cut_ns / 1e9


def test_capture_inside_namespace(tmp_path: Path) -> None:
    need_tools("tcpdump")
    pcap = tmp_path / "ns.pcap"
    with netns_pair("cp") as pair:
        handle = start_capture(pcap, pair.dev_b, "tcp", 128, netns=pair.b)
        bulk_transfer((pair.addr_b, 0), (pair.addr_b, 47010), 300_000, server_ns=pair.b, client_ns=pair.a)
        info = handle.stop()
    assert info.netns == pair.b and info.packets and info.packets > 10
    result = analyze_files([pcap])
    assert {h["address"] for h in result["hosts"]} == {pair.addr_a, pair.addr_b}


def test_bad_interface_is_a_one_line_error(tmp_path: Path) -> None:
    need_root()
    need_tools("tcpdump")
    with pytest.raises(DiagError, match="did not start"):
        start_capture(tmp_path / "x.pcap", "no-such-if0", "tcp", 128)


def test_scapy_fallback(tmp_path: Path) -> None:
    need_root()
    port = free_port()
    pcap = tmp_path / "scapy.pcap"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        handle = start_capture(pcap, "lo", f"tcp port {port}", 80, tool="scapy")
    assert any("drops packets" in str(w.message) for w in caught)
    bulk_transfer(("127.0.0.1", 0), ("127.0.0.1", port), 50_000)
    info = handle.stop()
    assert info.tool == "scapy" and info.kernel_dropped is None
    result = analyze_files([pcap])
    assert result["capture"]["packets"] > 0
    if need_tools_present("tshark"):
        theirs = tshark_directions(pcap)
        assert sum(t["packets"] for t in theirs.values()) == result["capture"]["packets"]


def need_tools_present(tool: str) -> bool:
    import shutil

    return shutil.which(tool) is not None


def test_capture_cli_with_duration(tmp_path: Path) -> None:
    need_root()
    need_tools("tcpdump")
    pcap = tmp_path / "cli.pcap"
    proc = subprocess.run([sys.executable, "-m", "diag", "capture", "-i", "lo", "-w", str(pcap), "--duration", "0.5",
                           "-f", "tcp port 9"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "kernel dropped 0" in proc.stderr
    assert json.loads((tmp_path / "cli.pcap.capture.json").read_text())["tool"] == "tcpdump"

"""`diag analyze` end to end: table, --json contract keys, --records phases, --plot."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from capture_helpers import LINK_HEADERS, synthetic_flow, write_pcap

from diag.records import Record, RecordWriter

DIR_KEYS = {"packets", "payload_bytes", "unique_payload_bytes", "retransmissions", "fast_retransmissions", "dup_acks",
            "zero_windows", "window_full", "first_ts", "last_ts", "goodput_Bps", "active_goodput_Bps", "rtt_ms",
            "idle_gaps", "throughput"}
CONN_KEYS = {"a", "b", "directions", "duplex_overlap", "active_s", "overlap_Bps", "alone_Bps"}
HOST_KEYS = {"address", "tx_bytes", "rx_bytes", "duplex_overlap", "tx_Bps_overlap", "rx_Bps_overlap", "active_s"}


def _record(start_ns: int, windows: list[list[int]]) -> Record:
    return Record(backend="gloo", algo="default", op="all_gather", world_size=2, size_bytes=1 << 20,
                  total_bytes=2 << 20, volume_bytes=1 << 20, dtype="float32", count=1 << 18, iters=len(windows),
                  warmup=1, times_s=[0.001] * len(windows), time_s=0.001, min_s=0.001, max_s=0.001, mean_s=0.001,
                  p95_s=0.001, stdev_s=0.0, algbw_Bps=1.0, busbw_Bps=1.0, nwrong=0, t_start_ns=start_ns,
                  t_end_ns=windows[-1][1], iter_windows_ns=windows, run_id="r1")


def _diag(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "diag", "analyze", *args], capture_output=True, text=True,
                          timeout=120)


def test_json_contract_phases_and_plots(tmp_path: Path) -> None:
    frames = [(t, LINK_HEADERS[1](ip, False)) for t, ip in synthetic_flow()]
    pcap = write_pcap(tmp_path / "f.pcap", frames, 1)
    ts_ns = [round(t * 1e6) * 1000 for t, _ in frames]  # as stored: microsecond pcap
    # Two "iterations": the first 10 packets and the rest (windows are inclusive wall-clock ranges).
    windows = [[ts_ns[0], ts_ns[9]], [ts_ns[10], ts_ns[-1]]]
    records = tmp_path / "run.jsonl"
    with RecordWriter(records) as writer:
        writer.start("r1", env={}, spec={})
        writer.record(_record(ts_ns[0], windows))
        writer.end("r1", "ok")
    proc = _diag(str(pcap), "--records", str(records), "--json", "--plot", str(tmp_path / "plots"))
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["schema"] == 1 and {"files", "capture", "connections", "hosts", "phases", "warnings"} <= set(result)
    assert {"kernel_dropped", "flagged"} <= set(result["capture"])
    conn = result["connections"][0]
    assert set(conn) >= CONN_KEYS and 0 <= conn["duplex_overlap"] <= 1
    for d in conn["directions"].values():
        assert set(d) >= DIR_KEYS
        assert {"median", "p95", "n"} <= set(d["rtt_ms"]) and {"count", "total_s", "max_s"} <= set(d["idle_gaps"])
        assert {"bin_s", "t0", "Bps"} <= set(d["throughput"])
    assert set(result["hosts"][0]) >= HOST_KEYS
    assert [ph["packets"] for ph in result["phases"]] == [10, len(frames) - 10]
    first = result["phases"][0]["phase"]
    assert first == {"backend": "gloo", "algo": "default", "op": "all_gather", "world_size": 2,
                     "size_bytes": 1 << 20, "iteration": 0, "t_start_ns": windows[0][0], "t_end_ns": windows[0][1]}
    per_phase = sum(c["directions"]["a->b"]["packets"] + c["directions"]["b->a"]["packets"]
                    for ph in result["phases"] for c in ph["connections"])
    assert per_phase == len(frames)
    assert sum(ph["connections"][0]["directions"]["b->a"]["dup_acks"] for ph in result["phases"]) == 4
    assert list((tmp_path / "plots").glob("*.png"))

    table = _diag(str(pcap), "--records", str(records))
    assert table.returncode == 0
    assert "duplex overlap" in table.stdout and "10.9.0.1:40000 > 10.9.0.2:5000" in table.stdout
    assert "gloo/default all_gather N=2" in table.stdout


def test_records_outside_the_capture_warn(tmp_path: Path) -> None:
    frames = [(t, LINK_HEADERS[1](ip, False)) for t, ip in synthetic_flow()]
    pcap = write_pcap(tmp_path / "f.pcap", frames, 1)
    records = tmp_path / "run.jsonl"
    with RecordWriter(records) as writer:
        writer.record(_record(10, [[10, 20]]))
    proc = _diag(str(pcap), "--records", str(records), "--json")
    assert any("no packet falls inside" in w for w in json.loads(proc.stdout)["warnings"])

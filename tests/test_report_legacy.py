"""diag report still renders run directories of the last release: a sweep's <out>.d as `diag sweep --capture
--observe` wrote it before every command wrote the one run-directory layout (one capture point at the top, its
records beside it in <out>.jsonl). The directory is built here by code, file for file as that release's
runner and capture/observer hooks wrote it (git show 7291be7:diag/runner.py, diag/hooks.py)."""

from __future__ import annotations

import json
from pathlib import Path

from report_helpers import LINK_BPS, TEST_ENV, ideal_time, make_record, timed

from diag.records import Record, RecordWriter
from tests.common import run_diag

MiB = 1 << 20


def _old_sweep(tmp_path: Path) -> tuple[Path, Path]:
    """diag sweep --nproc 2,3 --sizes 1M,4M --capture --observe --out sweep.jsonl, as the last release ran it:
    one launch per N, run ids <id>-n<N>, each start naming the run directory and its capture's tag."""
    out, run_dir = tmp_path / "sweep.jsonl", tmp_path / "sweep.d"
    earlier = make_record("gloo", "all_gather", 2, MiB, timed(0.2, seed=99))   # an earlier run in the same --out
    with RecordWriter(out) as writer:
        writer.start("0ld0ld0ld0ld-n2", env=TEST_ENV, world_size=2, spec={"backend": "gloo", "algo": "default"},
                     meta={"lab": None, "capture": None, "capture_tag": None, "run_dir": str(tmp_path / "other.d")})
        writer.record(Record(**{**earlier.__dict__, "run_id": "0ld0ld0ld0ld-n2"}))
        writer.end("0ld0ld0ld0ld-n2", "ok")
        for n in (2, 3):
            run_id, tag = f"abcdefabcdef-n{n}", f"gloo-all_gather-n{n}"
            writer.start(run_id, t_ns=1, world_size=n, spec={"backend": "gloo", "algo": "default", "ops": ["all_gather"]},
                         argv=["sweep", "--nproc", "2,3", "--capture", "--observe"], hosts=[f"h/10.0.0.{i + 1}" for i in range(n)],
                         knobs={}, env=TEST_ENV, meta={"lab": "lab1", "capture": "", "capture_tag": tag,
                                                        "run_dir": str(run_dir.resolve())})
            for size in (MiB, 4 * MiB):
                slow = 1.6 if n == 2 else 1.0
                row = make_record("gloo", "all_gather", n, size, timed(ideal_time("all_gather", n, size, LINK_BPS, slow)))
                writer.record(Record(**{**row.__dict__, "run_id": run_id}))
            writer.end(run_id, "ok", rows=2)
    # <out>.d: logs of each launch, one capture and one observer file per N (on rank 0's host link)
    for n in (2, 3):
        tag = f"gloo-all_gather-n{n}"
        (run_dir / "logs" / f"state-n{n}").mkdir(parents=True, exist_ok=True)
        (run_dir / "logs" / f"state-n{n}" / "rank0.json").write_text(json.dumps({"rank": 0, "status": "done"}))
        (run_dir / "logs" / f"launcher-n{n}-h0.log").write_text("")
        (run_dir / "captures").mkdir(exist_ok=True)
        (run_dir / "captures" / f"{tag}.pcap").write_bytes(bytes.fromhex("d4c3b2a1020004000000000000000000ffff000001000000"))
        (run_dir / "captures" / f"{tag}.pcap.capture.json").write_text(json.dumps({
            "path": str(run_dir / "captures" / f"{tag}.pcap"), "iface": "eth0", "snaplen": 128, "filter": "tcp",
            "start_ns": 1, "stop_ns": 2, "kernel_dropped": 7 if n == 2 else 0, "packets": 1000, "tool": "tcpdump",
            "host": "h", "netns": "diag-lab1-h0", "warnings": []}))
        (run_dir / "observe").mkdir(exist_ok=True)
        samples = [{"kind": "cpu_thread", "t_ns": 10 + k, "pid": 100, "tid": 101, "name": "python", "cpu_pct": 40.0}
                   for k in range(5)] + [{"kind": "cpu_host", "t_ns": 10, "cpus": 2, "busy_pct": 30.0,
                                          "per_cpu_pct": [30.0, 30.0]}]
        (run_dir / "observe" / f"{tag}.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    return out, run_dir


def test_report_renders_a_sweep_run_directory_of_the_last_release(tmp_path: Path) -> None:
    _out, run_dir = _old_sweep(tmp_path)
    from diag.report import load_run

    run = load_run([run_dir])
    # this directory's runs only (--out was appended to by an earlier sweep with its own run directory)
    assert sorted((r.world_size, r.size_bytes) for r in run.records) == [(2, MiB), (2, 4 * MiB), (3, MiB), (3, 4 * MiB)]
    # each capture's N and transport come from the start event that names its tag, not from its file name
    assert {tag: (c.world_size, c.transport) for tag, c in run.captures.items()} == {
        "gloo-all_gather-n2": (2, "torch:gloo"), "gloo-all_gather-n3": (3, "torch:gloo")}
    assert len(run.observe_samples) == 12 and not run.nodes

    report = tmp_path / "report"
    proc = run_diag("report", str(run_dir), "--out", str(report))
    assert proc.returncode == 0, proc.stderr[-2000:]
    findings = {f["rule"]: f for f in json.loads((report / "findings.json").read_text())["findings"]}
    drops = findings["capture_drops"]
    assert drops["status"] == "observed" and "N=2" in drops["evidence"][0]["text"]
    assert drops["evidence"][0]["source"] == "captures/gloo-all_gather-n2.capture.json"
    assert findings["n2_busbw_dip"]["status"] == "fired"
    markdown = (report / "report.md").read_text()
    assert "observe/*.jsonl (no observer samples" not in markdown      # the samples were read
    assert "captures/*.capture.json (no capture metadata" not in markdown


def test_a_legacy_sweep_directory_without_its_records_says_where_they_should_be(tmp_path: Path) -> None:
    out, run_dir = _old_sweep(tmp_path)
    out.unlink()
    proc = run_diag("report", str(run_dir), "--out", str(tmp_path / "r"))
    assert proc.returncode != 0 and len(proc.stderr.strip().splitlines()) == 1
    assert "<out>.jsonl beside it" in proc.stderr

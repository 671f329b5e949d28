"""diag advise for real: gloo on loopback at N=2 with small sizes, baseline and both workarounds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_advise_measures_each_workaround_against_gloo_and_prints_the_code(tmp_path: Path) -> None:
    out = tmp_path / "advise"
    done = subprocess.run([sys.executable, "-m", "diag", "advise", "--sizes", "4K,256K", "--warmup", "1",
                           "--iters", "3", "--out", str(out)], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((out / "advise.json").read_text())
    assert result["complete"] and result["failures"] == [] and result["world_size"] == 2
    assert [w["name"] for w in result["workarounds"]] == ["p2p-recv-first", "diag_tcp"]
    for workaround in result["workarounds"]:
        assert [row["size_bytes"] for row in workaround["rows"]] == [4096, 262144]
        for row in workaround["rows"]:
            assert row["nwrong"] == 0 and row["baseline_nwrong"] == 0
            assert row["iterations"] == 3
            assert row["speedup"] == row["baseline_time_s"] / row["time_s"]
            assert row["verdict"] in ("faster", "slower", "same")
            assert 0.0 <= row["p_value"] <= 1.0
    # the records behind it: one row per (backend, op, size), all checked
    rows = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    records = [(r["backend"], r["op"], r["size_bytes"]) for r in rows if r["event"] == "record"]
    assert sorted(records) == sorted((backend, op, size) for backend, op in (
        ("gloo", "all_gather"), ("gloo", "all_gather_p2p"), ("diag_tcp", "all_gather"))
        for size in (4096, 262144))
    # what a user copies into the script
    assert "dist.batch_isend_irecv(ops)" in done.stdout and "DIST_BACKEND=diag_tcp" in done.stdout
    assert "x (" in done.stdout and "loopback" in done.stdout

"""diag advise for real: gloo on loopback at N=2 with small sizes, the baseline and both workarounds as the arms
of one interleaved trial (gloo's process group and a diag_tcp one over the same two ranks)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_advise_measures_each_workaround_beside_gloo_in_one_trial_and_prints_the_code(tmp_path: Path) -> None:
    out = tmp_path / "advise"
    done = subprocess.run([sys.executable, "-m", "diag", "advise", "--sizes", "4K,256K", "--warmup", "1",
                           "--iters", "3", "--budget", "8", "--out", str(out)], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((out / "advise" / "advise.json").read_text())
    assert result["schema"] == 2 and result["complete"] and result["failures"] == [] and result["world_size"] == 2
    assert result["design"] == "difference" and result["effect"] == 0.1
    assert [w["name"] for w in result["workarounds"]] == ["p2p-recv-first", "diag_tcp"]
    for workaround in result["workarounds"]:
        assert [row["size_bytes"] for row in workaround["rows"]] == [4096, 262144]
        for row in workaround["rows"]:
            assert row["nwrong"] == 0 and row["baseline_nwrong"] == 0
            assert row["rounds"] >= 3
            assert row["speedup"] == pytest.approx(row["baseline_time_s"] / row["time_s"])
            assert row["speedup_low"] <= row["speedup"] <= row["speedup_high"]
            # the trial's own bootstrap decision over its rounds decides (the statistic of compare and the
            # mechanism trials); no Welch test anywhere. Each verdict agrees with the interval it rests on.
            assert row["decision"]["design"] == "difference" and row["decision"]["interleaved"]
            assert row["decision"]["rounds"] == row["rounds"]
            assert "p_value" not in row and "welch_p" not in row
            low, high, effect = row["speedup_low"], row["speedup_high"], result["effect"]
            if row["verdict"] == "faster":
                assert low > 1 and abs(1 / row["speedup"] - 1) >= effect, row
            elif row["verdict"] == "slower":
                assert high < 1 and abs(1 / row["speedup"] - 1) >= effect, row
            elif row["verdict"] == "same":
                assert 1 - effect <= 1 / high and 1 / low <= 1 + effect, row
            else:
                # undecided only with a reason, and only where the trial ran out of budget or rounds at that size
                assert row["verdict"] == "undecided", row
                assert row["reason"] and result["stopped"][str(row["size_bytes"])] in ("budget", "max_rounds"), row
    # the records behind it: every arm once a round, in the round's recorded order, in ONE launch: gloo's and
    # diag_tcp's arms on their own process groups of the same two ranks
    rows = [json.loads(line) for line in (out / "records" / "advise.jsonl").read_text().splitlines()]
    starts = [r for r in rows if r["event"] == "start"]
    blocks = [r for r in rows if r["event"] == "record"]
    assert len(starts) == 1 and starts[0]["meta"]["trial"]["name"] == "advise"
    assert {(r["backend"], r["op"]) for r in blocks} == {("gloo", "all_gather"), ("gloo", "all_gather_p2p"),
                                                         ("diag_tcp", "all_gather")}
    for size in (4096, 262144):
        by_round: dict[int, list[dict]] = {}
        for r in blocks:
            if r["size_bytes"] == size:
                by_round.setdefault(r["block"]["round"], []).append(r)
        assert len(by_round) >= 3
        for in_round in by_round.values():
            in_order = sorted(in_round, key=lambda r: r["t_start_ns"])
            assert [r["block"]["arm"] for r in in_order] == in_order[0]["block"]["order"]
            assert sorted(r["block"]["arm"] for r in in_order) == ["diag_tcp", "gloo", "p2p-recv-first"]
    # the run directory is the one layout: diag report renders it, Workarounds section and code included
    meta = json.loads((out / "run.json").read_text())
    assert meta["command"] == "advise" and meta["mode"] == "loopback"
    # what a user copies into the script, with the interleaved speed-ups
    assert "dist.batch_isend_irecv(ops)" in done.stdout and "DIST_BACKEND=diag_tcp" in done.stdout
    assert "x [" in done.stdout and "interleaved rounds" in done.stdout and "loopback" in done.stdout
    report = subprocess.run([sys.executable, "-m", "diag", "report", str(out), "--out", str(tmp_path / "report")],
                            capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert report.returncode == 0, report.stderr[-2000:]
    markdown = (tmp_path / "report" / "report.md").read_text()
    assert "## Workarounds (measured)" in markdown and "batch_isend_irecv" in markdown

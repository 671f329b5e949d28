"""diag trial end to end: programs as arms of an interleaved trial, with stand-ins whose speeds are known.

- in place (no root): torchrun starts diag trial on 3 ranks of this machine with --nproc 2,3 (one launch, a
  trial at each N on its subgroup); arms that sleep a known time every iteration (base 0.2 s, faster 0.1 s,
  same 0.2 s), read with the JSON-path adapter: faster is faster (2x), same is equal at both N; diag report
  and diagnose read the run's trials.
- lab (root): tests/programs/move_bytes.py moves a fixed number of bytes over TCP between two lab hosts at
  50 Mbit/s (base 1.5 MiB, fewer 1 MiB, same 1.5 MiB: the link makes the time), beside arms that fail on one
  rank only, print nothing, or hang past --block-timeout: each of those is one line naming the rank and why,
  its arm leaves the trial, the others are decided, and diag exits 1.

Neither needs gloo's own benchmark (docs/upstream/gloo-471.md builds it from a gloo tree the user provides):
its adapter is held to outputs it printed (tests/data/gloo-benchmark, tests/test_trial_adapters.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from diag.report import load_run
from diag.report.arms import arm_tables

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]
PROGRAM = REPO / "tests" / "programs" / "move_bytes.py"
SLEEP = ("python3 -S -c \"import json, time\nfor _ in range({iters}):\n t = time.perf_counter(); time.sleep(%s)\n"
         " print(json.dumps({'seconds': time.perf_counter() - t}))\"")


def _trial(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "diag", "trial", *args], capture_output=True, text=True,
                          timeout=timeout)


def _verdicts(run_dir: Path) -> dict[int, dict[str, str]]:
    return {t.world_size: {v.arm: v.word for v in t.verdicts} for t in arm_tables(load_run([str(run_dir)]))}


def test_stand_ins_that_sleep_are_faster_and_equal_in_place(tmp_path: Path) -> None:
    """In place: the user's own torchrun starts diag trial on every rank (each builds its own plan and run
    directory name: they must still run rank 0's trial), N=2 and N=3 on subgroups of one launch."""
    from diag.launch import free_port

    out = tmp_path / "run"
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "3", "--nnodes", "1", "--node-rank", "0",
         "--rdzv-backend", "static", "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
         "-m", "diag", "trial", "--world-sizes", "2,3", "--sizes", "1K", "--adapter", "json:seconds", "--iters", "2",
         "--warmup", "0", "--min-rounds", "4", "--max-rounds", "8", "--effect", "0.1", "--budget", "60",
         "--out", str(out),
         "--arm", f"base={SLEEP % 0.2}", "--arm", f"faster={SLEEP % 0.1}", "--arm", f"same={SLEEP % 0.2}"],
        capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _verdicts(out) == {2: {"faster": "faster", "same": "equal"}, 3: {"faster": "faster", "same": "equal"}}
    for table in arm_tables(load_run([str(out)])):
        faster = next(v for v in table.verdicts if v.arm == "faster")
        assert faster.speedup is not None and 1.6 < faster.speedup.point < 2.4, (table.world_size, faster)   # 0.2/0.1
    # every rank ran the same arm in every block: every sleep of arm faster was the short one
    kept = sorted((out / "outputs" / "n3" / "faster").iterdir())
    slept = [json.loads(line)["seconds"] for path in kept for line in path.read_text().splitlines()
             if line.startswith("{")]
    assert len(slept) == 3 * 2 * len(kept) and max(slept) < 0.15, slept
    # the records are the trial's own blocks, one run per N: backend command, the arm as its algo
    records = [json.loads(line) for line in (out / "records" / "ab.jsonl").read_text().splitlines()]
    blocks = [r for r in records if r["event"] == "record"]
    assert {(r["backend"], r["algo"]) for r in blocks} == {("command", "base"), ("command", "faster"),
                                                           ("command", "same")}
    assert {r["world_size"] for r in blocks} == {2, 3}
    assert all(r["block"]["trial"] == "ab" and len(r["times_s"]) == 2 for r in blocks)
    assert all(r["extra"]["program"]["statistic"] == "samples" for r in blocks)
    ends = [r for r in records if r["event"] == "end"]
    assert len(ends) == 2 and all(e["status"] == "ok" and e["trial"]["failed_arms"] == {} for e in ends)
    assert json.loads((out / "run.json").read_text())["command"] == "trial"
    assert "against the baseline" in proc.stdout and "faster: " in proc.stdout
    # every block's output is kept, rank by rank
    assert len(kept) == len([b for b in blocks if b["algo"] == "faster" and b["world_size"] == 3])
    assert "## rank 2" in kept[0].read_text()
    # report and diagnose read the trials from files, like any trial; the card is the arms'
    report = subprocess.run([sys.executable, "-m", "diag", "report", str(out)], capture_output=True, text=True,
                            timeout=120)
    assert report.returncode == 0, report.stderr[-2000:]
    assert "slow:       faster against base: faster at N=2, N=3 (" in report.stdout, report.stdout
    assert "same against base: equal at N=2, N=3" in report.stdout and "warning" not in report.stderr
    markdown = (out / "report" / "report.md").read_text()
    assert "Programs compared (interleaved trials)" in markdown and "| faster |" in markdown.replace("  ", " ")
    from diag.report.diagnose import diagnose

    assert not [f for f in diagnose(load_run([str(out)])) if f.status == "fired"]
    print(f"in-place stand-ins (N=2,3 in one launch): {time.monotonic() - started:.0f} s")


@pytest.fixture
def lab2(need_root):
    from diag.lab import LabConfig, lab_session

    with lab_session(LabConfig(name=f"tp{os.getpid() % 100000}", hosts=2, rate="50mbit")) as lab:
        yield lab


def test_stand_ins_over_tcp_on_the_lab_and_arms_that_fail(lab2, tmp_path: Path) -> None:
    out = tmp_path / "run"
    move = f"python3 -S {PROGRAM} --rank {{rank}} --world {{world}} --master {{master}} --port {{port}} --iters {{iters}}"
    started = time.monotonic()
    proc = _trial("--lab", lab2.name, "--nproc", "2", "--sizes", "1M", "--adapter", "json:seconds@s",
                  "--iters", "2", "--warmup", "0", "--min-rounds", "4", "--max-rounds", "8", "--effect", "0.1",
                  "--budget", "60", "--block-timeout", "4", "--out", str(out), "--name", "tcp",
                  "--arm", f"base={move} --bytes 1572864",
                  "--arm", f"fewer={move} --bytes {{bytes}}",
                  "--arm", f"same={move} --bytes 1572864",
                  "--arm", "fails=if [ {rank} = 1 ]; then echo rank one gives up >&2; exit 3; fi; sleep 60",
                  "--arm", "silent=true",
                  "--arm", "hangs=sleep 60")
    wall = time.monotonic() - started
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert _verdicts(out) == {2: {"fewer": "faster", "same": "equal"}}
    (table,) = arm_tables(load_run([str(out)]))
    assert set(table.failed) == {"fails", "silent", "hangs"}
    # one line each, naming the rank and why; rank 0 of 'fails' was stopped at once, not at the timeout
    assert "rank 1 on 10." in table.failed["fails"] and "exit 3: rank one gives up" in table.failed["fails"]
    assert "printed nothing the adapter json:seconds@s reads" in table.failed["silent"]
    assert "no end after 4 s (--block-timeout)" in table.failed["hangs"]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("diag trial: trial tcp N=2: arm ")]
    assert len(lines) == 3 and all("round 1" in line for line in lines)
    records = [json.loads(line) for line in (out / "records" / "tcp.jsonl").read_text().splitlines()]
    assert not [r for r in records if r["event"] == "record" and r["algo"] in table.failed]
    # the 1 MiB arm moved its bytes over a 50 Mbit/s link (6.25 MB/s, less the headers): busbw = D / time
    assert 4.0e6 < table.cells[("fewer", 1 << 20)].busbw_Bps < 6.25e6
    print(f"lab stand-ins: {wall:.0f} s")

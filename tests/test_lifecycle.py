"""Ranks live exactly as long as their sweep: long rows are not "hung", and no exit path leaves ranks behind.

Real launchers, real gloo ranks, real signals. A process "of a run" is any live process whose command line
names the run's job file (the torchrun launcher and every worker carry it).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.lab_faults import processes_naming  # one /proc scan for the tests and the fault bench
from diag.records import load_records

DIAG = [sys.executable, "-m", "diag"]


def wait_gone(needle: str, seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    left = processes_naming(needle)
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = processes_naming(needle)
    return left


def wait_running(run_dir: Path, world: int, seconds: float = 180) -> dict[int, dict]:
    """State files of every rank once all of them run a row."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        states = {}
        for path in (run_dir / "logs" / f"state-n{world}").glob("rank*.json"):
            try:
                data = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            states[data["rank"]] = data
        if len(states) == world and all(s.get("status") == "running" for s in states.values()):
            return states
        time.sleep(0.1)
    pytest.fail(f"ranks were not all running within {seconds} s")


def start_sweep(tmp_path: Path, *extra: str, env: dict[str, str] | None = None) -> tuple[subprocess.Popen, Path, Path]:
    out, run_dir = tmp_path / "run.jsonl", tmp_path / "run.d"
    proc = subprocess.Popen([*DIAG, "sweep", "--nproc", "2", "--out", str(out), "--run-dir", str(run_dir),
                             "--quiet", *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})})
    return proc, out, run_dir


@pytest.mark.slow
@pytest.mark.waits
def test_a_row_longer_than_the_watchdog_completes(tmp_path: Path) -> None:
    # watchdog = timeout 3 s + slack 2 s = 5 s; the row lasts >= 16 x 0.7 s = 11 s, heartbeats keep it alive.
    proc, out, _run_dir = start_sweep(tmp_path, "--sizes", "1K", "--iters", "16", "--warmup", "0",
                                      "--gap-ms", "700", "--timeout", "3", env={"DIAG_WATCHDOG_SLACK_S": "2"})
    _, stderr = proc.communicate(timeout=180)
    assert proc.returncode == 0, stderr
    row = load_records(out).records[0]
    assert row.iters == 16 and (row.t_end_ns - row.t_start_ns) / 1e9 > 10.5


@pytest.mark.waits
def test_stopped_ranks_are_reported_hung_and_killed(tmp_path: Path) -> None:
    """No progress at all (every rank SIGSTOPped): the watchdog fires and no rank survives, stopped or not.
    Most of it is the watchdog's and the terminate grace's waits (13.1-13.6 s in all beside two busy loops)."""
    proc, _out, run_dir = start_sweep(tmp_path, "--sizes", "1K", "--iters", "100000", "--warmup", "0",
                                      "--gap-ms", "1", "--timeout", "3", env={"DIAG_WATCHDOG_SLACK_S": "2"})
    try:
        states = wait_running(run_dir, 2)
        for state in states.values():
            os.kill(state["pid"], signal.SIGSTOP)
        stopped_at = time.monotonic()
        _, stderr = proc.communicate(timeout=60)
        took = time.monotonic() - stopped_at
    finally:
        if proc.poll() is None:
            proc.kill()
    err = stderr.strip().splitlines()
    assert proc.returncode == 1 and len(err) == 1 and "hung" in err[0], stderr
    assert took < 5 + 5 + 10, took  # watchdog 5 s, then at most the terminate grace and the kill
    assert wait_gone(str(run_dir / "logs" / "job-n2.json"), 10) == []


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGHUP])
def test_killing_the_runner_leaves_no_rank_or_launcher(tmp_path: Path, sig: signal.Signals) -> None:
    proc, out, run_dir = start_sweep(tmp_path, "--sizes", "1K,2K", "--iters", "100000", "--warmup", "0",
                                     "--gap-ms", "1")
    job = str(run_dir / "logs" / "job-n2.json")
    try:
        wait_running(run_dir, 2)
        assert len(processes_naming(job)) == 3  # one launcher, two workers
        proc.send_signal(sig)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert wait_gone(job, 15) == [], "ranks or launcher outlived the runner"
    if sig == signal.SIGKILL:
        return
    assert proc.returncode == 128 + sig
    err = stderr.strip().splitlines()
    assert len(err) == 1 and f"terminated by {sig.name}" in err[0] and "kept" in err[0], stderr
    # rank 0 was stopped by its launcher's SIGTERM and closed its run itself
    loaded = load_records(out)
    assert loaded.ends and loaded.ends[-1]["status"] == "failed"


@pytest.mark.waits
def test_a_supervisor_that_fails_stops_the_ranks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever goes wrong in the launching process while the ranks run (here its supervision loop raises
    once they are up), no launcher and no rank is left behind."""
    from diag import launch
    from diag.inplace.job import JobOptions
    from diag.plan import sweep_plan
    from diag.spec import SweepSpec

    def breaks(*args, **kwargs):
        time.sleep(3)  # ranks are starting by now
        raise RuntimeError("supervisor broke")

    monkeypatch.setattr(launch, "_supervise", breaks)
    plan = sweep_plan(SweepSpec(sizes=(1024,), iters=100000, warmup=0, gap_s=0.001), (2,))
    job = JobOptions(plan=plan.to_json(), command="sweep", out=str(tmp_path / "run"), quiet=True)
    work = tmp_path / "run" / "logs"
    work.mkdir(parents=True)
    with pytest.raises(RuntimeError, match="supervisor broke"):
        launch.run_world(job, [launch.HostLaunch("local", 2)], work)
    assert wait_gone(str(work / "job-n2.json"), 15) == []


def test_the_killed_rank_is_the_cause_however_torchrun_ordered_the_exits() -> None:
    """torchrun's report as it prints it when rank 2 was SIGKILLed and rank 0 saw its connection close first
    (its 'first observed failure'): the launcher's one line names rank 2 and the signal. torchrun's own SIGTERM
    to the survivors is never the cause; with no rank killed otherwise the first observed failure stands."""
    from diag.launch import _root_cause

    def entry(number: int, rank: int, code: str) -> str:
        return (f"[{number}]:\n  time      : 2026-12-05_03:36:10\n  host      : localhost\n"
                f"  rank      : {rank} (local_rank: {rank})\n  exitcode  : {code}\n  error_file: <N/A>\n")

    def report(failures: list[str], root: str) -> str:
        return ("torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n" + "=" * 54
                + "\n/x/diag/inplace/__main__.py FAILED\n" + "-" * 54 + "\nFailures:\n" + "".join(failures)
                + "-" * 54 + "\nRoot Cause (first observed failure):\n" + root + "=" * 54 + "\n")

    killed = report([entry(1, 1, "-15 (pid: 11)"), entry(2, 2, "-9 (pid: 12)")], entry(0, 0, "1 (pid: 10)"))
    assert _root_cause(killed) == (2, -9)
    stopped = report([entry(1, 1, "-15 (pid: 11)")], entry(0, 0, "1 (pid: 10)"))
    assert _root_cause(stopped) == (0, 1)
    assert _root_cause(report([], entry(0, 3, "-11 (pid: 13)"))) == (3, -11)
    assert _root_cause("no failure report") == (None, None)

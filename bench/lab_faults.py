"""Faults on the lab, end to end through the real command line (needs root, ip, tc).

    python -m bench.lab_faults --name NAME [--hosts 3] [--rate 200mbit] [--timeout 10]
                                    [--backends gloo,raw] [--big 200M] [--skip big]

Three checks, each printed as one JSON line, on a lab brought up under NAME and always torn down:

- ``killed_rank``: a 3-rank sweep per backend; once two rows are on disk, one rank is SIGKILLed mid-row. Every
  other rank must fail with a one-line error within timeout + 5 s (their state files' failure times), the
  runner must print one line, and every finished row must load.
- ``killed_runner``: a captured sweep; the runner (``diag sweep``) is SIGKILLed mid-row. No launcher, rank or
  tcpdump of the run may remain, and after ``diag lab down --name NAME`` no namespace of the lab either
  (qdiscs live in them; the root namespace's qdiscs must be as before).
- ``big_row``: one 200 MB all_gather row (N=2, 1 warm-up, --big-iters timed iterations, about 10 s each at
  200mbit) must complete, with the collective timeout and watchdog at their defaults (with 7 iterations the
  row outlasts the 90 s watchdog, which only per-iteration heartbeats satisfy).

Exit code 1 if any check failed.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from diag.lifeline import python_command

DIAG = python_command("-m", "diag")   # -P: never the working directory's diag (this runs as root)


def diag(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*DIAG, *args], capture_output=True, text=True, timeout=timeout)


def processes_naming(needle: str) -> list[int]:
    """Live (not zombie) processes whose command line contains needle."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if needle.encode() in cmdline and state != "Z" and int(entry) != os.getpid():
            found.append(int(entry))
    return found


def wait_for(predicate: Any, seconds: float, step: float = 0.1) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return bool(predicate())


def rows_on_disk(path: Path) -> int:
    try:
        return path.read_bytes().count(b'"event":"record"')
    except OSError:
        return 0


def states(run_dir: Path, world: int) -> dict[int, dict[str, Any]]:
    out = {}
    for path in (run_dir / "logs" / f"state-n{world}").glob("rank*.json"):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        out[int(data["rank"])] = data
    return out


def killed_rank(name: str, backend: str, timeout_s: float, work: Path) -> dict[str, Any]:
    from diag.records import load_records

    out, run_dir = work / f"killed-rank-{backend}.jsonl", work / f"killed-rank-{backend}.d"
    sizes = ",".join(f"{k}M" for k in range(1, 30))
    proc = subprocess.Popen([*DIAG, "sweep", "--lab", name, "--nproc", "3", "--backend", backend, "--sizes", sizes,
                             "--iters", "5", "--warmup", "1", "--timeout", str(timeout_s), "--out", str(out),
                             "--run-dir", str(run_dir), "--quiet"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        if not wait_for(lambda: rows_on_disk(out) >= 2, 300):
            proc.kill()
            return {"check": "killed_rank", "backend": backend, "ok": False, "why": "no rows in 300 s"}
        victim = states(run_dir, 3)[2]
        killed_ns = time.time_ns()
        os.kill(victim["pid"], signal.SIGKILL)
        _, stderr = proc.communicate(timeout=timeout_s + 120)
    finally:
        if proc.poll() is None:
            proc.kill()
    final = states(run_dir, 3)
    exits = {rank: (s.get("t_ns", 0) - killed_ns) / 1e9 for rank, s in final.items()
             if rank != 2 and s.get("status") == "failed"}
    errors = {rank: s.get("error", "") for rank, s in final.items() if rank != 2}
    lines = stderr.strip().splitlines()
    loaded = load_records(out)
    one_line_ranks = all(errors[r] and "\n" not in errors[r] for r in errors)
    ok = (len(exits) == 2 and max(exits.values()) <= timeout_s + 5 and len(lines) == 1 and one_line_ranks
          and len(loaded.records) >= 2 and loaded.ends[-1].get("status") == "failed")
    return {"check": "killed_rank", "backend": backend, "ok": ok, "timeout_s": timeout_s,
            "others_failed_after_s": {str(r): round(v, 2) for r, v in sorted(exits.items())},
            "rank_errors": errors, "runner_stderr": lines, "rows_kept": len(loaded.records),
            "torn_lines": loaded.torn_lines}


def root_qdiscs() -> str:
    return subprocess.run(["tc", "qdisc", "show"], capture_output=True, text=True, timeout=30).stdout


def killed_runner(name: str, work: Path) -> dict[str, Any]:
    from diag.lab.config import owns_netns
    from diag.lab.netns import list_netns

    out, run_dir = work / "killed-runner.jsonl", work / "killed-runner.d"
    qdiscs_before = root_qdiscs()
    sizes = ",".join(f"{k}M" for k in range(1, 30))
    proc = subprocess.Popen([*DIAG, "sweep", "--lab", name, "--nproc", "3", "--sizes", sizes, "--iters", "5",
                             "--warmup", "1", "--capture", "--out", str(out), "--run-dir", str(run_dir), "--quiet"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        if not wait_for(lambda: rows_on_disk(out) >= 1, 300):
            proc.kill()
            return {"check": "killed_runner", "ok": False, "why": "no rows in 300 s"}
        before = processes_naming(str(run_dir))
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    gone = wait_for(lambda: not processes_naming(str(run_dir)), 20)
    left = processes_naming(str(run_dir))
    down = diag("lab", "down", "--name", name, timeout=120)
    namespaces = [ns for ns in list_netns() if owns_netns(name, ns)]
    return {"check": "killed_runner", "ok": gone and down.returncode == 0 and not namespaces
            and root_qdiscs() == qdiscs_before,
            "run_processes_before_kill": len(before), "left_after_20s": left, "lab_down": down.stdout.strip(),
            "namespaces_left": namespaces, "root_qdiscs_unchanged": root_qdiscs() == qdiscs_before,
            "rows_kept": rows_on_disk(out)}


def big_row(name: str, size: str, iters: int, work: Path) -> dict[str, Any]:
    from diag.records import load_records

    out = work / "big.jsonl"
    started = time.monotonic()
    proc = diag("sweep", "--lab", name, "--nproc", "2", "--sizes", size, "--dtype", "uint8", "--iters", str(iters),
                "--warmup", "1", "--out", str(out), "--run-dir", str(work / "big.d"), "--quiet", timeout=900)
    took = time.monotonic() - started
    rows = load_records(out).records if out.exists() else []
    result: dict[str, Any] = {"check": "big_row", "ok": proc.returncode == 0 and len(rows) == 1 and rows[0].nwrong == 0,
                              "size": size, "seconds": round(took, 1), "stderr": proc.stderr.strip().splitlines()[-3:]}
    if rows:
        result.update(times_s=[round(t, 2) for t in rows[0].times_s],
                      busbw_Mbit_s=round(rows[0].busbw_Bps * 8 / 1e6, 1), nwrong=rows[0].nwrong)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.lab_faults", description=__doc__.splitlines()[0])
    parser.add_argument("--name", required=True, help="a lab name of your own (it is brought up and torn down)")
    parser.add_argument("--hosts", type=int, default=3)
    parser.add_argument("--rate", default="200mbit")
    parser.add_argument("--timeout", type=float, default=10.0, help="collective timeout of the killed-rank sweeps")
    parser.add_argument("--backends", default="gloo,raw")
    parser.add_argument("--big", default="200M", help="size of the big row (default 200M)")
    parser.add_argument("--big-iters", type=int, default=2,
                        help="timed iterations of the big row (default 2; 7 outlast the default 90 s watchdog)")
    parser.add_argument("--skip", default="", help="comma list of checks to skip: killed_rank,killed_runner,big_row")
    args = parser.parse_args(argv)
    skip = set(filter(None, args.skip.split(",")))
    results = []
    with tempfile.TemporaryDirectory(prefix="diag-lab-faults-") as tmp:
        work = Path(tmp)
        up = diag("lab", "up", "--name", args.name, "--hosts", str(args.hosts), "--rate", args.rate, timeout=120)
        if up.returncode != 0:
            print(json.dumps({"check": "lab_up", "ok": False, "stderr": up.stderr.strip()}))
            return 1
        try:
            if "big_row" not in skip:
                results.append(big_row(args.name, args.big, args.big_iters, work))
                print(json.dumps(results[-1]), flush=True)
            if "killed_rank" not in skip:
                for backend in filter(None, args.backends.split(",")):
                    results.append(killed_rank(args.name, backend, args.timeout, work))
                    print(json.dumps(results[-1]), flush=True)
            if "killed_runner" not in skip:  # last: it takes the lab down itself
                results.append(killed_runner(args.name, work))
                print(json.dumps(results[-1]), flush=True)
        finally:
            diag("lab", "down", "--name", args.name, timeout=120)
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())

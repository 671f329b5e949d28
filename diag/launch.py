"""Starting ranks. diag never manages rank processes itself: torch's launcher (torch.distributed.run) does.

- In place: under torchrun / srun / any env:// launcher, every rank runs the job directly (diag.runplan).
- Loopback: one ``torch.distributed.run`` on this machine with K workers.
- Lab: one ``torch.distributed.run`` per namespace host (``--nnodes K --node-rank i``), started inside that
  host's namespace, exactly as one would start a job on K real machines.

This module supervises the launchers only: it forwards Ctrl-C, stops the others when one fails, and
turns torchrun's multi-page failure report into one line naming world size, row and rank.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from diag import safefs
from diag.errors import DiagError
from diag.lifeline import CHILD_CWD, child_env, python_command
from diag.units import human_bytes

# After the first launcher fails, the others get this long to fail on their own (their errors name the
# cause better than our SIGTERM would), then they are terminated.
FAILURE_GRACE_S = 3.0
TERMINATE_GRACE_S = 5.0
# No rank reported progress for timeout + this long: the sweep is hung outside any collective. Ranks report
# after every iteration (at most every HEARTBEAT_S), so only a hang, never a long row, trips it.
WATCHDOG_SLACK_S = 30.0
WATCHDOG_SLACK_ENV = "DIAG_WATCHDOG_SLACK_S"   # tests and slow clusters change the slack
HEARTBEAT_S = 1.0
# Until every rank has reported once, the watchdog allows this much more than its interval (slow starts).
STARTUP_GRACE_S = 60.0


@dataclass(frozen=True)
class HostLaunch:
    """One machine (or one namespace host) that runs a launcher for ``nproc`` ranks."""

    name: str
    nproc: int
    address: str = "127.0.0.1"
    netns: str | None = None                            # lab host namespace; None = this namespace
    iface: str | None = None                            # the host's link (captures, GLOO_SOCKET_IFNAME)
    env: dict[str, str] = field(default_factory=dict)   # e.g. GLOO_SOCKET_IFNAME
    # How a command starts on this host, when the host says so (a lab host's Lab.exec_prefix: it may join the
    # host's CPU cgroup before entering its namespace); else derived from netns.
    exec_prefix: tuple[str, ...] = ()

    @property
    def prefix(self) -> tuple[str, ...]:
        if self.exec_prefix:
            return self.exec_prefix
        return ("ip", "netns", "exec", self.netns) if self.netns else ()


def free_port(address: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((address, 0))
        return int(sock.getsockname()[1])


def check_port_free(address: str, port: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((address, port))
        except OSError:
            raise DiagError(
                f"port {port} is already in use on {address}: pass another --master-port, "
                "or leave it out and diag picks a free one"
            ) from None


class Launchable(Protocol):
    """What diag's launcher hands every rank in a 0600 job file (diag.inplace.job.JobOptions). ``module`` is
    what each rank runs with the file's path; ``kept`` where a failed run's finished rows are."""

    module: str
    state_dir: str | None
    heartbeat_s: float

    @property
    def watchdog_base_s(self) -> float: ...

    @property
    def kept(self) -> str | None: ...

    def save(self, path: Path) -> None: ...


def launcher_command(host_index: int, host: HostLaunch, nnodes: int, master_addr: str, master_port: int,
                     job_path: Path, module_name: str = "diag.inplace") -> list[str]:
    """torchrun for one host, every rank running ``python -m MODULE JOB.json``."""
    module = ["-m", module_name]
    # diag.lifeline: the launcher gets SIGTERM (and stops its workers) if this process dies, even by SIGKILL.
    return [
        *host.prefix, *python_command("-m", "diag.lifeline", str(os.getpid()), "-m", "torch.distributed.run"),
        f"--nnodes={nnodes}", f"--node-rank={host_index}", f"--nproc-per-node={host.nproc}",
        "--rdzv-backend=static", f"--master-addr={master_addr}", f"--master-port={master_port}",
        "--max-restarts=0", "--monitor-interval=0.1",
        *module, str(job_path),
    ]


_ROOT_RANK = re.compile(r"rank\s*:\s*(\d+)")
_ROOT_EXIT = re.compile(r"exitcode\s*:\s*(-?\d+)")


def _root_cause(log_text: str) -> tuple[int | None, int | None]:
    """(rank, exit code) from torchrun's failure report: a rank killed by a signal torchrun did not send itself
    (it stops the others with SIGTERM) wherever the report lists it, else its 'Root Cause (first observed
    failure)'. torchrun's first observed failure is whichever exit it saw first: a rank whose peer was killed
    can exit with its connection error before the killed rank's exit is seen."""
    marker = log_text.find("Root Cause")
    if marker < 0:
        return None, None
    start = log_text.rfind("Failures:", 0, marker)
    report = log_text[start if start >= 0 else marker:marker + 2000]
    for entry in re.split(r"\n\s*\[\d+\]:", report)[1:]:
        rank, code = _ROOT_RANK.search(entry), _ROOT_EXIT.search(entry)
        if rank and code and int(code.group(1)) < 0 and int(code.group(1)) != -signal.SIGTERM:
            return int(rank.group(1)), int(code.group(1))
    block = log_text[marker:marker + 2000]
    rank = _ROOT_RANK.search(block)
    code = _ROOT_EXIT.search(block)
    return (int(rank.group(1)) if rank else None, int(code.group(1)) if code else None)


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "failed"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def _read_states(state_dir: Path) -> dict[int, dict[str, Any]]:
    states = {}
    for path in state_dir.glob("rank*.json"):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        states[int(data.get("rank", -1))] = data
    return states


def _latest_progress_ns(state_dir: Path, world_size: int, launched_ns: int) -> int:
    """When a rank last reported progress (the newest state-file change).

    Until every rank has reported once, ranks are starting (importing torch, meeting at the rendezvous,
    which the collective timeout bounds): the watchdog then counts from the launch, with STARTUP_GRACE_S
    more, so a slow start on a loaded machine is not a hang."""
    paths = list(state_dir.glob("rank*.json"))
    if len(paths) < world_size:
        return launched_ns + int(STARTUP_GRACE_S * 1e9)
    latest = 0
    for path in paths:
        try:
            latest = max(latest, path.stat().st_mtime_ns)
        except OSError:
            continue
    return latest


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def _stop_all(procs: Sequence[subprocess.Popen[bytes]], state_dir: Path | None = None,
              job_path: Path | None = None) -> None:
    """SIGTERM every launcher (torchrun stops its workers), SIGKILL what is left after a grace, then any
    worker still alive: torchrun starts each worker in a session of its own, out of the launcher's group."""
    for proc in procs:
        if proc.poll() is None:
            _signal_group(proc, signal.SIGTERM)
    deadline = time.monotonic() + TERMINATE_GRACE_S
    for proc in procs:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal_group(proc, signal.SIGKILL)
            proc.wait()
    if state_dir is not None and job_path is not None:
        _kill_workers(state_dir, job_path)


def _kill_workers(state_dir: Path, job_path: Path) -> None:
    """SIGKILL the workers of this job still alive (pids from their state files, checked by command line)."""
    for state in _read_states(state_dir).values():
        pid = state.get("pid")
        if not isinstance(pid, int) or pid <= 1 or pid == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue  # gone already
        if str(job_path).encode() in cmdline:  # the same pid number could be another process by now
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


def watchdog_slack_s() -> float:
    """The watchdog's slack over the collective timeout: WATCHDOG_SLACK_S, or $DIAG_WATCHDOG_SLACK_S."""
    text = os.environ.get(WATCHDOG_SLACK_ENV)
    if not text:
        return WATCHDOG_SLACK_S
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (0 < value < 1e6):
        raise DiagError(f"${WATCHDOG_SLACK_ENV}={text!r} must be a positive number of seconds")
    return value


def run_world(job: Launchable, hosts: list[HostLaunch], work_dir: Path, master_port: int | None = None,
              console: bool = False) -> None:
    """Start one launcher per host for the job's K ranks and supervise them until all end. ``console``: the
    first host's stderr goes to ours (the job's rank 0 prints its progress there), not to its log.

    Raises DiagError with a one-line summary if any rank fails; finished rows are already on disk.
    """
    world_size = sum(h.nproc for h in hosts)
    master_addr = hosts[0].address
    if master_port is None:
        master_port = free_port("127.0.0.1") if not hosts[0].prefix else 29500 + (os.getpid() % 1000)
    elif not hosts[0].prefix:
        check_port_free(master_addr, master_port)

    watchdog_s = job.watchdog_base_s + watchdog_slack_s()
    work_dir = work_dir.resolve()   # the launchers run in CHILD_CWD: every path they get is absolute
    state_dir = work_dir / f"state-n{world_size}"
    safefs.private_dir(state_dir)
    for stale in state_dir.glob("rank*.json"):
        stale.unlink()
    job = replace(job, state_dir=str(state_dir), heartbeat_s=min(HEARTBEAT_S, watchdog_s / 10))
    job_path = work_dir / f"job-n{world_size}.json"
    job.save(job_path)

    # The launcher re-imports diag in a fresh interpreter (child_env: the same package, never one planted in
    # the working directory; the launcher and its workers run in CHILD_CWD).
    # Its ranks are diag's, not a launcher's: no RANK of this process, no Slurm step they would read as theirs.
    from diag.launchenv import OWN_RANK_VARIABLES

    env_base = child_env({k: v for k, v in os.environ.items() if k not in OWN_RANK_VARIABLES})
    env_base.setdefault("PYTHONUNBUFFERED", "1")

    procs: list[subprocess.Popen[bytes]] = []
    logs: list[Path] = []
    try:
        for index, host in enumerate(hosts):
            log_path = work_dir / f"launcher-n{world_size}-{host.name}.log"
            logs.append(log_path)
            with os.fdopen(safefs.create(log_path, replace=True), "wb") as log:
                procs.append(subprocess.Popen(
                    launcher_command(index, host, len(hosts), master_addr, master_port, job_path,
                                     module_name=job.module),
                    env={**env_base, **host.env}, stderr=None if console and index == 0 else log,
                    stdout=None if index == 0 else log,
                    start_new_session=True,  # Ctrl-C goes to us; we stop the launchers in order
                    cwd=CHILD_CWD,
                ))
        failure = _supervise(procs, state_dir, watchdog_s, job_path, world_size)
    except BaseException:
        # Ctrl-C, SIGTERM/SIGHUP (diag.lifeline.Terminated), or anything raised here: never leave ranks behind.
        _stop_all(procs, state_dir, job_path)
        raise
    if failure is not None:
        _kill_workers(state_dir, job_path)  # a launcher that crashed may have left its workers behind
        raise DiagError(_failure_message(failure, world_size, state_dir, logs, job, watchdog_s), exit_code=1)


def _supervise(procs: list[subprocess.Popen[bytes]], state_dir: Path, watchdog_s: float,
               job_path: Path, world_size: int) -> str | None:
    """Wait for all launchers; returns None on success or a short failure kind."""
    launched_ns = time.time_ns()
    first_failure_at: float | None = None
    failure: str | None = None
    while True:
        codes = [p.poll() for p in procs]
        if all(c is not None for c in codes):
            break
        if failure is None and any(c not in (None, 0) for c in codes):
            failure, first_failure_at = "failed", time.monotonic()
        if first_failure_at is not None and time.monotonic() - first_failure_at > FAILURE_GRACE_S:
            _stop_all(procs, state_dir, job_path)
            break
        latest = _latest_progress_ns(state_dir, world_size, launched_ns)
        if failure is None and latest and time.time_ns() - latest > watchdog_s * 1e9 and not _all_finished(
                state_dir, world_size):
            failure = "hung"
            _stop_all(procs, state_dir, job_path)
            break
        time.sleep(0.1)
    if failure is None and any(p.returncode != 0 for p in procs):
        failure = "failed"
    return failure


def _all_finished(state_dir: Path, world_size: int) -> bool:
    """Every rank said it is done (or failed): it is leaving, not hung, however slowly its process exits."""
    states = _read_states(state_dir)
    return len(states) >= world_size and all(s.get("status") in ("done", "failed") for s in states.values())


def _failure_message(kind: str, world_size: int, state_dir: Path, logs: list[Path], job: Launchable,
                     watchdog_s: float) -> str:
    states = _read_states(state_dir)
    # One launcher per host, each with its own root cause: a rank killed by a signal explains the others'
    # connection errors, so it wins over them.
    causes = [_root_cause(p.read_text(errors="replace")) for p in logs if p.exists()]
    causes = [c for c in causes if c[0] is not None]
    killed = [c for c in causes if c[1] is not None and c[1] < 0]
    root_rank, root_code = (killed or causes or [(None, None)])[0]
    reported = {r: s.get("error") for r, s in states.items() if s.get("status") == "failed"}
    if root_rank is None:
        unfinished = [r for r in range(world_size) if states.get(r, {}).get("status") not in ("done", "failed")]
        root_rank = unfinished[0] if unfinished else (min(reported) if reported else None)
    where = states.get(root_rank or 0) or states.get(0) or {}
    row = ""
    if where.get("op"):
        row = f", {where['op']} {human_bytes(where.get('size_bytes') or 0)}"
    if kind == "hung":
        what = f"no rank made progress for {watchdog_s:.0f} s (hung); all stopped"
    elif root_rank is not None and root_rank in reported and root_code in (None, 1):
        what = f"rank {root_rank}: {reported[root_rank]}"
    else:
        what = f"rank {root_rank if root_rank is not None else '?'} {_describe_exit(root_code)}"
        others = [f"rank {r}: {msg}" for r, msg in sorted(reported.items()) if r != root_rank]
        if others:
            what += f"; then {others[0]}"
    kept = ""
    if job.kept:
        kept = f"; finished rows are in {job.kept}"
    return f"world size {world_size}{row}: {what}{kept} (logs: {logs[0].parent})"


def close_open_runs(out: str | os.PathLike[str], run_id: str, message: str) -> None:
    """Close the runs of ``run_id`` (each N's: <run_id>-n<N>) whose rank 0 died before it could write their
    ``end`` event: a reader then sees them failed, with the launcher's one line, not as still running."""
    if not out or not Path(out).exists():
        return
    from diag.records import RecordWriter, iter_events

    try:
        events = list(iter_events(out))
    except DiagError:
        return
    ended = {e.get("run_id") for e in events if e["event"] == "end"}
    mine = [e["run_id"] for e in events if e["event"] == "start" and str(e.get("run_id", "")).startswith(run_id)
            and e.get("run_id") not in ended]
    if mine and run_id:
        with RecordWriter(out) as writer:
            for open_run in mine:
                writer.end(open_run, "failed", t_ns=time.time_ns(), error=message)

"""Starting ranks. diag never manages rank processes itself: torch's launcher (torch.distributed.run) does.

- In place: under torchrun / srun / any env:// launcher, ``diag sweep`` runs the worker directly.
- Local (``--nproc N``): one ``torch.distributed.run`` on this machine with N workers.
- Lab (``--lab``): one ``torch.distributed.run`` per namespace host (``--nnodes N --node-rank i``), started
  inside that host's namespace, exactly as one would start a job on N real machines.

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
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from diag.errors import DiagError
from diag.units import human_bytes
from diag.worker import Job

# After the first launcher fails, the others get this long to fail on their own (their errors name the
# cause better than our SIGTERM would), then they are terminated.
FAILURE_GRACE_S = 3.0
TERMINATE_GRACE_S = 5.0
# No rank reported progress for timeout + this long: the sweep is hung outside any collective.
WATCHDOG_SLACK_S = 30.0


@dataclass(frozen=True)
class HostLaunch:
    """One machine (or one namespace host) that runs a launcher for ``nproc`` ranks."""

    name: str
    nproc: int
    address: str = "127.0.0.1"
    netns: str | None = None                            # lab host namespace; None = this namespace
    iface: str | None = None                            # the host's link (captures, GLOO_SOCKET_IFNAME)
    env: dict[str, str] = field(default_factory=dict)   # e.g. GLOO_SOCKET_IFNAME

    @property
    def prefix(self) -> tuple[str, ...]:
        return ("ip", "netns", "exec", self.netns) if self.netns else ()


@dataclass
class WorldContext:
    """What hooks (captures, observers) learn about a running world."""

    world_size: int
    hosts: list[HostLaunch]
    run_dir: Path
    tag: str
    launcher_pids: list[int] = field(default_factory=list)
    master_port: int = 0


class WorldHook(Protocol):
    """start() runs before the launchers (a capture sees the connections open); an optional
    launched(context) runs once their pids are known; stop() runs after they ended, also on failure."""

    def start(self, context: WorldContext) -> None: ...

    def stop(self, context: WorldContext) -> None: ...


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


def launcher_command(host_index: int, host: HostLaunch, nnodes: int, master_addr: str, master_port: int,
                     job_path: Path, via_exec: bool = False) -> list[str]:
    """torchrun for one host; ``via_exec`` starts each rank through ``diag.exec`` (registers diag_tcp and
    runs the worker as a script, exactly as ``diag exec`` runs a user's script)."""
    module = ["-m", "diag.exec", "-m", "diag.worker"] if via_exec else ["-m", "diag.worker"]
    return [
        *host.prefix, sys.executable, "-m", "torch.distributed.run",
        f"--nnodes={nnodes}", f"--node-rank={host_index}", f"--nproc-per-node={host.nproc}",
        "--rdzv-backend=static", f"--master-addr={master_addr}", f"--master-port={master_port}",
        "--max-restarts=0", "--monitor-interval=0.1",
        *module, str(job_path),
    ]


_ROOT_RANK = re.compile(r"rank\s*:\s*(\d+)")
_ROOT_EXIT = re.compile(r"exitcode\s*:\s*(-?\d+)")


def _root_cause(log_text: str) -> tuple[int | None, int | None]:
    """(rank, exit code) from torchrun's 'Root Cause (first observed failure)' block."""
    marker = log_text.find("Root Cause")
    if marker < 0:
        return None, None
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


def _latest_progress_ns(state_dir: Path) -> int:
    latest = 0
    for path in state_dir.glob("rank*.json"):
        try:
            latest = max(latest, path.stat().st_mtime_ns)
        except OSError:
            continue
    return latest


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def _stop_all(procs: Sequence[subprocess.Popen[bytes]]) -> None:
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


def run_world(job: Job, hosts: list[HostLaunch], work_dir: Path, hooks: Sequence[WorldHook] = (),
              master_port: int | None = None, tag: str = "", run_dir: Path | None = None) -> None:
    """Start one launcher per host for one world size and supervise them until all end.

    Raises DiagError with a one-line summary if any rank fails; finished rows are already on disk.
    """
    world_size = sum(h.nproc for h in hosts)
    master_addr = hosts[0].address
    if master_port is None:
        master_port = free_port("127.0.0.1") if not hosts[0].prefix else 29500 + (os.getpid() % 1000)
    elif not hosts[0].prefix:
        check_port_free(master_addr, master_port)

    state_dir = work_dir / f"state-n{world_size}"
    state_dir.mkdir(parents=True, exist_ok=True)
    for stale in state_dir.glob("rank*.json"):
        stale.unlink()
    job.state_dir = str(state_dir)
    job_path = work_dir / f"job-n{world_size}.json"
    job.save(job_path)

    env_base = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env_base.setdefault("PYTHONUNBUFFERED", "1")
    # The launcher re-imports diag in a fresh interpreter: make sure it finds the same package.
    package_root = str(Path(__file__).resolve().parent.parent)
    env_base["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env_base.get("PYTHONPATH")) if p)
    context = WorldContext(world_size, hosts, run_dir or work_dir, tag or f"n{world_size}",
                           master_port=master_port)

    procs: list[subprocess.Popen[bytes]] = []
    logs: list[Path] = []
    started_hooks: list[WorldHook] = []
    try:
        for hook in hooks:
            hook.start(context)
            started_hooks.append(hook)
        for index, host in enumerate(hosts):
            log_path = work_dir / f"launcher-n{world_size}-{host.name}.log"
            logs.append(log_path)
            with log_path.open("wb") as log:
                procs.append(subprocess.Popen(
                    launcher_command(index, host, len(hosts), master_addr, master_port, job_path,
                                     via_exec=job.spec.backend == "diag_tcp"),
                    env={**env_base, **host.env}, stderr=log, stdout=None if index == 0 else log,
                    start_new_session=True,  # Ctrl-C goes to us; we stop the launchers in order
                ))
        context.launcher_pids = [p.pid for p in procs]
        for hook in started_hooks:
            if hasattr(hook, "launched"):
                hook.launched(context)  # hooks that need the processes (observers)
        failure = _supervise(procs, state_dir, job.spec.timeout_s)
    except KeyboardInterrupt:
        _stop_all(procs)
        raise
    finally:
        for hook in reversed(started_hooks):
            try:
                hook.stop(context)
            except Exception as exc:  # a hook must never hide the sweep's own outcome
                print(f"diag sweep: warning: {type(hook).__name__} stop failed: {exc}", file=sys.stderr)
    if failure is not None:
        raise DiagError(_failure_message(failure, world_size, state_dir, logs, job), exit_code=1)


def _supervise(procs: list[subprocess.Popen[bytes]], state_dir: Path, timeout_s: float) -> str | None:
    """Wait for all launchers; returns None on success or a short failure kind."""
    first_failure_at: float | None = None
    failure: str | None = None
    while True:
        codes = [p.poll() for p in procs]
        if all(c is not None for c in codes):
            break
        if failure is None and any(c not in (None, 0) for c in codes):
            failure, first_failure_at = "failed", time.monotonic()
        if first_failure_at is not None and time.monotonic() - first_failure_at > FAILURE_GRACE_S:
            _stop_all(procs)
            break
        latest = _latest_progress_ns(state_dir)
        if failure is None and latest and time.time_ns() - latest > (timeout_s + WATCHDOG_SLACK_S) * 1e9:
            failure = "hung"
            _stop_all(procs)
            break
        time.sleep(0.1)
    if failure is None and any(p.returncode != 0 for p in procs):
        failure = "failed"
    return failure


def _failure_message(kind: str, world_size: int, state_dir: Path, logs: list[Path], job: Job) -> str:
    states = _read_states(state_dir)
    log_text = "\n".join(p.read_text(errors="replace") for p in logs if p.exists())
    root_rank, root_code = _root_cause(log_text)
    reported = {r: s.get("error") for r, s in states.items() if s.get("status") == "failed"}
    if root_rank is None:
        unfinished = [r for r in range(world_size) if states.get(r, {}).get("status") not in ("done", "failed")]
        root_rank = unfinished[0] if unfinished else (min(reported) if reported else None)
    where = states.get(root_rank or 0) or states.get(0) or {}
    row = ""
    if where.get("op"):
        row = f", {where['op']} {human_bytes(where.get('size_bytes') or 0)}"
    if kind == "hung":
        what = f"no rank made progress for {job.spec.timeout_s + WATCHDOG_SLACK_S:.0f} s (hung); all stopped"
    elif root_rank is not None and root_rank in reported and root_code in (None, 1):
        what = f"rank {root_rank}: {reported[root_rank]}"
    else:
        what = f"rank {root_rank if root_rank is not None else '?'} {_describe_exit(root_code)}"
        others = [f"rank {r}: {msg}" for r, msg in sorted(reported.items()) if r != root_rank]
        if others:
            what += f"; then {others[0]}"
    kept = ""
    if job.out:
        kept = f"; finished rows are in {job.out}"
    return f"world size {world_size}{row}: {what}{kept} (logs: {logs[0].parent})"


def append_failure_end(out: str | None, run_id: str, message: str) -> None:
    """Close a run whose rank 0 died before it could write its own ``end`` event."""
    if not out or not Path(out).exists():
        return
    from diag.records import RecordWriter, iter_events

    try:
        ended = any(e["event"] == "end" and e.get("run_id") == run_id for e in iter_events(out))
    except DiagError:
        ended = False
    if not ended:
        with RecordWriter(out) as writer:
            writer.end(run_id, "failed", t_ns=time.time_ns(), error=message)

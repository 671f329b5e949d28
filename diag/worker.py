"""One rank's part of one step: the sweep (diag.harness) or the interleaved trial (diag.trial) of a step at one
world size, on the subgroup the job made for it (diag.inplace.job). Rank 0 writes the records (and, for a
sweep, mirrors them into its --out) and prints the nccl-tests-like table.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from diag import safefs
from diag.errors import DiagError
from diag.records import transport_label
from diag.spec import SweepSpec
from diag.transports.group import GroupContext
from diag.trialspec import TrialSpec


@dataclass
class Job:
    """What one rank runs for one step at one world size (the job builds it; nothing reads it from a file)."""

    spec: SweepSpec
    out: str | None                 # records file (rank 0 appends to it)
    run_id: str
    state_dir: str | None = None    # per-rank progress/state files for the launcher
    rows_before: int = 0            # for a progress bar over several world sizes
    rows_total: int = 0
    weight_before: float = 0.0      # the same in bytes x iterations (diag.console.row_weight), for the ETA
    weight_total: float = 0.0
    heartbeat_s: float = 1.0        # at most this long between two state-file updates while a row runs
    quiet: bool = False
    argv: list[str] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)   # lab name, capture settings, ... (into start)
    # The raw transport's run token (hex) for ranks diag starts itself: it reaches them in the job's 0600 file,
    # never through the TCPStore, which any local user can reach. Never written to records.
    token: str | None = None
    mirror: str | None = None       # a second records file rank 0 appends every event to (diag sweep --out)


def env_rank() -> tuple[int, int]:
    """This rank and the world size, as the launcher gave them (torchrun, srun: diag.launchenv)."""
    from diag import launchenv

    launch = launchenv.current()
    if launch is None:
        raise DiagError("not launched by torchrun, srun or another env:// launcher (RANK/WORLD_SIZE unset): pass "
                        "--nproc N to start ranks on this machine, or run under torchrun/srun")
    return launch.rank, launch.world_size


def make_transport(spec: SweepSpec, rank: int, world_size: int, token: str | None = None,
                   group: GroupContext | None = None):
    """``token``: the raw transport's run token (hex) from the job file; None under the user's launcher.
    ``group``: a subgroup of the job (in place: one launch runs every N); rank and world_size are then the
    group's, torch runs on the group's process group (for diag_tcp, one the job made with that backend) and a
    raw mesh meets in the group's own store namespace."""
    if spec.backend == "raw":
        from diag.transports.raw import create_transport

        return create_transport(spec, rank, world_size, spec.timeout_s, store=group.store if group else None,
                                token=bytes.fromhex(token) if token else None)
    from diag.transports.torch_dist import TorchTransport

    if spec.backend == "diag_tcp":
        from diag.transports.raw.backend import ENV_KNOBS, ENV_TOKEN, register

        # what the records say this transport ran with (its group read the knobs when the job made it)
        if spec.knobs:
            os.environ[ENV_KNOBS] = json.dumps(spec.knobs)
        else:
            os.environ.pop(ENV_KNOBS, None)
        if token:
            os.environ[ENV_TOKEN] = token   # this process's own environment: the backend reads it there
        register()   # a no-op when diag.exec started this rank and registered it already
    return TorchTransport(spec.backend, spec.timeout_s, spec.device, group=group)


class StateFile:
    """A tiny per-rank JSON file, rewritten atomically at each row and iteration, read by the launcher."""

    def __init__(self, directory: str | None, rank: int) -> None:
        self.path = Path(directory) / f"rank{rank}.json" if directory else None
        self.state: dict[str, Any] = {"rank": rank, "pid": os.getpid(), "status": "starting"}

    def update(self, **changes: Any) -> None:
        self.state.update(changes, t_ns=time.time_ns())
        if self.path is None:
            return
        # A new file (O_EXCL, O_NOFOLLOW; a planted rank<N>.tmp is removed, never followed) renamed over.
        safefs.write_file(self.path, json.dumps(self.state), tmp=self.path.with_suffix(".tmp"))


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    first = text[0] if text else type(exc).__name__
    # gloo prefixes messages with a source location: "[../third_party/gloo/...cc:123] Read error ..."
    if first.startswith("[") and "] " in first:
        first = first.split("] ", 1)[1]
    return first[:300]


def run_job(job: Job, group: GroupContext | None = None, raise_errors: bool = False,
            groups: Mapping[str, GroupContext] | None = None) -> int:
    """Run the job's sweep (or trial) on this rank; rank 0 writes the records. ``group``: the subgroup of the
    job (diag.inplace) the step runs on, gloo's (None: the default group from env://); ``groups``: the
    subgroup on each torch backend the step runs on (its sweep's, a trial's arms'). ``raise_errors``: a
    failure is raised as DiagError (after the records' failed ``end``), not returned as an exit status."""
    from diag.console import SweepConsole
    from diag.envinfo import fingerprint
    from diag.harness import plan_rows, run_sweep
    from diag.records import RecordWriter
    from diag.units import human_bytes

    rank, world_size = (group.rank, group.world_size) if group is not None else env_rank()
    state = StateFile(job.state_dir, group.global_rank(rank) if group is not None else rank)
    state.update(status="init")
    writer: RecordWriter | None = None
    console: SweepConsole | None = None
    rows_done = 0
    try:
        spec = job.spec
        groups = dict(groups or {})
        trial = TrialSpec.from_json(job.meta["trial"]) if job.meta.get("trial") else None
        plans = plan_rows(spec, world_size) if trial is None else []
        transport = make_transport(spec, rank, world_size, job.token, groups.get(spec.backend, group))
        torch_transports = {spec.backend: transport}
        for backend in trial.torch_backends if trial is not None else ():
            if backend not in torch_transports:   # e.g. a trial's diag_tcp arm beside its gloo arms
                torch_transports[backend] = make_transport(spec.replace(backend=backend, knobs={}), rank,
                                                           world_size, job.token, groups.get(backend))
        if rank == 0:
            if job.out:
                writer = RecordWriter(job.out, mirror=job.mirror)
                writer.start(job.run_id, t_ns=time.time_ns(), world_size=world_size, spec=asdict(spec),
                             argv=job.argv, hosts=transport.hosts(), knobs=transport.knobs(),
                             env=fingerprint(), meta=job.meta)
            from diag.console import plan_weight

            console = SweepConsole(job.rows_total or len(plans), job.rows_before, quiet=job.quiet,
                                   weight_total=job.weight_total or plan_weight(spec, plans, world_size),
                                   weight_before=job.weight_before)
            trial = job.meta.get("trial")
            if trial:   # a trial prints a line per round, not a table of rows
                console.line(f"# trial {trial['name']} N={world_size}: {', '.join(a['name'] for a in trial['arms'])} "
                             f"on {', '.join(transport.hosts())}")
            else:
                label = transport_label(spec.backend, spec.algo)
                console.header(f"{label} N={world_size} ({', '.join(spec.ops)}) on {', '.join(transport.hosts())}")

        def on_row_start(plan) -> None:
            state.update(status="running", op=plan.op, size_bytes=plan.used_bytes, world_size=world_size)
            if console is not None:
                console.row_started(f"N={world_size} {plan.op} {human_bytes(plan.used_bytes)}")

        last_beat = time.monotonic()
        iterations = 0

        def heartbeat() -> None:
            # Called after every iteration; the file is rewritten at most every heartbeat_s, so the
            # launcher's watchdog sees a long row progressing at a cost of one clock read per iteration.
            nonlocal last_beat, iterations
            iterations += 1
            now = time.monotonic()
            if now - last_beat >= job.heartbeat_s:
                last_beat = now
                state.update(iterations=iterations)

        def emit(record) -> None:
            nonlocal rows_done
            rows_done += 1
            if writer is not None:
                writer.record(record)
            if console is not None and not record.block:   # a trial prints a line per round, not per block
                console.row(record)

        summary: dict[str, Any] = {}
        if trial is not None:   # an interleaved trial of several arms (diag/trial.py)
            from diag.trial import run_trial

            summary = run_trial(torch_transports, job.meta["trial"], spec, emit, job.run_id, heartbeat,
                                say=(lambda text: console.line(text)) if console else None,
                                token=bytes.fromhex(job.token) if job.token else None,
                                group=groups.get(spec.backend, group))
        else:
            run_sweep(transport, spec, emit, job.run_id, on_row_start, heartbeat)
        for opened in torch_transports.values():
            opened.close()
        state.update(status="between steps")   # "done" is the job's word: this rank has finished all of it
        if writer is not None:
            writer.end(job.run_id, "ok", t_ns=time.time_ns(), rows=rows_done, **summary)
        return 0
    except (Exception, KeyboardInterrupt) as exc:
        message = exc.args[0] if isinstance(exc, DiagError) else _one_line(exc)
        where = state.state
        state.update(status="failed", error=message)
        if writer is not None:
            writer.end(job.run_id, "failed", t_ns=time.time_ns(), rows=rows_done, error=message,
                       failed_at={k: where.get(k) for k in ("op", "size_bytes", "world_size")})
        if raise_errors:
            if isinstance(exc, KeyboardInterrupt):
                raise
            raise DiagError(message) from exc
        print(f"diag sweep: rank {rank}/{world_size}: {message}", file=sys.stderr, flush=True)
        return 130 if isinstance(exc, KeyboardInterrupt) else 1
    finally:
        if console is not None:
            console.close()
        if writer is not None:
            writer.close()

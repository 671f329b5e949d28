"""One rank of a sweep. Runs under any env:// launcher (torchrun, Slurm, the lab's per-host launchers).

``python -m diag.worker JOB.json`` is what diag's own launches start on every rank; ``diag sweep`` without
``--nproc`` calls :func:`run_job` in place, so a user's torchrun/srun command line works unchanged.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from diag import safefs
from diag.errors import DiagError
from diag.records import transport_label
from diag.spec import SweepSpec
from diag.transports.group import GroupContext


@dataclass
class Job:
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
    # In place (torchrun), rank 0 prints nccl-tests' closing lines and exits with the gate's status
    # (diag.gates); a rank started by diag's own launcher leaves both to the launching diag sweep.
    gate: bool = True
    min_busbw_GBps: float | None = None
    # The raw transport's run token (hex) for ranks diag starts itself: it reaches them in this 0600 file,
    # never through the TCPStore, which any local user can reach. Never written to records.
    token: str | None = None
    module: str = "diag.worker"     # what diag's launcher runs on every rank with this job file

    @property
    def watchdog_base_s(self) -> float:
        """A rank reports progress at least every iteration, so only a collective past its timeout is silent."""
        return self.spec.timeout_s

    @property
    def via_exec(self) -> bool:
        return self.spec.backend == "diag_tcp"

    def save(self, path: Path) -> None:
        """0600, a new file renamed into place: it says what root's ranks run and where they write."""
        safefs.write_file(path, json.dumps(asdict(self)), safefs.SECRET_MODE)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Job:
        """Only a job file of ours that nobody else can read or write (else another user could redirect
        where root writes, or read the run token)."""
        fd = safefs.open_trusted(path, secret=True)
        if fd is None:
            raise DiagError(f"job file {path} is not a regular file of yours with mode 0600; refusing to run it")
        with os.fdopen(fd, "rb") as handle:
            data = json.loads(handle.read())
        data["spec"] = SweepSpec.from_dict(data["spec"])
        return cls(**data)


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

        if spec.knobs:
            os.environ[ENV_KNOBS] = json.dumps(spec.knobs)
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


def run_job(job: Job, group: GroupContext | None = None, raise_errors: bool = False) -> int:
    """Run the job's sweep (or trial) on this rank; rank 0 writes the records. ``group``: on a subgroup of
    an in-place job (diag.inplace), else on the default group from env://. ``raise_errors``: a failure is
    raised as DiagError (after the records' failed ``end``), not returned as an exit status."""
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
    emitted: list[Any] = []
    try:
        spec = job.spec
        plans = plan_rows(spec, world_size)
        transport = make_transport(spec, rank, world_size, job.token, group)
        if rank == 0:
            if job.out:
                writer = RecordWriter(job.out)
                writer.start(job.run_id, t_ns=time.time_ns(), world_size=world_size, spec=asdict(spec),
                             argv=job.argv, hosts=transport.hosts(), knobs=transport.knobs(),
                             env=fingerprint(), meta=job.meta)
            from diag.console import plan_weight

            console = SweepConsole(job.rows_total or len(plans), job.rows_before, quiet=job.quiet,
                                   weight_total=job.weight_total or plan_weight(spec, plans, world_size),
                                   weight_before=job.weight_before)
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
            emitted.append(record)
            if writer is not None:
                writer.record(record)
            if console is not None and not record.block:   # a trial prints a line per round, not per block
                console.row(record)

        summary: dict[str, Any] = {}
        if job.meta.get("trial"):   # an interleaved trial of several arms (diag/trial.py)
            from diag.trial import run_trial

            summary = run_trial(transport, job.meta["trial"], spec, emit, job.run_id, heartbeat,
                                say=(lambda text: console.line(text)) if console else None,
                                token=bytes.fromhex(job.token) if job.token else None, group=group)
        else:
            run_sweep(transport, spec, emit, job.run_id, on_row_start, heartbeat)
        transport.close()
        state.update(status="done")
        if writer is not None:
            writer.end(job.run_id, "ok", t_ns=time.time_ns(), rows=rows_done, **summary)
        if rank == 0 and job.gate:
            from diag.gates import closing_lines, sweep_status

            if console is not None:
                for line in closing_lines(emitted):
                    console.line(line)
            code, why = sweep_status(emitted, job.min_busbw_GBps)
            if why:
                print(f"diag sweep: {why}", file=sys.stderr, flush=True)
            return code
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


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m diag.worker JOB.json", file=sys.stderr)
        return 2
    from diag.lifeline import bind_to_parent, terminate_as_exception

    # torch's launcher starts workers in sessions of their own: without this, a launcher killed by SIGKILL
    # (or whose runner was) would leave its ranks running. SIGKILL: a rank blocked in a collective must go.
    bind_to_parent(signal.SIGKILL)
    terminate_as_exception()  # the launcher's SIGTERM: rank 0 still writes its `end` event on the way out
    try:
        return run_job(Job.load(args[0]))
    except DiagError as exc:
        print(f"diag sweep: {exc}", file=sys.stderr)
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())

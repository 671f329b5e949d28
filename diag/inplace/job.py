"""The one job: one launch of K ranks runs a whole plan (docs/inplace.md). ``diag reproduce``, ``diag sweep``,
``diag advise`` and ``diag.sweep()`` all build a plan (diag.plan) and run it here, whether the ranks were
started by the user's launcher (torchrun, srun: in place) or by diag (loopback, the lab: diag.runplan).

Every rank runs ``run_in_place``; they walk the same list of actions in the same order. Before each step
the job's ranks meet (diag.inplace.world), the leaders of the nodes that take part start their node's
capture and observers, the step's subgroup runs it (diag.worker.run_job on a GroupContext: the same harness,
trial and records as any sweep), the others wait, and everyone meets again. Rank 0 writes the records and
run.json after every step, so a run that dies keeps what it finished. At the end every node analyses its own
captures against the records, the nodes' files reach the run directory (written there where it is shared,
else sent to rank 0 through the job's group), and rank 0 writes the report.

Adds no measurement logic of its own: the plan (diag.plan), the harness and trials (diag.worker), the
network probe (diag.probe) and the analyzer do the measuring. What the plan asks around its steps: the link
probe first, every node's capture and observers during the steps, the report at the end (Plan.probe, capture,
observe, report).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

from diag import safefs
from diag.errors import DiagError
from diag.inplace.node import NodeWork
from diag.inplace.topology import Topology, build_topology, identify, identity_from_message, job_interface
from diag.inplace.world import WORLD_TIMEOUT_S, World
from diag.launchenv import launch_json
from diag.plan import ADVISE, Plan, Step, capture_tag, step_spec, step_title, step_trial
from diag.runinfo import LabInfo, RunInfo
from diag.textsafe import lines, visible
from diag.transports.group import GroupContext
from diag.units import human_bytes

MODES = ("in-place", "lab", "loopback")
COMMANDS = ("reproduce", "sweep", "advise", "trial")
SHARED_MARK = ".diag-shared"   # rank 0 writes it into the run directory; a node that reads it shares it
# The longest a rank of the job may stay silent: one phase of the link probe, or the analysis of a node's
# captures. A plan with neither (a sweep without --capture) is silent at most one collective's timeout.
JOB_SILENCE_S = 600.0


@dataclass(frozen=True)
class JobOptions:
    """What every rank of the job is asked to do: the plan and where its results go. In place every rank
    builds it from its own command line; diag's own lab/loopback launch hands it to each rank in a job file
    (0600: it carries the run token)."""

    plan: dict[str, Any] = field(default_factory=dict)   # diag.plan.Plan.to_json()
    command: str = "reproduce"            # reproduce | sweep | advise | trial: run.json's command, the progress lines
    out: str = ""                         # the run directory
    records_out: str | None = None        # diag sweep's --out: rank 0 appends every event there too
    run_id: str = ""                      # the records' run id (each N's launch: <run_id>-n<N>); "": drawn
    iface: str | None = None
    capture_iface: str | None = None      # capture here instead of the job's interface (diag sweep --capture IFACE)
    snaplen: int = 128
    keep_pcaps: bool = False
    keep_going: bool = True
    quiet: bool = False                   # no sweep tables on rank 0's stdout (diag sweep --quiet)
    probe_seconds: int = 2                # each phase of the link probe
    mode: str = "in-place"
    lab: dict[str, Any] | None = None     # the lab's description for run.json (lab mode)
    token: str | None = None              # the raw transport's run token; None: rank 0 publishes one
    state_dir: str | None = None          # per-rank state files for diag's own launcher (its watchdog)
    argv: tuple[str, ...] = ()
    module: str = "diag.inplace"          # what diag's launcher starts on every rank with this job file
    heartbeat_s: float = 1.0

    @property
    def watchdog_base_s(self) -> float:
        """Rank 0 reports after every iteration of every step and at every phase of the job; the longest
        silence is one phase (the link probe, the analysis of a node's captures), or without those one
        collective's timeout."""
        plan = self.plan or {}
        if plan.get("probe", True) or plan.get("capture", True):
            return JOB_SILENCE_S
        return float(plan.get("timeout_s") or JOB_SILENCE_S)

    @property
    def kept(self) -> str:
        """Where a failed run's finished rows are (the launcher's failure line says it)."""
        return self.records_out or str(Path(self.out) / "records")

    def save(self, path: Path) -> None:
        safefs.write_file(path, json.dumps(asdict(self)), safefs.SECRET_MODE)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> JobOptions:
        fd = safefs.open_trusted(path, secret=True)
        if fd is None:
            raise DiagError(f"job file {path} is not a regular file of yours with mode 0600; refusing to run it")
        with os.fdopen(fd, "rb") as handle:
            data = json.loads(handle.read())
        data["argv"] = tuple(data.get("argv") or ())
        return cls(**data)


@dataclass
class Run:
    """The run directory and its run.json (rank 0; diag.runinfo), written again after every change."""

    root: Path
    info: RunInfo

    def save(self) -> None:
        self.info.save(self.root)


@dataclass
class Action:
    """One step at one world size: what the step's subgroup runs, where its records go, how its files are
    tagged on every node, and the row counts and weights of the sweep tables' progress."""

    title: str
    step: Step
    world_size: int
    spec: Any = None
    job_meta: dict[str, Any] = field(default_factory=dict)
    records: str = ""
    tag: str = ""
    capture: bool = False
    rows: int = 0
    weight: float = 0.0


def make_say(started: float, rank: int, quiet: bool = False) -> Callable[[str], None]:
    """Progress lines on rank 0's stderr, each with the time since the start (the tables go to stdout);
    ``quiet``: none (a sweep's own table and bar say it all)."""
    def say(text: str) -> None:
        if rank != 0 or quiet:
            return
        elapsed = int(time.monotonic() - started)
        print(f"{elapsed // 60:2d}:{elapsed % 60:02d} {visible(text)}", file=sys.stderr, flush=True)

    return say


class InPlaceJob:
    def __init__(self, options: JobOptions, world: World, topology: Topology, plan: Plan,
                 say: Callable[[str], None]) -> None:
        self.options = options
        self.world = world
        self.rank = world.rank
        self.topology = topology
        self.plan = plan
        self.say = say
        self.node = topology.node(self.rank)
        self.is_leader = self.node.leader == self.rank
        self.run: Run | None = None
        self.root = Path(options.out or f"runs/{options.command}-{time.strftime('%Y%m%d-%H%M%S')}")
        self.shared = False
        self.node_work: NodeWork | None = None
        # (N, backend, knobs) -> this rank's subgroup of N on that backend (None: not a member); gloo's for
        # every N, the others' where a step at N runs on them (diag.plan.Plan.groups_at)
        self.groups: dict[tuple[int, str, str], GroupContext | None] = {}
        self.failures: list[dict[str, str]] = []
        self.started = time.monotonic()
        self.run_id = options.run_id or uuid.uuid4().hex[:12]   # rank 0's names the records
        self.all_actions: list[Action] = []
        self.quiet_steps = options.command == "sweep"
        from diag.worker import StateFile

        self.state = StateFile(options.state_dir, self.rank)

    # --- set-up ----------------------------------------------------------------------------------------
    def prepare(self) -> None:
        """Rank 0 makes the run directory; every node finds out whether it reaches it (shared filesystem)."""
        mark = ""
        if self.rank == 0:
            if (self.root / "records").exists() and any((self.root / "records").iterdir()):
                raise DiagError(f"{self.root} already holds records: choose a new --out directory")
            safefs.private_dir(self.root, "--out")
            for sub in ("records", "nodes", *((ADVISE,) if self.plan.has_advise else ())):
                safefs.private_dir(self.root / sub)
            mark = secrets.token_hex(8)
            safefs.write_file(self.root / SHARED_MARK, mark)
            self.run = Run(self.root, self._initial_meta())
            self.run.save()
        root, mark = self._shared_place(self.world.broadcast([str(self.root.resolve()), mark] if self.rank == 0 else None,
                                                             "finding the run directory"))
        sees = None
        if self.is_leader:
            # The marker may sit where another user can plant a symlink, a FIFO or a huge file in its place:
            # read without following, never blocking, at most its own length.
            sees = safefs.read_limited(Path(root) / SHARED_MARK, len(mark)) == mark.encode()
        self.shared = all(s is True for s in self.world.all_gather(sees, "finding the run directory") if s is not None)
        # Where the run directory is shared, every node writes its own part of it; elsewhere each node keeps
        # its part on its own disk (same path) and sends it to rank 0 at the end.
        self.root = Path(root) if self.shared else self.root
        if self.is_leader:
            self.node_work = NodeWork(self.node, self.root / "nodes" / self.node.name, self.topology.iface,
                                      capture_iface=self.options.capture_iface or self.topology.iface,
                                      snaplen=self.options.snaplen, wants_capture=self.plan.capture)
            self.node_work.write_fingerprint(self.topology.to_json())
        notes = self.world.all_gather_texts(self.node_work.notes if self.node_work else [], "fingerprinting the nodes")
        if self.node_work is not None:
            self.node_work.notes.clear()
        self._note(notes)
        self._note_shared_hosts()

    @staticmethod
    def _shared_place(said: Any) -> tuple[str, str]:
        """Rank 0's run directory and marker, as every rank checks them: an absolute path and 16 hex digits."""
        if not (isinstance(said, list) and len(said) == 2 and all(isinstance(x, str) for x in said)
                and said[0].startswith("/") and "\0" not in said[0] and len(said[0]) < 4096
                and len(said[1]) == 16 and all(c in "0123456789abcdef" for c in said[1])):
            raise DiagError("finding the run directory: rank 0 sent something other than a path and a marker; is "
                            "every rank running the same diag?")
        return said[0], said[1]

    def _initial_meta(self) -> RunInfo:
        from diag.runinfo import RUN_SCHEMA
        from diag.typedjson import from_json

        return RunInfo(schema=RUN_SCHEMA, command=self.options.command, created_ns=time.time_ns(),
                       mode=self.options.mode, cpu_count=os.cpu_count(), quick=self.plan.name == "quick",
                       plan=self.plan.to_json(), lab=from_json(LabInfo, self.options.lab) if self.options.lab else None,
                       topology=self.topology.to_json(self.plan.world_sizes), argv=list(self.options.argv),
                       trial_seed=int.from_bytes(os.urandom(4), "little"), records_out=self.options.records_out,
                       launch=launch_json())

    def _note(self, notes: list[str], tag: str = "nodes") -> None:
        if self.run is None:
            return
        for note in notes:
            self.run.info.notes.append(note)
            if self.quiet_steps:   # a sweep prints no progress lines, but what a node could not do is said
                print(f"[{tag}] {note}", file=sys.stderr, flush=True)
            else:
                self.say(f"[{tag}] {note}")
        self.run.save()

    def _note_shared_hosts(self) -> None:
        shared = [n for n in self.plan.world_sizes if self.topology.shares_hosts(n)]
        if shared:
            self._note([f"N={','.join(map(str, shared))}: the job has {len(self.topology.nodes)} node(s), so ranks "
                        "share hosts there (N ranks on one host are not N hosts: their traffic stays inside the "
                        "machine)"])

    def make_groups(self) -> None:
        """One subgroup per N on gloo, made by every rank (torch's rule), used by its members for every step at N
        and as the control group of the others; one per N on every other backend a step at N runs on
        (diag.plan.Plan.groups_at: the backend under test, a sweep's backend, a trial's diag_tcp arm), their
        control messages over gloo's. diag_tcp reads its knobs when its group is made."""
        import torch.distributed as dist

        store = dist.distributed_c10d._get_default_store()
        timeout = timedelta(seconds=self.plan.timeout_s)
        for n in self.plan.world_sizes:
            members = self.topology.members(n)
            group = dist.new_group(ranks=list(members), backend="gloo", timeout=timeout)
            gloo = None
            if self.rank in members:
                prefix = dist.PrefixStore(f"diag_group/n{n}", store)
                gloo = GroupContext(members, members.index(self.rank), group, prefix, f"n{n}")
            self.groups[(n, "gloo", "")] = gloo
            for backend, knobs in self.plan.groups_at(n):
                self._prepare_backend(backend, knobs)
                tested = dist.new_group(ranks=list(members), backend=backend, timeout=timeout)
                self.groups[(n, backend, _knobs_key(backend, knobs))] = (
                    replace(gloo, process_group=tested, control_group=group, label=f"n{n}-{backend}")
                    if gloo is not None else None)

    def group(self, world_size: int, backend: str, knobs: dict[str, Any] | None = None) -> GroupContext | None:
        """This rank's subgroup of N on ``backend`` (raw transports run on gloo's: its store and control group)."""
        if backend == "raw":
            backend = "gloo"
        return self.groups.get((world_size, backend, _knobs_key(backend, knobs or {})))

    def _prepare_backend(self, backend: str, knobs: dict[str, Any]) -> None:
        """What a backend needs before its group is made: diag_tcp registered with its knobs and the run token;
        NCCL its device, one per local rank."""
        if backend == "diag_tcp":
            from diag.transports.raw.backend import ENV_KNOBS

            self._register_diag_tcp()
            if knobs:
                os.environ[ENV_KNOBS] = json.dumps(knobs)
            else:
                os.environ.pop(ENV_KNOBS, None)
        elif backend == "nccl":
            import torch

            from diag.errors import EXIT_NO_DEVICE

            if not torch.cuda.is_available():
                raise DiagError("backend nccl needs CUDA, and no CUDA device is visible; use --backend gloo",
                                exit_code=EXIT_NO_DEVICE)
            local_rank, gpus = int(os.environ.get("LOCAL_RANK", "0")), torch.cuda.device_count()
            if local_rank >= gpus:
                raise DiagError(f"backend nccl runs one rank per GPU: local rank {local_rank} has none of its own "
                                f"({gpus} visible on this node); start at most {gpus} ranks per node",
                                exit_code=EXIT_NO_DEVICE)
            torch.cuda.set_device(local_rank)

    def _register_diag_tcp(self) -> None:
        from diag.transports.raw.backend import ENV_TOKEN, register

        register()
        if self.options.token:
            os.environ[ENV_TOKEN] = self.options.token

    # --- the steps -------------------------------------------------------------------------------------
    def actions(self) -> list[Action]:
        from diag.console import plan_weights
        from diag.harness import plan_rows

        seed = self.world.broadcast(self.run.info.trial_seed if self.run else 0)
        weights = iter(plan_weights(self.plan, step_spec))
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise DiagError("sharing the plan: rank 0 sent a trial seed that is not an integer; is every rank running "
                            "the same diag?")
        memory = self._machines_memory() if any(s.kind == "profile" for s in self.plan.steps) else {}
        out = []
        for step in self.plan.steps:
            for n in self.plan.world_sizes_of(step):
                spec = step_spec(self.plan, step, n)
                meta: dict[str, Any] = {}
                if step.trial is not None:
                    meta["trial"] = step_trial(self.plan, step, seed, n).to_json()
                if step.kind == "profile":
                    meta["profile"] = True   # its rows feed the model, not the survey (diag.report.rundir)
                    spec = self._profile_fit(step, n, spec, memory)
                try:
                    rows = len(plan_rows(spec, n)) if step.trial is None else 0
                except DiagError:
                    rows = 0   # the step itself says what is wrong
                out.append(Action(step_title(step, n), step, n, spec, meta, f"records/{step.name}.jsonl",
                                  capture_tag(step, spec, n), capture=self.plan.capture and step.kind != "profile"
                                  and (step.trial is None or step.captured),
                                  rows=rows, weight=next(weights)))
        return out

    def _machines_memory(self) -> dict[str | None, int]:
        """Available memory per machine (boot id; ranks in the lab's namespaces share one machine), as its ranks
        see it: the least any of them saw."""
        import psutil

        what = "reading the machines' memory"
        seen = self.world.all_gather([self.node.boot_id, psutil.virtual_memory().available], what)
        out: dict[str | None, int] = {}
        for rank, said in enumerate(seen):
            if not (isinstance(said, list) and len(said) == 2 and (said[0] is None or isinstance(said[0], str))
                    and isinstance(said[1], int) and not isinstance(said[1], bool) and said[1] >= 0):
                raise DiagError(f"{what}: rank {rank} sent something other than its boot id and available bytes; is "
                                "every rank running the same diag?")
            boot_id, available = said
            out[boot_id] = min(out.get(boot_id, available), available)
        return out

    def _profile_fit(self, step: Step, world_size: int, spec: Any, memory: dict[str | None, int]) -> Any:
        """The profile step's sizes at N that fit the memory of the machines its ranks are on; what does not fit is
        said in run.json's notes."""
        from diag.plan import profile_sizes_that_fit

        ranks: dict[str | None, int] = {}
        for rank in self.topology.members(world_size):
            boot_id = self.topology.node(rank).boot_id
            ranks[boot_id] = ranks.get(boot_id, 0) + 1
        kept, left = profile_sizes_that_fit(step, world_size, spec.sizes,
                                            [(count, memory.get(boot_id, 0)) for boot_id, count in ranks.items()])
        if left:
            self._note([f"{step.name} N={world_size}: sizes {', '.join(human_bytes(s) for s in left)} left out: "
                        f"{max(ranks.values())} ranks on one machine would need more than half its available "
                        "memory"], tag="profile")
        return spec.replace(sizes=kept)

    def run_action(self, action: Action, index: int, total: int, progress: Any) -> None:
        members = self.topology.members(action.world_size)
        takes_part = {node.name for node in self.topology.nodes_of(members)}
        if progress is not None:
            self.say(f"[{index}/{total}] {action.title}  {progress.status()}")
        self.state.update(status="step", step=action.title)   # "running": a row of it runs (diag.worker)
        self.world.barrier(f"before {action.title}")
        if self.node_work is not None and self.node.name in takes_part:
            self.node_work.start_step(action.tag, action.capture, self.plan.observe)
        started = time.monotonic()
        error = None
        try:
            self.world.barrier(f"starting {action.title}")   # every capture listens before the first packet
            if self.rank in members:
                error = self._run_on(action)
            self.world.barrier(f"during {action.title} (N={action.world_size})")
        finally:
            if self.node_work is not None:
                self.node_work.stop_step()
        errors = self.world.all_gather_texts([error] if error else [], f"after {action.title}")
        if self.run is not None:
            if errors:
                self.failures.append({"step": action.title, "error": errors[0]})
                self.run.info.failures = list(self.failures)
                self.say(f"[{index}/{total}] failed: {errors[0]}")
            else:
                self.run.info.step_seconds[action.title] = round(time.monotonic() - started, 2)
            self.run.save()
        if errors and not self.options.keep_going:
            raise DiagError(f"{action.title}: {errors[0]}")

    def _run_on(self, action: Action) -> str | None:
        """This rank's part of one action: the step's sweep or trial (diag.worker.run_job) on its subgroup."""
        from diag.worker import Job, run_job

        spec = action.spec
        if spec.backend == "raw":
            # every rank writes its raw TCP_INFO samples into its own node's part of the run directory
            spec = spec.replace(knobs={**spec.knobs, "tcpinfo_dir": str(self._node_dir() / "tcpinfo")})
        n = action.world_size
        groups: dict[str, GroupContext] = {}
        backends = ([(a.backend, a.knobs) for a in step_trial(self.plan, action.step, world_size=n).arms if a.on_torch]
                    if action.step.trial is not None else [(spec.backend, spec.knobs)])
        for backend, knobs in backends:
            found = self.group(n, backend, knobs)
            if found is not None:
                groups.setdefault(backend, found)
        # the sweep tables' bar runs over every sweep action of the plan (a trial prints a line per round)
        sweeps = [a for a in self.all_actions if a.step.trial is None]
        before = sweeps[:next((i for i, a in enumerate(sweeps) if a is action), 0)]
        job = Job(spec=spec, out=str(self.root / action.records) if self.rank == 0 else None,
                  run_id=f"{self.run_id}-n{n}", argv=[self.options.command], quiet=self.options.quiet,
                  token=self.options.token, state_dir=self.options.state_dir,
                  mirror=self.options.records_out if self.rank == 0 else None,
                  rows_before=sum(a.rows for a in before), rows_total=sum(a.rows for a in sweeps),
                  weight_before=sum(a.weight for a in before),
                  weight_total=sum(a.weight for a in sweeps),
                  meta={**action.job_meta, "mode": self.options.mode, "lab": (self.options.lab or {}).get("name"),
                        "tag": action.tag,   # every node's files of this (step, N): captures, analysis, observe
                        "capture": "" if action.capture else None,
                        "capture_tag": action.tag if action.capture else None,
                        "run_dir": str(self.root.resolve())})
        try:
            run_job(job, group=self.group(n, "gloo"), groups=groups, raise_errors=True)
        except DiagError as exc:
            return str(exc)
        return None

    def _node_dir(self) -> Path:
        return self.root / "nodes" / self.node.name

    # --- the end ----------------------------------------------------------------------------------------
    def finish(self) -> None:
        """Every node analyses its captures; the nodes' files reach the run directory; advise.json."""
        self.world.barrier("after the last step")
        self.state.update(status="analyzing")
        if self.rank == 0 and self.plan.has_advise:
            self._write_advise()
        records = self._records_for_analysis()
        if self.node_work is not None and records:
            self.say("[analyze] every node analyses its own captures")
            # In a shared run directory the pcaps stay only with --keep-pcaps (their analyses always do); a node
            # that does not share it keeps them on its own disk, as before (and ships them with --keep-pcaps).
            self.node_work.analyze(records, keep_pcaps=self.options.keep_pcaps or not self.shared)
        self._note(self.world.all_gather_texts(self.node_work.notes if self.node_work else [], "analysing the captures"))
        if not self.shared:
            self._collect_nodes()

    def _records_for_analysis(self) -> list[str]:
        """The run's records where each node's leader reads them: the shared run directory's (their names
        from rank 0, checked on every rank), else a copy rank 0 sends every node (diag.inplace.transfer)."""
        from diag.inplace import transfer

        names = sorted(p.name for p in (self.root / "records").glob("*.jsonl")) if self.rank == 0 else []
        if self.shared:
            said = self.world.broadcast(names if self.rank == 0 else None, "sharing the records")
            if not isinstance(said, list) or any(transfer.record_name_problem(n) is not None for n in said):
                raise DiagError("sharing the records: rank 0 sent a records name diag refuses (a plain *.jsonl name "
                                "only); is every rank running the same diag?")
            return [str(self.root / "records" / name) for name in said]
        records = safefs.private_handle(self.root / "records", create=False) if self.rank == 0 else None
        local = ((lambda: safefs.private_handle(self._node_dir() / "records"))
                 if self.is_leader and self.rank != 0 else None)
        try:
            shared, note = transfer.share_records(self.world, records, local)
        finally:
            if records is not None:
                records.close()
        if note is not None:
            self._note([note])
        if self.rank == 0:
            return [str(self.root / "records" / name) for name in names]
        return [str(self._node_dir() / "records" / name) for name in shared] if local is not None else []

    def _collect_nodes(self) -> None:
        """Where the run directory is not shared: every other node's files to rank 0, one node after the other
        (diag.inplace.transfer: checked names, bounded chunks, a cap per node and per run); the other ranks
        wait. What stays on a node is in run.json's ``left_on_nodes`` and the notes."""
        from diag.inplace import transfer
        from diag.inplace.world import WORLD_TIMEOUT_S

        budget = transfer.Budget(transfer.SHIP_TOTAL_BYTES, transfer.SHIP_NODE_BYTES)
        nodes = safefs.private_handle(self.root / "nodes") if self.rank == 0 else None
        try:
            for node in self.topology.nodes:
                if node.leader == 0:
                    continue   # rank 0's own node wrote into the run directory itself
                what = f"collecting node {node.name}'s results"
                if self.rank == node.leader and self.node_work is not None:
                    files, skipped = self.node_work.files(self.options.keep_pcaps)
                    transfer.send_node_files(self.world, files, skipped, what)
                elif nodes is not None:
                    with nodes.private_dir(node.name) as folder:
                        shipment = transfer.receive_node_files(
                            self.world, node.leader, node.name, folder, budget, self.options.keep_pcaps, what,
                            str(self.root.resolve() / "nodes" / node.name))
                    self._write_shipped(shipment)
        finally:
            if nodes is not None:
                nodes.close()
        self.world.barrier("collecting the nodes' results", timeout_s=WORLD_TIMEOUT_S)

    def _write_shipped(self, shipment: Any) -> None:
        """Rank 0: what one node sent is in place; what stayed there goes into run.json and the notes."""
        if self.run is None:
            return
        self.say(f"[nodes] {shipment.node}: {len(shipment.written)} files ({human_bytes(shipment.bytes)}) received")
        if not shipment.left:
            return
        where = str(self.root.resolve() / "nodes" / shipment.node)
        self.run.info.extra.setdefault("left_on_nodes", {})[shipment.node] = {
            "directory": where, "files": [left.to_json() for left in shipment.left]}
        size = sum(left.size or 0 for left in shipment.left)
        self._note([f"{shipment.node}: {len(shipment.left)} file(s) ({human_bytes(size)}) stay on {shipment.node} under "
                    f"{where} (run.json left_on_nodes says which and why)"])

    def _write_advise(self) -> None:
        """advise.json from the advise trial's records (diag.advise), with the steps of it that failed."""
        from diag.advise import write_advise

        write_advise(self.root, lab=(self.options.lab or {}).get("name"),
                     failures=[{"workaround": f["step"], "error": f["error"]} for f in self.failures
                               if f["step"].startswith(ADVISE)])

    def report(self) -> int:
        """Rank 0: the report and the terminal summary; the exit status of the run."""
        assert self.run is not None
        self.say("[report] rendering")
        from diag.report import load_run, write_report
        from diag.report.diagnose import summary_lines
        from diag.report.verdict import verdict_lines

        result = write_report(load_run([str(self.root)]), self.root / "report")
        elapsed = time.monotonic() - self.started
        self.run.info.elapsed_s = round(elapsed, 1)
        self.run.save()
        print(f"\ndiag reproduce: done in {elapsed / 60:.1f} min; report: {self.root / 'report' / 'report.html'}")
        print(lines("\n".join(verdict_lines(result.verdict))) if result.verdict else "")   # nodes' strings escaped
        fired = [f for f in result.findings if f.status == "fired"]
        print(f"findings ({len(fired)}):")
        for line in summary_lines(result.findings):
            print(f"  {visible(line)}")
        print(f"  every finding with its evidence: {self.root / 'report' / 'report.md'}, "
              f"{self.root / 'report' / 'findings.json'}", flush=True)
        if self.failures:
            print(f"{len(self.failures)} step(s) failed: see {self.root / 'run.json'}")
            return 1
        return 0


def run_in_place(options: JobOptions) -> int:
    """Every rank of the job runs this (under torchrun/srun, or diag's own lab/loopback launch). Returns the
    exit status: 1 where diag reproduce's steps failed in place, else 0; a sweep's gate is its command's
    (diag.runplan), over the records rank 0 wrote."""
    import torch.distributed as dist

    from diag.console import Progress
    from diag.validate import interface
    from diag.worker import env_rank

    if options.mode not in MODES:
        raise DiagError(f"unknown job mode {options.mode!r}")
    if options.command not in COMMANDS:
        raise DiagError(f"unknown command {options.command!r} for the job")
    plan = Plan.from_json(options.plan)
    rank, world_size = env_rank()
    too_big = [n for n in plan.world_sizes if n > world_size]
    if too_big:
        raise DiagError(f"N={max(too_big)} needs {max(too_big)} ranks and the job has {world_size}: start "
                        f"{max(too_big)} ranks (torchrun --nproc-per-node / --nnodes), or ask for fewer")
    if options.iface and not os.environ.get("GLOO_SOCKET_IFNAME"):
        os.environ["GLOO_SOCKET_IFNAME"] = options.iface   # gloo and the raw transport bind the job's interface
    for name in (os.environ.get("GLOO_SOCKET_IFNAME") or "").split(","):
        interface(name, "GLOO_SOCKET_IFNAME")
    iface = job_interface(options.iface)
    started = time.monotonic()
    say = make_say(started, rank, quiet=options.command == "sweep")
    try:
        dist.init_process_group("gloo", timeout=timedelta(seconds=WORLD_TIMEOUT_S))
    except (RuntimeError, ValueError) as exc:
        raise DiagError(f"the job's process group did not form: {str(exc).splitlines()[0]}") from None
    from diag.probe import GroupCoordinator

    world = World(GroupCoordinator())
    job: InPlaceJob | None = None
    command = f"diag {options.command}"
    try:
        said = world.all_gather(asdict(identify(rank, iface)), "meeting the other ranks")
        topology = build_topology([identity_from_message(s, r) for r, s in enumerate(said)], iface)
        world.topology = topology
        say(f"{command} ({options.mode}): {world_size} ranks on {len(topology.nodes)} node(s) "
            f"({', '.join(n.name for n in topology.nodes)}); N = {', '.join(map(str, plan.world_sizes))}"
            + (f"; D = {', '.join(human_bytes(v) for v in plan.volumes)}" if plan.volumes else "")
            + (f"; profile: {len(plan.profile_sizes)} sizes per rank, {human_bytes(min(plan.profile_sizes))}.."
               f"{human_bytes(max(plan.profile_sizes))}" if any(s.kind == "profile" for s in plan.steps) else ""))
        from diag import launchenv

        launch = launchenv.current()
        if launch is not None:
            for line in (launch.describe(), *launch.notes):
                say(f"{command}: {line}")
        job = InPlaceJob(options, world, topology, plan, say)
        job.prepare()
        say(f"{command}: run directory {job.root}" + ("" if job.shared else
            " (not shared with every node: each node sends its results to rank 0 at the end)"))
        if plan.probe:
            from diag.inplace.links import measure_links

            measure_links(job)
        job.make_groups()
        actions = job.all_actions = job.actions()
        # One plan-level bar, weighted by bytes x iterations (sizes double: counting steps would mislead).
        progress = Progress(options.command, sum(a.weight for a in actions), live=False) if rank == 0 else None
        for index, action in enumerate(actions, 1):
            job.run_action(action, index, len(actions), progress)
            if progress is not None:
                progress.advance(action.weight)
        job.finish()
        code = job.report() if rank == 0 and plan.report else 0
        if options.mode != "in-place" or options.command != "reproduce":
            code = 0   # diag's own launch reads the failed steps from run.json (torchrun would add a traceback)
        job.state.update(status="done")
        world.barrier("at the end", timeout_s=600.0)
        return code
    except (DiagError, KeyboardInterrupt) as exc:
        message = str(exc) if isinstance(exc, DiagError) else "interrupted"
        if job is not None:
            job.state.update(status="failed", error=message)
            if job.run is not None:
                job.run.info.failures = [*job.failures, {"step": "job", "error": message}]
                job.run.save()
        raise
    finally:
        if job is not None and job.node_work is not None:
            with contextlib.suppress(DiagError, OSError):   # a step's capture still running on: ended and cut
                job.node_work.settle()
        if dist.is_initialized():
            with contextlib.suppress(Exception):   # a lost node may leave the group unable to shut down cleanly
                dist.destroy_process_group()


def _knobs_key(backend: str, knobs: dict[str, Any]) -> str:
    """Groups of diag_tcp differ by the knobs they were made with; the other backends take none."""
    return json.dumps(knobs, sort_keys=True) if backend == "diag_tcp" and knobs else ""


__all__ = ["MODES", "Action", "InPlaceJob", "JobOptions", "Run", "run_in_place"]

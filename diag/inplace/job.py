"""The main job in place: one launch of K ranks runs the whole plan (docs/inplace.md).

Every rank runs ``run_in_place``; they walk the same list of actions in the same order. Before each step
the job's ranks meet (diag.inplace.world), the leaders of the nodes that take part start their node's
capture and observers, the step's subgroup runs it (diag.worker.run_job on a GroupContext: the same harness,
trial and records as any sweep), the others wait, and everyone meets again. Rank 0 writes the records and
run.json after every step, so a run that dies keeps what it finished. At the end every node analyses its own
captures against the records, the nodes' files reach the run directory (written there where it is shared,
else sent to rank 0 through the job's group), and rank 0 writes the report.

Adds no measurement logic of its own: the plan (diag.plan), the harness and trials (diag.worker), the
network probe (diag.probe) and the analyzer do the measuring.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

from diag import safefs
from diag.errors import DiagError
from diag.inplace.node import NodeWork
from diag.inplace.topology import Topology, build_topology, identify, job_interface
from diag.inplace.world import WORLD_TIMEOUT_S, World
from diag.plan import (
    STEP_TIMEOUT_S,
    Plan,
    Step,
    per_rank_size,
    resolve_plan,
    step_spec,
    step_title,
    step_trial,
)
from diag.transports.group import GroupContext
from diag.units import human_bytes

MODES = ("in-place", "lab", "loopback")
SHARED_MARK = ".diag-shared"
JOB_SILENCE_S = 600.0      # rank 0 writes it into the run directory; a node that reads it shares it


@dataclass(frozen=True)
class JobOptions:
    """What every rank of the job is asked to do: the reproduce command line, or the job file diag's own
    lab/loopback launch hands each rank (0600: it carries the run token)."""

    quick: bool = True
    out: str = ""
    max_n: int | None = None
    volumes: tuple[int, ...] | None = None
    iface: str | None = None
    keep_pcaps: bool = False
    keep_going: bool = True
    backend: str = "gloo"                 # the backend under test (diag.plan.under_test)
    skip: tuple[str, ...] = ()            # step kinds left out (diag.plan.SKIPPABLE)
    profile: str = ""                     # the model's profile steps: "add", "only" or "" (diag.plan.with_profile)
    profile_sizes: tuple[int, ...] | None = None
    profile_row_s: float | None = None
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
        silence is one phase (the link probe, the analysis of a node's captures)."""
        return JOB_SILENCE_S

    @property
    def via_exec(self) -> bool:
        return False

    def save(self, path: Path) -> None:
        safefs.write_file(path, json.dumps(asdict(self)), safefs.SECRET_MODE)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> JobOptions:
        fd = safefs.open_trusted(path, secret=True)
        if fd is None:
            raise DiagError(f"job file {path} is not a regular file of yours with mode 0600; refusing to run it")
        with os.fdopen(fd, "rb") as handle:
            data = json.loads(handle.read())
        data["volumes"] = tuple(data["volumes"]) if data.get("volumes") else None
        data["argv"] = tuple(data.get("argv") or ())
        data["skip"] = tuple(data.get("skip") or ())
        data["profile_sizes"] = tuple(data["profile_sizes"]) if data.get("profile_sizes") else None
        return cls(**data)


@dataclass
class Run:
    """The run directory and its run.json (rank 0), written again after every change."""

    root: Path
    meta: dict[str, Any]

    def save(self) -> None:
        safefs.write_file(self.root / "run.json", json.dumps(self.meta, indent=1, default=str))


@dataclass
class Action:
    title: str
    step: Step | None          # None: the advise step
    world_size: int
    spec: Any = None
    job_meta: dict[str, Any] = field(default_factory=dict)
    records: str = ""
    tag: str = ""
    capture: bool = False
    group_backend: str = "gloo"


def make_say(started: float, rank: int) -> Callable[[str], None]:
    """Progress lines on rank 0's stderr, each with the time since the start (the tables go to stdout)."""
    def say(text: str) -> None:
        if rank != 0:
            return
        elapsed = int(time.monotonic() - started)
        print(f"{elapsed // 60:2d}:{elapsed % 60:02d} {text}", file=sys.stderr, flush=True)

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
        self.root = Path(options.out or f"runs/reproduce-{time.strftime('%Y%m%d-%H%M%S')}")
        self.shared = False
        self.node_work: NodeWork | None = None
        self.groups: dict[int, GroupContext | None] = {}          # gloo, per N
        self.backend_groups: dict[int, GroupContext | None] = {}  # the backend under test where not gloo
        self.failures: list[dict[str, str]] = []
        self.started = time.monotonic()
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
            for sub in ("records", "nodes", "advise"):
                safefs.private_dir(self.root / sub)
            mark = secrets.token_hex(8)
            safefs.write_file(self.root / SHARED_MARK, mark)
            self.run = Run(self.root, self._initial_meta())
            self.run.save()
        root, mark = self.world.broadcast((str(self.root.resolve()) if self.rank == 0 else "", mark))
        sees = None
        if self.is_leader:
            try:
                sees = (Path(root) / SHARED_MARK).read_text() == mark
            except OSError:
                sees = False
        self.shared = all(s for s in self.world.all_gather(sees, "finding the run directory") if s is not None)
        # Where the run directory is shared, every node writes its own part of it; elsewhere each node keeps
        # its part on its own disk (same path) and sends it to rank 0 at the end.
        self.root = Path(root) if self.shared else self.root
        if self.is_leader:
            self.node_work = NodeWork(self.node, self.root / "nodes" / self.node.name, self.topology.iface)
            self.node_work.write_fingerprint(self.topology.to_json())
        notes = self.world.all_gather(self.node_work.notes if self.node_work else [], "fingerprinting the nodes")
        if self.node_work is not None:
            self.node_work.notes.clear()
        self._note([n for node_notes in notes for n in node_notes])
        self._note_shared_hosts()

    def _initial_meta(self) -> dict[str, Any]:
        return {"created_ns": time.time_ns(), "mode": self.options.mode, "cpu_count": os.cpu_count(),
                "quick": self.options.quick, "plan": self.plan.to_json(), "lab": self.options.lab,
                "topology": self.topology.to_json(self.plan.world_sizes), "link": None, "notes": [],
                "failures": [], "argv": list(self.options.argv),
                "trial_seed": int.from_bytes(os.urandom(4), "little")}

    def _note(self, notes: list[str], tag: str = "nodes") -> None:
        if self.run is None:
            return
        for note in notes:
            self.run.meta["notes"].append(note)
            self.say(f"[{tag}] {note}")
        self.run.save()

    def _note_shared_hosts(self) -> None:
        shared = [n for n in self.plan.world_sizes if self.topology.shares_hosts(n)]
        if shared:
            self._note([f"N={','.join(map(str, shared))}: the job has {len(self.topology.nodes)} node(s), so ranks "
                        "share hosts there (N ranks on one host are not N hosts: their traffic stays inside the "
                        "machine)"])

    def make_groups(self) -> None:
        """One subgroup per N, made by every rank (torch's rule), used by its members for every step at N; where
        the backend under test is not gloo, one of that backend too (its control messages go over gloo's)."""
        import torch.distributed as dist

        store = dist.distributed_c10d._get_default_store()
        if self.plan.backend == "diag_tcp":
            self._register_diag_tcp()
        for n in self.plan.world_sizes:
            members = self.topology.members(n)
            timeout = timedelta(seconds=STEP_TIMEOUT_S)
            group = dist.new_group(ranks=list(members), backend="gloo", timeout=timeout)
            tested = (dist.new_group(ranks=list(members), backend=self.plan.backend, timeout=timeout)
                      if self.plan.backend != "gloo" else None)
            if self.rank not in members:
                self.groups[n] = self.backend_groups[n] = None
                continue
            prefix = dist.PrefixStore(f"diag_group/n{n}", store)
            self.groups[n] = GroupContext(members, members.index(self.rank), group, prefix, f"n{n}")
            self.backend_groups[n] = replace(self.groups[n], process_group=tested, control_group=group,
                                             label=f"n{n}-{self.plan.backend}") if tested is not None else None

    def _register_diag_tcp(self) -> None:
        from diag.transports.raw.backend import ENV_TOKEN, register

        register()
        if self.options.token:
            os.environ[ENV_TOKEN] = self.options.token

    # --- the steps -------------------------------------------------------------------------------------
    def actions(self) -> list[Action]:
        seed = self.world.broadcast(self.run.meta["trial_seed"] if self.run else 0)
        memory = self._machines_memory() if any(s.kind == "profile" for s in self.plan.steps) else {}
        out = []
        for step in self.plan.steps:
            for n in self.plan.world_sizes_of(step):
                spec = step_spec(self.plan, step, n)
                meta: dict[str, Any] = {}
                if step.trial is not None:
                    meta["trial"] = step_trial(self.plan, step, seed).to_json()
                if step.kind == "profile":
                    meta["profile"] = True   # its rows feed the model, not the survey (diag.report.rundir)
                    spec = self._profile_fit(step, n, spec, memory)
                from diag.runner import transport_tag

                tag = f"{step.name}--{transport_tag(spec)}-{'-'.join(spec.ops)}-n{n}"
                tested = self.plan.backend != "gloo" and (step.trial is not None or step.backend == self.plan.backend)
                out.append(Action(step_title(step, n), step, n, spec, meta, f"records/{step.name}.jsonl", tag,
                                  capture=step.trial is None and step.kind != "profile",
                                  group_backend=self.plan.backend if tested else "gloo"))
        return out

    def _machines_memory(self) -> dict[str | None, int]:
        """Available memory per machine (boot id; ranks in the lab's namespaces share one machine), as its ranks
        see it: the least any of them saw."""
        import psutil

        seen = self.world.all_gather((self.topology.node(self.rank).boot_id, psutil.virtual_memory().available),
                                     "reading the machines' memory")
        out: dict[str | None, int] = {}
        for boot_id, available in seen:
            out[boot_id] = min(out.get(boot_id, available), available)
        return out

    def _profile_fit(self, step: Step, world_size: int, spec: Any, memory: dict[str | None, int]) -> Any:
        """The profile step's sizes at N that fit the memory of the machines its ranks are on; what does not fit is
        said in run.json's notes."""
        from diag.plan import profile_sizes_that_fit

        members = self.topology.members(world_size)
        ranks: dict[str | None, int] = {}
        for rank in members:
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
        self.state.update(status="running", step=action.title)
        self.world.barrier(f"before {action.title}")
        if self.node_work is not None and self.node.name in takes_part:
            self.node_work.start_step(action.tag, action.capture)
        started = time.monotonic()
        error = None
        try:
            self.world.barrier(f"starting {action.title}")   # every capture listens before the first packet
            if action.group_backend == "gloo":
                group = self.groups.get(action.world_size)
            elif action.step is not None:
                group = self.backend_groups.get(action.world_size)
            else:
                group = self._tcp_group(members)
            if self.rank in members:
                error = self._run_on(action, group)
            self.world.barrier(f"during {action.title} (N={action.world_size})")
        finally:
            if self.node_work is not None:
                self.node_work.stop_step()
        errors = [e for e in self.world.all_gather(error, f"after {action.title}") if e]
        if self.run is not None:
            if errors:
                self.failures.append({"step": action.title, "error": errors[0]})
                self.run.meta["failures"] = self.failures
                self.say(f"[{index}/{total}] failed: {errors[0]}")
            else:
                self.run.meta.setdefault("step_seconds", {})[action.title] = round(time.monotonic() - started, 2)
            self.run.save()
        if errors and not self.options.keep_going:
            raise DiagError(f"{action.title}: {errors[0]}")

    def _run_on(self, action: Action, group: GroupContext | None) -> str | None:
        from diag.runner import make_job
        from diag.worker import run_job

        spec = action.spec
        if spec.backend == "raw":
            # every rank writes its raw TCP_INFO samples into its own node's part of the run directory
            spec = spec.replace(knobs={**spec.knobs, "tcpinfo_dir": str(self._node_dir() / "tcpinfo")})
        job = make_job(spec, self.root / action.records, argv=["reproduce"], quiet=False)
        job = replace(job, run_id=f"{job.run_id}-n{action.world_size}", gate=False, token=self.options.token,
                      state_dir=self.options.state_dir,
                      meta={**action.job_meta, "mode": self.options.mode, "lab": (self.options.lab or {}).get("name"),
                            "capture": "" if action.capture else None,
                            "capture_tag": action.tag if action.capture else None,
                            "run_dir": str(self.root.resolve())})
        if self.rank != 0:
            job = replace(job, out=None)
        try:
            run_job(job, group=group, raise_errors=True)
        except DiagError as exc:
            return str(exc)
        return None

    def _node_dir(self) -> Path:
        return self.root / "nodes" / self.node.name

    def _tcp_group(self, members: tuple[int, ...]) -> GroupContext | None:
        """A subgroup on the diag_tcp backend (advise: the unchanged script's workaround), made by every rank."""
        import torch.distributed as dist

        self._register_diag_tcp()
        group = dist.new_group(ranks=list(members), backend="diag_tcp", timeout=timedelta(seconds=STEP_TIMEOUT_S))
        return GroupContext(members, members.index(self.rank), group, None, "diag_tcp") if self.rank in members else None

    def advise_actions(self) -> list[Action]:
        """Plain gloo all_gather and each workaround at N=2 (diag.advise), one action each; none where the
        backend under test is not gloo (the workarounds are gloo's)."""
        from diag.advise import advise_specs

        if self.plan.backend != "gloo" or not self.plan.advise:
            return []
        size = per_rank_size(max(self.plan.knob_volumes), 2)
        from diag.runner import transport_tag

        return [Action(f"advise: {entry.title}, N=2", None, 2, spec, {"advise": entry.name}, "advise/records.jsonl",
                       f"advise-{entry.name}--{transport_tag(spec)}-{spec.ops[0]}-n2", capture=False,
                       group_backend="diag_tcp" if spec.backend == "diag_tcp" else "gloo")
                for entry, spec in advise_specs((size,), self.plan.warmup, max(self.plan.iters, 3))]

    # --- the end ----------------------------------------------------------------------------------------
    def finish(self) -> None:
        """Every node analyses its captures; the nodes' files reach the run directory; advise.json."""
        self.world.barrier("after the last step")
        self.state.update(status="analyzing")
        if self.rank == 0 and self.plan.backend == "gloo" and self.plan.advise:
            self._write_advise()
        records = self._records_for_analysis()
        if self.node_work is not None and records:
            self.say("[analyze] every node analyses its own captures")
            self.node_work.analyze(records)
        notes = self.world.all_gather(self.node_work.notes if self.node_work else [], "analysing the captures")
        self._note([n for node_notes in notes for n in node_notes])
        if not self.shared:
            shipped = self.world.gather((self.node.name, self.node_work.files(self.options.keep_pcaps))
                                        if self.node_work else None, "collecting the nodes' results")
            if shipped is not None:
                self._write_shipped([s for s in shipped if s is not None])

    def _records_for_analysis(self) -> list[str]:
        names = sorted(p.name for p in (self.root / "records").glob("*.jsonl")) if self.rank == 0 else []
        if self.shared:
            names = self.world.broadcast(names, "sharing the records")
            return [str(self.root / "records" / name) for name in names]
        contents = self.world.broadcast({name: (self.root / "records" / name).read_bytes() for name in names}
                                        if self.rank == 0 else None, "sharing the records")
        if not self.is_leader or self.rank == 0:
            return [str(self.root / "records" / name) for name in contents] if self.rank == 0 else []
        local = self._node_dir() / "records"
        safefs.private_dir(local)
        for name, data in contents.items():
            safefs.write_file(local / name, data)
        return [str(local / name) for name in contents]

    def _write_shipped(self, shipped: list[tuple[str, dict[str, bytes]]]) -> None:
        for name, files in shipped:
            if name == self.node.name:
                continue
            base = self.root / "nodes" / name
            for relative, data in files.items():
                if relative.startswith("records/"):
                    continue   # rank 0's own copy is the run's
                target = base / relative
                safefs.private_dir(target.parent)
                safefs.write_file(target, data)

    def _write_advise(self) -> None:
        from diag.advise import write_advise

        records = self.root / "advise" / "records.jsonl"
        write_advise(self.root / "advise", records, world_size=2,
                     sizes=(per_rank_size(max(self.plan.knob_volumes), 2),),
                     lab=(self.options.lab or {}).get("name"),
                     failures=[{"workaround": f["step"], "error": f["error"]} for f in self.failures
                               if f["step"].startswith("advise")])

    def report(self) -> int:
        """Rank 0: the report and the terminal summary; the exit status of the run."""
        assert self.run is not None
        self.say("[report] rendering")
        from diag.report import load_run, write_report
        from diag.report.diagnose import summary_lines
        from diag.report.verdict import verdict_lines

        result = write_report(load_run([str(self.root)]), self.root / "report")
        elapsed = time.monotonic() - self.started
        self.run.meta["elapsed_s"] = round(elapsed, 1)
        self.run.save()
        print(f"\ndiag reproduce: done in {elapsed / 60:.1f} min; report: {self.root / 'report' / 'report.html'}")
        print("\n".join(verdict_lines(result.verdict)) if result.verdict else "")
        fired = [f for f in result.findings if f.status == "fired"]
        print(f"findings ({len(fired)}):")
        for line in summary_lines(result.findings):
            print(f"  {line}")
        print(f"  every finding with its evidence: {self.root / 'report' / 'report.md'}, "
              f"{self.root / 'report' / 'findings.json'}", flush=True)
        if self.failures:
            print(f"{len(self.failures)} step(s) failed: see {self.root / 'run.json'}")
            return 1
        return 0


def run_in_place(options: JobOptions) -> int:
    """Every rank of the job runs this (under torchrun/srun, or diag's own lab/loopback launch)."""
    import torch.distributed as dist

    from diag.console import Progress, reproduce_weights
    from diag.worker import env_rank

    if options.mode not in MODES:
        raise DiagError(f"unknown job mode {options.mode!r}")
    rank, world_size = env_rank()
    if world_size < 2:
        raise DiagError("diag reproduce in place needs at least 2 ranks (torchrun --nnodes K or --nproc-per-node K)")
    iface = job_interface(options.iface)
    if options.iface and not os.environ.get("GLOO_SOCKET_IFNAME"):
        os.environ["GLOO_SOCKET_IFNAME"] = options.iface   # gloo and the raw transport bind the job's interface
    started = time.monotonic()
    say = make_say(started, rank)
    try:
        dist.init_process_group("gloo", timeout=timedelta(seconds=WORLD_TIMEOUT_S))
    except (RuntimeError, ValueError) as exc:
        raise DiagError(f"the job's process group did not form: {str(exc).splitlines()[0]}") from None
    from diag.probe import GroupCoordinator

    world = World(GroupCoordinator())
    job: InPlaceJob | None = None
    try:
        topology = build_topology(world.all_gather(identify(rank, iface), "meeting the other ranks"), iface)
        world.topology = topology
        max_n = min(options.max_n or world_size, world_size)
        plan = resolve_plan(options.quick, max_n, list(options.volumes) if options.volumes else None,
                            options.backend, options.skip, options.profile or None, options.profile_sizes,
                            options.profile_row_s)
        plan = replace(plan, world_sizes=tuple(n for n in plan.world_sizes if n <= world_size))
        say(f"diag reproduce ({options.mode}): {world_size} ranks on {len(topology.nodes)} node(s) "
            f"({', '.join(n.name for n in topology.nodes)}); N = {', '.join(map(str, plan.world_sizes))}; "
            f"D = {', '.join(human_bytes(v) for v in plan.volumes)}"
            + (f"; profile: {len(plan.profile_sizes)} sizes per rank, {human_bytes(min(plan.profile_sizes))}.."
               f"{human_bytes(max(plan.profile_sizes))}" if any(s.kind == "profile" for s in plan.steps) else ""))
        job = InPlaceJob(options, world, topology, plan, say)
        job.prepare()
        say(f"diag reproduce: run directory {job.root}" + ("" if job.shared else
            " (not shared with every node: each node sends its results to rank 0 at the end)"))
        from diag.inplace.links import measure_links

        measure_links(job)
        job.make_groups()
        actions = job.actions() + job.advise_actions()
        # One plan-level bar, weighted by bytes x iterations (sizes double: counting steps would mislead).
        *weights, advise = reproduce_weights(plan, step_spec, per_rank_size(max(plan.knob_volumes), 2))
        left = len(actions) - len(weights)   # advise's actions share its weight (none: another backend)
        weights += [advise / left] * left if left else []
        progress = Progress("reproduce", sum(weights), live=False) if rank == 0 else None
        for index, (action, weight) in enumerate(zip(actions, weights, strict=True), 1):
            job.run_action(action, index, len(actions), progress)
            if progress is not None:
                progress.advance(weight)
        job.finish()
        code = job.report() if rank == 0 else 0
        if options.mode != "in-place":
            code = 0   # diag's own launch reads the failed steps from run.json (torchrun would add a traceback)
        job.state.update(status="done")
        world.barrier("at the end", timeout_s=600.0)
        return code
    except (DiagError, KeyboardInterrupt) as exc:
        message = str(exc) if isinstance(exc, DiagError) else "interrupted"
        if job is not None:
            job.state.update(status="failed", error=message)
            if job.run is not None:
                job.run.meta["failures"] = [*job.failures, {"step": "job", "error": message}]
                job.run.save()
        raise
    finally:
        if dist.is_initialized():
            with contextlib.suppress(Exception):   # a lost node may leave the group unable to shut down cleanly
                dist.destroy_process_group()


__all__ = ["MODES", "Action", "InPlaceJob", "JobOptions", "Run", "run_in_place"]

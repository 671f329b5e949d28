"""Interleaved trials: the arms of several paired experiments, run in ONE launch at one world size, in
rounds of short blocks, each round in a fresh random order, until every comparison the trial serves is
decided or its time budget is spent.

Why one launch: arms run minutes apart in separate launches see different background load, and a verdict
then reads the load, not the knob (seen: raw --conn shared 1.25x slower than split beside a busy core, 0.99x
on a quiet machine). Here every arm runs in every round, so drift falls on all arms alike, and the analysis
resamples by round (diag.stats.bootstrap_means). Each raw arm has its own transport (its own sockets); the arms
of a torch backend share that backend's process group over the trial's ranks (gloo's, and e.g. diag_tcp's
beside it: one launch holds arms of several backends), and the control group (gloo) carries the trial's own
small messages (stop votes, CPU samples), outside every timed window.

A block is one call of the shared timing loop (harness.measure_row) and one record, with ``block`` set:
trial, arm, round, position in the round, the round's order, and the CPU the block saw. The same
comparisons decide here (to stop) and in diagnose (from the records), through diag.verdicts; the trial's
data types and the reading of its blocks are diag.trialspec, which the report imports instead of this.
"""

from __future__ import annotations

import math
import re
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from diag.trialspec import COMMAND_BACKEND, TrialArm, TrialSpec, decide_all, round_order
from diag.units import human_bytes


def arm_spec(base: Any, arm: TrialArm, size: int, iters: int, warmup: int) -> Any:
    """The SweepSpec one block of an arm runs."""
    spec = base.replace(backend=arm.backend, ops=(arm.op,), sizes=(size,), iters=iters, warmup=warmup,
                        order=arm.order)
    if arm.backend == "raw":
        spec = spec.replace(algo=arm.algo, knobs={**base.knobs, **arm.knobs})
    return spec


class _CpuMeter:
    """CPU of this rank's process per thread, and of the whole machine, between two reads."""

    def __init__(self) -> None:
        import psutil

        self._process = psutil.Process()
        self._psutil = psutil
        self._mark()

    def _mark(self) -> None:
        self._t = time.monotonic()
        self._machine = self._psutil.cpu_times()
        try:
            self._threads = {t.id: t.user_time + t.system_time for t in self._process.threads()}
        except self._psutil.Error:
            self._threads = {}

    def read(self) -> dict[str, float | None]:
        t, machine, threads = self._t, self._machine, self._threads
        self._mark()
        wall = max(self._t - t, 1e-9)
        busy_before = sum(machine) - machine.idle - getattr(machine, "iowait", 0.0)
        busy_after = sum(self._machine) - self._machine.idle - getattr(self._machine, "iowait", 0.0)
        total = sum(self._machine) - sum(machine)
        busiest = max((v - threads.get(k, 0.0) for k, v in self._threads.items()), default=None)
        return {"machine_busy": (busy_after - busy_before) / total if total > 0 else None,
                "busiest_thread": busiest / wall if busiest is not None else None}


def _cpu_shares(said: Any) -> dict[str, float | None]:
    """One rank's CPU reading as another rank received it: a share (a finite number) or None per key."""
    def share(value: Any) -> float | None:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        return float(value) if ok else None

    said = said if isinstance(said, dict) else {}
    return {key: share(said.get(key)) for key in ("machine_busy", "busiest_thread")}


def run_trial(torch_transports: Mapping[str, Any], trial_json: Mapping[str, Any], base: Any,
              emit: Callable[[Any], None], run_id: str, heartbeat: Callable[[], None] | None = None,
              say: Callable[[str], None] | None = None, token: bytes | None = None, group: Any = None) -> dict[str, Any]:
    """Every rank runs this; rank 0 emits the block records and returns the trial's summary for the end event.
    ``torch_transports``: one TorchTransport per torch backend the arms name (diag.trialspec.TrialSpec.
    torch_backends), each on its own process group of the trial's ranks; ``token``: the raw arms' run token from
    the job file (None: rank 0 publishes one in the store, as for any raw launch); ``group``: the subgroup of
    the job the trial runs on (diag.transports.group.GroupContext), whose control group carries the stop votes
    and CPU samples (None: the default group of a launch of its own)."""
    import torch
    import torch.distributed as dist

    from diag.external.arm import ArmFailed, CommandArm
    from diag.harness import measure_row, plan_rows
    from diag.transports import messages
    from diag.transports.raw import create_transport

    spec = TrialSpec.from_json(trial_json)
    missing = [b for b in spec.torch_backends if b not in torch_transports]
    if missing:
        raise ValueError(f"trial {spec.name}: no process group for its {', '.join(missing)} arms")
    rank, world = (group.rank, group.world_size) if group is not None else (dist.get_rank(), dist.get_world_size())
    # torch's collectives name their root by its global rank, also on a subgroup
    pg = group.control if group is not None else None
    leader = group.global_rank(0) if group is not None else 0
    if spec.programs:
        spec = _programs_of_rank0(spec, pg)
    tell = say or (lambda text: print(text, file=sys.stderr, flush=True))
    transports: dict[str, Any] = {}
    programs: dict[str, CommandArm] = {}   # arms whose block is a program's run (diag.external), not a row
    failed: dict[str, str] = {}            # arm -> why it left the trial (a program that failed)
    try:
        for arm in spec.arms:   # the same order on every rank: raw meshes rendezvous by creation order
            if arm.backend == COMMAND_BACKEND:
                programs[arm.name] = CommandArm(arm, rank, world, group, spec.name)
                continue
            transports[arm.name] = torch_transports[arm.backend] if arm.backend != "raw" else create_transport(
                arm_spec(base, arm, spec.sizes[0], 1, 0), rank, world, base.timeout_s,
                store=group.store if group is not None else None, token=token)
        meter = _CpuMeter()
        summary: dict[str, Any] = {}
        for size_index, size in enumerate(spec.sizes):
            if spec.comparisons and all(set(c.arm_names) & set(failed) for c in spec.comparisons):
                if rank == 0:   # the arms left cannot decide anything: no block is worth running
                    summary[str(size)] = {"rounds": 0, "stopped": "failed", "seconds": 0.0, "decisions": {}}
                continue
            records: list[Any] = []
            budget = spec.budget_for(size)
            started = time.monotonic()
            longest_round = 0.0
            stopped = "max_rounds"
            for round_index in range(spec.max_rounds):
                round_started = time.monotonic()
                order = [n for n in round_order(spec, size_index, round_index) if n not in failed]
                for position, name in enumerate(order):
                    arm = spec.arm(name)
                    meter.read()
                    if name in programs:
                        try:   # a fresh process every block: the program's warm-up runs every time
                            record = programs[name].measure(size, size_index, round_index, arm.op,
                                                            spec.block_iters, spec.warmup, run_id, heartbeat)
                        except ArmFailed as exc:
                            failed[name] = str(exc)
                            tell(f"  trial {spec.name}: {exc}; the arm leaves the trial")
                            continue
                    else:
                        block_spec = arm_spec(base, arm, size, spec.block_iters,
                                              spec.warmup if round_index == 0 else 0)
                        (plan,) = plan_rows(block_spec, world)
                        record = measure_row(transports[name], block_spec, plan, run_id, heartbeat)
                    cpu = {**meter.read(), **(programs[name].cpu if name in programs else {})}
                    # data, never a pickle (diag.transports.messages); a rank's CPU shares checked as numbers
                    gathered = [_cpu_shares(g) for g in messages.all_gather(cpu, group=pg)]
                    if record is not None:
                        # a block is short by design: the sample-count warning speaks of rows, not blocks
                        record = replace(record, warnings=[w for w in record.warnings if "samples" not in w],
                                         block={
                            "trial": spec.name, "arm": name, "round": round_index, "position": position,
                            "order": order, "size_index": size_index,
                            "cpu": {key: [g[key] for g in gathered] for key in ("machine_busy", "busiest_thread")}})
                        records.append(record)
                        emit(record)
                longest_round = max(longest_round, time.monotonic() - round_started)
                stop = torch.zeros(1, dtype=torch.int64)
                if rank == 0:
                    decisions = decide_all(spec, records, size)
                    alive = [c.key for c in spec.comparisons if not set(c.arm_names) & set(failed)]
                    open_rules = [key for key in alive if key not in decisions
                                  or (decisions[key].verdict == "undecided" and not decisions[key].final)]
                    elapsed = time.monotonic() - started
                    if not alive and spec.comparisons:
                        stopped = "failed"   # every comparison names an arm that failed
                    elif round_index + 1 >= spec.min_rounds and not open_rules:
                        stopped = "decided"
                    elif round_index + 1 >= spec.min_rounds and elapsed + longest_round > budget:
                        stopped = "budget"
                    else:
                        stopped = ""
                    tell(f"  trial {spec.name} {human_bytes(size)} round {round_index + 1}: " + ", ".join(
                        f"{key} {d.verdict}" for key, d in decisions.items()) + (f" -> stop ({stopped})"
                                                                                 if stopped else ""))
                    stop[0] = 1 if stopped else 0
                dist.broadcast(stop, src=leader, group=pg)
                if int(stop[0]):
                    break
            if rank == 0:
                decisions = decide_all(spec, records, size)
                summary[str(size)] = {"rounds": round_index + 1, "stopped": stopped or "max_rounds",
                                      "seconds": round(time.monotonic() - started, 3),
                                      "decisions": {key: d.to_json() for key, d in decisions.items()}}
        return {"trial": {"name": spec.name, "spec": spec.to_json(), "sizes": summary,
                          "failed_arms": failed}} if rank == 0 else {}
    finally:
        for program in programs.values():
            program.close()
        shared = [id(t) for t in torch_transports.values()]
        for name, transport in transports.items():
            if id(transport) not in shared:
                try:
                    transport.close()
                except Exception as exc:  # closing must not hide the trial's own error
                    tell(f"  trial: closing arm {name}: {exc}")


def _programs_of_rank0(spec: TrialSpec, pg: Any) -> TrialSpec:
    """A trial of programs with rank 0's directories for the programs ({shared}, where block outputs go): in
    a user's own launch every rank named its own run directory. Each rank keeps its own commands (what its
    own command line asked; rank 0 never sends another rank something to run), and a rank whose arms differ
    from rank 0's stops the trial in one line."""
    from diag.errors import DiagError
    from diag.transports import messages

    mine = {a.name: [a.knobs.get("command"), a.knobs.get("adapter")] for a in spec.arms if a.backend == COMMAND_BACKEND}
    first = next(a for a in spec.arms if a.backend == COMMAND_BACKEND)
    said = messages.broadcast({"arms": mine, "shared_dir": first.knobs.get("shared_dir", ""),
                               "outputs_dir": first.knobs.get("outputs_dir", "")}, src=0, group=pg)
    differs = [r for r, arms in enumerate(messages.all_gather(mine, group=pg)) if arms != said.get("arms")]
    if differs:
        raise DiagError(f"trial {spec.name}: rank {differs[0]} was given other arms than rank 0 (--arm, --adapter): "
                        "start every rank with the same command line")
    paths = {k: str(said.get(k) or "") for k in ("shared_dir", "outputs_dir")}
    for key, path in paths.items():   # {shared} goes into every rank's shell command: a plain absolute path only
        if path and not re.fullmatch(r"/[A-Za-z0-9._/+-]*", path):
            raise DiagError(f"trial {spec.name}: rank 0's {key.replace('_dir', '')} directory {path[:80]!r} is not a "
                            "plain absolute path (letters, digits, . _ / + -): choose --out or --shared-dir so")
    return replace(spec, arms=tuple(replace(a, knobs={**a.knobs, **paths}) if a.backend == COMMAND_BACKEND else a
                                    for a in spec.arms))


__all__ = ["arm_spec", "run_trial"]


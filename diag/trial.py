"""Interleaved trials: the arms of several paired experiments, run in ONE launch at one world size, in
rounds of short blocks, each round in a fresh random order, until every comparison the trial serves is
decided or its time budget is spent.

Why one launch: arms run minutes apart in separate launches see different background load, and a verdict
then reads the load, not the knob (seen: raw --conn shared 1.25x slower than split beside a busy core, 0.99x
on a quiet machine). Here every arm runs in every round, so drift falls on all arms alike, and the analysis
resamples by round (diag.stats.bootstrap_means). Each arm has its own transport (its own sockets); the gloo
process group of the launch is the gloo arm's and also carries the trial's own small messages (stop votes,
CPU samples), outside every timed window.

A block is one call of the shared timing loop (harness.measure_row) and one record, with ``block`` set:
trial, arm, round, position in the round, the round's order, and the CPU the block saw. The same
comparisons decide here (to stop) and in diagnose (from the records), through diag.verdicts.
"""

from __future__ import annotations

import math
import random
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from diag.errors import DiagError
from diag.stats import Arm
from diag.units import human_bytes
from diag.verdicts import DESIGNS, ArmCpu, Decision, difference, explained_share

TRIAL_SCHEMA = 1


@dataclass(frozen=True)
class TrialArm:
    """One arm: a transport with its knobs, running one op."""

    name: str
    backend: str = "raw"                   # "raw", or the launch's own backend (gloo, diag_tcp): its process group
    op: str = "all_gather"
    algo: str = "ring"
    order: str = "recv-first"              # exchange / p2p post order
    knobs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Comparison:
    """A question the trial answers, by arm names; ``rule`` is the diagnose rule whose finding it is."""

    rule: str
    design: str                            # diag.verdicts.DESIGNS
    on: str                                # knock-out: base (suspect on); knock-in: healthy + suspect; difference: b
    off: str                               # knock-out: toggle; knock-in: healthy; difference: a
    reference: str = ""                    # knock-out: the healthy arm; knock-in: the anomaly arm
    effect: float = 0.15                   # difference: smallest change that counts

    def __post_init__(self) -> None:
        if self.design not in DESIGNS:
            raise DiagError(f"unknown experiment design {self.design!r}: one of {', '.join(DESIGNS)}")
        if self.design != "difference" and not self.reference:
            raise DiagError(f"a {self.design} comparison needs a reference arm")

    @property
    def key(self) -> str:
        """Names the comparison among a trial's (several may serve one rule, e.g. an order effect per backend)."""
        return f"{self.rule}:{self.on}/{self.off}"

    @property
    def arm_names(self) -> tuple[str, ...]:
        return tuple(n for n in (self.on, self.off, self.reference) if n)

    def decide(self, arms: Mapping[str, Arm], cpu: Mapping[str, ArmCpu] | None = None, seed: int = 0) -> Decision:
        if self.design == "difference":
            return difference(arms[self.off], arms[self.on], self.effect, cpu, seed)
        if self.design == "knock-out":
            return explained_share(arms[self.on], arms[self.off], arms[self.on], arms[self.reference],
                                   "knock-out", cpu, seed)
        return explained_share(arms[self.on], arms[self.off], arms[self.reference], arms[self.off],
                               "knock-in", cpu, seed)


@dataclass(frozen=True)
class TrialSpec:
    name: str
    arms: tuple[TrialArm, ...]
    comparisons: tuple[Comparison, ...]
    sizes: tuple[int, ...]                 # per-rank bytes, one set of rounds each
    block_iters: int = 2
    warmup: int = 1                        # before each arm's first block at a size
    min_rounds: int = 4
    max_rounds: int = 16
    budget_s: float = 90.0                 # all sizes together, shared in proportion to size
    seed: int = 0

    def __post_init__(self) -> None:
        names = [a.name for a in self.arms]
        if len(set(names)) != len(names):
            raise DiagError(f"trial {self.name}: two arms with one name")
        for c in self.comparisons:
            missing = [n for n in c.arm_names if n not in names]
            if missing:
                raise DiagError(f"trial {self.name}: comparison {c.rule} names unknown arms {missing}")
        if not 1 <= self.min_rounds <= self.max_rounds or self.block_iters < 1:
            raise DiagError("a trial needs 1 <= min_rounds <= max_rounds and block_iters >= 1")
        if self.budget_s <= 0 or not self.sizes:
            raise DiagError("a trial needs sizes and a positive time budget")

    def to_json(self) -> dict[str, Any]:
        return {"schema": TRIAL_SCHEMA, **asdict(self)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TrialSpec:
        data = {k: v for k, v in data.items() if k != "schema"}
        return cls(**{**data, "arms": tuple(TrialArm(**a) for a in data["arms"]),
                      "comparisons": tuple(Comparison(**c) for c in data["comparisons"]),
                      "sizes": tuple(data["sizes"])})

    def budget_for(self, size: int) -> float:
        return self.budget_s * size / sum(self.sizes)

    def arm(self, name: str) -> TrialArm:
        return next(a for a in self.arms if a.name == name)


def round_order(spec: TrialSpec, size_index: int, round_index: int) -> list[str]:
    """The arms of one round in a fresh random order, the same on every rank (seeded by position)."""
    names = [a.name for a in spec.arms]
    random.Random(f"{spec.seed}/{size_index}/{round_index}").shuffle(names)
    return names


def arm_spec(base: Any, arm: TrialArm, size: int, iters: int, warmup: int) -> Any:
    """The SweepSpec one block of an arm runs."""
    spec = base.replace(backend=arm.backend, ops=(arm.op,), sizes=(size,), iters=iters, warmup=warmup,
                        order=arm.order)
    if arm.backend == "raw":
        spec = spec.replace(algo=arm.algo, knobs={**base.knobs, **arm.knobs})
    return spec


# --- what the analysis reads back ------------------------------------------------------------------------

def arms_of(records: Sequence[Any], trial: str, size: int) -> dict[str, Arm]:
    """arm name -> its blocks at one per-rank size, keyed by round (the records' ``block``)."""
    blocks: dict[str, list[tuple[list[float], str]]] = {}
    for r in records:
        b = r.block
        if b.get("trial") == trial and r.size_bytes == size:
            blocks.setdefault(b["arm"], []).append((r.times_s, f"{trial}/{size}/{b['round']}"))
    return {name: Arm.of(name, [t for t, _ in items], [k for _, k in items]) for name, items in blocks.items()}


def cpu_of(records: Sequence[Any], trial: str, size: int) -> dict[str, ArmCpu]:
    """arm name -> the CPU its blocks saw (None where a block carried no samples)."""
    busy: dict[str, list[float]] = {}
    thread: dict[str, list[float]] = {}
    for r in records:
        b = r.block
        if b.get("trial") != trial or r.size_bytes != size or not b.get("cpu"):
            continue
        for key, into in (("machine_busy", busy), ("busiest_thread", thread)):
            values = [v for v in b["cpu"].get(key) or () if v is not None]
            if values:
                into.setdefault(b["arm"], []).append(max(values))
    names = set(busy) | set(thread)
    # The busiest thread counts only where it held most of a core in at least half the arm's blocks: one
    # block's spike is not an arm's bottleneck.
    return {n: ArmCpu(sum(busy[n]) / len(busy[n]) if busy.get(n) else None,
                      sorted(thread[n])[len(thread[n]) // 2] if thread.get(n) else None) for n in names}


def decide_all(spec: TrialSpec, records: Sequence[Any], size: int) -> dict[str, Decision]:
    arms = arms_of(records, spec.name, size)
    cpu = cpu_of(records, spec.name, size)
    return {c.key: c.decide(arms, cpu, spec.seed) for c in spec.comparisons
            if all(n in arms for n in c.arm_names)}


# --- the worker side ------------------------------------------------------------------------------------

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


def run_trial(gloo: Any, trial_json: Mapping[str, Any], base: Any, emit: Callable[[Any], None], run_id: str,
              heartbeat: Callable[[], None] | None = None, say: Callable[[str], None] | None = None,
              token: bytes | None = None, group: Any = None) -> dict[str, Any]:
    """Every rank runs this; rank 0 emits the block records and returns the trial's summary for the end event.
    ``gloo`` is the launch's TorchTransport (the arms of its backend run on it; its group, or the subgroup's
    control group, carries the stop votes); ``token``: the raw arms' run
    token from the job file (None: rank 0 publishes one in the store, as for any raw launch); ``group``: the
    subgroup of an in-place job the trial runs on (diag.transports.group.GroupContext), None: the whole
    launch."""
    import torch
    import torch.distributed as dist

    from diag.harness import measure_row, plan_rows
    from diag.transports import messages
    from diag.transports.raw import create_transport

    spec = TrialSpec.from_json(trial_json)
    rank, world = gloo.rank, gloo.world_size
    # torch's collectives name their root by its global rank, also on a subgroup
    pg = group.control if group is not None else None
    leader = group.global_rank(0) if group is not None else 0
    tell = say or (lambda text: print(text, file=sys.stderr, flush=True))
    transports: dict[str, Any] = {}
    try:
        for arm in spec.arms:   # the same order on every rank: raw meshes rendezvous by creation order
            transports[arm.name] = gloo if arm.backend != "raw" else create_transport(
                arm_spec(base, arm, spec.sizes[0], 1, 0), rank, world, base.timeout_s,
                store=group.store if group is not None else None, token=token)
        meter = _CpuMeter()
        summary: dict[str, Any] = {}
        for size_index, size in enumerate(spec.sizes):
            records: list[Any] = []
            budget = spec.budget_for(size)
            started = time.monotonic()
            longest_round = 0.0
            stopped = "max_rounds"
            for round_index in range(spec.max_rounds):
                round_started = time.monotonic()
                order = round_order(spec, size_index, round_index)
                for position, name in enumerate(order):
                    arm = spec.arm(name)
                    block_spec = arm_spec(base, arm, size, spec.block_iters,
                                          spec.warmup if round_index == 0 else 0)
                    (plan,) = plan_rows(block_spec, world)
                    meter.read()
                    record = measure_row(transports[name], block_spec, plan, run_id, heartbeat)
                    cpu = meter.read()
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
                    open_rules = [key for key, d in decisions.items() if d.verdict == "undecided" and not d.final]
                    elapsed = time.monotonic() - started
                    if round_index + 1 >= spec.min_rounds and not open_rules:
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
        return {"trial": {"name": spec.name, "spec": spec.to_json(), "sizes": summary}} if rank == 0 else {}
    finally:
        for name, transport in transports.items():
            if transport is not gloo:
                try:
                    transport.close()
                except Exception as exc:  # closing must not hide the trial's own error
                    tell(f"  trial: closing arm {name}: {exc}")


__all__ = ["Comparison", "TrialArm", "TrialSpec", "arm_spec", "arms_of", "cpu_of", "decide_all",
           "round_order", "run_trial"]


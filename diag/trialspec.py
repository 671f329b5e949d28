"""An interleaved trial as data: its arms, the comparisons it answers, its sizes and rounds, and how its block
records are read back into arms and decisions. One definition, imported by the runner (diag/trial.py, which
writes the blocks) and by the report (which reads them): the report never imports the runner.

The spec travels in a records file's start event (``meta.trial``, ``TrialSpec.to_json``); every block of
the trial is one record whose ``block`` names its trial, arm, round, position and the round's order
(diag/records.py, schema 2). Decisions go through diag.verdicts, so the trial that stops on them while it
runs and the diagnosis that reads them afterwards cannot disagree.

Trial spec history (bump TRIAL_SCHEMA for any change a reader must know about):
  1 - first version: arms (transport x knobs x op), comparisons by arm name, sizes, rounds, budget, seed. An
      arm's ``backend`` is "raw" or a torch.distributed backend (gloo, diag_tcp, nccl); one trial may hold arms
      of several torch backends, each run on its own process group of the same ranks. An arm whose backend
      is "command" is a program (diag trial, diag.external): its knobs hold the command and its adapter, its
      blocks' records are labelled ``command:<arm>``, and the end event's ``trial.failed_arms`` names the
      arms that left the trial (a block that failed on some rank) with why.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from diag.errors import DiagError
from diag.stats import Arm
from diag.verdicts import DESIGNS, ArmCpu, Decision, difference, explained_share

TRIAL_SCHEMA = 1
TORCH_BACKENDS = ("gloo", "nccl", "diag_tcp")
# A program's trial (diag trial): what its records say, read by diag.report.arms.
COMMAND_BACKEND = "command"      # TrialArm.backend of a program's arm; its records' backend ("command:<arm>")
ARM_RULE = "arm_difference"      # the rule of each arm's comparison with the trial's baseline
LINK_ARM = "link"                # diag's raw-TCP reference arm beside the programs (diag trial --link)


@dataclass(frozen=True)
class TrialArm:
    """One arm: a transport with its knobs, running one op. ``backend``: "raw" (diag's own TCP collectives)
    or a torch.distributed backend, run on a process group of that backend over the trial's ranks."""

    name: str
    backend: str = "raw"
    op: str = "all_gather"
    algo: str = "ring"
    order: str = "recv-first"              # exchange / p2p post order
    knobs: dict[str, Any] = field(default_factory=dict)

    @property
    def on_torch(self) -> bool:
        """The arm runs on a torch.distributed process group (not diag's raw TCP, not a program)."""
        return self.backend not in ("raw", COMMAND_BACKEND)


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

    @property
    def programs(self) -> bool:
        """Some arm is a program (diag trial)."""
        return any(a.backend == COMMAND_BACKEND for a in self.arms)

    @property
    def torch_backends(self) -> tuple[str, ...]:
        """The torch.distributed backends its arms run on, in arm order (each needs a process group)."""
        return tuple(dict.fromkeys(a.backend for a in self.arms if a.on_torch))


def round_order(spec: TrialSpec, size_index: int, round_index: int) -> list[str]:
    """The arms of one round in a fresh random order, the same on every rank (seeded by position)."""
    names = [a.name for a in spec.arms]
    random.Random(f"{spec.seed}/{size_index}/{round_index}").shuffle(names)
    return names


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


__all__ = ["ARM_RULE", "COMMAND_BACKEND", "LINK_ARM", "TORCH_BACKENDS", "TRIAL_SCHEMA", "Comparison", "TrialArm", "TrialSpec", "arms_of", "cpu_of",
           "decide_all", "round_order"]

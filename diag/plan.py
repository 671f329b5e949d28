"""A run's plan, as data (flent's tests are data too): which steps run, at which world sizes and per-device
volumes D, with which knobs, and what every node records around them. Every command that measures builds one
and runs it on the one job (diag.inplace): ``diag reproduce`` the full plan (--quick and the default differ
only in these numbers and steps), ``diag sweep`` and ``diag.sweep()`` a plan of one sweep step, ``diag
advise`` a plan of one trial step (the workarounds beside plain gloo). A new experiment is one more Step.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from diag.errors import DiagError
from diag.runinfo import step_tag, transport_name
from diag.spec import SweepSpec
from diag.trialspec import Comparison, TrialArm, TrialSpec
from diag.units import parse_size
from diag.verdicts import MIN_ROUNDS, WORKAROUND_EFFECT

# Survey rows sample until the standard error of their mean time is this fraction of it, or SURVEY_MAX_ITERS:
# N=2 rows are a mixture of a fast and a slow mode, and five samples put the median in either.
SURVEY_TARGET_SEM = 0.03
SURVEY_MAX_ITERS = 12
# Every collective of a step may take this long before a dead or hung peer fails it (the subgroups' own
# timeout in place); a 16 MiB exchange at 100 Mbit/s takes ~1.5 s.
STEP_TIMEOUT_S = 120.0
ADVISE = "advise"              # the name of the advise step, its trial and its records file
MIN_ROUNDS_DECIDE = int(MIN_ROUNDS.value)   # a trial's fewest rounds: no verdict is taken on fewer
SWEEP = "sweep"                # the name of diag sweep's one step and its records file


@dataclass(frozen=True)
class Step:
    """One experiment of the plan, as data: which transport runs which op, at which world sizes and volumes,
    with which knobs. ``at`` is "every_n" (the plan's world sizes) or "n2"; ``volumes`` is "sweep" (the
    plan's per-device volumes D), "experiment" (its knob volumes), "largest" (the largest knob volume),
    "exchange" (its exchange sizes, per rank), "profile" (the plan's profile sizes, per rank, the same at every
    N), "given" (the trial's or the sweep's own sizes) or "per_n"
    (``sizes_at``: per-rank sizes chosen for each world size by the step's maker, e.g. diag trial's --volumes
    in its op's own bus model). ``captured``: every node captures during this trial step too (diag trial
    --capture; a trial's blocks name their arm in the analysis' phases); the model's profile is never captured.
    ``sweep``:
    a sweep as the user gave it (sizes, ops, dtype, gap, seed, check, timeout: diag sweep), run as it is at
    every N. The step's name names its records file and prefixes its captures' tags."""

    name: str
    backend: str                         # "gloo" | "raw" | "nccl" | "diag_tcp", or "trial"
    op: str = "all_gather"
    at: str = "every_n"
    volumes: str = "sweep"
    knobs: dict[str, Any] = field(default_factory=dict)
    algo: str = "ring"                   # raw only
    order: str = "recv-first"            # exchange: which call each rank posts first
    min_iters: int = 0                   # e.g. the order effect is judged by a two-sample test on these rows
    trial: TrialSpec | None = None       # an interleaved trial (backend "trial"): its arms, comparisons
    budget_share: float = 0.0            # of the plan's trial budget
    dtype: str = "float32"
    sweep: SweepSpec | None = None
    sizes_at: dict[str, tuple[int, ...]] = field(default_factory=dict)   # "per_n": str(N) -> per-rank sizes
    captured: bool = False

    @property
    def kind(self) -> str:
        """"sweep" (every N), "trial" (an interleaved N=2 trial), "advise" (the workarounds' trial), "knob"
        (a raw knob row at N=2) or "profile" (the model's profile at every N: with_profile): what --skip
        names."""
        if self.volumes == "profile":
            return "profile"
        if self.trial is not None:
            return ADVISE if self.trial.name == ADVISE else "trial"
        return "sweep" if self.at == "every_n" else "knob"

    @property
    def torch_backends(self) -> tuple[tuple[str, dict[str, Any]], ...]:
        """(backend, knobs) of every torch.distributed process group the step runs on besides gloo's (gloo's
        group exists for every N: it carries the job's own messages): diag_tcp takes its knobs when its group
        is made, the others none."""
        if self.trial is not None:
            pairs = [(a.backend, a.knobs) for a in self.trial.arms if a.on_torch]
        elif self.sweep is not None:
            pairs = [(self.sweep.backend, self.sweep.knobs)] if self.sweep.backend != "raw" else []
        else:
            pairs = [(self.backend, self.knobs)] if self.backend not in ("raw", "trial") else []
        return tuple((b, dict(k) if b == "diag_tcp" else {}) for b, k in pairs if b != "gloo")

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["trial"] = self.trial.to_json() if self.trial else None
        out["sweep"] = asdict(self.sweep) if self.sweep else None
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Step:
        data = dict(data)
        data["trial"] = TrialSpec.from_json(data["trial"]) if data.get("trial") else None
        data["sweep"] = SweepSpec.from_dict(data["sweep"]) if data.get("sweep") else None
        return cls(**data)


@dataclass(frozen=True)
class Plan:
    """What a run does. ``name``: what built it ("quick", "full": diag reproduce; "sweep"; "advise"). Around the
    steps: ``probe`` measures the link matrix and the ring pattern first, ``capture`` has every node capture
    its own NIC during the steps that are not trials, ``observe`` samples every node's ranks (CPU, ss/TCP_INFO,
    NIC counters) during every step, ``report`` has rank 0 write the report at the end."""

    world_sizes: tuple[int, ...]
    volumes: tuple[int, ...] = ()       # per-device volume D = (N-1) x per-rank bytes, the same for every N
    exchange_sizes: tuple[int, ...] = ()
    knob_volumes: tuple[int, ...] = ()  # D of the N=2 experiments (interleaved trials, raw knob rows)
    rate: str = ""
    warmup: int = 1
    iters: int = 5
    steps: tuple[Step, ...] = ()
    trial_budget_s: float = 90.0        # all trials together; each stops sooner once its verdicts are decided
    backend: str = "gloo"               # the backend under test (see under_test)
    name: str = "quick"
    probe: bool = True
    incast: bool = True                 # the probe's incast phases (--skip incast)
    capture: bool = True
    observe: bool = True
    report: bool = True
    timeout_s: float = STEP_TIMEOUT_S   # every subgroup's: a collective past it fails the step
    profile_sizes: tuple[int, ...] = () # per-rank sizes of the profile steps (with_profile)
    profile_row_s: float = 0.0          # each profile row samples until its mean is known or this is spent

    def world_sizes_of(self, step: Step) -> tuple[int, ...]:
        return self.world_sizes if step.at == "every_n" else (2,)

    def sizes_of(self, step: Step, world_size: int) -> tuple[int, ...]:
        """Per-rank sizes of a step at one world size."""
        if step.volumes == "given":
            return step.sweep.sizes if step.sweep is not None else step.trial.sizes if step.trial else ()
        if step.volumes == "exchange":
            return self.exchange_sizes
        if step.volumes == "profile":
            return self.profile_sizes
        if step.volumes == "per_n":
            return tuple(step.sizes_at.get(str(world_size), ()))
        volumes = {"sweep": self.volumes, "experiment": self.knob_volumes,
                   "largest": self.knob_volumes[-1:]}[step.volumes]
        return tuple(sorted({per_rank_size(v, world_size) for v in volumes}))

    def groups_at(self, world_size: int) -> tuple[tuple[str, dict[str, Any]], ...]:
        """(backend, knobs) of the process groups besides gloo's that the steps at one N run on, in plan order."""
        out: list[tuple[str, dict[str, Any]]] = []
        for step in self.steps:
            if world_size in self.world_sizes_of(step):
                out += [pair for pair in step.torch_backends if pair not in out]
        return tuple(out)

    @property
    def has_advise(self) -> bool:
        return any(step.kind == ADVISE for step in self.steps)

    def to_json(self) -> dict[str, Any]:
        """The plan as a JSON object (lists, not tuples: what run.json and the job file hold, read back equal)."""
        document = {**{k: v for k, v in asdict(self).items() if k != "steps"}, "steps": [s.to_json() for s in self.steps]}
        return json.loads(json.dumps(document))

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Plan:
        known = {name for name in cls.__dataclass_fields__}
        data = {k: v for k, v in data.items() if k in known}
        for name in ("world_sizes", "volumes", "exchange_sizes", "knob_volumes", "profile_sizes"):
            data[name] = tuple(data.get(name) or ())
        data["steps"] = tuple(Step.from_json(s) for s in data.get("steps") or ())
        return cls(**data)


# gloo and raw TCP at every N, equal D; --emulate gloo (shared + notify + 2 chunks) runs at every N too.
SWEEPS = (
    Step("gloo-all_gather", "gloo"),
    Step("raw-ring-all_gather", "raw"),
    Step("raw-ring-emulate-gloo-all_gather", "raw", knobs={"emulate": "gloo"}),
)
# The interleaved trial at N=2 (diag/trial.py): every arm in every round, so the comparisons below hold arms
# that saw the same background load. Arms: gloo (the anomaly), raw TCP with one connection per direction
# (the healthy reference: the link), gloo's protocol model (--emulate gloo: the base arm of M1's knock-out),
# the model with only its ready notice on its own connection (M1's toggle), and raw TCP with both directions
# on one connection (M4's knock-in: each direction's ACKs behind the other's data).
N2_ARMS = (
    TrialArm("gloo", "gloo"),
    TrialArm("raw"),
    TrialArm("model", knobs={"emulate": "gloo"}),
    TrialArm("model-own-conn", knobs={"emulate": "gloo", "notice": "own-conn"}),
    TrialArm("shared-conn", knobs={"conn": "shared"}),
)
N2_COMPARISONS = (
    Comparison("notice_behind_data", "knock-out", on="model", off="model-own-conn", reference="raw"),
    Comparison("shared_connection", "knock-in", on="shared-conn", off="raw", reference="gloo"),
)
# The exchange op in both orders, gloo's and raw TCP's arms in the same rounds (diagnose: exchange_order),
# so an order effect can be pinned on the backend alone.
EXCHANGE_ARMS = tuple(TrialArm(f"{name}-{order}", backend, op="exchange", order=order)
                      for name, backend in (("gloo", "gloo"), ("raw", "raw")) for order in ("recv-first", "send-first"))
EXCHANGE_COMPARISONS = tuple(Comparison("exchange_order", "difference", on=f"{name}-send-first",
                                        off=f"{name}-recv-first", effect=0.15) for name in ("gloo", "raw"))
# The workarounds a user can apply to gloo's N=2 all_gather without touching gloo (diag/advise.py), beside
# plain gloo all_gather in the same rounds: all_gather built from batch_isend_irecv with every receive posted
# first, and the unchanged call on the diag_tcp backend (its own process group of the same ranks). Each is
# held against plain gloo by the same design as an order effect: a difference of at least WORKAROUND_EFFECT.
ADVISE_ARMS = (
    TrialArm("gloo", "gloo"),
    TrialArm("p2p-recv-first", "gloo", op="all_gather_p2p", order="recv-first"),
    TrialArm("diag_tcp", "diag_tcp"),
)
ADVISE_COMPARISONS = tuple(Comparison("workarounds", "difference", on=arm.name, off="gloo",
                                      effect=WORKAROUND_EFFECT.value) for arm in ADVISE_ARMS[1:])


def _trial(name: str, arms: tuple[TrialArm, ...], comparisons: tuple[Comparison, ...], volumes: str,
           share: float, dtype: str = "float32") -> Step:
    """A trial step; its sizes come from the plan at run time (step_trial)."""
    # One iteration a block: the variance is between rounds as much as within them, so rounds are what a
    # verdict needs most of (and a block's first iteration pays no switch-over cost worth a warm-up: the lab's
    # RTT is far below a millisecond).
    return Step(name, "trial", op=arms[0].op, at="n2", volumes=volumes,
                trial=TrialSpec(name, arms, comparisons, sizes=(1,), block_iters=1, min_rounds=5, max_rounds=30),
                budget_share=share, dtype=dtype)


TRIALS = (
    _trial("n2-trial", N2_ARMS, N2_COMPARISONS, "experiment", 0.75),
    _trial("n2-exchange-trial", EXCHANGE_ARMS, EXCHANGE_COMPARISONS, "exchange", 0.25),
)
# The workarounds at the largest knob volume, after every other step (uint8: any size a user asks for).
ADVISE_STEP = _trial(ADVISE, ADVISE_ARMS, ADVISE_COMPARISONS, "largest", 0.3, dtype="uint8")
# N=2 raw rows the wire must see (captured, so not in a trial): a half-duplex schedule, directions in turns,
# the reference half_duplex_match holds gloo against.
KNOBS_QUICK = (
    Step("raw-ring-alternate-io-all_gather", "raw", at="n2", volumes="experiment", knobs={"io": "alternate"}),
)
KNOBS_FULL = (
    *KNOBS_QUICK,
    Step("raw-ring-notify-all_gather", "raw", at="n2", volumes="experiment",
         knobs={"conn": "split", "handshake": "notify", "chunks": 2}),
    Step("raw-ring-shared-alternate-all_gather", "raw", at="n2", volumes="experiment",
         knobs={"conn": "shared", "io": "alternate"}),
)

QUICK = Plan(world_sizes=(2, 3, 4), volumes=tuple(parse_size(s) for s in ("1M", "4M", "16M")),
             exchange_sizes=(parse_size("16M"),), knob_volumes=(parse_size("4M"), parse_size("16M")),
             rate="200mbit", warmup=1, iters=5, trial_budget_s=80.0, name="quick",
             steps=(*SWEEPS, *TRIALS, *KNOBS_QUICK, ADVISE_STEP))
# D=32M is left out of the default: on a 2-core machine N=2..8 with it measured ~21 min (half the steps in
# 10.7 min), over the 20 minutes the default may take; pass --volumes 1M,4M,16M,32M to include it.
FULL = Plan(world_sizes=(2, 3, 4, 5, 6, 7, 8), volumes=tuple(parse_size(s) for s in ("1M", "4M", "16M")),
            exchange_sizes=(parse_size("4M"), parse_size("16M")),
            knob_volumes=(parse_size("4M"), parse_size("16M")), rate="200mbit", warmup=1, iters=6,
            trial_budget_s=200.0, name="full", steps=(*SWEEPS, *TRIALS, *KNOBS_FULL, ADVISE_STEP))


# The profile a simulator needs (docs/model.md, "Profile"): the ops a simulator of distributed inference asks
# about (all_gather, send/recv, all_reduce) at every N, on the backend under test and the raw-TCP reference (its
# all_reduce gathers and reduces locally: no reference for a ring), per-rank sizes from 1 B to 200 MiB (the
# seed's own benchmark went to ~200 MB). Each row samples past PROFILE_MIN_ITERS until the standard error of its
# mean is PROFILE_TARGET_SEM of it or it has spent the plan's profile_row_s: small sizes run hundreds of
# iterations, large ones PROFILE_MIN_ITERS. The model reads records only: the profile is not captured, and its
# rows feed the model, not the diagnosis's survey (their sizes are a simulator's, not an experiment's).
PROFILE_SIZES = (*(4**k for k in range(14)), 200 << 20)       # 1 B, 4 B, 16 B, ..., 64 MiB, 200 MiB
PROFILE_OPS = ("all_gather", "send_recv", "all_reduce")
PROFILE_MIN_ITERS = 2
PROFILE_MAX_ITERS = 1000
PROFILE_TARGET_SEM = 0.01
PROFILE_ROW_S = 2.0
# 200 MiB of all_gather at N=8 over 50 Mbit/s takes ~4 minutes: a profile's collective may take this long.
PROFILE_TIMEOUT_S = 600.0
# A size whose buffers, for every rank of the subgroup on one machine (the lab's N ranks share one), would take
# more than this share of that machine's available memory is left out at that N, and the run says so.
PROFILE_MEMORY_SHARE = 0.5
PROFILE_STEPS = tuple(Step(f"{name}-{op}", backend, op, volumes="profile")
                      for name, backend in (("profile-gloo", "gloo"), ("profile-raw-ring", "raw"))
                      for op in PROFILE_OPS if not (backend == "raw" and op == "all_reduce"))
PROFILE_MODES = ("add", "only")


def with_profile(plan: Plan, mode: str, sizes: tuple[int, ...] | None = None, row_s: float | None = None) -> Plan:
    """The plan with the profile steps: "add" after its own steps (before the advise trial, which stays last),
    "only" instead of them (no survey, trials, knobs or advise, nothing captured: the model's profile alone).
    The profile runs on the backend under test; its subgroups wait PROFILE_TIMEOUT_S for a collective."""
    if mode not in PROFILE_MODES:
        raise DiagError(f"--profile {mode!r}: choose add (the default) or only")
    if row_s is not None and not 0 < row_s <= 3600:
        raise DiagError(f"--profile-row-seconds {row_s}: give 0 < seconds <= 3600")
    steps = tuple(replace(s, backend=plan.backend if s.backend == "gloo" else s.backend,
                          name=s.name.replace("profile-gloo", f"profile-{plan.backend}")) for s in PROFILE_STEPS)
    plan = replace(plan, profile_sizes=tuple(sorted(set(sizes or PROFILE_SIZES))), profile_row_s=row_s or PROFILE_ROW_S,
                   timeout_s=max(plan.timeout_s, PROFILE_TIMEOUT_S))
    if mode == "only":
        return replace(plan, steps=steps, capture=False)
    last = [s for s in plan.steps if s.kind == ADVISE]
    return replace(plan, steps=(*(s for s in plan.steps if s.kind != ADVISE), *steps, *last))


def profile_bytes_per_rank(op: str, world_size: int, size: int) -> int:
    """What one rank of a profile row holds: its input and output, twice over (the transport's own copies)."""
    output = world_size * size if op == "all_gather" else size
    return 2 * (size + output)


def profile_sizes_that_fit(step: Step, world_size: int, sizes: tuple[int, ...],
                           machines: list[tuple[int, int]]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(kept, left out) of a profile step's sizes at N, where ``machines`` is (ranks of the subgroup there,
    available bytes) per machine: a size is kept where every machine holds its ranks' buffers in
    PROFILE_MEMORY_SHARE of its available memory. The smallest size is always kept."""
    def fits(size: int) -> bool:
        return all(ranks * profile_bytes_per_rank(step.op, world_size, size) <= PROFILE_MEMORY_SHARE * available
                   for ranks, available in machines if ranks)
    kept = tuple(s for i, s in enumerate(sizes) if i == 0 or fits(s))
    return kept, tuple(s for s in sizes if s not in kept)


BACKENDS_UNDER_TEST = ("gloo", "diag_tcp")


def under_test(plan: Plan, backend: str) -> Plan:
    """The plan with ``backend`` where the steps, trial arms and comparisons name gloo: the same experiments
    around another backend. diag_tcp (diag's raw transport behind torch's API) takes no turns on a
    connection: with it the run is the negative control of the seed anomaly, and a lab fault is the only
    slowdown left to name. The workarounds are gloo's: another backend's plan has no advise step."""
    if backend not in BACKENDS_UNDER_TEST:
        raise DiagError(f"--backend {backend!r}: the main job tests {' or '.join(BACKENDS_UNDER_TEST)}")
    if backend == plan.backend:
        return plan

    def name(text: str) -> str:
        return backend + text[len(plan.backend):] if text.startswith(plan.backend) else text

    def trial(spec: TrialSpec) -> TrialSpec:
        arms = tuple(replace(a, name=name(a.name), backend=backend if a.backend == plan.backend else a.backend)
                     for a in spec.arms)
        names = {a.name for a in arms}
        comparisons = tuple(renamed for c in spec.comparisons
                            if set((renamed := replace(c, on=name(c.on), off=name(c.off),
                                                       reference=name(c.reference) if c.reference else c.reference)
                                    ).arm_names) <= names)
        return replace(spec, arms=arms, comparisons=comparisons)

    steps = tuple(replace(step, name=name(step.name), backend=backend if step.backend == plan.backend else step.backend,
                          trial=trial(step.trial) if step.trial else None)
                  for step in plan.steps if step.kind != ADVISE)
    return replace(plan, steps=steps, backend=backend)


def per_rank_size(volume: int, world_size: int, element: int = 4) -> int:
    """S = D / (N-1), rounded down to whole elements."""
    return max(element, volume // (world_size - 1) // element * element)


# Step kinds (--skip names them in the plural, but advise), and the link probe's incast phases (one per node:
# K x 2 s and more on a big job).
SKIPPABLE = ("trials", "knobs", "advise", "incast")
_SKIP_NAME = {"trial": "trials", "knob": "knobs", ADVISE: ADVISE}


def resolve_plan(quick: bool, max_n: int | None, volumes: list[int] | None, backend: str = "gloo",
                 skip: tuple[str, ...] = (), profile: str | None = None,
                 profile_sizes: tuple[int, ...] | None = None, profile_row_s: float | None = None) -> Plan:
    """The quick or full plan with the user's --max-n, --volumes (the experiments then run at the largest
    volume), --backend and --skip applied (the sweeps at every N always run: every rule reads them), and the
    profile steps where --profile asks for them (with_profile)."""
    unknown = [kind for kind in skip if kind not in SKIPPABLE]
    if unknown:
        raise DiagError(f"--skip {unknown[0]!r}: choose from {', '.join(SKIPPABLE)}")
    plan = under_test(QUICK if quick else FULL, backend)
    plan = replace(plan, steps=tuple(s for s in plan.steps if _SKIP_NAME.get(s.kind) not in skip),
                   incast="incast" not in skip)
    if volumes:
        largest = tuple(sorted(set(volumes))[-2:])
        plan = replace(plan, volumes=tuple(volumes), exchange_sizes=(max(volumes),), knob_volumes=largest)
    if max_n is not None:
        if max_n < 2:
            raise DiagError("--max-n must be at least 2")
        plan = replace(plan, world_sizes=tuple(range(2, max_n + 1)))
    if profile:
        plan = with_profile(plan, profile, profile_sizes, profile_row_s)
    return plan


def sweep_plan(spec: SweepSpec, world_sizes: tuple[int, ...], *, capture: bool = False,
               observe: bool = False) -> Plan:
    """diag sweep: the spec at every world size, one step; every node captures and observes only when asked."""
    if not world_sizes:
        raise DiagError("no world sizes: pass --nproc, e.g. --nproc 2,3,4")
    if any(n < 1 for n in world_sizes):
        raise DiagError("world sizes must be >= 1")
    step = Step(SWEEP, spec.backend, op=spec.ops[0], volumes="given", knobs=dict(spec.knobs), algo=spec.algo,
                order=spec.order, dtype=spec.dtype, sweep=spec.replace(world_sizes=()))
    return Plan(world_sizes=tuple(world_sizes), warmup=spec.warmup, iters=spec.iters, steps=(step,),
                backend=spec.backend, name="sweep", probe=False, capture=capture, observe=observe, report=False,
                timeout_s=spec.timeout_s)


def advise_plan(sizes: tuple[int, ...], world_size: int = 2, *, warmup: int = 2, min_rounds: int = 5,
                budget_s: float = 60.0) -> Plan:
    """diag advise: the workarounds' trial at ``sizes`` per rank, at one world size, in rounds until every
    comparison is decided or the budget is spent."""
    if world_size < 2:
        raise DiagError("--nproc must be at least 2: all_gather's workarounds need a peer")
    trial = replace(ADVISE_STEP.trial, sizes=tuple(sizes), warmup=warmup, min_rounds=min_rounds,
                    max_rounds=max(min_rounds, ADVISE_STEP.trial.max_rounds), budget_s=budget_s)
    step = replace(ADVISE_STEP, at="every_n", volumes="given", trial=trial, budget_share=1.0)
    return Plan(world_sizes=(world_size,), warmup=warmup, steps=(step,), trial_budget_s=budget_s, name=ADVISE,
                probe=False, capture=False, observe=True, report=False)


def step_spec(plan: Plan, step: Step, world_size: int) -> SweepSpec:
    """The sweep one step runs at one world size (a trial's: the launch's base spec)."""
    if step.sweep is not None:
        return step.sweep
    if step.kind == "profile":
        # uint8: any size, 1 B included; all_reduce sums float32 (exact at N <= 8), from one element up
        dtype = "float32" if step.op == "all_reduce" else "uint8"
        sizes = tuple(s for s in plan.sizes_of(step, world_size) if dtype == "uint8" or s >= 4)
        spec = SweepSpec(backend=step.backend, ops=(step.op,), sizes=sizes or (4,), warmup=plan.warmup,
                         iters=PROFILE_MIN_ITERS, timeout_s=PROFILE_TIMEOUT_S, dtype=dtype, max_iters=PROFILE_MAX_ITERS,
                         target_sem=PROFILE_TARGET_SEM, row_budget_s=plan.profile_row_s or PROFILE_ROW_S)
        return spec.replace(algo=step.algo, knobs=dict(step.knobs)) if step.backend == "raw" else spec
    if step.trial is not None:
        trial = step_trial(plan, step, world_size=world_size)
        # Every arm sets its own block's iterations; the launch's iters are what the trial is expected to run
        # (its arms at least min_rounds times), so progress bars weigh it for what it is.
        return SweepSpec(backend=trial.arms[0].backend if trial.arms[0].on_torch else plan.backend,
                         ops=(step.op,), sizes=trial.sizes, warmup=trial.warmup, dtype=step.dtype,
                         iters=trial.block_iters * len(trial.arms) * trial.min_rounds, timeout_s=STEP_TIMEOUT_S)
    iters = max(plan.iters, step.min_iters)
    spec = SweepSpec(backend=step.backend, ops=(step.op,), sizes=plan.sizes_of(step, world_size),
                     warmup=plan.warmup, iters=iters, timeout_s=STEP_TIMEOUT_S, order=step.order, dtype=step.dtype,
                     max_iters=max(iters, SURVEY_MAX_ITERS), target_sem=SURVEY_TARGET_SEM)
    if step.backend == "raw":
        spec = spec.replace(algo=step.algo, knobs=dict(step.knobs))
    return spec


def step_trial(plan: Plan, step: Step, seed: int = 0, world_size: int = 2) -> TrialSpec:
    """A trial step's spec on this plan at one world size: its sizes (per rank), its share of the budget, the
    warm-up."""
    assert step.trial is not None
    # a trial's own seed (diag trial --seed) wins over the job's
    if step.volumes == "given":
        return replace(step.trial, seed=step.trial.seed or seed)
    if step.volumes == "per_n":
        return replace(step.trial, sizes=plan.sizes_of(step, world_size), seed=step.trial.seed or seed)
    return replace(step.trial, sizes=plan.sizes_of(step, 2), budget_s=plan.trial_budget_s * step.budget_share,
                   warmup=plan.warmup, seed=seed)


def step_title(step: Step, world_size: int) -> str:
    """'gloo all_gather N=2', 'raw-ring-emulate-gloo all_gather N=3', 'gloo exchange send-first N=2'."""
    if step.sweep is not None:
        spec = step.sweep
        return f"{transport_name(spec.backend, spec.algo, spec.knobs)} {','.join(spec.ops)} N={world_size}"
    name = step.name.removesuffix(f"-{step.op}").removesuffix(f"-{step.op}-{step.order}")
    return f"{name} {step.op}{' ' + step.order if step.op == 'exchange' else ''} N={world_size}"


def capture_tag(step: Step, spec: SweepSpec, world_size: int) -> str:
    """The tag of a step's files on every node at one N (diag.runinfo.step_tag)."""
    return step_tag(step.name, spec.backend, spec.algo, spec.knobs, spec.ops, world_size)

"""The main job's plan, as data (flent's tests are data too): which steps run, at which world sizes and
per-device volumes D, with which knobs; --quick and the default differ only in these numbers and steps.

``diag.inplace`` runs a plan in one launch (every N through subgroups), ``diag reproduce`` brings up the lab
(or loopback) and starts that launch. A new experiment is one more Step.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

from diag.errors import DiagError
from diag.spec import SweepSpec
from diag.trial import Comparison, TrialArm, TrialSpec
from diag.units import parse_size

# Survey rows sample until the standard error of their mean time is this fraction of it, or SURVEY_MAX_ITERS:
# N=2 rows are a mixture of a fast and a slow mode, and five samples put the median in either.
SURVEY_TARGET_SEM = 0.03
SURVEY_MAX_ITERS = 12
# Every collective of a step may take this long before a dead or hung peer fails it (the subgroups' own
# timeout in place); a 16 MiB exchange at 100 Mbit/s takes ~1.5 s.
STEP_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Step:
    """One experiment of the plan, as data: which transport runs which op, at which world sizes and volumes,
    with which knobs. ``at`` is "every_n" (the plan's world sizes) or "n2"; ``volumes`` is "sweep" (the
    plan's per-device volumes D), "experiment" (its knob volume) or "exchange" (its exchange sizes, per
    rank) or "profile" (the plan's profile sizes, per rank, the same at every N). The step's name names its
    records file and prefixes its captures' tags."""

    name: str
    backend: str                         # "gloo" | "raw"
    op: str = "all_gather"
    at: str = "every_n"
    volumes: str = "sweep"
    knobs: dict[str, Any] = field(default_factory=dict)
    algo: str = "ring"                   # raw only
    order: str = "recv-first"            # exchange: which call each rank posts first
    min_iters: int = 0                   # e.g. the order effect is judged by a two-sample test on these rows
    trial: TrialSpec | None = None       # an interleaved trial (backend "trial"): its arms, comparisons
    budget_share: float = 0.0            # of the plan's trial budget

    @property
    def kind(self) -> str:
        """"sweep" (every N), "trial" (an interleaved N=2 trial), "knob" (a raw knob row at N=2) or "profile"
        (the model's profile at every N): what --skip names."""
        if self.volumes == "profile":
            return "profile"
        return "trial" if self.trial is not None else ("sweep" if self.at == "every_n" else "knob")

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["trial"] = self.trial.to_json() if self.trial else None
        return out


@dataclass(frozen=True)
class Plan:
    """What a reproduce run does; --quick and the default differ only in these numbers and steps."""

    world_sizes: tuple[int, ...]
    volumes: tuple[int, ...]            # per-device volume D = (N-1) x per-rank bytes, the same for every N
    exchange_sizes: tuple[int, ...]
    knob_volumes: tuple[int, ...]       # D of the N=2 experiments (interleaved trials, raw knob rows)
    rate: str
    warmup: int
    iters: int
    steps: tuple[Step, ...] = ()
    trial_budget_s: float = 90.0        # all trials together; each stops sooner once its verdicts are decided
    backend: str = "gloo"               # the backend under test (see under_test)
    advise: bool = True                 # measure gloo's workarounds at N=2 after the steps
    profile_sizes: tuple[int, ...] = () # per-rank sizes of the profile steps (with_profile)
    profile_row_s: float = 0.0          # each profile row samples until its mean is known or this is spent

    def world_sizes_of(self, step: Step) -> tuple[int, ...]:
        return self.world_sizes if step.at == "every_n" else (2,)

    def sizes_of(self, step: Step, world_size: int) -> tuple[int, ...]:
        """Per-rank sizes of a step at one world size."""
        if step.volumes == "exchange":
            return self.exchange_sizes
        if step.volumes == "profile":
            return self.profile_sizes
        volumes = self.volumes if step.volumes == "sweep" else self.knob_volumes
        return tuple(sorted({per_rank_size(v, world_size) for v in volumes}))

    def to_json(self) -> dict[str, Any]:
        return {**{k: v for k, v in asdict(self).items() if k != "steps"},
                "steps": [s.to_json() for s in self.steps]}


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


def _trial(name: str, arms: tuple[TrialArm, ...], comparisons: tuple[Comparison, ...], volumes: str,
           share: float) -> Step:
    """A trial step; its sizes come from the plan at run time (step_trial)."""
    # One iteration a block: the variance is between rounds as much as within them, so rounds are what a
    # verdict needs most of (and a block's first iteration pays no switch-over cost worth a warm-up: the lab's
    # RTT is far below a millisecond).
    return Step(name, "trial", op=arms[0].op, at="n2", volumes=volumes,
                trial=TrialSpec(name, arms, comparisons, sizes=(1,), block_iters=1, min_rounds=5, max_rounds=30),
                budget_share=share)


TRIALS = (
    _trial("n2-trial", N2_ARMS, N2_COMPARISONS, "experiment", 0.75),
    _trial("n2-exchange-trial", EXCHANGE_ARMS, EXCHANGE_COMPARISONS, "exchange", 0.25),
)
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
             rate="200mbit", warmup=1, iters=5, trial_budget_s=80.0, steps=(*SWEEPS, *TRIALS, *KNOBS_QUICK))
# D=32M is left out of the default: on a 2-core machine N=2..8 with it measured ~21 min (half the steps in
# 10.7 min), over the 20 minutes the default may take; pass --volumes 1M,4M,16M,32M to include it.
FULL = Plan(world_sizes=(2, 3, 4, 5, 6, 7, 8), volumes=tuple(parse_size(s) for s in ("1M", "4M", "16M")),
            exchange_sizes=(parse_size("4M"), parse_size("16M")),
            knob_volumes=(parse_size("4M"), parse_size("16M")), rate="200mbit", warmup=1, iters=6,
            trial_budget_s=200.0, steps=(*SWEEPS, *TRIALS, *KNOBS_FULL))


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
    """The plan with the profile steps: "add" after its own steps, "only" instead of them (no survey, trials,
    knobs or advise: the model's profile alone). The profile runs on the backend under test."""
    if mode not in PROFILE_MODES:
        raise DiagError(f"--profile {mode!r}: choose add (the default) or only")
    if row_s is not None and not 0 < row_s <= 3600:
        raise DiagError(f"--profile-row-seconds {row_s}: give 0 < seconds <= 3600")
    steps = tuple(replace(s, backend=plan.backend if s.backend == "gloo" else s.backend,
                          name=s.name.replace("profile-gloo", f"profile-{plan.backend}")) for s in PROFILE_STEPS)
    plan = replace(plan, profile_sizes=tuple(sorted(set(sizes or PROFILE_SIZES))), profile_row_s=row_s or PROFILE_ROW_S)
    if mode == "only":
        return replace(plan, steps=steps, advise=False)
    return replace(plan, steps=(*plan.steps, *steps))


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
    slowdown left to name."""
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
                          trial=trial(step.trial) if step.trial else None) for step in plan.steps)
    return replace(plan, steps=steps, backend=backend)


def per_rank_size(volume: int, world_size: int, element: int = 4) -> int:
    """S = D / (N-1), rounded down to whole elements."""
    return max(element, volume // (world_size - 1) // element * element)


# Step kinds, the workarounds, and the link probe's incast phases (one per node: K x 2 s and more on a big job).
SKIPPABLE = ("trials", "knobs", "advise", "incast")


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
    plan = replace(plan, steps=tuple(s for s in plan.steps if f"{s.kind}s" not in skip), advise="advise" not in skip)
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


def step_spec(plan: Plan, step: Step, world_size: int) -> SweepSpec:
    """The sweep one step runs at one world size (a trial's: the launch's base spec, the backend under test)."""
    if step.kind == "profile":
        # uint8: any size, 1 B included; all_reduce sums float32 (exact at N <= 8), from one element up
        dtype = "float32" if step.op == "all_reduce" else "uint8"
        sizes = tuple(s for s in plan.sizes_of(step, world_size) if dtype == "uint8" or s >= 4)
        spec = SweepSpec(backend=step.backend, ops=(step.op,), sizes=sizes or (4,), warmup=plan.warmup,
                         iters=PROFILE_MIN_ITERS, timeout_s=PROFILE_TIMEOUT_S, dtype=dtype, max_iters=PROFILE_MAX_ITERS,
                         target_sem=PROFILE_TARGET_SEM, row_budget_s=plan.profile_row_s or PROFILE_ROW_S)
        return spec.replace(algo=step.algo, knobs=dict(step.knobs)) if step.backend == "raw" else spec
    if step.trial is not None:
        trial = step_trial(plan, step)
        # Every arm sets its own block's iterations; the launch's iters are what the trial is expected to run
        # (its arms at least min_rounds times), so progress bars weigh it for what it is.
        return SweepSpec(backend=plan.backend, ops=(step.op,), sizes=trial.sizes, warmup=trial.warmup,
                         iters=trial.block_iters * len(trial.arms) * trial.min_rounds, timeout_s=STEP_TIMEOUT_S)
    iters = max(plan.iters, step.min_iters)
    spec = SweepSpec(backend=step.backend, ops=(step.op,), sizes=plan.sizes_of(step, world_size),
                     warmup=plan.warmup, iters=iters, timeout_s=STEP_TIMEOUT_S, order=step.order,
                     max_iters=max(iters, SURVEY_MAX_ITERS), target_sem=SURVEY_TARGET_SEM)
    if step.backend == "raw":
        spec = spec.replace(algo=step.algo, knobs=dict(step.knobs))
    return spec


def step_trial(plan: Plan, step: Step, seed: int = 0) -> TrialSpec:
    """A trial step's spec on this plan: its sizes (per rank, N=2), its share of the budget, the warm-up."""
    assert step.trial is not None
    return replace(step.trial, sizes=plan.sizes_of(step, 2), budget_s=plan.trial_budget_s * step.budget_share,
                   warmup=plan.warmup, seed=seed)


def step_title(step: Step, world_size: int) -> str:
    """'gloo all_gather N=2', 'raw-ring-emulate-gloo all_gather N=3', 'gloo exchange send-first N=2'."""
    name = step.name.removesuffix(f"-{step.op}").removesuffix(f"-{step.op}-{step.order}")
    return f"{name} {step.op}{' ' + step.order if step.op == 'exchange' else ''} N={world_size}"

"""The main job: reproduce (or rule out) the WORLD_SIZE=2 all_gather anomaly on one machine, with evidence.

Composes the other parts and adds no measurement logic of its own: lab (shaped full-duplex hosts) -> link
measurement -> the plan's steps -> analysis of every capture against its records -> report + findings. The
lab is always torn down. The plan is data (``Plan`` of ``Step`` rows, as flent's tests are): gloo and raw-TCP
all_gather sweeps at equal per-device volume D for every N, captured and observed; exchange in both orders;
raw knob experiments at N=2. A new experiment is one more Step.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from diag import safefs
from diag.errors import DiagError
from diag.spec import SweepSpec
from diag.trial import Comparison, TrialArm, TrialSpec
from diag.units import human_bits, human_bytes, parse_rate_bps, parse_size

# A single TCP stream below this fraction of the shaped goodput means the CPU, not the link, limits the lab.
CPU_BOUND_LINK_FRACTION = 0.85
EXCHANGE_MIN_ITERS = 8
# Each N's iperf3 ring pattern runs this long (0.5 s of it warm-up): 7 N add ~20 s to a default run.
RING_PATTERN_SECONDS = 2.0
# Survey rows sample until the standard error of their mean time is this fraction of it, or SURVEY_MAX_ITERS:
# N=2 rows are a mixture of a fast and a slow mode, and five samples put the median in either.
SURVEY_TARGET_SEM = 0.03
SURVEY_MAX_ITERS = 12


@dataclass(frozen=True)
class Step:
    """One experiment of the plan, as data: which transport runs which op, at which world sizes and volumes,
    with which knobs. ``at`` is "every_n" (the plan's world sizes) or "n2"; ``volumes`` is "sweep" (the
    plan's per-device volumes D), "experiment" (its knob volume) or "exchange" (its exchange sizes, per
    rank). The step's name names its records file and prefixes its captures' tags."""

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

    def world_sizes_of(self, step: Step) -> tuple[int, ...]:
        return self.world_sizes if step.at == "every_n" else (2,)

    def sizes_of(self, step: Step, world_size: int) -> tuple[int, ...]:
        """Per-rank sizes of a step at one world size."""
        if step.volumes == "exchange":
            return self.exchange_sizes
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


def per_rank_size(volume: int, world_size: int, element: int = 4) -> int:
    """S = D / (N-1), rounded down to whole elements."""
    return max(element, volume // (world_size - 1) // element * element)


def make_say(started: float) -> Callable[[str], None]:
    """Progress lines on stderr, each with the time since the start (the tables go to stdout)."""

    def say(text: str) -> None:
        elapsed = int(time.monotonic() - started)
        print(f"{elapsed // 60:2d}:{elapsed % 60:02d} {text}", file=sys.stderr, flush=True)

    return say


def resolve_plan(quick: bool, max_n: int | None, volumes: list[int] | None) -> Plan:
    """The quick or full plan with the user's --max-n and --volumes applied (the experiments then run at
    the largest volume)."""
    plan = QUICK if quick else FULL
    if volumes:
        largest = tuple(sorted(set(volumes))[-2:])
        plan = replace(plan, volumes=tuple(volumes), exchange_sizes=(max(volumes),), knob_volumes=largest)
    if max_n is not None:
        if max_n < 2:
            raise DiagError("--max-n must be at least 2")
        plan = replace(plan, world_sizes=tuple(range(2, max_n + 1)))
    return plan


@dataclass
class Run:
    """The run directory and its run.json, written again after every change so a killed run keeps it."""

    root: Path
    meta: dict[str, Any]

    def save(self) -> None:
        safefs.write_file(self.root / "run.json", json.dumps(self.meta, indent=1, default=str))


def run_reproduce(quick: bool, out: Path | None, rate: str | None, max_n: int | None, keep_going: bool,
                  volumes: list[int] | None = None) -> int:
    """lab -> link -> steps -> analyze -> report."""
    plan = resolve_plan(quick, max_n, volumes)
    rate = rate or plan.rate
    parse_rate_bps(rate)
    run_dir = out or Path("runs") / f"reproduce-{time.strftime('%Y%m%d-%H%M%S')}"
    if (run_dir / "records").exists() and any((run_dir / "records").iterdir()):
        raise DiagError(f"{run_dir} already holds records: choose a new --out directory")
    safefs.private_dir(run_dir, "--out")
    for sub in ("records", "captures", "analysis", "observe", "tcpinfo"):
        safefs.private_dir(run_dir / sub)

    use_lab = os.geteuid() == 0 and shutil.which("ip") is not None and shutil.which("tc") is not None
    started = time.monotonic()
    say = make_say(started)
    say(f"diag reproduce: {'quick' if quick else 'full'} run into {run_dir}; N = "
        f"{', '.join(map(str, plan.world_sizes))}; D = {', '.join(human_bytes(v) for v in plan.volumes)}")
    if not use_lab:
        say("diag reproduce: no root (CAP_NET_ADMIN) or no iproute2: falling back to unshaped loopback. There the "
            "CPU, not a NIC, is the bottleneck and the N=2 anomaly may not show; run as root for the lab.")
    capture = "" if use_lab and shutil.which("tcpdump") else None
    if use_lab and capture is None:
        say("diag reproduce: tcpdump is missing: no captures (install it: apt-get install tcpdump)")

    run = Run(run_dir, {"created_ns": time.time_ns(), "cpu_count": os.cpu_count(), "quick": quick,
                        "plan": plan.to_json(), "lab": None, "link": None, "notes": [], "failures": []})
    run.save()
    if use_lab:
        from diag.lab import LabConfig, lab_session

        config = LabConfig(name=f"repro{os.getpid() % 100000}", hosts=max(plan.world_sizes), rate=rate)
        with lab_session(config) as lab:
            run.meta["lab"] = {"name": lab.name, "rate_bps": lab.rate_bps, "hosts": len(lab.hosts),
                               "addresses": [h.address for h in lab.hosts]}
            _measure_link(lab, run, say)
            _measure_ring_pattern(lab, plan.world_sizes, run, say)
            _run_steps(plan, run, lab, capture, say, keep_going)
        say("[lab] torn down")
    else:
        _run_steps(plan, run, None, None, say, keep_going)

    _analyze(run_dir, say)
    say("[report] rendering")
    from diag.report import load_run, write_report
    from diag.report.diagnose import summary_lines

    result = write_report(load_run([str(run_dir)]), run_dir / "report")
    elapsed = time.monotonic() - started
    run.meta["elapsed_s"] = round(elapsed, 1)
    run.save()
    print(f"\ndiag reproduce: done in {elapsed / 60:.1f} min; report: {run_dir / 'report' / 'report.html'}")
    from diag.report.verdict import verdict_lines

    print("\n".join(verdict_lines(result.verdict)) if result.verdict else "")
    fired = [f for f in result.findings if f.status == "fired"]
    print(f"findings ({len(fired)}):")
    for line in summary_lines(result.findings):
        print(f"  {line}")
    print(f"  every finding with its evidence: {run_dir / 'report' / 'report.md'}, "
          f"{run_dir / 'report' / 'findings.json'}")
    if run.meta["failures"]:
        print(f"{len(run.meta['failures'])} step(s) failed: see {run_dir / 'run.json'}")
        return 1
    return 0


def _measure_link(lab: Any, run: Run, say: Callable[[str], None]) -> None:
    """One TCP stream and both directions at once between h0 and h1: the link rate every plot compares with."""
    from diag.lab import measure_link
    from diag.lab.measure import iperf3_available

    say(f"[lab] {len(lab.hosts)} hosts, {human_bits(lab.rate_bps)} full duplex each; measuring the link")
    # iperf3 (C) when present: diag's own socket probe runs both directions in one Python process,
    # which a 2-core machine can make CPU-bound.
    link = measure_link(lab, 0, 1, seconds=2.0, tool="iperf3" if iperf3_available() else "socket")
    run.meta["link"] = {"single_stream_Bps": link.single_stream_Bps, "bidir_Bps": list(link.bidir_Bps),
                        "tool": link.tool}
    expected = lab.rate_bps / 8 * 0.94
    if link.single_stream_Bps < CPU_BOUND_LINK_FRACTION * expected:
        note = (f"one TCP stream reached {link.single_stream_Bps / 1e6:.1f} MB/s, below "
                f"{CPU_BOUND_LINK_FRACTION:.0%} of the {expected / 1e6:.1f} MB/s the link allows: the CPU "
                "(or other load) limits this machine; lower --rate")
        run.meta["notes"].append(note)
        say(f"[lab] warning: {note}")
    say(f"[lab] single stream {link.single_stream_Bps / 1e6:.1f} MB/s, both directions "
        f"{link.bidir_Bps[0] / 1e6:.1f} + {link.bidir_Bps[1] / 1e6:.1f} MB/s")
    run.save()


def _measure_ring_pattern(lab: Any, world_sizes: tuple[int, ...], run: Run, say: Callable[[str], None]) -> None:
    """The machine's own limit per N: iperf3 in the ring's flow pattern (h(i) -> h((i+1) % N), every edge at
    once) -> run.json link.ring_pattern. Where it stays below the single stream the CPU, not the link, sets
    the pace, and the report's link-reference table and the cpu_bound rule hold raw TCP against it there."""
    from diag.lab import measure_ring_pattern
    from diag.lab.measure import iperf3_available
    from diag.report.rundir import RING_PATTERN_CPU_LIMIT

    if not iperf3_available():
        note = "iperf3 is not installed: no ring-pattern reference, every N is held against the single stream"
        run.meta["notes"].append(note)
        say(f"[lab] {note}")
        return
    patterns: dict[str, Any] = {}
    for n in world_sizes:
        try:
            pattern = measure_ring_pattern(lab, n, seconds=RING_PATTERN_SECONDS)
        except DiagError as exc:
            run.meta["notes"].append(f"ring pattern N={n} not measured: {exc}")
            say(f"[lab] ring pattern N={n} not measured: {exc}")
            continue
        patterns[str(n)] = pattern.to_json()
    run.meta["link"]["ring_pattern"] = patterns
    if patterns:
        say("[lab] iperf3 ring pattern, mean MB/s per edge: " + ", ".join(
            f"N={n} {p['mean_edge_Bps'] / 1e6:.1f}" for n, p in patterns.items()))
    single = run.meta["link"]["single_stream_Bps"]
    cpu_limited = [n for n, p in patterns.items() if p["mean_edge_Bps"] < RING_PATTERN_CPU_LIMIT * single]
    if cpu_limited:
        note = (f"at N={','.join(cpu_limited)} iperf3's ring pattern stayed below {RING_PATTERN_CPU_LIMIT:.0%} of "
                "the single stream: the CPU, not the link, is the limit there, and the report holds raw TCP "
                "against the pattern at those N")
        run.meta["notes"].append(note)
        say(f"[lab] {note}")
    run.save()


def _advise_step(run_dir: Path, lab: Any, size: int, plan: Plan, say: Callable[[str], None]) -> Callable[[], None]:
    """diag advise on the same lab: RUN_DIR/advise/{records.jsonl,advise.json} (docs/raw-tcp.md)."""
    def action() -> None:
        from diag.advise import run_advise

        result = run_advise(run_dir / "advise", lab=lab, world_size=2, sizes=(size,), warmup=plan.warmup,
                            iters=max(plan.iters, 3), say=say)
        if result["failures"]:
            raise DiagError("; ".join(f"{f['workaround']}: {f['error']}" for f in result["failures"]))
    return action


def step_spec(plan: Plan, step: Step, world_size: int) -> SweepSpec:
    """The sweep one step runs at one world size (a trial's: the launch's base spec, gloo)."""
    if step.trial is not None:
        trial = step_trial(plan, step)
        # Every arm sets its own block's iterations; the launch's iters are what the trial is expected to run
        # (its arms at least min_rounds times), so progress bars weigh it for what it is.
        return SweepSpec(backend="gloo", ops=(step.op,), sizes=trial.sizes, warmup=trial.warmup,
                         iters=trial.block_iters * len(trial.arms) * trial.min_rounds, timeout_s=120.0)
    iters = max(plan.iters, step.min_iters)
    spec = SweepSpec(backend=step.backend, ops=(step.op,), sizes=plan.sizes_of(step, world_size),
                     warmup=plan.warmup, iters=iters, timeout_s=120.0, order=step.order,
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


def _run_steps(plan: Plan, run: Run, lab: Any, capture: str | None, say: Callable[[str], None],
               keep_going: bool) -> None:
    from diag.runner import make_job, run_worlds

    # One seed a run for the trials' block orders (recorded in the trial spec of every trial's start event).
    seed = run.meta.setdefault("trial_seed", int.from_bytes(os.urandom(4), "little"))

    def sweep(step: Step, n: int) -> Callable[[], None]:
        def action() -> None:
            spec = step_spec(plan, step, n)
            out = run.root / "records" / f"{step.name}.jsonl"
            job = make_job(spec, out, argv=["reproduce"], quiet=False)
            if step.trial is not None:
                # Interleaved arms in one launch; not captured: a capture's phases would mix the arms.
                job = replace(job, meta={"trial": step_trial(plan, step, seed).to_json()})
                run_worlds(spec, job, out, run.root, world_sizes=[n], lab=lab, capture=None,
                           observe=lab is not None, tag_prefix=f"{step.name}--")
                return
            run_worlds(spec, job, out, run.root, world_sizes=[n], lab=lab, capture=capture,
                       observe=lab is not None, tag_prefix=f"{step.name}--")
        return action

    actions = [(step_title(step, n), sweep(step, n)) for step in plan.steps for n in plan.world_sizes_of(step)]
    # diag advise on the same lab, after the experiments: measured workarounds for the N=2 anomaly
    actions.append(("advise: workarounds for gloo all_gather N=2",
                    _advise_step(run.root, lab, per_rank_size(max(plan.knob_volumes), 2), plan, say)))
    from diag.console import Progress, reproduce_weights

    # One plan-level bar, weighted by bytes x iterations (sizes double: counting steps would mislead),
    # printed with every step line (the sweeps draw their own tables on stdout meanwhile).
    weights = reproduce_weights(plan, step_spec, per_rank_size(max(plan.knob_volumes), 2))
    progress = Progress("reproduce", sum(weights), live=False)
    for index, (title, action) in enumerate(actions, 1):
        say(f"[{index}/{len(actions)}] {title}  {progress.status()}")
        step_started = time.monotonic()
        try:
            action()
            run.meta.setdefault("step_seconds", {})[title] = round(time.monotonic() - step_started, 2)
            run.save()
        except DiagError as exc:
            run.meta["failures"].append({"step": title, "error": str(exc)})
            run.save()
            say(f"[{index}/{len(actions)}] failed: {exc}")
            if not keep_going:
                raise
        finally:
            progress.advance(weights[index - 1] if index <= len(weights) else 0.0)


def _analyze(run_dir: Path, say: Callable[[str], None]) -> None:
    pcaps = sorted((run_dir / "captures").glob("*.pcap"))
    if not pcaps:
        return
    from diag.capture import analyze_files

    records = [str(p) for p in sorted((run_dir / "records").glob("*.jsonl"))]
    started = time.monotonic()
    for index, pcap in enumerate(pcaps, 1):
        say(f"[analyze {index}/{len(pcaps)}] {pcap.name}")
        try:
            result = analyze_files([str(pcap)], records=records)
        except DiagError as exc:
            say(f"[analyze] {pcap.name}: {exc}")
            continue
        safefs.write_file(run_dir / "analysis" / f"{pcap.stem}.json", json.dumps(result, default=str))
    say(f"[analyze] {len(pcaps)} captures in {time.monotonic() - started:.0f} s")

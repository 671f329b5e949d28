"""``diag trial``: programs as the arms of an interleaved trial, at one or more world sizes.

A plan of one trial step (diag.plan: at every N of --nproc, per-rank sizes given or chosen per N from
--volumes) run on the one job (diag.runplan: K = max(N) ranks, one launch for every N: one torchrun per lab
host, or K local ranks; in place, the user's own launch), each N's trial (diag/trial.py) on the subgroup of
the first N ranks, its command arms run by diag.external.arm. The run directory is the job's layout
(diag.runinfo): records/<name>.jsonl (the trial's blocks, one run per N), run.json, nodes/<node>/ (every
node's capture and its analysis with --capture), and this command's own outputs/ (every block's output,
rank by rank) and shared/ ({shared}). At the end the arms' table (diag.report.arms) is printed from those
files.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from diag import safefs
from diag.errors import EXIT_FAILED, EXIT_SLOWER, DiagError
from diag.external.adapters import adapter
from diag.trialspec import ARM_RULE, COMMAND_BACKEND, LINK_ARM, Comparison, TrialArm, TrialSpec
from diag.units import human_bytes, parse_size_list

NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")


@dataclass(frozen=True)
class ProgramTrial:
    """What ``diag trial`` was asked to do."""

    arms: tuple[tuple[str, str], ...]            # (name, command)
    adapter: str
    world_sizes: tuple[int, ...] = ()            # () = in place
    sizes: tuple[int, ...] = ()                  # per rank
    volumes: tuple[int, ...] = ()                # per-device D (instead of sizes)
    op: str = "all_gather"
    baseline: str = ""
    link: bool = False
    element_bytes: int = 4
    iters: int = 3
    warmup: int = 1
    effect: float = 0.05
    min_rounds: int = 5
    max_rounds: int = 20
    budget_s: float = 600.0
    block_timeout_s: float = 600.0
    seed: int = 0
    fail_on: str | None = None
    lab: str | None = None
    iface: str | None = None
    shared_dir: str = ""
    out: str = ""
    name: str = "ab"
    capture: str | None = None
    snaplen: int = 128
    cwd: str = field(default_factory=os.getcwd)
    argv: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        names = [n for n, _ in self.arms]
        if len(self.arms) + (1 if self.link else 0) < 2:
            raise DiagError("a trial needs two arms: give --arm NAME=COMMAND twice (or once with --link)")
        for name in [*names, self.name]:
            if not name or not set(name) <= NAME_CHARS:
                raise DiagError(f"name {name!r}: use letters, digits, '-', '_' and '.' (e.g. --arm stock=CMD)")
        if len(set(names)) != len(names) or (self.link and LINK_ARM in names):
            raise DiagError("two arms with one name: give every --arm its own name" +
                            (f" ('{LINK_ARM}' is --link's)" if self.link else ""))
        if self.baseline and self.baseline not in [*names, *([LINK_ARM] if self.link else [])]:
            raise DiagError(f"--baseline {self.baseline!r} is not an arm: one of {', '.join(names)}")
        if bool(self.sizes) == bool(self.volumes):
            raise DiagError("say the sizes: --sizes (per rank) or --volumes (per-device D), one of them")
        if any(n < 2 for n in self.world_sizes):
            raise DiagError("--nproc: a trial needs at least 2 ranks")
        for value, flag in ((self.iters, "--iters"), (self.min_rounds, "--min-rounds"),
                            (self.element_bytes, "--element-bytes")):
            if value < 1:
                raise DiagError(f"{flag} must be at least 1")
        if self.seed < 0:
            raise DiagError("--seed must be a positive integer")
        if self.warmup < 0:
            raise DiagError("--warmup must be at least 0")
        if self.max_rounds < self.min_rounds:
            raise DiagError("--max-rounds must be at least --min-rounds")
        if not 0 < self.effect < 1:
            raise DiagError("--effect is a fraction of the time, e.g. 0.05")
        for value, flag in ((self.budget_s, "--budget"), (self.block_timeout_s, "--block-timeout")):
            if not value > 0:
                raise DiagError(f"{flag} takes seconds > 0")
        adapter(self.adapter)   # a bad adapter is one line before anything starts

    @property
    def baseline_arm(self) -> str:
        return self.baseline or self.arms[0][0]

    def sizes_at(self, world_size: int) -> tuple[int, ...]:
        """Per-rank sizes at N: --sizes as given, or each volume D as the per-rank size whose per-device volume
        is D, in whole elements."""
        if self.sizes:
            return self.sizes
        from diag.collectives import make_collective

        collective = make_collective(self.op)
        unit = 1 << 20
        per_rank = collective.volume_bytes(unit, world_size) / unit   # D = per_rank x S (all_gather: N-1)
        e = self.element_bytes
        return tuple(sorted({max(e, int(v / per_rank) // e * e) for v in self.volumes}))

    def trial_spec(self, sizes: tuple[int, ...], run_dir: Path, shared: str) -> TrialSpec:
        knobs = {"adapter": self.adapter, "cwd": self.cwd, "shared_dir": shared,
                 "outputs_dir": str((run_dir / "outputs").resolve()), "block_timeout_s": self.block_timeout_s,
                 "element_bytes": self.element_bytes}
        arms = [TrialArm(name, COMMAND_BACKEND, op=self.op, algo="default", knobs={"command": command, **knobs})
                for name, command in self.arms]
        if self.link:
            arms.append(TrialArm(LINK_ARM, "raw", op=self.op))
        base = self.baseline_arm
        # The link is a reference each arm's busbw is read against (diag.report.arms), not a contender: a
        # comparison with it would keep the trial running where it is only nearly equal to the baseline.
        comparisons = tuple(Comparison(ARM_RULE, "difference", on=a.name, off=base, effect=self.effect)
                            for a in arms if a.name not in (base, LINK_ARM))
        return TrialSpec(self.name, tuple(arms), comparisons, sizes=sizes, block_iters=self.iters,
                         warmup=self.warmup, min_rounds=self.min_rounds, max_rounds=self.max_rounds,
                         budget_s=self.budget_s, seed=self.seed)

    def plan(self, world_sizes: tuple[int, ...], run_dir: Path, shared: str) -> Any:
        """One trial step at every world size, on the one job: per-rank sizes as given (--sizes), or chosen per
        N from the volumes D in the op's own bus model; every node captures during it with --capture. The
        job's collectives may wait a whole block of another rank's program (its results are gathered after
        it), so the subgroups' timeout is the block's and a minute."""
        from diag.plan import Plan, Step

        sizes_at = {str(n): self.sizes_at(n) for n in world_sizes}
        spec = self.trial_spec(sizes_at[str(world_sizes[0])], run_dir, shared)
        step = Step(self.name, "trial", op=self.op, volumes="per_n" if self.volumes else "given", trial=spec,
                    budget_share=1.0, sizes_at=sizes_at if self.volumes else {}, captured=self.capture is not None)
        return Plan(world_sizes=world_sizes, warmup=self.warmup, iters=self.iters, steps=(step,),
                    trial_budget_s=self.budget_s, name="trial", probe=False, incast=False,
                    capture=self.capture is not None, observe=False, report=False,
                    timeout_s=self.block_timeout_s + 60.0)


def options_from_args(args: argparse.Namespace) -> ProgramTrial:
    arms = []
    for text in args.arm:
        name, sep, command = text.partition("=")
        if not sep or not command.strip():
            raise DiagError(f"--arm {text!r}: give NAME=COMMAND, e.g. --arm stock='./benchmark ...'")
        arms.append((name.strip(), command))
    from diag import validate

    if args.shared_dir:
        validate.output_dir(Path(args.shared_dir), "--shared-dir")
    return ProgramTrial(
        arms=tuple(arms), adapter=args.adapter, world_sizes=tuple(args.nproc or ()),
        sizes=tuple(parse_size_list(args.sizes)) if args.sizes else (),
        volumes=tuple(parse_size_list(args.volumes)) if args.volumes else (), op=args.op,
        baseline=args.baseline or "", link=args.link, element_bytes=args.element_bytes, iters=args.iters,
        warmup=args.warmup, effect=args.effect, min_rounds=args.min_rounds, max_rounds=args.max_rounds,
        budget_s=args.budget, block_timeout_s=args.block_timeout,
        seed=args.seed or 0,   # 0: the job's own seed, drawn by rank 0 and recorded (run.json trial_seed)
        fail_on=args.fail_on, lab=args.lab, iface=args.iface, shared_dir=args.shared_dir or "",
        out=args.out or "", name=args.name, capture=args.capture, snaplen=args.snaplen,
        argv=tuple(sys.argv[1:]))


def run_program_trial(options: ProgramTrial) -> int:
    from diag.inplace.job import JobOptions
    from diag.runinfo import read_run_json
    from diag.runplan import in_place, run_plan

    here = in_place(options.iface)
    if not options.world_sizes and not here:
        raise DiagError("no ranks to run: pass --nproc 2,3,4 (with --lab: one rank per lab host), or start "
                        "diag trial under torchrun")
    world_sizes = options.world_sizes or (int(os.environ.get("WORLD_SIZE") or 1),)
    if any(n < 2 for n in world_sizes):
        raise DiagError("a trial needs at least 2 ranks: start diag trial under torchrun --nproc-per-node 2 or more")
    lab = None
    if options.lab:
        if here:
            raise DiagError("--lab starts diag's own ranks in the lab's namespaces: run it without torchrun/srun")
        from diag.lab import load_lab

        lab = load_lab(options.lab)
    rank = int(os.environ.get("RANK") or 0) if here else 0
    run_dir = Path(options.out or Path("runs") / f"trial-{time.strftime('%Y%m%d-%H%M%S')}")
    if rank == 0:
        _make_run_dir(run_dir)
    shared = options.shared_dir or str((run_dir / "shared").resolve())
    plan = options.plan(world_sizes, run_dir, shared)
    if rank == 0:
        print(f"diag trial {options.name}: {', '.join(a.name for a in plan.steps[0].trial.arms)} at N="
              f"{', '.join(map(str, world_sizes))}: " + "; ".join(
                  f"N={n} {', '.join(human_bytes(s) for s in plan.sizes_of(plan.steps[0], n))}" for n in world_sizes)
              + " per rank", file=sys.stderr, flush=True)
    job = JobOptions(plan=plan.to_json(), command="trial", out=str(run_dir.resolve()), run_id=uuid.uuid4().hex[:12],
                     iface=options.iface, capture_iface=options.capture or None, snaplen=options.snaplen,
                     argv=options.argv)
    failures: list[str] = []
    try:
        run_plan(job, lab=lab)
    except DiagError as exc:   # the job died: what it finished is on disk, and the table says what that is
        failures.append(str(exc))
        print(f"diag trial: {exc}", file=sys.stderr, flush=True)
    if rank != 0:
        return EXIT_FAILED if failures else 0
    info = read_run_json(run_dir) or {}
    failures += [f"{f.get('step')}: {f.get('error')}" for f in info.get("failures") or [] if f.get("step") != "job"]
    return _finish(options, run_dir, failures)


def _make_run_dir(run_dir: Path) -> None:
    """The run directory and this command's own parts of it (the job adds records/, nodes/ and run.json)."""
    if (run_dir / "records").is_dir() and any((run_dir / "records").iterdir()):
        raise DiagError(f"{run_dir} already holds records: choose a new --out")
    safefs.private_dir(run_dir, "--out")
    for sub in ("outputs", "shared"):
        safefs.private_dir(run_dir / sub)


def _finish(options: ProgramTrial, run_dir: Path, launch_failures: list[str]) -> int:
    from diag.report import load_run
    from diag.report.arms import arm_tables, table_lines

    tables = arm_tables(load_run([str(run_dir)]))
    for line in table_lines(tables):
        print(line)
    print(f"records: {run_dir / 'records'}; every block's output: {run_dir / 'outputs'}; "
          f"diag report {run_dir}", flush=True)
    failed = [f"{t.title}: {why}" for t in tables for why in t.failed.values()]
    if failed or launch_failures:
        for line in failed + launch_failures:
            print(f"diag trial: {line}", file=sys.stderr)
        return EXIT_FAILED
    if options.fail_on == "slower" and any(v.word == "slower" for t in tables for v in t.verdicts):
        print("diag trial: an arm is slower than the baseline (--fail-on slower)", file=sys.stderr)
        return EXIT_SLOWER
    return 0


__all__ = ["ARM_RULE", "LINK_ARM", "ProgramTrial", "options_from_args", "run_program_trial"]

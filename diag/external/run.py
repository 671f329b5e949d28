"""``diag trial``: programs as the arms of an interleaved trial, at one or more world sizes.

One launch per world size (diag.runner.run_worlds: one torchrun per lab host, or local ranks; in place, the
user's own launch), each running one trial (diag/trial.py) whose command arms are diag.external.arm. The run
directory is diag's own layout: records/<name>.jsonl (the trial's blocks), run.json, outputs/ (every block's
output, rank by rank), shared/ ({shared}), captures/ and analysis/ with --capture. At the end the arms'
table (diag.report.arms) is printed from those files.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from diag import safefs
from diag.errors import EXIT_FAILED, EXIT_SLOWER, DiagError
from diag.external import ARM_RULE, COMMAND_BACKEND, LINK_ARM
from diag.external.adapters import adapter
from diag.trial import Comparison, TrialArm, TrialSpec
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

    def trial_spec(self, world_size: int, run_dir: Path, shared: str) -> TrialSpec:
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
        return TrialSpec(self.name, tuple(arms), comparisons, sizes=self.sizes_at(world_size),
                         block_iters=self.iters, warmup=self.warmup, min_rounds=self.min_rounds,
                         max_rounds=self.max_rounds, budget_s=self.budget_s, seed=self.seed)


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
        seed=args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 31),
        fail_on=args.fail_on, lab=args.lab, iface=args.iface, shared_dir=args.shared_dir or "",
        out=args.out or "", name=args.name, capture=args.capture, snaplen=args.snaplen,
        argv=tuple(sys.argv[1:]))


def _base_spec(options: ProgramTrial, spec: TrialSpec) -> Any:
    """The launch's own sweep spec: gloo carries the trial's messages; the link arm's rows come from it."""
    from diag.spec import SweepSpec

    return SweepSpec(backend="gloo", ops=(options.op,), sizes=spec.sizes, warmup=spec.warmup,
                     iters=spec.block_iters * len(spec.arms) * spec.min_rounds,
                     timeout_s=options.block_timeout_s + 60.0)


def run_program_trial(options: ProgramTrial) -> int:
    if os.environ.get("RANK") is not None and not options.world_sizes and not options.lab:
        return _in_place(options)
    if not options.world_sizes:
        raise DiagError("no ranks to run: pass --nproc 2,3,4 (with --lab: one rank per lab host), or start "
                        "diag trial under torchrun")
    lab = None
    if options.lab:
        from diag.lab import load_lab

        lab = load_lab(options.lab)
        if max(options.world_sizes) > len(lab.hosts):
            raise DiagError(f"lab {lab.name!r} has {len(lab.hosts)} hosts, fewer than N={max(options.world_sizes)}: "
                            f"run diag lab up --name {lab.name} --hosts {max(options.world_sizes)}")
    run_dir = _run_dir(options)
    meta = _meta(options, "lab" if lab is not None else "local", lab)
    records = run_dir / "records" / f"{options.name}.jsonl"
    shared = options.shared_dir or str((run_dir / "shared").resolve())
    launch_failures: list[str] = []
    captured: list[str] = []
    from diag.runner import make_job, run_worlds

    for n in options.world_sizes:
        spec = options.trial_spec(n, run_dir, shared)
        base = _base_spec(options, spec)
        print(f"diag trial {options.name} N={n}: {', '.join(a.name for a in spec.arms)} at "
              f"{', '.join(human_bytes(s) for s in spec.sizes)} per rank", file=sys.stderr, flush=True)
        job = replace(make_job(base, records, argv=list(options.argv)), meta={"trial": spec.to_json(), "kind": "trial"})
        try:
            tags = run_worlds(base, job, records, run_dir, world_sizes=[n], lab=lab, iface=options.iface,
                              capture=options.capture, snaplen=options.snaplen, tag=options.name)
        except DiagError as exc:
            launch_failures.append(f"N={n}: {exc}")
            print(f"diag trial: N={n} failed: {exc}", file=sys.stderr, flush=True)
            tags = [f"{options.name}-n{n}"] if options.capture is not None else []
        captured += tags
        meta["failures"] = launch_failures
        safefs.write_file(run_dir / "run.json", json.dumps(meta, indent=1, default=str))
    # after every world size ran: a long trial's capture takes minutes to analyse (1.7 GB at N=2 for four
    # sizes up to 64 MiB at 200 Mbit/s), and every verdict is on disk before the first analysis starts
    for tag in captured:
        _analyse(run_dir, tag, records)
    return _finish(options, run_dir, launch_failures)


def _in_place(options: ProgramTrial) -> int:
    """Every rank of the user's launch runs this: one trial at the launch's world size."""
    from diag.runner import make_job
    from diag.worker import env_rank, run_job

    rank, world = env_rank()
    # rank 0's directory is the run's (its spec, {shared} included, is the one every rank runs)
    run_dir = _run_dir(options) if rank == 0 else Path(options.out or "runs/trial")
    if options.iface:
        os.environ["GLOO_SOCKET_IFNAME"] = options.iface
    shared = options.shared_dir or str((run_dir / "shared").resolve())
    spec = options.trial_spec(world, run_dir, shared)   # rank 0's is the one every rank runs (its seed)
    records = run_dir / "records" / f"{options.name}.jsonl"
    job = replace(make_job(_base_spec(options, spec), records, argv=list(options.argv)), gate=False,
                  meta={"trial": spec.to_json(), "kind": "trial"}, out=str(records.resolve()) if rank == 0 else None)
    code = run_job(job)
    if rank != 0:
        return code
    meta = _meta(options, "in-place", None)
    meta["failures"] = [] if code == 0 else [f"N={world}: the trial's launch failed (exit {code})"]
    safefs.write_file(run_dir / "run.json", json.dumps(meta, indent=1, default=str))
    return _finish(options, run_dir, meta["failures"])


def _run_dir(options: ProgramTrial) -> Path:
    run_dir = Path(options.out or Path("runs") / f"trial-{time.strftime('%Y%m%d-%H%M%S')}")
    if (run_dir / "records" / f"{options.name}.jsonl").exists():
        raise DiagError(f"{run_dir} already holds the records of a trial {options.name}: choose a new --out")
    safefs.private_dir(run_dir, "--out")
    for sub in ("records", "outputs", "shared"):
        safefs.private_dir(run_dir / sub)
    return run_dir


def _meta(options: ProgramTrial, mode: str, lab: Any) -> dict[str, Any]:
    lab_json = None
    if lab is not None:
        from diag.reproduce import lab_meta

        lab_json = lab_meta(lab)
    return {"created_ns": time.time_ns(), "kind": "trial", "mode": mode, "cpu_count": os.cpu_count(),
            "lab": lab_json, "argv": list(options.argv), "trial": asdict(options), "failures": []}


def _analyse(run_dir: Path, tag: str, records: Path) -> None:
    pcap = run_dir / "captures" / f"{tag}.pcap"
    if not pcap.is_file():
        return
    from diag.capture import analyze_files

    print(f"diag trial: analysing {pcap.name} ({pcap.stat().st_size / 1e6:.0f} MB)", file=sys.stderr, flush=True)
    try:
        document = analyze_files([str(pcap)], records=[str(records)])
    except DiagError as exc:
        print(f"diag trial: analysis of {pcap.name} failed: {exc}", file=sys.stderr)
        return
    safefs.private_dir(run_dir / "analysis")
    safefs.write_file(run_dir / "analysis" / f"{tag}.json", json.dumps(document, default=str))


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

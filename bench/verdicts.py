"""How often would the main job's verdicts flip? Resample saved runs and decide again.

    python -m bench.verdicts runs/reproduce-* --resamples 1000

The per-iteration samples of every saved `diag reproduce` run are pooled by what they measure (records
file, arm or series, world size, size): quiet and busy runs together, as users' machines are. Each
resampled run takes the first run's rows and blocks, and draws every row's samples, with replacement, from
its pool (a trial block keeps its round, so the rounds' pairing survives), then decides the records rules,
the paired experiments, the suspects and the mechanism again, exactly as `diag diagnose` does (the wire
rules only add observations, which never move the mechanism verdict, and are left out).

It prints, per verdict, how often each status came out, and the flip rate of the mechanism verdict: the
share of resampled runs where M1 is not shown or another suspect is shown.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from diag.errors import DiagError
from diag.records import Record, RecordFile
from diag.report.series import series_label

VERDICTS = ("n2_busbw_dip", "notice_behind_data", "shared_connection", "exchange_order", "suspect_m1", "suspect_m2",
            "suspect_m3", "suspect_m4", "mechanism")


def pool_key(path: Path, r: Record) -> tuple[Any, ...]:
    arm = r.block.get("arm") if r.block else series_label(r)
    return (path.stem, arm, r.op, r.world_size, r.size_bytes)


def pools(runs: Sequence[Any]) -> dict[tuple[Any, ...], list[float]]:
    out: dict[tuple[Any, ...], list[float]] = defaultdict(list)
    for run in runs:
        for f in run.record_files:
            for r in f.records:
                out[pool_key(f.path, r)].extend(r.times_s)
    return out


def resample(template: Any, pooled: dict[tuple[Any, ...], list[float]], rng: random.Random) -> Any:
    """The template run with every row's samples drawn again from its pool."""
    from diag.report.rundir import RunData

    files = []
    for f in template.record_files:
        records = []
        for r in f.records:
            pool = pooled[pool_key(f.path, r)]
            times = [rng.choice(pool) for _ in r.times_s]
            ordered = sorted(times)
            median = ordered[len(ordered) // 2] if len(ordered) % 2 else sum(ordered[len(ordered) // 2 - 1:
                                                                                  len(ordered) // 2 + 1]) / 2
            scale = r.time_s / median if median > 0 else 1.0
            records.append(replace(r, times_s=times, time_s=median, mean_s=sum(times) / len(times),
                                   algbw_Bps=r.algbw_Bps * scale, busbw_Bps=r.busbw_Bps * scale))
        files.append(RecordFile(f.path, f.starts, records, f.ends))
    return RunData(template.root, files, template.meta, {}, [], [])


def decide(run: Any) -> dict[str, str]:
    from diag.report.diagnose import EXPERIMENTS, mechanism, n2_busbw_dip, suspects

    findings = [*n2_busbw_dip(run)]
    for experiment in EXPERIMENTS:
        findings.extend(experiment(run))
    verdicts = suspects(findings)
    mech = mechanism([*findings, *verdicts])
    out = {f.rule: f.status for f in verdicts}
    gloo_dips = [f for f in findings if f.rule == "n2_busbw_dip" and f.statement.startswith("torch:")]
    out["n2_busbw_dip"] = (gloo_dips[0].strength or gloo_dips[0].status) if gloo_dips else "absent"
    for f in findings:
        if f.rule in ("notice_behind_data", "shared_connection", "exchange_order"):
            out[f.rule] = f.status
    out["mechanism"] = mech.status + (" M1" if "M1:" in mech.statement.split(";")[0] else "")
    return out


def flipped(verdict: dict[str, str]) -> bool:
    """The mechanism verdict flips: M1 not shown, or another suspect shown."""
    others = [k for k in ("suspect_m2", "suspect_m3", "suspect_m4") if verdict.get(k) == "fired"]
    return verdict.get("suspect_m1") != "fired" or bool(others)


def _status(findings: dict[str, Any], rule: str) -> str:
    f = findings.get(rule)
    return {"fired": "shown", "clear": "ruled out"}.get(f["status"], f["status"]) if f else "-"


def table(paths: Sequence[str]) -> list[str]:
    """One line per saved run, from its findings.json, run.json and advise.json: what `diag reproduce` said."""
    lines = [f"{'run':28s} {'wall':>6s} {'dip':9s} {'M1':9s} {'M2':9s} {'M3':9s} {'M4':9s} {'mechanism':12s} workarounds"]
    for path in paths:
        root = Path(path)
        try:
            findings = {f["rule"]: f for f in json.loads((root / "report" / "findings.json").read_text())["findings"]}
            meta = json.loads((root / "run.json").read_text())
        except (OSError, ValueError, KeyError):
            lines.append(f"{root.name:28s} (no findings.json: the run did not finish)")
            continue
        dips = [f for f in findings.values() if f["rule"] == "n2_busbw_dip"]
        all_findings = json.loads((root / "report" / "findings.json").read_text())["findings"]
        gloo = next((f for f in all_findings if f["rule"] == "n2_busbw_dip" and f["statement"].startswith("torch:")),
                    dips[0] if dips else None)
        dip = (gloo["strength"] or gloo["status"]) if gloo else "-"


        mech = findings.get("mechanism", {})
        named = "M1" if "M1:" in mech.get("statement", "").split(";")[0] else ""
        mechanism = f"{mech.get('status', '-')}{' ' + named if named else ''}"
        speedups = []
        try:
            advise = json.loads((root / "advise" / "advise.json").read_text())
            for w in advise.get("workarounds", []):
                rows = [r["speedup"] for r in w.get("rows", []) if r.get("speedup")]
                if rows:
                    speedups.append(f"{w['name']} {max(rows):.2f}x")
        except (OSError, ValueError):
            pass
        wall = meta.get("elapsed_s")
        lines.append(f"{root.name:28s} {wall / 60 if wall else float('nan'):5.1f}m {dip:9s} "
                     + " ".join(f"{_status(findings, f'suspect_m{k}'):9s}" for k in range(1, 5))
                     + f" {mechanism:12s} {', '.join(speedups)}")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.verdicts", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", help="saved diag reproduce run directories")
    parser.add_argument("--resamples", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print the tallies as JSON")
    parser.add_argument("--table", action="store_true", help="only print what each saved run said, one line a run")
    args = parser.parse_args(argv)
    if args.table:
        print("\n".join(table(args.runs)))
        return 0
    from diag.report import load_run

    try:
        runs = [load_run([path]) for path in args.runs]
    except DiagError as exc:
        print(f"bench.verdicts: {exc}", file=sys.stderr)
        return 2
    started = time.monotonic()
    as_run = [decide(run) for run in runs]
    pooled = pools(runs)
    rng = random.Random(args.seed)
    tallies: dict[str, Counter[str]] = defaultdict(Counter)
    flips = 0
    for _ in range(args.resamples):
        verdict = decide(resample(runs[0], pooled, rng))
        flips += flipped(verdict)
        for key, value in verdict.items():
            tallies[key][value] += 1
    result = {"runs": [str(p) for p in args.runs], "resamples": args.resamples,
              "as_run": as_run, "as_run_flips": sum(flipped(v) for v in as_run),
              "tallies": {k: dict(v) for k, v in sorted(tallies.items())}, "flips": flips,
              "flip_rate": flips / args.resamples, "seconds": round(time.monotonic() - started, 1)}
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    print(f"{len(runs)} saved runs; as run, the mechanism verdict flipped in {result['as_run_flips']} of them")
    for k, v in enumerate(as_run):
        print(f"  {args.runs[k]}: " + ", ".join(f"{key}={v.get(key)}" for key in VERDICTS))
    print(f"{args.resamples} resampled runs ({result['seconds']} s):")
    for key in VERDICTS:
        counts = tallies.get(key, Counter())
        print(f"  {key:20s} " + ", ".join(f"{value} {count / args.resamples:.1%}" for value, count in counts.most_common()))
    print(f"mechanism verdict flipped (M1 not shown, or another suspect shown): {flips} of {args.resamples} "
          f"= {result['flip_rate']:.2%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

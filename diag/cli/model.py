"""Fit and query latency/bandwidth models: T(S) = alpha + beta * S per (series, op, N), plus a
two-segment fit where the data bends; JSON for simulators.

examples:
  diag model fit RUN_DIR|RECORDS... -o model.json
  diag model predict --model model.json --op all_gather --world-size 4 --size 16M [--backend gloo]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from diag import safefs


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="model_command", metavar="ACTION", required=True)
    fit = sub.add_parser("fit", help="fit models to records and write JSON")
    fit.add_argument("paths", nargs="+", metavar="RUN_DIR|RECORDS")
    fit.add_argument("-o", "--output", type=Path, default=None, help="model JSON file (default: print it)")
    predict = sub.add_parser("predict", help="how long will OP of SIZE on N ranks take")
    predict.add_argument("--model", type=Path, required=True, help="model JSON from `diag model fit`")
    predict.add_argument("--op", default="all_gather")
    predict.add_argument("--world-size", type=int, required=True)
    predict.add_argument("--size", required=True, help="per-rank input size, e.g. 16M, 12589824")
    predict.add_argument("--backend", default=None, help="gloo, raw, a transport such as raw:ring (every series of "
                         "it), or one series as the model file names it, e.g. \"raw:ring [emulate=gloo]\"")
    predict.add_argument("--algo", default=None, help="raw algorithm (ring, pairwise)")
    predict.add_argument("--json", action="store_true")


def run(args: argparse.Namespace) -> int:
    return _fit(args) if args.model_command == "fit" else _predict(args)


def _fit(args: argparse.Namespace) -> int:
    from diag.errors import DiagError
    from diag.report.model import fit_all, models_to_json
    from diag.report.rundir import load_run
    from diag.units import human_rate, human_time

    data = load_run(args.paths)
    models = fit_all(data.records)
    if not models:
        raise DiagError("no (series, op, N) group has two or more sizes: sweep more sizes to fit a model")
    document = models_to_json(models, [str(f.path) for f in data.record_files])
    if args.output is None:
        print(json.dumps(document, indent=1, allow_nan=False))
        return 0
    safefs.write_file(safefs.make_parent(args.output), json.dumps(document, indent=1, allow_nan=False) + "\n", flag="--output")
    for m in models:
        bw = human_rate(m.linear.bandwidth_Bps) if m.linear.beta_s_per_byte > 0 else "n/a"
        bend = ""
        if m.best == "two_segment" and m.two_segment:
            bend = f"; bends at {m.two_segment.breakpoint_bytes:.0f} bytes (fit error {m.two_segment.rel_rms:.1%})"
        print(f"{m.label} {m.op} N={m.world_size}: alpha {human_time(m.linear.alpha_s)}, "
              f"1/beta {bw}, fit error {m.linear.rel_rms:.1%}{bend}")
    print(f"wrote {len(models)} models to {args.output}")
    return 0


def _predict(args: argparse.Namespace) -> int:
    from diag.errors import DiagError
    from diag.report.model import Z95, models_from_json, select
    from diag.units import human_bytes, human_time, parse_size

    try:
        document = json.loads(args.model.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise DiagError(f"cannot read model {args.model}: {exc}") from None
    size = parse_size(args.size)
    answers = []
    for m in select(models_from_json(document), args.op, args.world_size, args.backend, args.algo):
        t, se = m.predict(size)
        inside = m.sizes_bytes and min(m.sizes_bytes) <= size <= max(m.sizes_bytes)
        answers.append({"series": m.label, "transport": m.transport, "op": m.op, "world_size": m.world_size, "size_bytes": size,
                        "time_s": t, "stderr_s": se, "ci95_s": [t - Z95 * se, t + Z95 * se], "fit": m.best,
                        "extrapolated": not inside})
        if not args.json:
            where = "" if inside else (f" (extrapolated: fitted on {human_bytes(min(m.sizes_bytes))}.."
                                       f"{human_bytes(max(m.sizes_bytes))})")
            print(f"{m.op} of {human_bytes(size)} per rank on {m.world_size} ranks with {m.label}: "
                  f"{human_time(t)} +/- {human_time(Z95 * se)} (95%, {m.best} fit){where}")
    if args.json:
        print(json.dumps(answers, indent=1))
    return 0

"""Row-by-row ratios of two record files (or run directories), decided on launches, never on iterations.

Rows match on series (transport + mechanism knobs), op, world size and size (before vs after), or with
--across on op/world_size/size only (backend vs backend: e.g. gloo in A against raw:ring in B, or both from
one file with --a-transport and --b-transport). Each launch of a row (a file several runs appended to) and
each round of an interleaved trial's arm is one block; the ratio of mean times B/A gets a bootstrap interval
over blocks at confidence 1 - --alpha, and a change counts when that interval excludes 1 and the ratio is at
least --threshold from 1. A row with fewer than 3 blocks a side is untested; Welch's t-test on the
iterations is shown beside, never decides.

examples:
  diag compare before.jsonl after.jsonl
  diag compare before.jsonl after.jsonl --html compare.html --fail-on slower:5%
  diag compare runs/sweep.jsonl runs/sweep.jsonl --across --a-transport gloo --b-transport raw:ring
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("a", metavar="A", help="baseline: records .jsonl or a run directory")
    parser.add_argument("b", metavar="B", help="changed: records .jsonl or a run directory")
    parser.add_argument("--across", action="store_true",
                        help="match rows across backends (op, world size, size), for backend-vs-backend")
    parser.add_argument("--a-transport", default=None, metavar="T",
                        help="only A's rows of this transport/backend (torch:gloo, gloo, raw:ring, raw)")
    parser.add_argument("--b-transport", default=None, metavar="T", help="only B's rows of this transport")
    parser.add_argument("--threshold", type=float, default=None,
                        help="smallest relative time change that counts (default 0.05 = 5%%)")
    parser.add_argument("--alpha", type=float, default=None,
                        help="1 - the confidence of the ratio's bootstrap interval (default 0.05: 95%%)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("--html", type=Path, default=None, metavar="FILE",
                        help="also write FILE: busbw vs size per N, both runs overlaid with their spreads, and the "
                             "rows (one self-contained page)")
    parser.add_argument("--fail-on", default=None, metavar="slower:PERCENT",
                        help="exit 8 when a row of B is slower than A by PERCENT or more (its interval over launches "
                             "above 1), e.g. slower:5%% (a CI gate on a regression); exit 2 when no row is in common "
                             "or none has 3 launches a side, since the gate then checked nothing")


def run(args: argparse.Namespace) -> int:
    from diag.errors import DiagError
    from diag.gates import CompareGate
    from diag.report.compare import ALPHA, THRESHOLD, compare, render_text
    from diag.report.rundir import load_run

    threshold = THRESHOLD if args.threshold is None else args.threshold
    alpha = ALPHA if args.alpha is None else args.alpha
    if threshold < 0 or not 0 < alpha < 1:
        raise DiagError("--threshold must be >= 0 and --alpha between 0 and 1")
    gate = CompareGate.parse(args.fail_on) if args.fail_on else None
    if args.html is not None:
        from diag import validate

        validate.output_file(args.html, "--html")
    # every row of each side: the survey rows (one block per launch) and the trials' blocks (one per round)
    a = load_run([args.a]).all_records
    b = load_run([args.b]).all_records
    result = compare(a, b, across=args.across, a_transport=args.a_transport, b_transport=args.b_transport,
                     alpha=alpha, threshold=threshold)
    text = render_text(result)
    if args.json:
        print(json.dumps(result.to_json(), indent=1))
    else:
        print(text)
    if args.html is not None:
        from diag.report.overlay import write_compare_html

        write_compare_html(args.html, [r for r in a if not r.block], [r for r in b if not r.block], result, args.a,
                           args.b, text.splitlines()[-1] if text else "")
        print(f"overlay: {args.html}", file=sys.stderr)
    if gate is None:
        return 0
    code, why = gate.check(result)
    if why:
        print(f"diag compare: {why}", file=sys.stderr)
    return code

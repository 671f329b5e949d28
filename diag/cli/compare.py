"""Row-by-row ratios of two record files (or run directories), with Welch's two-sample t-test on times_s.

Rows match on backend/algo/op/world_size/size (before vs after), or with --across on op/world_size/size
only (backend vs backend: e.g. gloo in A against raw:ring in B, or both from one file with --a-transport
and --b-transport). A difference counts when p < --alpha and the time changed by at least --threshold.
"""

from __future__ import annotations

import argparse
import json


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
    parser.add_argument("--alpha", type=float, default=None, help="significance level (default 0.05)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def run(args: argparse.Namespace) -> int:
    from diag.errors import DiagError
    from diag.report.compare import ALPHA, THRESHOLD, compare, render_text
    from diag.report.rundir import load_run

    threshold = THRESHOLD if args.threshold is None else args.threshold
    alpha = ALPHA if args.alpha is None else args.alpha
    if threshold < 0 or not 0 < alpha < 1:
        raise DiagError("--threshold must be >= 0 and --alpha between 0 and 1")
    a = load_run([args.a]).records
    b = load_run([args.b]).records
    result = compare(a, b, across=args.across, a_transport=args.a_transport, b_transport=args.b_transport,
                     alpha=alpha, threshold=threshold)
    if args.json:
        print(json.dumps(result.to_json(), indent=1))
    else:
        print(render_text(result))
    return 0

"""Measure user-level workarounds for gloo's N=2 all_gather beside plain gloo and print the code to use.

One interleaved trial in one launch: plain gloo all_gather, all_gather built from batch_isend_irecv with
receives posted first, and the unchanged all_gather on the diag_tcp backend (a process group of its own over
the same ranks) run in rounds, every arm once a round in a fresh random order, until each workaround is
decided against plain gloo (the bootstrap interval of the time ratio, at least WORKAROUND_EFFECT apart) or the
budget is spent. The same step runs at the end of diag reproduce. Results land in a run directory as they
finish: DIR/records/advise.jsonl and DIR/advise/advise.json (diag report DIR renders them).

examples:
  diag lab up --name adv --hosts 2 --rate 200mbit
  diag advise --lab adv --sizes 16M,32M
  diag lab down --name adv
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--lab", default=None, metavar="NAME",
                        help="run on this lab (diag lab up); without it ranks run on this machine's loopback, "
                             "which is unshaped and CPU-bound: the N=2 dip needs a shaped link")
    parser.add_argument("--sizes", default="16M,32M", help="per-rank sizes (default 16M,32M)")
    parser.add_argument("--nproc", type=int, default=2, help="world size (default 2: the anomaly's N)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed iterations of each arm before its first "
                                                              "block at a size (default 2)")
    parser.add_argument("--iters", type=int, default=5,
                        help="rounds at least: each round times every arm once, in a fresh random order "
                             "(default 5); more follow until every workaround is decided or --budget is spent")
    parser.add_argument("--budget", type=float, default=60.0, metavar="S",
                        help="seconds the trial may take over all sizes (default 60)")
    parser.add_argument("--out", default=None, metavar="DIR",
                        help="the run directory (default runs/advise-<time>)")
    parser.add_argument("--json", action="store_true", help="print advise.json instead of the table")


def run(args: argparse.Namespace) -> int:
    from diag.errors import require_torch

    require_torch("diag advise")
    from diag import validate
    from diag.advise import render_text
    from diag.advisefile import ADVISE_NAME, load_advise
    from diag.errors import DiagError
    from diag.inplace.job import JobOptions
    from diag.plan import ADVISE, MIN_ROUNDS_DECIDE, advise_plan
    from diag.runplan import in_place, run_plan
    from diag.units import parse_size_list

    if args.iters < MIN_ROUNDS_DECIDE:
        raise DiagError(f"--iters must be at least {MIN_ROUNDS_DECIDE}: a verdict needs that many rounds of each arm")
    if args.warmup < 0:
        raise DiagError("--warmup must be >= 0")
    validate.seconds(args.budget, "--budget")
    sizes = tuple(parse_size_list(args.sizes))
    plan = advise_plan(sizes, args.nproc, warmup=args.warmup, min_rounds=args.iters, budget_s=args.budget)
    lab = None
    if args.lab:
        from diag.lab import load_lab

        lab = load_lab(args.lab)
    out = Path(args.out) if args.out else Path("runs") / f"advise-{time.strftime('%Y%m%d-%H%M%S')}"
    if not in_place():
        validate.output_dir(out, "--out")
    options = JobOptions(plan=plan.to_json(), command=ADVISE, out=str(out.resolve()), run_id=uuid.uuid4().hex[:12],
                         argv=tuple(sys.argv[1:]))
    code = run_plan(options, lab=lab)
    if in_place() and int(os.environ.get("RANK", "0")) != 0:
        return code
    result = load_advise(out / ADVISE / ADVISE_NAME)
    print(json.dumps(result, indent=1) if args.json else render_text(result))
    print(f"results: {out / ADVISE / ADVISE_NAME} (records: {out / 'records' / f'{ADVISE}.jsonl'}; "
          f"diag report {out})", file=sys.stderr, flush=True)
    return 1 if result["failures"] or code else 0

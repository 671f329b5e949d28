"""Measure user-level workarounds for gloo's N=2 all_gather against plain gloo and print the code to use.

Runs plain gloo all_gather, all_gather built from batch_isend_irecv with receives posted first, and the
unchanged harness on the diag_tcp backend (through diag exec), one after the other on the same hosts,
then reports each workaround as a speed-up with Welch's t-test. Results are written as they finish:
DIR/records.jsonl and DIR/advise.json.

examples:
  diag lab up --name adv --hosts 2 --rate 200mbit
  diag advise --lab adv --sizes 16M,32M
  diag lab down --name adv
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--lab", default=None, metavar="NAME",
                        help="run on this lab (diag lab up); without it ranks run on this machine's loopback, "
                             "which is unshaped and CPU-bound: the N=2 dip needs a shaped link")
    parser.add_argument("--sizes", default="16M,32M", help="per-rank sizes (default 16M,32M)")
    parser.add_argument("--nproc", type=int, default=2, help="world size (default 2: the anomaly's N)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed iterations per size (default 2)")
    parser.add_argument("--iters", type=int, default=5, help="timed iterations per size (default 5)")
    parser.add_argument("--out", default=None, metavar="DIR",
                        help="where records.jsonl and advise.json go (default runs/advise-<time>)")
    parser.add_argument("--json", action="store_true", help="print advise.json instead of the table")


def run(args: argparse.Namespace) -> int:
    from diag.errors import require_torch

    require_torch("diag advise")
    from diag.advise import render_text, run_advise
    from diag.errors import DiagError
    from diag.units import parse_size_list

    if args.nproc < 2:
        raise DiagError("--nproc must be at least 2: all_gather's workarounds need a peer")
    if args.iters < 2:
        raise DiagError("--iters must be at least 2: the significance test needs two samples a side")
    sizes = tuple(parse_size_list(args.sizes))
    lab = None
    if args.lab:
        from diag.lab import load_lab

        lab = load_lab(args.lab)
    out = Path(args.out) if args.out else Path("runs") / f"advise-{time.strftime('%Y%m%d-%H%M%S')}"

    def say(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    result = run_advise(out, lab=lab, world_size=args.nproc, sizes=sizes, warmup=args.warmup, iters=args.iters,
                        say=say)
    print(json.dumps(result, indent=1) if args.json else render_text(result))
    say(f"results: {out / 'advise.json'} (records: {out / 'records.jsonl'})")
    return 1 if result["failures"] else 0

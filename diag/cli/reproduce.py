"""The main job: reproduce the WORLD_SIZE=2 all_gather anomaly (or show its absence), with evidence.

Brings up the lab (hosts with shaped full-duplex links; falls back to loopback without root), measures the
link, runs gloo and raw-TCP all_gather sweeps at equal per-device volume D for every N, the exchange op in
both orders and raw knob experiments at N=2, captures and observes them, analyses the captures, writes the
report and prints the findings. --quick (N = 2, 3, 4) takes a few minutes; the default (N = 2..8) longer.
Ctrl-C tears the lab down and keeps what finished.

examples:
  diag reproduce --quick                       # N = 2, 3, 4: a few minutes
  diag reproduce --out runs/r1 --rate 1gbit     # N = 2..8 on a 1 Gbit/s lab
  diag reproduce --quick --volumes 4M,16M,32M   # larger volumes D
"""

from __future__ import annotations

import argparse
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="N = 2, 3, 4 and fewer sizes (a few minutes)")
    parser.add_argument("--out", type=Path, help="run directory (default runs/reproduce-<time>)")
    parser.add_argument("--rate", help="per-host link rate of the lab, tc syntax (default 200mbit, which a "
                                       "2-core machine sustains)")
    parser.add_argument("--max-n", type=int, help="largest world size (default 4 with --quick, else 8)")
    parser.add_argument("--volumes", help="per-device volumes D to run at every N, e.g. 1M,4M,16M "
                                          "(default 1M,4M,16M)")
    parser.add_argument("--stop-on-error", action="store_true",
                        help="stop at the first failed step (default: note it and go on)")


def run(args: argparse.Namespace) -> int:
    from diag.errors import require_torch

    require_torch("diag reproduce")
    from diag.reproduce import run_reproduce
    from diag.units import parse_size_list

    volumes = parse_size_list(args.volumes) if args.volumes else None
    if args.out is not None:
        from diag import validate

        validate.output_dir(args.out, "--out")
    return run_reproduce(args.quick, args.out, args.rate, args.max_n, keep_going=not args.stop_on_error,
                         volumes=volumes)

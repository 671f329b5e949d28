"""A/B-test programs as arms of one interleaved trial: a patched library build, an environment variable, a
kernel setting. Every arm is a shell command started once per block on every rank (each lab host, or each
rank of an in-place launch) and timed by what it prints, through an adapter; the arms run in rounds, each
round in a fresh seeded order, until every arm's comparison with the baseline is decided or the budget is
spent: the same statistics (bootstrap over rounds), CPU samples and records as diag's own trials.

Placeholders in a command (see docs/cli.md, "diag trial"): {rank} {world} {address} {master} {addresses}
{iface} {port} {prefix} {shared} {output} {bytes} {elements} {total_bytes} {volume} {iters} {warmup} {arm}
{round}; RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT are set as torchrun sets them. The command runs in
the directory diag was started from. A command that fails, times out or prints nothing the adapter reads
is one line; its arm leaves the trial, the others go on, and diag exits 1 at the end.

examples:
  diag trial --lab lab4 --nproc 2,3,4 --volumes 1M,4M,16M,64M --adapter gloo-benchmark --link --capture \\
    --arm stock='/opt/gloo-stock/benchmark --size {world} --rank {rank} --shared-path {shared} \\
                 --prefix {prefix} --transport tcp --tcp-device {iface} --elements {elements} \\
                 --iteration-count {iters} --warmup-iters {warmup} --no-verify allgather' \\
    --arm patched='/opt/gloo-patched/benchmark ... (the same)'
  diag trial --lab lab2 --nproc 2 --sizes 16M --adapter 'json:seconds@s' \\
    --arm one='GLOO_SOCKET_IFNAME={iface} python3 bench.py' --arm two='GLOO_SOCKET_IFNAME={iface},{iface} python3 bench.py'
  diag trial --nproc 2 --sizes 64M --adapter nccl-tests-json \\
    --arm a='all_gather_perf -b {total_bytes} -e {total_bytes} -J {output}' --arm b='NCCL_NSOCKS_PERTHREAD=4 all_gather_perf ...'
"""

from __future__ import annotations

import argparse

from diag.cli.sweep import int_list


def add_arguments(parser: argparse.ArgumentParser) -> None:
    arms = parser.add_argument_group("the arms")
    arms.add_argument("--arm", action="append", default=[], metavar="NAME=COMMAND",
                      help="one arm: a name and the shell command every rank runs for each block (repeat; at least "
                           "two arms, or one with --link)")
    arms.add_argument("--adapter", required=True, metavar="ADAPTER",
                      help="how the commands' output becomes times: gloo-benchmark, nccl-tests[:in-place], "
                           "nccl-tests-json[:in-place] (the file written to {output}), regex:PATTERN (a named group "
                           "time_s, time_ms, time_us or time_ns; optional bytes or total_bytes), json:PATH[@UNIT]")
    arms.add_argument("--baseline", help="the arm every other arm is held against (default: the first)")
    arms.add_argument("--link", action="store_true",
                      help="also run diag's raw-TCP reference (one connection per direction) as an arm 'link': the "
                           "link measured beside the programs, in the same rounds")
    arms.add_argument("--op", default="all_gather",
                      help="what the programs run (default all_gather): the bus factor of busbw and what "
                           "{total_bytes} and --volumes mean")

    sizes = parser.add_argument_group("sizes and statistics")
    sizes.add_argument("--sizes", help="per-rank sizes, e.g. 1M,16M ({bytes}; K/M/G binary)")
    sizes.add_argument("--volumes", help="per-device volumes D instead, the same at every N, e.g. 1M,4M,16M,64M "
                                         "(per rank: D/(N-1) for all_gather, in whole elements)")
    sizes.add_argument("--element-bytes", type=int, default=4, help="bytes per element for {elements} (default 4)")
    sizes.add_argument("--iters", type=int, default=3, help="{iters}: timed iterations a block (default 3)")
    sizes.add_argument("--warmup", type=int, default=1, help="{warmup}: warm-up iterations a block (default 1)")
    sizes.add_argument("--effect", type=float, default=0.05,
                       help="smallest difference in time that counts, a fraction (default 0.05): arms are equal when "
                            "the interval of their time ratio lies within it")
    sizes.add_argument("--min-rounds", type=int, default=5, help="rounds before any stop (default 5)")
    sizes.add_argument("--max-rounds", type=int, default=20, help="most rounds a size (default 20)")
    sizes.add_argument("--budget", type=float, default=600.0, metavar="SECONDS",
                       help="time for all sizes at one world size, shared in proportion to size (default 600); "
                            "then the verdicts left open say 'undecided (budget)'")
    sizes.add_argument("--block-timeout", type=float, default=600.0, metavar="SECONDS",
                       help="a block whose command has not ended by then fails its arm (default 600)")
    sizes.add_argument("--seed", type=int, help="seed of the round orders, > 0 (default: a new one, drawn by rank 0 "
                                                "and recorded in run.json and the records)")
    sizes.add_argument("--fail-on", choices=["slower"],
                       help="exit 8 when an arm is shown slower than the baseline (a CI gate)")

    where = parser.add_argument_group("where ranks run")
    where.add_argument("--nproc", "--world-sizes", dest="nproc", type=int_list,
                       help="world sizes, a trial at each, e.g. 2,3,4: one launch of max(N) ranks, each N on the "
                            "first N (without --lab: K local ranks); under torchrun (in place: default, the "
                            "launch's size) spell it --world-sizes, which torchrun does not take for its own "
                            "--nproc-per-node")
    where.add_argument("--lab", nargs="?", const="diag", default=None, metavar="NAME",
                       help="one rank in each lab host's namespace (default lab name: diag)")
    where.add_argument("--iface", help="without --lab: the network interface of the ranks (GLOO_SOCKET_IFNAME)")
    where.add_argument("--shared-dir",
                       help="{shared}: a directory every host sees (default: the run directory's shared/, which "
                            "every lab host sees; in place across machines, give one on a shared filesystem)")

    out = parser.add_argument_group("output")
    out.add_argument("--out", help="run directory (default runs/trial-<time>): records/, outputs/ (every block's "
                                   "output), run.json; diag report reads it")
    out.add_argument("--name", default="ab", help="the trial's name in the records (default ab)")
    out.add_argument("--capture", nargs="?", const="", default=None, metavar="IFACE",
                     help="every node captures its own link with tcpdump during the trial, analysed per block at "
                          "the end (duplex overlap per arm)")
    out.add_argument("--snaplen", type=int, default=128, help="capture snap length (default 128)")


def run(args: argparse.Namespace) -> int:
    from diag.errors import require_torch
    from diag.external.run import options_from_args, run_program_trial

    require_torch("diag trial")
    return run_program_trial(options_from_args(args))

"""Time collectives over a size sweep: torch.distributed (gloo, nccl) or diag's raw-TCP reference.

Three ways to start ranks, one job: K = the largest N ranks start once, and every N runs on a subgroup of them.
  diag sweep --nproc 2,3,4 ...           K ranks on this machine, started by torch's launcher
  diag sweep --lab [NAME] --nproc 2,3    one launcher per lab host (network namespaces), as on a cluster
  torchrun ... -m diag sweep ...         in place, under torchrun / srun / any env:// launcher (--nproc: the N
                                         to run on subgroups of the job; default: the whole job)
  srun -N 2 diag sweep ...               in place, every Slurm task a rank (srun alone: diag reads SLURM_*)
Every run writes a run directory (--run-dir, default <out>.d): records/sweep.jsonl, run.json and each node's
fingerprint, captures (--capture), their analyses and observer samples (--observe) under nodes/<node>/;
diag report renders it. The records are appended to --out as well.

Ends with nccl-tests' closing lines (Out of bounds values, Avg bus bandwidth) and gates on them: exit 6 when a
row has #wrong > 0, 7 when the average busbw is below --min-busbw (docs/cli.md, Exit codes).

examples:
  diag sweep --backend gloo --op all_gather --nproc 2,3,4 --min 1K --max 64M
  diag sweep --nproc 2 --sizes 16M,64M --min-busbw 0.05 --samples-csv samples.csv   # a CI gate + samples
  diag sweep --backend raw --algo ring --emulate gloo --nproc 2 --sizes 16M,64M
  diag sweep --backend gloo --op exchange --order send-first --nproc 2 --sizes 1M,32M
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from diag.errors import DiagError

DEFAULT_MIN, DEFAULT_MAX, DEFAULT_FACTOR = "1K", "64M", 2.0


def int_list(text: str) -> list[int]:
    """An argparse type: '2,3,4' as [2, 3, 4] (diag sweep's and diag trial's --nproc)."""
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers like 2,3,4, got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError("empty list")
    return values


def add_arguments(parser: argparse.ArgumentParser) -> None:
    what = parser.add_argument_group("what to run")
    what.add_argument("--backend", default="gloo", choices=["gloo", "nccl", "raw", "diag_tcp"],
                      help="torch.distributed backend, 'raw' for diag's own TCP collectives, or 'diag_tcp' for "
                           "those as a torch.distributed backend, ranks started through diag.exec (default gloo)")
    what.add_argument("--op", default="all_gather",
                      help="comma list: all_gather, all_gather_p2p, send_recv, ping_pong, exchange, all_reduce, "
                           "reduce_scatter, broadcast, all_to_all (default all_gather)")
    what.add_argument("--sizes", help="explicit per-rank sizes, e.g. 1,512K,12589824,200M (K/M/G binary)")
    what.add_argument("--min", default=DEFAULT_MIN, help=f"smallest size (default {DEFAULT_MIN})")
    what.add_argument("--max", default=DEFAULT_MAX, help=f"largest size (default {DEFAULT_MAX})")
    what.add_argument("--factor", type=float, default=DEFAULT_FACTOR, help="size multiplier (default 2)")
    what.add_argument("--dtype", default="float32", help="tensor dtype (default float32; uint8 for odd sizes)")
    what.add_argument("--device", default=None, help="cpu or cuda (default: cpu for gloo/raw, cuda for nccl)")
    what.add_argument("--order", default=None, choices=["recv-first", "send-first"],
                      help="exchange and the raw transport: which call each rank posts first (default "
                           "recv-first; --emulate gloo: send-first, as gloo's all_gather)")

    how = parser.add_argument_group("how to measure")
    how.add_argument("--warmup", type=int, default=5, help="untimed iterations per size (default 5)")
    how.add_argument("--iters", type=int, default=20, help="timed iterations per size (default 20)")
    how.add_argument("--gap-ms", type=float, default=0.0,
                     help="idle time before each timed iteration (TCP slow start after idle), default 0")
    how.add_argument("--timeout", type=float, default=60.0,
                     help="seconds a collective may take before a dead/hung peer fails the sweep (default 60)")
    how.add_argument("--no-check", action="store_true", help="skip the data check (nwrong is then -1)")
    how.add_argument("--seed", type=int, default=0, help="seed of the data pattern")
    how.add_argument("--min-busbw", type=float, default=None, metavar="GBPS",
                     help="exit 7 when the average bus bandwidth over the rows is below GBPS (GB/s, 1e9 bytes/s), "
                          "as nccl-tests' NCCL_TESTS_MIN_BW (default: no bandwidth gate)")

    where = parser.add_argument_group("where ranks run")
    where.add_argument("--nproc", type=int_list,
                       help="world sizes N to run, e.g. 2,3,4: max(N) ranks start once on this machine (or the "
                            "lab) and each N runs on a subgroup of them; under torchrun/env:// the subgroups of "
                            "the job (default there: the whole job)")
    where.add_argument("--lab", nargs="?", const="diag", default=None, metavar="NAME",
                       help="run each rank in its own lab host namespace (default lab name: diag)")
    where.add_argument("--iface", help="network interface for the ranks (sets GLOO_SOCKET_IFNAME)")
    where.add_argument("--master-addr", default="127.0.0.1", help="rendezvous address for --nproc runs")
    where.add_argument("--master-port", type=int, help="rendezvous port (default: a free one)")

    raw = parser.add_argument_group("raw TCP transport (--backend raw)")
    raw.add_argument("--algo", default="ring", choices=["ring", "pairwise", "direct"],
                     help="all_gather algorithm (default ring)")
    raw.add_argument("--emulate", choices=["gloo"], help="preset of knobs that mirrors gloo's pattern")
    raw.add_argument("--conn", choices=["shared", "split"],
                     help="one connection per peer pair for both directions (shared, as gloo) or one per "
                          "direction (split, as NCCL's net transport)")
    raw.add_argument("--handshake", choices=["none", "notify"],
                     help="notify: gloo's protocol, a send writes data only after the receiver's RECV_READY")
    raw.add_argument("--notice", choices=["in-band", "own-conn"],
                     help="with notify: ready notices on the data connection (in-band, gloo) or on a "
                          "connection of their own per pair")
    raw.add_argument("--skew-us", type=int, help="every rank but 0 starts each operation this many microseconds "
                                                  "later (default 0)")
    raw.add_argument("--io", choices=["duplex", "alternate"], help="concurrent send/recv or one thread alternating")
    raw.add_argument("--chunks", type=int, help="chunks per block (gloo uses 2; default: 1 MiB pieces)")
    raw.add_argument("--chunk-bytes", help="piece size when --chunks is not given (default 1M)")
    raw.add_argument("--sockbuf", help="SO_SNDBUF/SO_RCVBUF in bytes, e.g. 4M (default: kernel autotuning)")
    raw.add_argument("--nodelay", choices=["on", "off"], help="TCP_NODELAY")
    raw.add_argument("--streams", type=int, help="connections per peer, striped")
    raw.add_argument("--tcpinfo-interval", type=float, help="also sample TCP_INFO every this many seconds")

    out = parser.add_argument_group("output")
    out.add_argument("--out", help="records file (JSON Lines, appended; default runs/sweep-<time>.jsonl)")
    out.add_argument("--run-dir", help="the run directory: records, run.json, every node's captures, analyses, "
                                       "observer and TCP_INFO files, logs (default: beside --out, <out>.d, "
                                       "or <out>-<run id>.d where that holds an earlier run)")
    out.add_argument("--csv", help="also export this run's rows as CSV to this file (one line per row)")
    out.add_argument("--samples-csv", metavar="FILE",
                     help="also export every timed iteration (max over ranks) as one CSV row, long format for "
                          "pandas and R (columns: diag.records.SAMPLE_FIELDS)")
    out.add_argument("--capture", nargs="?", const="", default=None, metavar="IFACE",
                     help="every node captures its own NIC with tcpdump (root) and analyses it against the records "
                          "(default interface: the job's, e.g. each lab host's link; lo locally); a node that may "
                          "not capture samples TCP_INFO instead and says so")
    out.add_argument("--snaplen", type=int, default=128, help="capture snap length (default 128)")
    out.add_argument("--keep-pcaps", action="store_true",
                     help="keep each node's pcaps after its analysis (default: deleted once analysed; the "
                          "analyses stay)")
    out.add_argument("--observe", action="store_true",
                     help="every node samples its ranks' ss/TCP_INFO, per-thread CPU and NIC counters during the "
                          "sweep")
    out.add_argument("--quiet", action="store_true", help="print no table")


def build_spec(args: argparse.Namespace):
    from diag import validate
    from diag.spec import SweepSpec
    from diag.units import geometric_sizes, parse_size, parse_size_list

    validate.seconds(args.timeout, "--timeout")
    validate.seconds(args.gap_ms / 1000.0, "--gap-ms (as seconds)", allow_zero=True)
    if args.tcpinfo_interval is not None:
        validate.seconds(args.tcpinfo_interval, "--tcpinfo-interval")

    sizes = (parse_size_list(args.sizes) if args.sizes
             else geometric_sizes(parse_size(args.min), parse_size(args.max), args.factor))
    ops = tuple(op.strip() for op in args.op.split(",") if op.strip())
    from diag.collectives import OPS

    for op in ops:
        if op not in OPS:
            raise DiagError(f"unknown op {op!r}: choose from {', '.join(OPS)}")
    knobs: dict[str, object] = {}
    if args.backend in ("raw", "diag_tcp"):
        from diag.transports.raw.knobs import knobs_from_args, resolve_knobs

        knobs = knobs_from_args(args)
        if args.tcpinfo_interval is not None:
            knobs["tcpinfo_interval_s"] = args.tcpinfo_interval
        # The ranks resolve the knobs again; resolving them here too refuses a bad one (--streams 0) with one
        # line before any launcher starts, not as N ranks' failures after torchrun did.
        resolve_knobs(args.algo if args.backend == "raw" else "ring", args.order or "recv-first", knobs)
    if args.master_port is not None:
        validate.port(args.master_port, "--master-port")
    device = args.device or ("cuda" if args.backend == "nccl" else "cpu")
    return SweepSpec(
        backend=args.backend, ops=ops, sizes=tuple(sizes), world_sizes=tuple(args.nproc or ()),
        algo=args.algo if args.backend == "raw" else "default", warmup=args.warmup, iters=args.iters,
        gap_s=args.gap_ms / 1000.0, timeout_s=args.timeout, dtype=args.dtype, device=device,
        order=args.order or "recv-first", check=not args.no_check, seed=args.seed, knobs=knobs,
    )


def run(args: argparse.Namespace) -> int:
    from diag.errors import require_torch

    require_torch("diag sweep")
    spec = build_spec(args)
    from diag import validate
    from diag._sweep import default_out, run_sweep
    from diag.runplan import in_place, run_records

    if args.iface:
        validate.interface(args.iface)
        os.environ["GLOO_SOCKET_IFNAME"] = args.iface
    out = validate.output_file(args.out, "--out") if args.out else default_out()
    if args.csv:
        validate.output_file(args.csv, "--csv")
    if args.samples_csv:
        validate.output_file(args.samples_csv, "--samples-csv")
    if args.min_busbw is not None and not args.min_busbw >= 0:
        raise DiagError("--min-busbw takes GB/s, a number >= 0, e.g. 0.1")
    lab = None
    if args.lab:
        from diag.lab import load_lab

        lab = load_lab(args.lab)
    root = run_sweep(spec, out, run_dir=args.run_dir, lab=lab, iface=args.iface, master_addr=args.master_addr,
                     master_port=args.master_port, capture=args.capture, snaplen=args.snaplen, keep_pcaps=args.keep_pcaps,
                     observe=args.observe, quiet=args.quiet, argv=tuple(sys.argv[1:]))
    if in_place() and int(os.environ.get("RANK", "0")) != 0:
        return 0   # rank 0 writes the records and gates on them
    from diag.plan import SWEEP

    records = run_records(root, SWEEP)
    export_tables(args, records)
    from diag.gates import closing_lines, sweep_status

    if not args.quiet:
        print("\n".join(closing_lines(records)), flush=True)
        print(f"# {len(records)} row{'' if len(records) == 1 else 's'} written to {out} (run directory {root})", file=sys.stderr, flush=True)
    code, why = sweep_status(records, args.min_busbw)
    if why:
        print(f"diag sweep: {why}", file=sys.stderr, flush=True)
    return code


def export_tables(args: argparse.Namespace, records: list) -> None:
    if args.csv:
        from diag.records import write_csv

        write_csv(records, Path(args.csv))
    if args.samples_csv:
        from diag.records import export_samples_csv

        export_samples_csv(records, Path(args.samples_csv))

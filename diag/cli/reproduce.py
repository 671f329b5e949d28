"""The main job: reproduce the WORLD_SIZE=2 all_gather anomaly (or show its absence), with evidence.

One job runs the whole plan in one launch of K ranks: every N = 2..K through subgroups, gloo and the raw-TCP
reference at equal per-device volume D, the N=2 experiments as interleaved trials, the exchange in both
orders, raw knob rows, the workarounds (advise); a pairwise link matrix between the hosts; every node
fingerprinted, captured (or sampled with TCP_INFO) and analysed where its data is; one report on rank 0.

Where it runs: under torchrun, srun (with or without torchrun) or any env:// launcher it runs IN PLACE on the
job's hosts (the path on a real cluster). Started by hand as root it brings up the lab (a cluster in a box: one namespace per host,
shaped full-duplex links) and starts one torchrun per host itself; without root, K ranks on loopback.
Ctrl-C tears the lab down and keeps what finished.

examples:
  diag reproduce --quick                       # the lab: N = 2, 3, 4, a few minutes
  diag reproduce --out runs/r1 --rate 1gbit     # N = 2..8 on a 1 Gbit/s lab
  diag reproduce --quick --volumes 4M,16M,32M   # larger volumes D
  diag reproduce --quick --lab-fault h2:rate=50mbit   # one host stuck at a lower rate
  diag reproduce --quick --lab-scenario shallow-buffer  # a built-in fault scenario (docs/lab.md)
  diag reproduce --profile only --rate 1gbit    # the model's profile alone: 1 B..200 MiB, every N (docs/model.md)
  # on each of 4 nodes (rank 0's host at 10.0.0.1), the same command:
  torchrun --nnodes 4 --nproc-per-node 1 --node-rank $NODE_RANK --rdzv-backend static \\
           --master-addr 10.0.0.1 --master-port 29500 -m diag reproduce --quick --iface eth0 --out /shared/r1
  # Slurm (in an allocation): srun starts the ranks, diag reads SLURM_PROCID, the node list, ...
  srun --nodes 4 --ntasks-per-node 1 diag reproduce --quick --out /shared/r1
  # or srun starts one torchrun per node ($HEAD: the allocation's first node)
  srun --nodes 4 --ntasks-per-node 1 torchrun --nnodes 4 --nproc-per-node 1 --rdzv-backend c10d \\
       --rdzv-id $SLURM_JOB_ID --rdzv-endpoint $HEAD:29500 -m diag reproduce --quick --out /shared/r1
"""

from __future__ import annotations

import argparse
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="N = 2, 3, 4 and fewer sizes (a few minutes)")
    parser.add_argument("--out", type=Path, help="run directory (default runs/reproduce-<time>); in place, on a "
                                                 "shared filesystem every node writes its part there, else each "
                                                 "node sends its results to rank 0")
    parser.add_argument("--rate", help="the lab: per-host link rate, tc syntax (default 200mbit, which a 2-core "
                                       "machine sustains)")
    parser.add_argument("--max-n", type=int, help="largest world size (default 4 with --quick, else 8; in place "
                                                  "at most the job's ranks)")
    parser.add_argument("--volumes", help="per-device volumes D to run at every N, e.g. 1M,4M,16M "
                                          "(default 1M,4M,16M)")
    parser.add_argument("--backend", default="gloo", choices=["gloo", "diag_tcp"],
                        help="the backend under test (default gloo); diag_tcp takes no turns on a connection: "
                             "the negative control of the N=2 anomaly, where a lab fault is the only slowdown")
    parser.add_argument("--skip", default="", metavar="KINDS",
                        help="leave out step kinds, comma list of trials (the interleaved N=2 experiments), knobs "
                             "(raw knob rows), advise (the workarounds), incast (the link probe's phases with every "
                             "other node sending into one, which find a shallow switch port: K phases of 2 s or "
                             "more); the sweeps at every N and the link matrix always run (a health check: --skip "
                             "trials,knobs,advise)")
    parser.add_argument("--profile", nargs="?", const="add", choices=("add", "only"), default=None,
                        help="also run the model's profile (docs/model.md): all_gather, send_recv and all_reduce of "
                             "the backend under test and the raw-TCP reference at every N, per-rank sizes 1 B to "
                             "200 MiB, each size sampled until its mean is known to 1%% or its time budget is spent; "
                             "'--profile only' runs the profile alone")
    parser.add_argument("--profile-sizes", metavar="SIZES",
                        help="the profile's per-rank sizes (default 1,4,16,...,64M,200M: powers of 4 and 200 MiB)")
    parser.add_argument("--profile-row-seconds", type=float, metavar="S",
                        help="each profile size samples for at most about this long past its first 2 iterations "
                             "(default 2)")
    parser.add_argument("--probe-seconds", type=int, default=2, metavar="S",
                        help="seconds of each phase of the link probe, 1..60 (default 2; a K=4 matrix is 9 phases, "
                             "then 4 incast phases of at least 2 s)")
    parser.add_argument("--iface", help="in place: the network interface of the job's traffic (sets "
                                        "GLOO_SOCKET_IFNAME; default: GLOO_SOCKET_IFNAME, else the route to "
                                        "MASTER_ADDR)")
    parser.add_argument("--keep-pcaps", action="store_true",
                        help="keep the pcaps (a quick run takes ~1.1 GB of them); default: each node analyses "
                             "its captures and deletes the pcaps from a shared run directory, keeping the analyses; "
                             "without a shared --out the pcaps stay on their node, and this sends them to rank 0 "
                             "too")
    parser.add_argument("--lab-fault", action="append", default=[], metavar="HOST:KEY=VALUE[,KEY=VALUE]",
                        help="the lab: one host's own fault, repeatable, as diag lab up --fault (rate, rx-queue, "
                             "tx-queue, mtu, tcp_rmem, tcp_wmem, cc, slow_start_after_idle, cpu), e.g. "
                             "h2:rate=50mbit (docs/lab.md)")
    parser.add_argument("--lab-scenario", metavar="FILE|NAME",
                        help="the lab: a scenario of per-host faults, a file or a built-in name (slow-nic, "
                             "shallow-buffer, small-windows, jumbo-host, slow-cpu)")
    parser.add_argument("--stop-on-error", action="store_true",
                        help="stop at the first failed step (default: note it and go on)")


def run(args: argparse.Namespace) -> int:
    from diag.errors import require_torch

    require_torch("diag reproduce")
    from diag.reproduce import run_reproduce
    from diag.units import parse_size_list

    volumes = parse_size_list(args.volumes) if args.volumes else None
    from diag.errors import DiagError

    if args.max_n is not None and args.max_n < 2:
        raise DiagError("--max-n must be at least 2")
    if (args.profile_sizes or args.profile_row_seconds is not None) and not args.profile:
        raise DiagError("--profile-sizes and --profile-row-seconds set the profile: add --profile")
    if not 1 <= args.probe_seconds <= 60:
        raise DiagError("--probe-seconds must be 1..60 (iperf3 takes whole seconds)")
    if args.out is not None:
        from diag import validate

        validate.output_dir(args.out, "--out")
    return run_reproduce(args.quick, args.out, args.rate, args.max_n, keep_going=not args.stop_on_error,
                         volumes=volumes, iface=args.iface, keep_pcaps=args.keep_pcaps,
                         lab_faults=tuple(args.lab_fault), lab_scenario=args.lab_scenario, backend=args.backend,
                         skip=tuple(k.strip() for k in args.skip.split(",") if k.strip()),
                         probe_seconds=args.probe_seconds, profile=args.profile,
                         profile_sizes=tuple(parse_size_list(args.profile_sizes)) if args.profile_sizes else None,
                         profile_row_s=args.profile_row_seconds)

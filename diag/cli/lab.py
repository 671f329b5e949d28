"""Cluster in a box: network namespaces h0..hN-1 behind a bridge, each host link shaped both ways.

examples:
  diag lab up --hosts 2 --rate 1gbit [--queue-limit BYTES] [--delay 100us] [--loss 0.1%] [--mtu 1500]
  diag lab up --hosts 3 --rate 200mbit --fault h2:rate=100mbit --fault "h1:rx-queue=16K,cc=reno"
  diag lab up --hosts 3 --rate 200mbit --scenario slow-nic      (or --scenario FILE.toml / FILE.json)
  diag lab status [--measure] [--ring 2,3,4]
  diag lab exec h0 -- ip addr
  diag lab down            (also cleans up after a crashed or killed `up`)

Each host is a namespace with eth0 = 10.77.0.(i+1)/24; tbf on the host's eth0 shapes what it sends and
tbf on its switch port shapes what it receives, so every host has a full-duplex NIC of --rate.
One host can differ (--fault): its rate, queues, MTU, TCP sysctls or CPU share (docs/lab.md, "Per-host
faults"). See docs/lab.md for what the rate means in TCP goodput and which tbf burst is used.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="lab_command", metavar="ACTION")

    up = actions.add_parser("up", help="create (or keep) a lab of N shaped hosts")
    _add_name(up)
    up.add_argument("--hosts", type=int, default=2, help="number of hosts h0..hN-1 (default 2)")
    up.add_argument("--rate", default="1gbit", help="each host's NIC rate per direction, tc units (default 1gbit)")
    up.add_argument("--queue-limit", metavar="BYTES", default=None,
                    help="switch-port (host RX) tbf queue before tail drops (default: 5 ms of the rate, >= 64K); "
                         "the host TX queue is a NIC's 1000 frames")
    up.add_argument("--burst", metavar="BYTES", default=None,
                    help="tbf bucket (default: 100 us of the rate, >= 8 frames; see docs/lab.md)")
    up.add_argument("--delay", default=None, help="one-way delay between hosts, e.g. 100us (needs netem)")
    up.add_argument("--loss", default=None, help="packet loss per path, e.g. 0.1%% (needs netem)")
    up.add_argument("--mtu", type=int, default=1500, help="IP MTU of every link (default 1500)")
    up.add_argument("--offloads", action="store_true",
                    help="keep TSO/GSO/GRO on (default off, so the wire carries MTU-sized frames)")
    up.add_argument("--fault", metavar="HOST:KEY=VALUE[,...]", action="append", default=[],
                    help="give one host its own settings (repeatable): rate=100mbit|25%%, rx-queue=BYTES, "
                         "tx-queue=BYTES, mtu=N, \"tcp_rmem=MIN DEF MAX\" (or MIN/DEF/MAX), tcp_wmem=..., "
                         "cc=ALGORITHM (e.g. reno), slow_start_after_idle=0|1, cpu=0.3 (CPUs of time); e.g. "
                         "h2:rate=100mbit,mtu=9000; HOST 'all' sets it on every host under each host's own, e.g. "
                         "all:cc=reno (docs/lab.md, \"Per-host faults\")")
    up.add_argument("--scenario", metavar="FILE|NAME", default=None,
                    help="faults from a scenario file (.json, or .toml on Python 3.11+) or a built-in scenario "
                         "(slow-nic, shallow-buffer, small-windows, jumbo-host, slow-cpu); --fault keys override "
                         "its keys")
    up.add_argument("--json", action="store_true", help="print the lab as JSON")

    down = actions.add_parser("down", help="remove a lab: namespaces, links, qdiscs, state")
    _add_name(down)
    down.add_argument("--all", action="store_true", help="remove every diag lab on this machine")

    status = actions.add_parser("status", help="hosts, addresses, qdiscs; --measure for real rates")
    _add_name(status)
    status.add_argument("--measure", action="store_true", help="measure single-stream and bidirectional goodput")
    status.add_argument("--seconds", type=float, default=2.0,
                        help="length of each measurement, whole seconds 1..60 (default 2)")
    status.add_argument("--between", nargs=2, default=["h0", "h1"], metavar=("A", "B"),
                        help="hosts to measure between (default h0 h1)")
    status.add_argument("--tool", choices=["auto", "socket", "iperf3"], default="auto",
                        help="auto: diag's own sockets, plus iperf3 when installed")
    status.add_argument("--ring", metavar="N[,N...]", default=None,
                        help="also measure the ring pattern with iperf3 for these host counts: h(i) -> h((i+1)%%N), "
                             "one flow per edge, all at once (--seconds each); e.g. 2,3,4")
    status.add_argument("--json", action="store_true", help="print status as JSON")

    run_in = actions.add_parser("exec", help="run a command on a lab host: diag lab exec h0 -- CMD")
    _add_name(run_in)
    run_in.add_argument("host", help="h0, 0 or an address")
    run_in.add_argument("argv", nargs=argparse.REMAINDER, help="-- command and arguments")


def _add_name(parser: argparse.ArgumentParser) -> None:
    from diag.lab.config import DEFAULT_NAME  # the naming rule's home; no torch, a few ms

    parser.add_argument("--name", default=DEFAULT_NAME, help=f"lab name (default {DEFAULT_NAME})")


def run(args: argparse.Namespace) -> int:
    handlers = {"up": _up, "down": _down, "status": _status, "exec": _exec}
    handler = handlers.get(args.lab_command or "")
    if handler is None:
        print("usage: diag lab {up,down,status,exec} ...  (diag lab --help)", file=sys.stderr)
        return 2
    return handler(args)


def _up(args: argparse.Namespace) -> int:
    from diag.lab import LabConfig, bring_up
    from diag.units import parse_size

    config = LabConfig(
        name=args.name,
        hosts=args.hosts,
        rate=args.rate,
        queue_limit_bytes=parse_size(args.queue_limit) if args.queue_limit is not None else None,
        burst_bytes=parse_size(args.burst) if args.burst is not None else None,
        delay=args.delay,
        loss=args.loss,
        mtu=args.mtu,
        offloads=args.offloads,
    ).with_faults(args.fault, args.scenario)
    lab = bring_up(config)
    if args.json:
        print(json.dumps(lab.to_json(), indent=1))
    else:
        from diag.lab.status import format_lab

        print(format_lab(lab))
    return 0


def _down(args: argparse.Namespace) -> int:
    from diag.lab import remove_lab
    from diag.lab.status import lab_names_present

    names = lab_names_present() if args.all else [args.name]
    for name in names:
        removed = remove_lab(name)
        if removed:
            print(f"lab {name}: removed {len(removed)} namespaces ({', '.join(removed)})")
        else:
            print(f"lab {name}: nothing to remove")
    if not names:
        print("no diag labs found")
    return 0


def _status(args: argparse.Namespace) -> int:
    from diag.errors import DiagError
    from diag.lab import load_lab
    from diag.lab.netns import require_privilege
    from diag.lab.status import format_status, lab_names_present, status_report

    try:
        lab = load_lab(args.name)
    except DiagError as exc:
        others = [name for name in lab_names_present() if name != args.name]
        hint = f" (labs present: {', '.join(others)}; use --name)" if others else ""
        raise DiagError(f"{exc}{hint}") from exc
    require_privilege("diag lab status")
    ring_sizes = _ring_sizes(args.ring, len(lab.hosts)) if args.ring else []
    if args.measure or ring_sizes:
        from diag import validate

        validate.seconds(args.seconds, "--seconds", maximum=60)
        if not float(args.seconds).is_integer() or args.seconds < 1:
            raise DiagError(f"--seconds takes whole seconds in 1..60 (the probe's flows run whole seconds, as "
                            f"iperf3 -t does), not {args.seconds:g}")
    report = status_report(lab, args.measure, args.tool, tuple(args.between), args.seconds, ring_sizes)
    print(json.dumps(report, indent=1) if args.json else format_status(lab, report, args.tool))
    return 0


def _ring_sizes(text: str, hosts: int) -> list[int]:
    from diag.errors import DiagError

    try:
        sizes = [int(part) for part in text.split(",") if part.strip()]
    except ValueError as exc:
        raise DiagError(f"--ring takes host counts like 2,3,4, not {text!r}") from exc
    bad = [n for n in sizes if not 2 <= n <= hosts]
    if bad or not sizes:
        raise DiagError(f"--ring host counts must lie in 2..{hosts} (this lab's hosts); got {text!r}")
    return sizes


def _exec(args: argparse.Namespace) -> int:
    from diag.errors import DiagError
    from diag.lab import load_lab
    from diag.lab.netns import require_privilege

    argv = list(args.argv)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        raise DiagError("give a command after the host: diag lab exec h0 -- ip addr")
    lab = load_lab(args.name)
    host = lab.host(args.host)
    require_privilege("diag lab exec")
    if shutil.which(argv[0]) is None and "/" not in argv[0]:
        raise DiagError(f"command {argv[0]!r} was not found")
    sys.stdout.flush()
    prefix = lab.exec_prefix(host)     # ip netns exec, after joining the host's CPU cgroup where it has one
    os.execvp(prefix[0], [*prefix, *argv])
    return 127  # not reached: execvp replaces this process

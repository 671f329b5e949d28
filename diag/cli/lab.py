"""Cluster in a box: network namespaces h0..hN-1 behind a bridge, each host link shaped both ways.

  diag lab up --hosts 2 --rate 1gbit [--queue-limit BYTES] [--delay 100us] [--loss 0.1%] [--mtu 1500]
  diag lab status [--measure] [--ring 2,3,4]
  diag lab exec h0 -- ip addr
  diag lab down            (also cleans up after a crashed or killed `up`)

Each host is a namespace with eth0 = 10.77.0.(i+1)/24; tbf on the host's eth0 shapes what it sends and
tbf on its switch port shapes what it receives, so every host has a full-duplex NIC of --rate.
See docs/lab.md for what the rate means in TCP goodput and which tbf burst is used.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
from typing import Any

DEFAULT_NAME = "diag"


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
    up.add_argument("--json", action="store_true", help="print the lab as JSON")

    down = actions.add_parser("down", help="remove a lab: namespaces, links, qdiscs, state")
    _add_name(down)
    down.add_argument("--all", action="store_true", help="remove every diag lab on this machine")

    status = actions.add_parser("status", help="hosts, addresses, qdiscs; --measure for real rates")
    _add_name(status)
    status.add_argument("--measure", action="store_true", help="measure single-stream and bidirectional goodput")
    status.add_argument("--seconds", type=float, default=2.0, help="length of each measurement (default 2)")
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
    )
    lab = bring_up(config)
    if args.json:
        print(json.dumps(lab.to_json(), indent=1))
    else:
        _print_lab(lab)
    return 0


def _down(args: argparse.Namespace) -> int:
    from diag.lab import remove_lab

    names = _all_lab_names() if args.all else [args.name]
    for name in names:
        removed = remove_lab(name)
        if removed:
            print(f"lab {name}: removed {len(removed)} namespaces ({', '.join(removed)})")
        else:
            print(f"lab {name}: nothing to remove")
    if not names:
        print("no diag labs found")
    return 0


def _all_lab_names() -> list[str]:
    from diag.lab.netns import list_netns
    from diag.lab.state import known_lab_names

    pattern = re.compile(r"^diag-([a-z0-9_]+)-(?:sw|h\d+)$")
    found = {match.group(1) for ns in list_netns() if (match := pattern.match(ns))}
    return sorted(found | set(known_lab_names()))


def _status(args: argparse.Namespace) -> int:
    from diag.errors import DiagError
    from diag.lab import load_lab, measure_link, measure_ring_pattern
    from diag.lab.measure import iperf3_available
    from diag.lab.netns import require_privilege

    try:
        lab = load_lab(args.name)
    except DiagError as exc:
        others = [name for name in _all_lab_names() if name != args.name]
        hint = f" (labs present: {', '.join(others)}; use --name)" if others else ""
        raise DiagError(f"{exc}{hint}") from exc
    require_privilege("diag lab status")
    ring_sizes = _ring_sizes(args.ring, len(lab.hosts)) if args.ring else []
    report: dict[str, Any] = {"lab": lab.to_json(), "links": _links(lab), "measurements": [], "ring_pattern": []}
    if args.measure:
        from diag import validate

        validate.seconds(args.seconds, "--seconds", maximum=3600)
        tools = {"auto": ["socket", *(["iperf3"] if iperf3_available() else [])],
                 "socket": ["socket"], "iperf3": ["iperf3"]}[args.tool]
        a, b = (lab.host(which) for which in args.between)
        for tool in tools:
            result = measure_link(lab, a.index, b.index, seconds=args.seconds, tool=tool)
            report["measurements"].append({"a": a.name, "b": b.name, **result.to_json()})
    for world_size in ring_sizes:
        report["ring_pattern"].append(measure_ring_pattern(lab, world_size, seconds=args.seconds).to_json())
    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    _print_lab(lab, report["links"])
    for measured in report["measurements"]:
        _print_measurement(lab, measured)
    for pattern in report["ring_pattern"]:
        _print_ring_pattern(lab, pattern)
    if args.measure and "iperf3" not in [m["tool"] for m in report["measurements"]] and args.tool == "auto":
        print("  (iperf3 not installed: measured with diag's own sockets only)")
    return 0


def _links(lab: Any) -> list[dict[str, Any]]:
    from diag.lab.shaping import read_qdiscs

    links = []
    for host in lab.hosts:
        links.append({
            "host": host.name,
            "tx": [q.to_json() for q in read_qdiscs(host.netns, host.iface)],
            "rx": [q.to_json() for q in read_qdiscs(lab.switch_netns, host.switch_port)],
        })
    return links


def _print_lab(lab: Any, links: list[dict[str, Any]] | None = None) -> None:
    from diag.units import human_bits, human_bytes, human_rate

    config = lab.config
    extras = [f"mtu {config.mtu}", f"burst {lab.burst_bytes} B", f"switch queue {human_bytes(lab.queue_limit_bytes)}",
              "offloads " + ("on" if config.offloads else "off")]
    if config.delay:
        extras.append(f"delay {config.delay}")
    if config.loss:
        extras.append(f"loss {config.loss}")
    print(f"lab {lab.name}: {len(lab.hosts)} hosts, {human_bits(lab.rate_bps)} full duplex per host "
          f"(TCP goodput at most {human_rate(lab.expected_goodput_Bps)} each way), {', '.join(extras)}")
    by_host = {link["host"]: link for link in links or []}
    for host in lab.hosts:
        line = f"  {host.name:<4} {host.address + '/' + str(host.prefix_len):<15} {host.iface} in {host.netns}"
        link = by_host.get(host.name)
        if link is not None:
            line += f"   tx: {_qdisc_text(link['tx'])}   rx: {_qdisc_text(link['rx'])}"
        print(line)
    print(f"  run a command on a host: diag lab exec{_name_flag(lab.name)} h0 -- CMD ; "
          f"remove: diag lab down{_name_flag(lab.name)}")


def _qdisc_text(qdiscs: list[dict[str, Any]]) -> str:
    from diag.units import human_bits

    if not qdiscs:
        return "NONE (unshaped!)"
    parts = []
    for q in qdiscs:
        text = q["kind"]
        if q.get("rate_bps"):
            text += f" {human_bits(q['rate_bps'])} burst {q.get('burst_bytes')}"
        if q.get("kind") == "netem":
            text += " " + " ".join(f"{k}={v}" for k, v in q["options"].items() if k in ("delay", "loss", "limit"))
        if q.get("drops"):
            text += f" drops {q['drops']}"
        parts.append(text)
    return " > ".join(parts)


def _print_measurement(lab: Any, measured: dict[str, Any]) -> None:
    from diag.units import human_bits

    expected = lab.expected_goodput_Bps
    single = measured["single_stream_Bps"]
    forward, backward = measured["bidir_Bps"]
    print(f"  measured with {measured['tool']} ({measured['seconds']:g} s each), TCP goodput:")
    print(f"    {measured['a']} -> {measured['b']} alone:  {human_bits(single * 8)} "
          f"({100 * single / expected:.1f}% of the {human_bits(expected * 8)} bound)")
    print(f"    both ways at once:  {measured['a']} -> {measured['b']} {human_bits(forward * 8)} "
          f"({100 * forward / expected:.1f}%), {measured['b']} -> {measured['a']} {human_bits(backward * 8)} "
          f"({100 * backward / expected:.1f}%)  (ACKs share each direction: ~3% less is expected)")


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


def _print_ring_pattern(lab: Any, pattern: dict[str, Any]) -> None:
    from diag.units import human_bits

    expected = lab.expected_goodput_Bps
    flows = ", ".join(f"{flow['sender']}->{flow['receiver']} {human_bits(flow['goodput_Bps'] * 8)}"
                      for flow in pattern["flows"])
    print(f"  ring of {pattern['world_size']} with {pattern['tool']} ({pattern['seconds']:g} s, every edge at once): "
          f"mean {human_bits(pattern['mean_edge_Bps'] * 8)} per edge ({100 * pattern['mean_edge_Bps'] / expected:.1f}% "
          f"of the bound), slowest {human_bits(pattern['min_edge_Bps'] * 8)}: {flows}")


def _name_flag(name: str) -> str:
    return "" if name == DEFAULT_NAME else f" --name {name}"


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
    os.execvp("ip", [*lab.exec_prefix(host), *argv])
    return 127  # not reached: execvp replaces this process

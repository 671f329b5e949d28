"""Capture TCP traffic with tcpdump (scapy's sniffer when tcpdump is missing) for a while or until Ctrl-C.

Writes PCAP and PCAP.capture.json (interface, snaplen, filter, start/stop, the kernel's dropped-packet count).

examples:
  diag capture -i lo -w lo.pcap --duration 10
  diag capture -i eth0 -w node.pcap -f 'tcp port 29500' -s 96
"""

from __future__ import annotations

import argparse
import sys
import time


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-i", "--iface", default="any", help="interface (default: any)")
    parser.add_argument("-w", "--write", dest="path", required=True, metavar="PCAP", help="output file")
    parser.add_argument("-s", "--snaplen", type=int, default=128, help="bytes kept per packet (default 128)")
    parser.add_argument("-f", "--filter", default="tcp", help="BPF filter (default: tcp)")
    parser.add_argument("--netns", help="capture inside this network namespace")
    parser.add_argument("--duration", type=float, help="stop after this many seconds (default: until Ctrl-C)")
    parser.add_argument("--tool", choices=["tcpdump", "scapy"], help="force the capture tool")


def run(args: argparse.Namespace) -> int:
    from diag import validate
    from diag.capture.live import start_capture

    if args.duration is not None:
        validate.seconds(args.duration, "--duration")
    handle = start_capture(args.path, args.iface, args.filter, args.snaplen, args.netns, tool=args.tool)
    print(f"capturing on {args.iface} -> {args.path} (Ctrl-C to stop)", file=sys.stderr)
    try:
        deadline = time.monotonic() + args.duration if args.duration else None
        while deadline is None or time.monotonic() < deadline:
            time.sleep(0.1 if deadline is None else max(0.0, min(0.1, deadline - time.monotonic())))
    except KeyboardInterrupt:
        pass
    finally:
        info = handle.stop()
    dropped = "unknown" if info.kernel_dropped is None else info.kernel_dropped
    print(f"{info.packets} packets captured, kernel dropped {dropped}; wrote {info.path}", file=sys.stderr)
    return 0

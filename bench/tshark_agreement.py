"""diag against tshark on a directory of captures: per file, the TCP packets and payload bytes of every
direction (source ip:port -> destination ip:port), as `diag analyze --json` and `tshark -Y tcp` count them.

    python -m bench.tshark_agreement DIR [--jobs 2] [--match PATTERN] [--show N]

Made for the tcpdump project's own test captures (its tests/ directory: hundreds of pcap/pcapng files of
every protocol, tunnels, super-segments, truncated and corrupt records), but any directory works. For each
file: diag's analysis (a one-line error counts as "diag error"), then tshark's fields (the innermost IP
addresses, so tunnelled TCP is keyed by its inner endpoints, and tcp.len); the file agrees when both see the
same directions with the same packets and payload. Files without TCP in either are counted apart. Prints a
summary, the files that differ (with the first directions that differ) and those where diag failed. tshark's
TCP inside ICMP errors (the quoted header of a destination unreachable) is TCP to tshark and not to diag;
such files differ by design and are listed with the reason.
"""

from __future__ import annotations

import argparse
import fnmatch
import os
import subprocess
import sys
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

TSHARK_FIELDS = ("frame.protocols", "ip.src", "ipv6.src", "tcp.srcport", "ip.dst", "ipv6.dst", "tcp.dstport",
                 "tcp.len")
Directions = dict[tuple[str, str], tuple[int, int]]   # (src, dst) -> (packets, payload bytes)


@dataclass
class Outcome:
    path: Path
    diag: Directions | None = None
    tshark: Directions | None = None
    error: str | None = None        # diag's one-line error
    tshark_error: str | None = None
    in_icmp: int = 0                # TCP headers tshark found quoted inside ICMP errors
    differences: list[str] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        if self.tshark_error is not None:
            return "tshark error"
        if self.error is not None:
            return "diag error" if self.tshark else "diag error, no TCP in tshark"
        if not self.diag and not self.tshark:
            return "no TCP"
        return "agrees" if not self.differences else ("differs (TCP in ICMP)" if self.in_icmp else "differs")


def endpoint(address: str, port: str) -> str:
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def tshark_directions(path: Path) -> tuple[Directions, int]:
    """tshark's TCP directions (innermost addresses) and how many TCP headers sat inside ICMP errors."""
    command = ["tshark", "-n", "-r", str(path), "-Y", "tcp", "-T", "fields", "-E", "separator=|",
               "-E", "occurrence=a", "-E", "aggregator=,"]
    for name in TSHARK_FIELDS:
        command += ["-e", name]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    if proc.returncode != 0 and not proc.stdout:
        raise RuntimeError((proc.stderr.strip().splitlines() or ["tshark failed"])[-1])
    out: dict[tuple[str, str], list[int]] = {}
    in_icmp = 0
    for line in proc.stdout.splitlines():
        protocols, src4, src6, sport, dst4, dst6, dport, length = (line.split("|") + [""] * 8)[:8]
        layers = protocols.split(":")
        if "tcp" not in layers:
            continue
        below = layers[:layers.index("tcp")]  # the IP header that carries the (first) TCP header
        if "icmp" in below or "icmpv6" in below:
            in_icmp += 1
            continue
        network = next((name for name in reversed(below) if name in ("ip", "ipv6")), None)
        if network is None:
            continue
        nth = below.count(network) - 1
        src_list, dst_list = (src4, dst4) if network == "ip" else (src6, dst6)
        first = [value.split(",")[0] for value in (sport, dport, length)]
        try:
            src, dst = src_list.split(",")[nth], dst_list.split(",")[nth]
        except IndexError:
            continue
        sport, dport, length = first
        if not sport or not dport:
            continue
        key = (endpoint(src, sport), endpoint(dst, dport))
        entry = out.setdefault(key, [0, 0])
        entry[0] += 1
        entry[1] += int(length or 0)
    return {key: (p, b) for key, (p, b) in out.items()}, in_icmp


def diag_directions(path: Path) -> Directions:
    from diag.capture.analysis import analyze_files

    result = analyze_files([path], with_series=False)
    out: Directions = {}
    for conn in result["connections"]:
        for name, src, dst in (("a->b", conn["a"], conn["b"]), ("b->a", conn["b"], conn["a"])):
            direction = conn["directions"][name]
            if direction["packets"]:
                out[(src, dst)] = (direction["packets"], direction["payload_bytes"])
    return out


def compare(path: Path) -> Outcome:
    from diag.errors import DiagError

    outcome = Outcome(path)
    try:
        outcome.tshark, outcome.in_icmp = tshark_directions(path)
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        outcome.tshark_error = str(exc)
    try:
        outcome.diag = diag_directions(path)
    except DiagError as exc:
        outcome.error = str(exc)
    if outcome.diag is not None and outcome.tshark is not None:
        for key in sorted(set(outcome.diag) | set(outcome.tshark)):
            ours, theirs = outcome.diag.get(key, (0, 0)), outcome.tshark.get(key, (0, 0))
            if ours != theirs:
                outcome.differences.append(f"{key[0]} -> {key[1]}: diag {ours[0]} packets {ours[1]} bytes, "
                                           f"tshark {theirs[0]} packets {theirs[1]} bytes")
    return outcome


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.tshark_agreement",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", type=Path, help="a directory of captures (searched recursively)")
    parser.add_argument("--match", default="*", help="only file names matching this glob (default *)")
    parser.add_argument("--jobs", type=int, default=2, help="files compared at once (default 2)")
    parser.add_argument("--show", type=int, default=3, help="differing directions listed per file (default 3)")
    args = parser.parse_args(argv)
    files = sorted(p for p in args.directory.rglob("*") if p.is_file()
                   and p.name.endswith((".pcap", ".pcapng", ".cap", ".pcap.gz", ".pcapng.gz"))
                   and fnmatch.fnmatch(p.name, args.match))
    if not files:
        print(f"no capture files under {args.directory}", file=sys.stderr)
        return 1
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        outcomes = list(pool.map(compare, files))
    tally = Counter(outcome.verdict for outcome in outcomes)
    with_tcp = sum(1 for o in outcomes if o.tshark or o.diag)
    print(f"{len(files)} files, {with_tcp} with TCP (diag or tshark); load average {os.getloadavg()[0]:.2f}")
    for verdict, count in sorted(tally.items()):
        print(f"  {verdict}: {count}")
    for outcome in outcomes:
        if outcome.verdict.startswith("differs") or outcome.verdict == "diag error":
            print(f"{outcome.path.name}: {outcome.verdict}"
                  + (f" ({outcome.in_icmp} TCP headers inside ICMP)" if outcome.in_icmp else ""))
            for line in outcome.differences[:args.show] or [outcome.error or ""]:
                print(f"    {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

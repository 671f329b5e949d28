"""The in-place probe on the lab, started as an operator starts a job: one rank per lab host, each started by
hand inside its namespace (`ip netns exec`), gloo by env://, ``python -m diag.probe.driver`` (needs root).

    python -m bench.probe_matrix [--name NAME] [--hosts 4] [--rate 100mbit] [--burst 50000]
                                      [--seconds 1] [--tools iperf3,socket] [--slow h2:50mbit]

Brings up a lab (always torn down), measures the link matrix with each tool in one launch and prints every
edge in MB/s and as a share of what its slower host lets through (alone: the one-way goodput bound; both ways: the ACK-sharing
ceiling, docs/lab.md), and the matrix's wall time against the time its phases measure. ``--slow HOST:RATE``
lowers one host's NIC first (tc qdisc change on both its tbfs). The tests start the probe with
:func:`launch_probe` too (tests/test_probe.py).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from diag.lab import Lab, LabConfig, lab_session
from diag.lab.config import ETH_HEADER_BYTES, ETH_WIRE_OVERHEAD_BYTES, TCP_IP_HEADER_BYTES
from diag.lab.shaping import tbf_line
from diag.lifeline import CHILD_CWD, child_env, python_command

FIRST_MASTER_PORT = 29400      # inside the lab's private namespaces; one per launch, so no TIME_WAIT clash
_master_ports = itertools.count(FIRST_MASTER_PORT)


@dataclass
class ProbeLaunch:
    """What one launch left: rank 0's document (diag.probe.driver's JSON), each rank's exit and stderr."""

    document: dict[str, Any]
    returncodes: list[int]
    stderr: list[str]
    wall_s: float

    @property
    def steps(self) -> dict[str, dict[str, Any]]:
        return {step["step"]: step for step in self.document["steps"]}


def launch_probe(lab: Lab, steps: Sequence[str], out_dir: Path, *, seconds: int = 1, tool: str = "auto",
                 path_of: Mapping[str, str] | None = None, group_timeout_s: float = 60,
                 timeout_s: float = 300) -> ProbeLaunch:
    """One ``python -m diag.probe.driver`` per lab host inside its namespace, rank i on host i, all waited
    for; whatever is left is killed on any exit. ``path_of``: a PATH for some hosts (without iperf3, or a
    fake one)."""
    port = str(next(_master_ports))
    out = out_dir / f"probe-{port}.json"
    ip = shutil.which("ip") or "ip"   # absolute: a host's PATH may be a bare directory
    logs = [out_dir / f"probe-{port}-rank{rank}.err" for rank in range(len(lab.hosts))]
    procs: list[subprocess.Popen[str]] = []
    started = time.monotonic()
    try:
        for rank, host in enumerate(lab.hosts):
            env = child_env({**os.environ, **lab.host_env(host), "RANK": str(rank), "WORLD_SIZE": str(len(lab.hosts)),
                             "MASTER_PORT": port, "DIAG_NODE_NAME": host.name})
            if path_of and host.name in path_of:
                env["PATH"] = path_of[host.name]
            argv = [ip, "netns", "exec", host.netns,
                    *python_command("-m", "diag.probe.driver", "--address", host.address, "--out", str(out),
                                    "--seconds", str(seconds), "--tool", tool, "--timeout", str(group_timeout_s),
                                    *steps)]
            with open(logs[rank], "w", encoding="utf-8") as log:
                procs.append(subprocess.Popen(argv, env=env, cwd=CHILD_CWD, stdout=subprocess.DEVNULL,
                                              stderr=log, text=True))
        deadline = time.monotonic() + timeout_s
        returncodes = [proc.wait(max(1.0, deadline - time.monotonic())) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    wall_s = time.monotonic() - started
    stderr = [log.read_text(encoding="utf-8") for log in logs]
    if not out.exists():
        raise RuntimeError(f"rank 0 wrote no results; the ranks said: {[text[-500:] for text in stderr]}")
    return ProbeLaunch(json.loads(out.read_text(encoding="utf-8")), returncodes, stderr, wall_s)


def ack_sharing_ceiling_Bps(config: LabConfig) -> float:
    """Goodput each way with both directions busy (docs/lab.md): the data of one direction shares its link
    with the other direction's ACKs, one 90-byte wire ACK (headers + the Ethernet overhead) per two
    segments: 1448 / (1538 + 45) of the rate at MTU 1500. (A receiver that ACKs less often lets a flow
    above it, up to the one-way bound, 2.9% higher.)"""
    ack_wire_bytes = TCP_IP_HEADER_BYTES + ETH_HEADER_BYTES + ETH_WIRE_OVERHEAD_BYTES
    payload = config.mtu - TCP_IP_HEADER_BYTES
    return config.rate_bps / 8 * payload / (config.frame_bytes + ack_wire_bytes / 2)


def slow_down(lab: Lab, host_name: str, rate: str) -> LabConfig:
    """Lower one host's NIC both ways: `tc qdisc change` of the tbf on its eth0 (TX) and on its switch port
    (RX), as a slow or misconfigured host would be. The config of that host's new rate."""
    slow = LabConfig(name=lab.name, hosts=len(lab.hosts), rate=rate, burst_bytes=lab.config.burst_bytes)
    host = lab.host(host_name)
    shape = slow.host_shape([h.name for h in lab.hosts].index(host_name))  # the host's link at the new rate
    for netns, iface, host_side in ((host.netns, host.iface, True), (lab.switch_netns, host.switch_port, False)):
        line = tbf_line(iface, shape, host_side=host_side).replace("qdisc replace", "qdisc change", 1)
        subprocess.run(["tc", "-n", netns, *line.split()], check=True, capture_output=True, timeout=20)
    return slow


def edge_shares(matrix: Mapping[str, Any], config_of: Mapping[str, LabConfig]) -> list[tuple[str, float, float]]:
    """(edge, alone / one-way bound, both ways / ACK-sharing ceiling) per edge, each against its slower host."""
    shares = []
    for edge in matrix["edges"]:
        config = min(config_of[edge["src"]], config_of[edge["dst"]], key=lambda c: c.rate_bps)
        shares.append((f"{edge['src']}->{edge['dst']}", edge["alone_Bps"] / config.expected_goodput_Bps,
                       edge["bidir_Bps"] / ack_sharing_ceiling_Bps(config)))
    return shares


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.probe_matrix", description=__doc__.split("\n\n")[0])
    parser.add_argument("--name", default="pbench")
    parser.add_argument("--hosts", type=int, default=4)
    parser.add_argument("--rate", default="100mbit")
    parser.add_argument("--burst", type=int, default=50_000, help="tbf burst bytes (docs/lab.md: steadier under load)")
    parser.add_argument("--seconds", type=int, default=1, help="per phase")
    parser.add_argument("--tools", default="iperf3,socket")
    parser.add_argument("--slow", help="HOST:RATE, e.g. h2:50mbit")
    args = parser.parse_args(argv)
    tools = args.tools.split(",")
    config = LabConfig(name=args.name, hosts=args.hosts, rate=args.rate, burst_bytes=args.burst)
    with lab_session(config) as lab, tempfile.TemporaryDirectory(prefix="diag-probe-bench-") as scratch:
        config_of = {host.name: lab.config for host in lab.hosts}
        if args.slow:
            slow_host, _, slow_rate = args.slow.partition(":")
            config_of[lab.host(slow_host).name] = slow_down(lab, slow_host, slow_rate)
        launch = launch_probe(lab, [f"matrix@{tool}" for tool in tools], Path(scratch), seconds=args.seconds)
        if launch.document["error"]:
            print(f"probe failed: {launch.document['error']}", file=sys.stderr)
            return 1
        previous = 0.0
        for tool in tools:
            step = launch.steps[f"matrix@{tool}"]
            matrix, elapsed = step["matrix"], step["elapsed_s"]
            incast_s = sum(phase["seconds"] for phase in matrix["incast"])
            measured_s = 3 * len(matrix["rounds"]) * args.seconds + incast_s
            print(f"{matrix['tool']}: {len(matrix['rounds'])} rounds x 3 phases of {args.seconds} s and "
                  f"{len(matrix['incast'])} incasts ({incast_s:.0f} s), matrix {elapsed - previous:.1f} s = "
                  f"{(elapsed - previous) / measured_s:.2f}x its phases' time; notes {matrix['notes']}")
            previous = elapsed
            for (edge, alone, both), figures in zip(edge_shares(matrix, config_of), matrix["edges"], strict=True):
                print(f"  {edge:10} alone {figures['alone_Bps'] / 1e6:6.2f} MB/s = {alone:5.3f}   both ways "
                      f"{figures['bidir_Bps'] / 1e6:6.2f} MB/s = {both:5.3f}")
        print(f"launch (torch start, node discovery, both matrices): {launch.wall_s:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

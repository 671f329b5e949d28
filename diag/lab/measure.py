"""Measure what the lab carries, through the network probe (diag/probe): a link (one TCP stream, then both
directions at once, one connection each way), flows at once (e.g. an incast), and the ring pattern per N.

The lab is measured from outside its namespaces the way the in-place job measures its nodes: one probe rank
per host involved, here a thread of this process that joined that host's namespace (diag/probe/threads.py),
with the probe's tools started on the host as `diag lab exec` starts a command (its namespace and cgroup).
So a link reads the same whether the lab status or the job measured it: the goodput its receiver got after
the warm-up (diag/goodput.py), with diag's own streams or iperf3.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from diag.errors import DiagError
from diag.goodput import GRACE_S, EdgeFlow, RingPatternMeasurement, iperf3_available
from diag.lab.netns import enter_netns
from diag.lab.topology import Lab, LabHost

__all__ = ["EdgeFlow", "LinkMeasurement", "RingPatternMeasurement", "iperf3_available", "measure_flows",
           "measure_link", "measure_ring_pattern"]

T = TypeVar("T")
# The probe's own exchanges besides the flows (opening, connecting, the tools' start and exit), at most.
PROBE_OVERHEAD_S = 4 * GRACE_S


@dataclass(frozen=True)
class LinkMeasurement:
    """Goodput (TCP payload bytes/s) between two lab hosts."""

    single_stream_Bps: float            # a -> b alone
    bidir_Bps: tuple[float, float]      # (a -> b, b -> a) at the same time
    tool: str                           # "diag-socket" or "iperf3"
    seconds: float = 0.0

    def to_json(self) -> dict[str, object]:
        return {"single_stream_Bps": self.single_stream_Bps, "bidir_Bps": list(self.bidir_Bps),
                "tool": self.tool, "seconds": self.seconds}


def on_hosts(lab: Lab, hosts: Sequence[LabHost], body: Callable[[Any, list[Any]], T], seconds: float,
             measurements: int = 1) -> T:
    """body(coordinator, nodes) run by one probe rank per host (rank i leads hosts[i], inside its namespace);
    rank 0's result. body runs that many probe measurements of `seconds` each (this bounds the wait)."""
    from diag.probe import ProbeNode
    from diag.probe.threads import run_ranks

    nodes = [ProbeNode(host.name, host.address, rank, tuple(lab.exec_prefix(host))) for rank, host in enumerate(hosts)]
    results = run_ranks(len(hosts), lambda coord: body(coord, nodes), measurements * (seconds + PROBE_OVERHEAD_S),
                        setup=lambda rank: enter_netns(hosts[rank].netns))
    return results[0]


def _hosts(lab: Lab, names: Sequence[LabHost | int | str]) -> list[LabHost]:
    """The distinct hosts named, in the order first named."""
    hosts: list[LabHost] = []
    for name in names:
        host = lab.host(name)
        if host not in hosts:
            hosts.append(host)
    return hosts


def measure_link(lab: Lab, a: int = 0, b: int = 1, seconds: float = 2.0, tool: str = "socket") -> LinkMeasurement:
    """Single-stream a->b, then a->b and b->a together, `seconds` (whole, 1..60) each; tool: socket (diag's own
    streams) or iperf3."""
    from diag.probe import measure_flows as probe_flows

    host_a, host_b = lab.host(a), lab.host(b)
    if host_a == host_b:
        raise DiagError("measure between two different hosts, e.g. h0 and h1")
    if tool not in ("socket", "iperf3"):
        raise DiagError(f"unknown measurement tool {tool!r}: use socket or iperf3")
    if tool == "iperf3" and not iperf3_available():
        raise DiagError("iperf3 is not installed; use the built-in measurement (--tool socket) or apt-get install iperf3")
    forward, backward = (host_a.name, host_b.name), (host_b.name, host_a.name)

    def body(coord: Any, nodes: list[Any]) -> tuple[Any, Any]:
        return (probe_flows(coord, nodes, [forward], seconds, tool),
                probe_flows(coord, nodes, [forward, backward], seconds, tool))

    (alone,), (both_forward, both_backward) = on_hosts(lab, [host_a, host_b], body, seconds, measurements=2)
    return LinkMeasurement(single_stream_Bps=alone.goodput_Bps,
                           bidir_Bps=(both_forward.goodput_Bps, both_backward.goodput_Bps), tool=alone.tool,
                           seconds=float(seconds))


def measure_flows(lab: Lab, pairs: list[tuple[LabHost | int | str, LabHost | int | str]],
                  seconds: float = 2.0, tool: str = "socket") -> list[float]:
    """Goodput of one TCP connection per (sender, receiver) pair, all at once (e.g. incast: two senders into
    one host), `seconds` (whole); in the order of pairs."""
    from diag.probe import measure_flows as probe_flows

    resolved = [(lab.host(sender), lab.host(receiver)) for sender, receiver in pairs]
    if not resolved or any(sender == receiver for sender, receiver in resolved):
        raise DiagError("measure between pairs of two different hosts, e.g. (h0, h1)")
    flows = [(sender.name, receiver.name) for sender, receiver in resolved]
    results = on_hosts(lab, _hosts(lab, [host for pair in resolved for host in pair]),
                       lambda coord, nodes: probe_flows(coord, nodes, flows, seconds, tool), seconds)
    return [result.goodput_Bps for result in results]


def measure_ring_pattern(lab: Lab, world_size: int, seconds: float = 3.0) -> RingPatternMeasurement:
    """One iperf3 flow per ring edge of hosts h0..h(N-1), all edges at once, `seconds` (whole) each: what the
    machine carries in a ring collective's own flow pattern (the reference for "what this machine can push
    through N flows at once": one Python process driving N flows would measure Python, not the machine)."""
    from diag.probe.ring import measure_ring_pattern as probe_ring

    if not 2 <= world_size <= len(lab.hosts):
        raise DiagError(f"a ring of {world_size} hosts needs 2..{len(lab.hosts)} (the lab has {len(lab.hosts)} hosts)")
    if not iperf3_available():
        raise DiagError("iperf3 is not installed; the ring pattern needs it (apt-get install iperf3)")
    hosts = [lab.host(index) for index in range(world_size)]
    return on_hosts(lab, hosts, lambda coord, nodes: probe_ring(coord, nodes, seconds, "iperf3"), seconds)

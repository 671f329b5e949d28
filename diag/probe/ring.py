"""The ring pattern in place: node i -> node (i+1) % N, every edge at once (run.json
``link.ring_pattern[N]``): what the job's hosts carry in a ring collective's own flow pattern."""

from __future__ import annotations

from collections.abc import Sequence

from diag.errors import DiagError
from diag.goodput import EdgeFlow, RingPatternMeasurement
from diag.probe.coordinator import Coordinator
from diag.probe.flows import Flow, ProbeNode, check_nodes, check_seconds, choose_tool, run_flows


def ring_flows(names: Sequence[str]) -> list[Flow]:
    return [Flow(names[index], names[(index + 1) % len(names)]) for index in range(len(names))]


def measure_ring_pattern(coord: Coordinator, ring: Sequence[ProbeNode], seconds: float = 2.0,
                         tool: str = "auto") -> RingPatternMeasurement:
    """One flow per ring edge of ``ring`` (in ring order), all at once. Every rank calls it alike, also the
    ranks of nodes outside the ring (they only take part in the coordination)."""
    check_nodes(ring, coord.world_size)
    if len(ring) < 2:
        raise DiagError(f"a ring pattern needs two or more nodes, got {len(ring)}")
    whole = check_seconds(seconds)
    choice = choose_tool(coord, ring, tool)
    flows = ring_flows([node.name for node in ring])
    results = run_flows(coord, ring, flows, whole, choice.tool, f"ring of {len(ring)}")
    return RingPatternMeasurement(world_size=len(ring),
                                  flows=tuple(EdgeFlow(r.src, r.dst, r.goodput_Bps) for r in results),
                                  tool=choice.label, seconds=float(whole))

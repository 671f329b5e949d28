"""The pairwise link matrix: every ordered pair of nodes, each direction alone and both at once, in rounds
of disjoint pairs (run.json ``link.matrix``, docs/inplace.md).

A round pairs every node with at most one other (the circle method: K nodes take K-1 rounds, odd K takes
K rounds with one node resting in each), so the pairs of a round share no host and run at once: on a
switched network they do not meet, and K=8 takes 7 rounds instead of 56 runs one by one. Each round runs
three phases, every pair of the round at once in each: a -> b, then b -> a (each alone on its pair), then
both directions together, each its own connection (as iperf3 --bidir).

With three or more nodes the rounds are followed by one incast phase per node: every other node sends into
it at once, one connection each. Pairs never converge on a host, so only here does a switch port's buffer
in front of a host decide what is dropped: a shallow one tail-drops several times more of the converging
segments than its peers' ports do (docs/lab.md, "Queue"). The retransmissions counted after the warm-up
(slow start overshoots any buffer) are what loss_at_host compares.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from diag.errors import DiagError
from diag.probe.coordinator import Coordinator
from diag.probe.flows import Flow, FlowResult, ProbeNode, check_nodes, check_seconds, choose_tool, run_flows

PHASES = ("a->b", "b->a", "both")
# An incast phase runs at least this long: at 1 s (0.33 s of it warm-up) two of three reno flows into a 16 KiB
# port sat out the steady window in retransmission timeouts and the port read as losing less than the others;
# at 2 s its steady share was 7.8-8.7% against 0.39-0.57% into the 64 KiB ports (lab 200mbit, three runs).
INCAST_MIN_S = 2
# Every node's incast runs this many times, in rounds (h0..hK, then again): a host is named only where it
# stands out in each. Under bbr every port drops 1-10% of an incast, unevenly (one host read 2.4x the next in
# one run of six), so one round alone could single out a host by chance.
INCAST_ROUNDS = 2

Pair = tuple[str, str]


@dataclass(frozen=True)
class MatrixEdge:
    """src -> dst: alone (its reverse idle) and while dst -> src runs too; with the segments src resent in
    each phase (its kernel's count over the phase; None where it could not be read)."""

    src: str
    dst: str
    alone_Bps: float
    bidir_Bps: float
    alone_retransmits: int | None = None
    bidir_retransmits: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {"src": self.src, "dst": self.dst, "alone_Bps": self.alone_Bps, "bidir_Bps": self.bidir_Bps,
                "alone_retransmits": self.alone_retransmits, "bidir_retransmits": self.bidir_retransmits}


@dataclass(frozen=True)
class IncastFlow:
    """One sender of an incast phase: its goodput at the receiver, and the segments it resent over the whole
    flow and over the steady window after the warm-up."""

    src: str
    goodput_Bps: float
    retransmits: int | None = None
    steady_retransmits: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {"src": self.src, "goodput_Bps": self.goodput_Bps, "retransmits": self.retransmits,
                "steady_retransmits": self.steady_retransmits}


@dataclass(frozen=True)
class Incast:
    """Every other node sending into ``dst`` at once for ``seconds``; ``steady_s`` of it after the warm-up; in
    round ``round`` of the incasts (1, 2, ...)."""

    dst: str
    seconds: float
    steady_s: float | None
    flows: tuple[IncastFlow, ...]
    round: int = 1

    def to_json(self) -> dict[str, Any]:
        return {"dst": self.dst, "round": self.round, "seconds": self.seconds, "steady_s": self.steady_s,
                "flows": [flow.to_json() for flow in self.flows]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Incast:
        steady = data.get("steady_s")
        return cls(str(data["dst"]), float(data["seconds"]), float(steady) if steady is not None else None,
                   tuple(IncastFlow(str(flow["src"]), float(flow["goodput_Bps"]), _count(flow.get("retransmits")),
                                    _count(flow.get("steady_retransmits"))) for flow in data["flows"]),
                   int(data.get("round", 1)))


@dataclass(frozen=True)
class LinkMatrix:
    """Goodput between every ordered pair of nodes; ``rounds`` is the schedule that measured it."""

    tool: str                                   # "iperf3" or "diag-socket"
    seconds: float                              # per phase
    nodes: tuple[str, ...]
    rounds: tuple[tuple[Pair, ...], ...]
    edges: tuple[MatrixEdge, ...]               # every ordered pair, src in node order, then dst
    notes: tuple[str, ...] = ()
    incast: tuple[Incast, ...] = ()             # one per node and round, in node order (three or more nodes)

    def edge(self, src: str, dst: str) -> MatrixEdge:
        for edge in self.edges:
            if (edge.src, edge.dst) == (src, dst):
                return edge
        raise KeyError(f"no edge {src} -> {dst} in the matrix of {', '.join(self.nodes)}")

    def to_json(self) -> dict[str, Any]:
        """run.json's ``link.matrix`` (docs/inplace.md)."""
        return {"tool": self.tool, "seconds": self.seconds, "nodes": list(self.nodes),
                "rounds": [[list(pair) for pair in pairs] for pairs in self.rounds],
                "edges": [edge.to_json() for edge in self.edges], "notes": list(self.notes),
                "incast": [phase.to_json() for phase in self.incast]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LinkMatrix:
        return cls(tool=str(data["tool"]), seconds=float(data["seconds"]), nodes=tuple(data["nodes"]),
                   rounds=tuple(tuple((str(a), str(b)) for a, b in pairs) for pairs in data["rounds"]),
                   edges=tuple(MatrixEdge(str(edge["src"]), str(edge["dst"]), float(edge["alone_Bps"]),
                                          float(edge["bidir_Bps"]), _count(edge.get("alone_retransmits")),
                                          _count(edge.get("bidir_retransmits"))) for edge in data["edges"]),
                   notes=tuple(data.get("notes", ())),
                   incast=tuple(Incast.from_json(phase) for phase in data.get("incast", ())))


def circle_rounds(names: Sequence[str]) -> list[list[Pair]]:
    """Rounds of disjoint pairs that meet every pair exactly once (the circle method of round-robin
    tournaments): the first name stays, the others rotate one seat per round; with an odd count an empty
    seat is added and whoever faces it rests that round."""
    seats: list[str | None] = list(names) + ([None] if len(names) % 2 else [])
    count = len(seats)
    rounds = []
    for _round in range(count - 1):
        pairs = [(seats[i], seats[count - 1 - i]) for i in range(count // 2)]
        rounds.append([(a, b) for a, b in pairs if a is not None and b is not None])
        seats = [seats[0], seats[-1], *seats[1:-1]]
    return rounds


def phase_flows(pairs: Sequence[Pair], phase: str) -> list[Flow]:
    if phase == "a->b":
        return [Flow(a, b) for a, b in pairs]
    if phase == "b->a":
        return [Flow(b, a) for a, b in pairs]
    return [flow for a, b in pairs for flow in (Flow(a, b), Flow(b, a))]


def _count(value: Any) -> int | None:
    return int(value) if isinstance(value, (int, float)) else None


def measure_matrix(coord: Coordinator, nodes: Sequence[ProbeNode], seconds: float = 2.0,
                   tool: str = "auto", incast: bool = True) -> LinkMatrix:
    """Every ordered pair's goodput alone and both ways at once, ``seconds`` per phase, then (``incast``, three
    or more nodes) every node's incast, INCAST_ROUNDS times, max(``seconds``, INCAST_MIN_S) each. Every rank
    calls it alike; the tool is chosen once for the whole matrix (see measure_flows)."""
    check_nodes(nodes, coord.world_size)
    if len(nodes) < 2:
        raise DiagError(f"a link matrix needs two or more nodes, the job has {len(nodes)}")
    whole = check_seconds(seconds)
    choice = choose_tool(coord, nodes, tool)
    names = [node.name for node in nodes]
    rounds = circle_rounds(names)
    alone: dict[Pair, FlowResult] = {}
    both: dict[Pair, FlowResult] = {}
    for number, pairs in enumerate(rounds, 1):
        label = ", ".join(f"{a}<->{b}" for a, b in pairs)
        for phase in PHASES:
            context = f"matrix round {number}/{len(rounds)} ({label}), phase {phase}"
            for result in run_flows(coord, nodes, phase_flows(pairs, phase), whole, choice.tool, context):
                (both if phase == "both" else alone)[(result.src, result.dst)] = result
    converging = _incast_phases(coord, nodes, whole, choice.tool) if incast else ()
    edges = tuple(MatrixEdge(src, dst, alone[(src, dst)].goodput_Bps, both[(src, dst)].goodput_Bps,
                             alone[(src, dst)].retransmits, both[(src, dst)].retransmits)
                  for src in names for dst in names if src != dst)
    return LinkMatrix(tool=choice.label, seconds=float(whole), nodes=tuple(names),
                      rounds=tuple(tuple(pairs) for pairs in rounds), edges=edges,
                      notes=(choice.note,) if choice.note else (), incast=converging)


def measure_incast(coord: Coordinator, nodes: Sequence[ProbeNode], seconds: float = 2.0, tool: str = "auto",
                   rounds: int = INCAST_ROUNDS) -> tuple[Incast, ...]:
    """Every node's incast (every other node sending into it at once), max(``seconds``, INCAST_MIN_S) each, in
    node order, ``rounds`` times; none with fewer than three nodes. Every rank calls it alike."""
    check_nodes(nodes, coord.world_size)
    whole = check_seconds(seconds)
    if not 1 <= rounds <= 10:
        raise DiagError(f"incast rounds must be 1..10, got {rounds}")
    return _incast_phases(coord, nodes, whole, choose_tool(coord, nodes, tool).tool, rounds)


def _incast_phases(coord: Coordinator, nodes: Sequence[ProbeNode], seconds: int, tool: str,
                   rounds: int = INCAST_ROUNDS) -> tuple[Incast, ...]:
    names = [node.name for node in nodes]
    if len(names) < 3:    # with two, the one other node sending in is the matrix's own a -> b
        return ()
    incast_s = max(seconds, INCAST_MIN_S)
    phases = []
    for round_number in range(1, rounds + 1):
        for number, dst in enumerate(names, 1):
            context = f"matrix incast {number}/{len(names)}, round {round_number}/{rounds} (every other node -> {dst})"
            results = run_flows(coord, nodes, [Flow(src, dst) for src in names if src != dst], incast_s, tool,
                                context)
            phases.append(Incast(dst, float(incast_s), results[0].steady_s, tuple(
                IncastFlow(r.src, r.goodput_Bps, r.retransmits, r.steady_retransmits) for r in results),
                round_number))
    return tuple(phases)

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

What it measures is the document diag/linkmatrix.py defines (LinkMatrix: the one definition the report reads).
"""

from __future__ import annotations

from collections.abc import Sequence

from diag.errors import DiagError
from diag.linkmatrix import Incast, IncastFlow, LinkMatrix, MatrixEdge, Pair
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
            phases.append(Incast(dst, round_number, float(incast_s), results[0].steady_s, tuple(
                IncastFlow(r.src, r.goodput_Bps, r.retransmits, r.steady_retransmits) for r in results)))
    return tuple(phases)

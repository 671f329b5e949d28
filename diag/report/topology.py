"""The job's nodes as run.json describes them (docs/inplace.md): typed ``topology`` and ``link.matrix``, and
the lookups that turn an address or a rank into a node's name.

A node is a host as the network sees it (its address on the job's interface, its network namespace, its
boot id); the report names it by ``name`` (h0, h1, ... in the lab). Every lookup here answers None where the
run does not say, never a guess.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class TopologyNode:
    name: str = "?"
    address: str | None = None
    hostname: str | None = None
    netns: str | None = None
    boot_id: str | None = None
    ranks: list[int] = field(default_factory=list)
    leader: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Topology:
    """run.json ``topology``: the nodes, the ranks of each N's subgroup, the N whose ranks share a host."""

    world_size: int | None = None
    iface: str | None = None
    nodes: list[TopologyNode] = field(default_factory=list)
    subgroups: dict[str, list[int]] = field(default_factory=dict)
    shared_hosts: list[int] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    def subgroup(self, world_size: int) -> list[int] | None:
        """The ranks of N's subgroup, in the job's "spread" order; None where run.json does not list it."""
        ranks = self.subgroups.get(str(world_size))
        return list(ranks) if isinstance(ranks, list) else None


@dataclass(frozen=True)
class LinkEdge:
    """One ordered pair of the link matrix: goodput src -> dst alone, and while dst -> src runs too, and the
    segments src resent in each (None: not read, or a run before they were recorded)."""

    src: str = "?"
    dst: str = "?"
    alone_Bps: float | None = None
    bidir_Bps: float | None = None
    alone_retransmits: int | None = None
    bidir_retransmits: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


# Bytes a segment, to turn a probe flow's goodput into the segments it sent (a jumbo sender sends fewer: its
# share of segments resent reads low, never high).
SEGMENT_BYTES = 1448


@dataclass(frozen=True)
class IncastFlow:
    """One sender of an incast phase (every other node into one at once)."""

    src: str = "?"
    goodput_Bps: float | None = None
    retransmits: int | None = None
    steady_retransmits: int | None = None          # after the warm-up: the window of the goodput
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Incast:
    """run.json ``link.matrix.incast[]``: every other node sending into ``dst`` at once, in round ``round``."""

    dst: str = "?"
    round: int = 1
    seconds: float | None = None
    steady_s: float | None = None                   # the window after the warm-up
    flows: list[IncastFlow] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    def resent_share(self) -> float | None:
        """The share of segments its senders resent in the steady window; None where a count is missing or
        nothing was sent."""
        if any(f.steady_retransmits is None for f in self.flows):
            return None
        return steady_resent_share([(self, f) for f in self.flows])


def steady_resent_share(sent_in: Sequence[tuple[Incast, IncastFlow]]) -> float | None:
    """Segments resent after the warm-up over segments sent (goodput x steady seconds / SEGMENT_BYTES), over
    any senders of any incasts (a missing count reads as none); None where nothing was sent."""
    resent = sum(int(f.steady_retransmits or 0) for _phase, f in sent_in)
    sent = sum((f.goodput_Bps or 0) * (phase.steady_s or 0) / SEGMENT_BYTES for phase, f in sent_in)
    return resent / sent if sent > 0 else None


@dataclass(frozen=True)
class LinkMatrix:
    """run.json ``link.matrix``: every ordered pair of nodes, measured in rounds of disjoint pairs."""

    tool: str | None = None
    seconds: float | None = None
    nodes: list[str] = field(default_factory=list)
    rounds: list[Any] = field(default_factory=list)
    edges: list[LinkEdge] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    incast: list[Incast] = field(default_factory=list)     # runs before 2026-12-03 have none
    extra: dict[str, Any] = field(default_factory=dict)

    def incast_rounds(self) -> dict[int, dict[str, Incast]]:
        """round -> dst -> that incast."""
        rounds: dict[int, dict[str, Incast]] = {}
        for phase in self.incast:
            rounds.setdefault(int(phase.round or 1), {})[phase.dst] = phase
        return dict(sorted(rounds.items()))

    def incast_shares(self) -> tuple[dict[tuple[str, str], float], dict[str, float]]:
        """What each node's port delivered while every other node sent into it at once: (src, dst) -> src's share
        of the goodput dst received, and dst -> the goodput it received in all; both the mean over the rounds
        that measured it. TCP flows converging on one port often share it unevenly (one near the link rate, the
        others starved and resending): a column total at the link rate is a port that delivers, whatever the
        shares; one below it is a port that drops what converges on it."""
        into: dict[str, list[float]] = {}
        by_pair: dict[tuple[str, str], list[float]] = {}
        for phase in self.incast:
            rates = [(f.src, float(f.goodput_Bps)) for f in phase.flows if isinstance(f.goodput_Bps, (int, float))]
            total = sum(rate for _src, rate in rates)
            if total <= 0:
                continue
            into.setdefault(phase.dst, []).append(total)
            for src, rate in rates:
                by_pair.setdefault((src, phase.dst), []).append(rate / total)
        return ({pair: sum(v) / len(v) for pair, v in by_pair.items()},
                {dst: sum(v) / len(v) for dst, v in into.items()})

    def names(self) -> list[str]:
        """The matrix's nodes: as listed, then any an edge names that the list lacks."""
        seen = list(dict.fromkeys(self.nodes))
        for e in self.edges:
            for name in (e.src, e.dst):
                if name not in seen:
                    seen.append(name)
        return seen

    def alone(self) -> dict[tuple[str, str], float]:
        """(src, dst) -> alone_Bps, for the edges measured (a failed pair has no number)."""
        return {(e.src, e.dst): float(e.alone_Bps) for e in self.edges
                if isinstance(e.alone_Bps, (int, float)) and e.alone_Bps > 0 and e.src != e.dst}

    def bidir(self) -> dict[tuple[str, str], float]:
        return {(e.src, e.dst): float(e.bidir_Bps) for e in self.edges
                if isinstance(e.bidir_Bps, (int, float)) and e.bidir_Bps > 0 and e.src != e.dst}


def endpoint_address(text: str) -> str:
    """'10.0.0.1:5000' -> '10.0.0.1'; '[::ffff:10.0.0.1]:5000' -> '10.0.0.1'; '[fe80::1]:5000' -> 'fe80::1'; a
    bare address is returned as it is (IPv4-mapped IPv6 unwrapped)."""
    address = text
    if text.startswith("["):
        address = text[1:].split("]", 1)[0]
    elif text.count(":") == 1:
        address = text.split(":", 1)[0]
    if address.startswith("::ffff:") and "." in address:
        address = address[len("::ffff:"):]
    return address


@dataclass(frozen=True)
class NodeLookup:
    """Address -> node and rank -> node, from run.json's topology; for a lab run of the earlier layout (no
    topology), from the lab's addresses, host h<i> at the i-th address running rank i (one launcher per lab
    host, node-rank i)."""

    by_address: dict[str, str] = field(default_factory=dict)
    by_rank: dict[int, str] = field(default_factory=dict)
    order: tuple[str, ...] = ()          # the nodes in the job's order (rank 0's node first)

    @classmethod
    def of(cls, topology: Topology | None, lab_addresses: list[str]) -> NodeLookup:
        if topology is not None and topology.nodes:
            ordered = sorted(topology.nodes, key=lambda n: (min(n.ranks) if n.ranks else 1 << 30, n.name))
            return cls({n.address: n.name for n in ordered if n.address},
                       {rank: n.name for n in ordered for rank in n.ranks}, tuple(n.name for n in ordered))
        names = [f"h{i}" for i in range(len(lab_addresses))]
        return cls(dict(zip(lab_addresses, names, strict=True)), dict(enumerate(names)), tuple(names))

    def node_of(self, endpoint: str | None) -> str | None:
        """The node an "ip:port" (or bare address) belongs to."""
        if not endpoint:
            return None
        return self.by_address.get(endpoint_address(endpoint))

    def node_of_rank(self, rank: Any) -> str | None:
        return self.by_rank.get(rank) if isinstance(rank, int) else None

    def direction(self, label: str) -> tuple[str | None, str | None]:
        """(sending node, receiving node) of a direction "ip:port->ip:port"."""
        src, _, dst = label.partition("->")
        return self.node_of(src), self.node_of(dst)

    def direction_text(self, label: str) -> str:
        """'10.77.0.3:4711->10.77.0.1:5000' -> 'into h0 from h2' (an unknown end stays its address)."""
        src, _, dst = label.partition("->")
        return f"into {self.node_of(dst) or dst} from {self.node_of(src) or src}"

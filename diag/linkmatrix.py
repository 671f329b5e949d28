"""The pairwise link matrix (run.json ``link.matrix``, docs/inplace.md) as typed dataclasses: the one definition
that the probe writes (diag/probe/matrix.py builds these objects, ``to_json`` writes them) and the report
reads (``LinkMatrix.from_json``: a key missing from an older run takes its default, an unknown one is kept in
``extra`` and written back).

Every ordered pair of nodes, each direction alone and both at once, measured in rounds of disjoint pairs;
with three or more nodes, every node's incast (every other node sending into it at once). The retransmission
counts are the sender's kernel's (None: not read, or a run before they were recorded); runs before
2026-12-03 have no incast.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from diag.typedjson import from_json, to_json
from diag.units import ETHERNET_MSS

Pair = tuple[str, str]
# Bytes a segment, to turn a probe flow's goodput into the segments it sent (a jumbo sender sends fewer: its
# share of segments resent reads low, never high).
SEGMENT_BYTES = ETHERNET_MSS


@dataclass(frozen=True)
class MatrixEdge:
    """src -> dst: alone (its reverse idle) and while dst -> src runs too; with the segments src resent in
    each phase (its kernel's count over the phase; None where it could not be read). A failed pair has no
    goodput (None)."""

    src: str = "?"
    dst: str = "?"
    alone_Bps: float | None = None
    bidir_Bps: float | None = None
    alone_retransmits: int | None = None
    bidir_retransmits: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class IncastFlow:
    """One sender of an incast phase: its goodput at the receiver, and the segments it resent over the whole
    flow and over the steady window after the warm-up (the window of the goodput)."""

    src: str = "?"
    goodput_Bps: float | None = None
    retransmits: int | None = None
    steady_retransmits: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Incast:
    """Every other node sending into ``dst`` at once for ``seconds``, in round ``round`` of the incasts (1,
    2, ...); ``steady_s`` of it after the warm-up."""

    dst: str = "?"
    round: int = 1
    seconds: float | None = None
    steady_s: float | None = None
    flows: tuple[IncastFlow, ...] = ()
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
    """Goodput between every ordered pair of nodes; ``rounds`` is the schedule that measured it."""

    tool: str | None = None                     # "iperf3" or "diag-socket"
    seconds: float | None = None                # per phase
    nodes: tuple[str, ...] = ()
    rounds: tuple[tuple[Pair, ...], ...] = ()
    edges: tuple[MatrixEdge, ...] = ()          # every ordered pair, src in node order, then dst
    notes: tuple[str, ...] = ()
    incast: tuple[Incast, ...] = ()             # one per node and round, in node order (three or more nodes)
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return to_json(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LinkMatrix:
        return from_json(cls, data)

    def edge(self, src: str, dst: str) -> MatrixEdge:
        for edge in self.edges:
            if (edge.src, edge.dst) == (src, dst):
                return edge
        raise KeyError(f"no edge {src} -> {dst} in the matrix of {', '.join(self.nodes)}")

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


__all__ = ["SEGMENT_BYTES", "Incast", "IncastFlow", "LinkMatrix", "MatrixEdge", "Pair", "steady_resent_share"]

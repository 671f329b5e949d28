"""The job's nodes as run.json describes them (docs/inplace.md): typed ``topology`` (``link.matrix`` is typed
once, in diag/linkmatrix.py, for the probe that writes it and the report), and the lookups that turn an
address or a rank into a node's name.

A node is a host as the network sees it (its address on the job's interface, its network namespace, its
boot id); the report names it by ``name`` (h0, h1, ... in the lab). Every lookup here answers None where the
run does not say, never a guess.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from diag.linkmatrix import SEGMENT_BYTES, Incast, IncastFlow, LinkMatrix, MatrixEdge, steady_resent_share

# The report's name for one ordered pair of the matrix (the diagnosis rules read edges under it).
LinkEdge = MatrixEdge


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


__all__ = ["SEGMENT_BYTES", "Incast", "IncastFlow", "LinkEdge", "LinkMatrix", "NodeLookup", "Topology", "TopologyNode",
           "endpoint_address", "steady_resent_share"]

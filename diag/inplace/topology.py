"""Which ranks share a host, and which ranks form the subgroup of each N (docs/inplace.md, "Nodes").

A node is a host as the network sees it: its address on the job's interface, its network namespace and the
machine's boot id. A hostname alone would merge the lab's namespaces (they share one) and containers on one
machine, and split nothing. Pure code below ``identify``: every rule is tested without a process group.
"""

from __future__ import annotations

import os
import re
import socket
from dataclasses import asdict, dataclass, field
from typing import Any

from diag.errors import DiagError

NODE_NAME_ENV = "DIAG_NODE_NAME"   # the lab names its hosts h0, h1, ...; an operator may name nodes too
_SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass(frozen=True)
class RankIdentity:
    """What one rank says about where it runs."""

    rank: int
    pid: int
    hostname: str
    address: str | None          # IPv4 address on the job's interface
    netns: str | None            # /proc/self/ns/net, e.g. "net:[4026532401]"
    boot_id: str | None
    name_hint: str | None = None  # $DIAG_NODE_NAME

    @property
    def node_key(self) -> tuple[str | None, str | None, str | None, str]:
        # The hostname joins the key only where nothing else tells machines apart (no address, no boot id).
        return (self.address, self.netns, self.boot_id,
                self.hostname if self.address is None and self.boot_id is None else "")


MAX_IDENTITY_CHARS = 255    # a hostname, address, namespace or boot id as a rank reports it
MAX_NODE_NAME_CHARS = 64


def identity_from_message(said: Any, rank: int) -> RankIdentity:
    """What the rank in slot ``rank`` of the job's all_gather said about where it runs, checked: its rank is
    the slot's (never the one it claims), every field a string of bounded length (or None where allowed), the
    pid an integer; anything else is one line naming the rank."""
    def bad(why: str) -> DiagError:
        return DiagError(f"meeting the other ranks: rank {rank} sent an identity diag cannot use ({why}); is "
                         "every rank running the same diag?")

    if not isinstance(said, dict):
        raise bad("not an object")
    fields: dict[str, Any] = {"rank": rank}
    pid = said.get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool) or not 0 < pid < 1 << 32:
        raise bad("pid")
    fields["pid"] = pid
    for key, optional in (("hostname", False), ("address", True), ("netns", True), ("boot_id", True),
                          ("name_hint", True)):
        value = said.get(key)
        if value is None and optional:
            fields[key] = None
            continue
        if not isinstance(value, str) or len(value) > MAX_IDENTITY_CHARS:
            raise bad(key)
        fields[key] = value
    return RankIdentity(**fields)


@dataclass(frozen=True)
class Node:
    name: str
    address: str | None
    hostname: str
    netns: str | None
    boot_id: str | None
    ranks: tuple[int, ...]
    pids: tuple[int, ...] = ()

    @property
    def leader(self) -> int:
        """The node's lowest rank: it does the node's own work (fingerprint, capture, analysis)."""
        return self.ranks[0]

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["ranks"] = list(self.ranks)
        out["leader"] = self.leader
        out.pop("pids")
        return out


@dataclass(frozen=True)
class Topology:
    world_size: int
    iface: str | None
    nodes: tuple[Node, ...]
    node_of_rank: tuple[int, ...]          # rank -> index into nodes
    spread: tuple[int, ...] = field(default=())   # ranks, one per node first (see members)

    def node(self, rank: int) -> Node:
        return self.nodes[self.node_of_rank[rank]]

    def members(self, world_size: int) -> tuple[int, ...]:
        """The ranks of the subgroup of N: the first N of the spread order (rank 0 first), so N ranks sit on
        N different nodes whenever the job has N nodes."""
        if not 1 <= world_size <= self.world_size:
            raise DiagError(f"N={world_size} needs 1..{self.world_size} ranks; the job has {self.world_size}")
        return self.spread[:world_size]

    def nodes_of(self, ranks: tuple[int, ...]) -> list[Node]:
        seen: dict[int, Node] = {}
        for rank in ranks:
            seen.setdefault(self.node_of_rank[rank], self.node(rank))
        return list(seen.values())

    def shares_hosts(self, world_size: int) -> bool:
        """The subgroup of N puts two of its ranks on one node (N ranks there are not N hosts)."""
        return len(self.nodes_of(self.members(world_size))) < world_size

    def to_json(self, world_sizes: tuple[int, ...] = ()) -> dict[str, Any]:
        sizes = [n for n in world_sizes if 1 <= n <= self.world_size]
        return {"world_size": self.world_size, "iface": self.iface,
                "nodes": [node.to_json() for node in self.nodes],
                "subgroups": {str(n): list(self.members(n)) for n in sizes},
                "shared_hosts": [n for n in sizes if self.shares_hosts(n)]}


def build_topology(identities: list[RankIdentity], iface: str | None) -> Topology:
    """Group ranks into nodes by identity and name the nodes (pure)."""
    ordered = sorted(identities, key=lambda i: i.rank)
    if [i.rank for i in ordered] != list(range(len(ordered))):
        raise DiagError("the job's ranks did not all report where they run")
    groups: dict[tuple[Any, ...], list[RankIdentity]] = {}
    for identity in ordered:
        groups.setdefault(identity.node_key, []).append(identity)
    members = sorted(groups.values(), key=lambda ids: ids[0].rank)
    names = _node_names(members)
    nodes = tuple(Node(name=name, address=ids[0].address, hostname=ids[0].hostname, netns=ids[0].netns,
                       boot_id=ids[0].boot_id, ranks=tuple(i.rank for i in ids), pids=tuple(i.pid for i in ids))
                  for name, ids in zip(names, members, strict=True))
    node_of_rank = [0] * len(ordered)
    for index, node in enumerate(nodes):
        for rank in node.ranks:
            node_of_rank[rank] = index
    spread = [node.ranks[depth] for depth in range(max(len(n.ranks) for n in nodes))
              for node in nodes if depth < len(node.ranks)]
    return Topology(len(ordered), iface, nodes, tuple(node_of_rank), tuple(spread))


def _node_names(members: list[list[RankIdentity]]) -> list[str]:
    """$DIAG_NODE_NAME where the node's ranks agree on one, else the hostname; a name two nodes share gets
    the node's address (the lab's namespaces share a hostname). Safe as a directory name."""
    def base(ids: list[RankIdentity]) -> str:
        hints = {i.name_hint for i in ids if i.name_hint}
        return hints.pop() if len(hints) == 1 else ids[0].hostname

    bases = [_safe(base(ids)) for ids in members]
    names = []
    for ids, name in zip(members, bases, strict=True):
        if bases.count(name) > 1:
            name = _safe(f"{name}-{ids[0].address or ids[0].rank}")
        names.append(name)
    # Still equal (same host, same address: ranks in two containers without their own network)? Number them.
    return [name if names.count(name) == 1 else f"{name}-{index}" for index, name in enumerate(names)]


def _safe(name: str) -> str:
    """A plain directory name: letters, digits, '.', '_', '-' only, never '.' or '..', at most
    MAX_NODE_NAME_CHARS (nodes/<name>/ in the run directory)."""
    return _SAFE_NAME.sub("_", name).strip("._")[:MAX_NODE_NAME_CHARS].strip("._") or "node"


def interface_address(iface: str | None) -> str | None:
    """The IPv4 address of ``iface`` (psutil), None where it has none."""
    if not iface:
        return None
    import psutil

    for addr in psutil.net_if_addrs().get(iface, []):
        if addr.family == socket.AF_INET:
            return str(addr.address)
    return None


def job_interface(iface: str | None) -> str | None:
    """The interface the job's traffic uses: --iface, else GLOO_SOCKET_IFNAME (what gloo binds), else the
    route to MASTER_ADDR (what gloo picks by default: the address its hostname resolves to usually lies
    there)."""
    from diag.envinfo import interface_for

    chosen = iface or (os.environ.get("GLOO_SOCKET_IFNAME") or "").split(",")[0] or None
    return chosen or interface_for(os.environ.get("MASTER_ADDR"))


def identify(rank: int, iface: str | None) -> RankIdentity:
    def read(path: str) -> str | None:
        try:
            return os.readlink(path) if path.startswith("/proc/self/ns") else open(path).read().strip()
        except OSError:
            return None

    return RankIdentity(rank=rank, pid=os.getpid(), hostname=socket.gethostname(),
                        address=interface_address(iface), netns=read("/proc/self/ns/net"),
                        boot_id=read("/proc/sys/kernel/random/boot_id"),
                        name_hint=os.environ.get(NODE_NAME_ENV) or None)


__all__ = ["NODE_NAME_ENV", "Node", "RankIdentity", "Topology", "build_topology", "identify", "identity_from_message",
           "interface_address", "job_interface"]

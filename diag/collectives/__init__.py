"""The collectives diag knows. Add one: a small Collective subclass and a line in COLLECTIVES."""

from __future__ import annotations

from diag.collectives.all_gather import AllGather, AllGatherP2P
from diag.collectives.base import Buffers, Collective, pair_peer
from diag.collectives.point_to_point import Exchange, PingPong, SendRecv
from diag.collectives.reductions import AllReduce, AllToAll, Broadcast, ReduceScatter
from diag.errors import DiagError

COLLECTIVES: dict[str, type[Collective]] = {
    "all_gather": AllGather,
    "all_gather_p2p": AllGatherP2P,
    "send_recv": SendRecv,
    "ping_pong": PingPong,
    "exchange": Exchange,
    "all_reduce": AllReduce,
    "reduce_scatter": ReduceScatter,
    "broadcast": Broadcast,
    "all_to_all": AllToAll,
}
OPS = tuple(COLLECTIVES)


def make_collective(name: str, seed: int = 0, order: str = "recv-first") -> Collective:
    try:
        cls = COLLECTIVES[name]
    except KeyError:
        raise DiagError(f"unknown op {name!r}: choose from {', '.join(OPS)}") from None
    if cls is Exchange or cls is AllGatherP2P:
        return cls(seed=seed, order=order)
    return cls(seed=seed)


__all__ = ["COLLECTIVES", "OPS", "Buffers", "Collective", "make_collective", "pair_peer"]

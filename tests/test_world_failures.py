"""How a rank that loses a peer names the node that went first: each rank that loses one says which in the
job's store (a real torch store), and a node that left only after losing another is not the one named."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import pytest
import torch.distributed as dist

from diag.inplace import world as world_module
from diag.inplace.topology import Node, Topology
from diag.inplace.world import LOSS_KEY, MAX_LOSS_REPORT, World, first_to_go

ADDRESSES = ("10.77.0.1", "10.77.0.2", "10.77.0.3")
CLOSED_BY_H1 = "[../gloo/transport/tcp/pair.cc:598] Connection closed by peer [10.77.0.2]:41234"


def topology() -> Topology:
    nodes = tuple(Node(f"h{i}", address, "box", f"net:[{i}]", "boot", (i,)) for i, address in enumerate(ADDRESSES))
    return Topology(3, "eth0", nodes, (0, 1, 2), (0, 1, 2))


def rank0(store: dist.Store) -> World:
    world = World(SimpleNamespace(rank=0, world_size=3), store=store)   # only rank and size are read here
    world.topology = topology()
    return world


@pytest.fixture(autouse=True)
def short_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(world_module, "LOSS_WAIT_S", 0.3)


def test_a_neighbour_that_closed_after_losing_the_dead_node_is_not_named() -> None:
    store = dist.HashStore()
    store.set(LOSS_KEY.format(rank=1), json.dumps({"node": "h2"}))   # h1 lost h2, then its connections closed
    line = rank0(store).suspect(CLOSED_BY_H1)
    assert line == "node h2 (10.77.0.3, rank 2) died or closed its connections (h1 left after losing it)"
    # rank 0 told the others what it found, for any rank still following the chain
    assert json.loads(store.get(LOSS_KEY.format(rank=0))) == {"node": "h2"}


def test_a_peer_with_no_report_is_the_one_named_after_the_wait() -> None:
    store = dist.HashStore()
    started = time.monotonic()
    line = rank0(store).suspect(CLOSED_BY_H1)
    waited = time.monotonic() - started
    assert line == "node h1 (10.77.0.2, rank 1) died or closed its connections"
    assert 0.3 <= waited < 5.0
    # the missing ranks of the monitored barrier: the one that reported losing the other is left out
    store.set(LOSS_KEY.format(rank=2), json.dumps({"node": "h1"}))
    line = rank0(store).suspect("Ranks 1, 2 failed to pass monitoredBarrier in 600000 ms")
    assert line == "node h1 (10.77.0.2, rank 1) stopped answering (h2 left after losing it)"


@pytest.mark.parametrize("report", [b"x" * (MAX_LOSS_REPORT + 1), b"not json", b'["h2"]', b'{"node": "h9"}',
                                    b'{"node": 2}'], ids=["long", "not-json", "a-list", "unknown-node", "not-a-name"])
def test_a_report_that_is_not_one_is_ignored(report: bytes) -> None:
    store = dist.HashStore()
    store.set(LOSS_KEY.format(rank=1), report)
    assert rank0(store).suspect(CLOSED_BY_H1) == "node h1 (10.77.0.2, rank 1) died or closed its connections"


def test_reports_that_blame_each_other_end_and_a_chain_is_followed() -> None:
    store = dist.HashStore()
    topo = topology()
    _, h1, h2 = topo.nodes
    store.set(LOSS_KEY.format(rank=1), json.dumps({"node": "h2"}))
    store.set(LOSS_KEY.format(rank=2), json.dumps({"node": "h1"}))
    assert first_to_go(store, topo, [h1], 0, 0.1) == ([h2], [h1])
    # a node that blames the rank asking is named itself: that rank is alive
    store = dist.HashStore()
    store.set(LOSS_KEY.format(rank=1), json.dumps({"node": "h0"}))
    assert first_to_go(store, topo, [h1], 0, 0.1) == ([h1], [])
    # no store to read: the node the rank lost
    assert first_to_go(None, topo, [h1], 0, 0.1) == ([h1], [])

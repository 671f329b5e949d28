"""The job's own process group: how the ranks of an in-place job agree on what to do next, and how a node
that dies or stops answering becomes one line that names it.

Every rank of the job calls every method here, in the same order (point-to-point: the two ranks named). The
default group (gloo) carries only these messages, as data (diag.transports.messages), never pickles; the
measurements run on subgroups (diag.transports.group). Ranks outside a step's subgroup wait in ``barrier``
while it runs, so the group's own timeout is long (WORLD_TIMEOUT_S); the
barrier after a step names the ranks that did not come (gloo's monitored barrier) and a lost connection
names the peer's address, which the topology turns into a node. A rank that loses a node says so in the job's
store before its own connections close, so the others name the node that went first, not a neighbour that
left after losing it.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from diag.errors import EXIT_FAILED, DiagError
from diag.inplace.topology import Node, Topology
from diag.probe.coordinator import GroupCoordinator, first_sentence
from diag.transports.messages import MessageError

# Idle ranks wait in the job's group while a subgroup runs a step: no step comes near this; a node that
# dies is seen at once (its connections close), one that hangs within STEP_WAIT_S of the step's end.
WORLD_TIMEOUT_S = 3600.0
STEP_WAIT_S = 900.0
# The tag of the job's point-to-point messages (a node's files to rank 0): far above the counters gloo tags
# its own collectives with, so the two never meet.
CONTROL_TAG = 0x7D1A0001
# A rank that loses a peer says which node, in the job's store: a node whose connections closed because it
# lost another is not the one that died. How long a rank follows those reports before it names a node, and
# the longest report it reads (another rank's data).
LOSS_KEY = "diag/lost/{rank}"
LOSS_WAIT_S = 2.0
MAX_LOSS_REPORT = 256
MAX_TEXTS = 200           # lines one rank may add to the run's notes at one time
MAX_TEXT_CHARS = 2000

# gloo names the peer of a broken pair as "[10.0.0.3]:24257" (Read error, Connection closed/reset by peer)
_PEER_ADDRESS = re.compile(r"\[([0-9A-Fa-f.:]+)\]:\d+")
_MISSING_RANKS = re.compile(r"Ranks? ([\d, ]+) failed to pass monitoredBarrier")


class NodeLost(DiagError):
    """A node died or stopped answering: the run cannot go on (its finished steps are on disk)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, exit_code=EXIT_FAILED)


class World:
    """The job's default group, through the probe's GroupCoordinator, with the monitored barrier and
    failures that name the node. Every message is data (diag.transports.messages): JSON values in uint8
    tensors, length-checked before anything is allocated and parsed with limits, never unpickled; a message
    from rank r is the one in r's slot (or received from r), never a name it gives itself."""

    def __init__(self, coordinator: GroupCoordinator, store: Any = None) -> None:
        self.coordinator = coordinator
        self.rank = coordinator.rank
        self.world_size = coordinator.world_size
        self.topology: Topology | None = None
        self.store = store          # the job's store (torch's default one unless given)

    # --- messages ------------------------------------------------------------------------------------
    def barrier(self, what: str, timeout_s: float = STEP_WAIT_S) -> None:
        import torch.distributed as dist

        try:
            dist.monitored_barrier(timeout=timedelta(seconds=timeout_s), wait_all_ranks=True)
        except RuntimeError as exc:
            raise self.lost(exc, what) from None

    def all_gather(self, value: Any, what: str = "exchanging results") -> list[Any]:
        """Every rank's ``value`` (a JSON value), indexed by rank."""
        try:
            return self.coordinator.all_gather_object(value)
        except MessageError as exc:
            raise DiagError(f"{what}: {exc}") from None
        except RuntimeError as exc:
            raise self.lost(exc, what) from None

    def all_gather_texts(self, texts: list[str], what: str) -> list[str]:
        """Every rank's lines (notes, errors), in rank order: each rank's at most MAX_TEXTS lines of at most
        MAX_TEXT_CHARS characters (longer ones cut, with a mark); anything that is not a list of strings is
        one line naming the rank."""
        out: list[str] = []
        for rank, said in enumerate(self.all_gather(texts, what)):
            if not isinstance(said, list) or not all(isinstance(t, str) for t in said):
                raise DiagError(f"{what}: rank {rank} sent something other than lines of text; is every rank "
                                "running the same diag?")
            out += [t if len(t) <= MAX_TEXT_CHARS else t[:MAX_TEXT_CHARS] + " [cut]" for t in said[:MAX_TEXTS]]
        return out

    def broadcast(self, value: Any, what: str = "sharing the plan", src: int = 0) -> Any:
        try:
            return self.coordinator.broadcast_object(value, src)
        except MessageError as exc:
            raise DiagError(f"{what}: {exc}") from None
        except RuntimeError as exc:
            raise self.lost(exc, what) from None

    def broadcast_into(self, buffer: Any, what: str, src: int = 0) -> None:
        """Rank ``src``'s uint8 ``buffer`` into every rank's (a length every rank knows beforehand)."""
        from diag.transports import messages

        try:
            messages.broadcast_bytes_into(buffer, src)
        except RuntimeError as exc:
            raise self.lost(exc, what) from None

    def send(self, value: Any, dst: int, what: str) -> None:
        """One message to rank ``dst`` (which calls :meth:`recv`), on the job's own tag."""
        from diag.transports import messages

        try:
            messages.send(value, dst, CONTROL_TAG)
        except RuntimeError as exc:
            raise self.lost(exc, what) from None

    def recv(self, src: int, what: str) -> Any:
        """The message rank ``src`` sent with :meth:`send` (MessageError where it is not one)."""
        from diag.transports import messages

        try:
            return messages.recv(src, CONTROL_TAG)
        except RuntimeError as exc:
            raise self.lost(exc, what) from None

    def send_chunk(self, buffer: Any, dst: int, what: str) -> None:
        from diag.transports import messages

        try:
            messages.send_bytes(buffer, dst, CONTROL_TAG)
        except RuntimeError as exc:
            raise self.lost(exc, what) from None

    def recv_chunk(self, buffer: Any, src: int, what: str) -> None:
        """Exactly ``buffer``'s length from rank ``src`` (a length both sides agreed on)."""
        from diag.transports import messages

        try:
            messages.recv_bytes_into(buffer, src, CONTROL_TAG)
        except RuntimeError as exc:
            raise self.lost(exc, what) from None

    # --- failures ------------------------------------------------------------------------------------
    def lost(self, exc: BaseException, what: str) -> NodeLost:
        """One line: which node, during what, and gloo's own first sentence."""
        return NodeLost(f"{what}: {self.suspect(str(exc))} ({first_sentence(exc)}); the steps finished before "
                        "it are kept")

    def suspect(self, message: str) -> str:
        topology = self.topology
        if "waiting for send/recv from rank 0" in message:
            # rank 0 left the barrier with an error of its own: it names the node that failed
            return "rank 0 stopped the job after a failure (its output names the node)"
        missing = _MISSING_RANKS.search(message)
        if missing and topology is not None:
            ranks = sorted({int(r) for r in re.findall(r"\d+", missing.group(1))})
            nodes = topology.nodes_of(tuple(r for r in ranks if 0 <= r < topology.world_size))
            if nodes:
                self._report_loss(nodes[0])
                gone, after = first_to_go(self._job_store(), topology, nodes, self.rank, LOSS_WAIT_S)
                if gone[0] != nodes[0]:
                    self._report_loss(gone[0])
                return ", ".join(f"node {_named(n)}" for n in gone) + " stopped answering" + _after(after)
        peer = _PEER_ADDRESS.search(message)
        if peer:
            address = peer.group(1)
            if topology is not None:
                nodes = [n for n in topology.nodes if n.address == address and self.rank not in n.ranks]
                if len(nodes) == 1:
                    self._report_loss(nodes[0])
                    [node], after = first_to_go(self._job_store(), topology, nodes, self.rank, LOSS_WAIT_S)
                    if node != nodes[0]:
                        self._report_loss(node)
                    return f"node {_named(node)} died or closed its connections" + _after(after)
            return f"the node at {address} died or closed its connections"
        return "a node died or stopped answering"

    def _job_store(self) -> Any:
        if self.store is None:
            import torch.distributed as dist

            try:
                self.store = dist.distributed_c10d._get_default_store()
                self.store.set_timeout(timedelta(seconds=LOSS_WAIT_S))
            except Exception:   # no store to share reports through: each rank names what it saw itself
                return None
        return self.store

    def _report_loss(self, node: Node) -> None:
        """Tell the other ranks which node this rank lost, before this rank's own connections close."""
        store = self._job_store()
        if store is not None:
            with contextlib.suppress(Exception):   # the store's host is gone too: the error still names the node
                store.set(LOSS_KEY.format(rank=self.rank), json.dumps({"node": node.name}))


def first_to_go(store: Any, topology: Topology, nodes: Sequence[Node], own_rank: int, wait_s: float
                ) -> tuple[list[Node], list[Node]]:
    """Of the nodes a rank lost, the ones that went first, and the ones that left after losing another.

    A node whose ranks report (in the store, LOSS_KEY) that they lost another node was still running when it
    left; the node it lost is followed the same way, within ``wait_s`` in all. Returns (the nodes to name,
    the nodes that only left after them, in the order they were followed)."""
    deadline = time.monotonic() + wait_s
    by_name = {n.name: n for n in topology.nodes}
    own = topology.node(own_rank).name if 0 <= own_rank < topology.world_size else None
    gone: list[Node] = []
    after: list[Node] = []
    todo = list(nodes)
    while todo:
        node = todo.pop(0)
        if node in gone or node in after:
            continue
        lost = _loss_report(store, node, deadline) if store is not None else None
        nxt = by_name.get(lost) if lost else None
        if nxt is None or nxt.name == own or nxt in after or nxt == node:
            gone.append(node)
        else:
            after.append(node)
            todo.append(nxt)
    return gone, after


def _loss_report(store: Any, node: Node, deadline: float) -> str | None:
    """The node one of ``node``'s ranks reported losing, waiting until ``deadline`` for a report."""
    keys = [LOSS_KEY.format(rank=r) for r in node.ranks]
    while True:
        for key in keys:
            try:
                if not store.check([key]):
                    continue
                raw = store.get(key)
            except Exception:
                return None
            if len(raw) > MAX_LOSS_REPORT:
                continue
            try:
                said = json.loads(raw)
            except ValueError:
                continue
            if isinstance(said, dict) and isinstance(said.get("node"), str):
                return said["node"]
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.05)


def _named(node: Node) -> str:
    return f"{node.name} ({node.address}, rank {', '.join(map(str, node.ranks))})"


def _after(after: list[Node]) -> str:
    if not after:
        return ""
    names = ", ".join(n.name for n in after)
    return f" ({names} left after losing it)" if len(after) == 1 else f" ({names} left after losing it, in turn)"


__all__ = ["CONTROL_TAG", "LOSS_KEY", "LOSS_WAIT_S", "MAX_TEXTS", "MAX_TEXT_CHARS", "STEP_WAIT_S", "WORLD_TIMEOUT_S",
           "NodeLost", "World", "first_to_go"]

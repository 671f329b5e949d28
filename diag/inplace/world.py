"""The job's own process group: how the ranks of an in-place job agree on what to do next, and how a node
that dies or stops answering becomes one line that names it.

Every rank of the job calls every method here, in the same order (point-to-point: the two ranks named). The
default group (gloo) carries only these messages, as data (diag.transports.messages), never pickles; the
measurements run on subgroups (diag.transports.group). Ranks outside a step's subgroup wait in ``barrier``
while it runs, so the group's own timeout is long (WORLD_TIMEOUT_S); the
barrier after a step names the ranks that did not come (gloo's monitored barrier) and a lost connection
names the peer's address, which the topology turns into a node.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

from diag.errors import EXIT_FAILED, DiagError
from diag.inplace.topology import Topology
from diag.probe.coordinator import GroupCoordinator, first_sentence
from diag.transports.messages import MessageError

# Idle ranks wait in the job's group while a subgroup runs a step: no step comes near this; a node that
# dies is seen at once (its connections close), one that hangs within STEP_WAIT_S of the step's end.
WORLD_TIMEOUT_S = 3600.0
STEP_WAIT_S = 900.0
# The tag of the job's point-to-point messages (a node's files to rank 0): far above the counters gloo tags
# its own collectives with, so the two never meet.
CONTROL_TAG = 0x7D1A0001
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

    def __init__(self, coordinator: GroupCoordinator) -> None:
        self.coordinator = coordinator
        self.rank = coordinator.rank
        self.world_size = coordinator.world_size
        self.topology: Topology | None = None

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
                return "node " + ", ".join(f"{n.name} ({n.address}, rank {', '.join(map(str, n.ranks))})"
                                           for n in nodes) + " stopped answering"
        peer = _PEER_ADDRESS.search(message)
        if peer:
            address = peer.group(1)
            if topology is not None:
                nodes = [n for n in topology.nodes if n.address == address and self.rank not in n.ranks]
                if len(nodes) == 1:
                    node = nodes[0]
                    return f"node {node.name} ({address}, rank {', '.join(map(str, node.ranks))}) died or closed its connections"
            return f"the node at {address} died or closed its connections"
        return "a node died or stopped answering"


__all__ = ["CONTROL_TAG", "MAX_TEXTS", "MAX_TEXT_CHARS", "STEP_WAIT_S", "WORLD_TIMEOUT_S", "NodeLost", "World"]

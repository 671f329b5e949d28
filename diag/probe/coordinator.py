"""How the probe's ranks talk: a small coordination interface, and its implementation over torch.distributed.

The probe only ever needs four things from the job: who am I, how many are we, wait for everyone, and
exchange small messages. Everything the probe measures travels on its own sockets or iperf3's; the
coordinator carries ports, availability and results (a few hundred bytes per call) as JSON values, never
pickled objects (diag.transports.messages: length-checked, parsed with limits, named by the sending rank).
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any, Protocol

from diag.errors import DiagError


class Coordinator(Protocol):
    """The job's ranks, seen by one of them. Every rank must make the same calls in the same order."""

    @property
    def rank(self) -> int: ...

    @property
    def world_size(self) -> int: ...

    def barrier(self) -> None: ...

    def all_gather_object(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, indexed by rank: a JSON value (dicts with string keys, lists, strings,
        numbers, booleans, None; a tuple arrives as a list)."""
        ...

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        """Rank ``src``'s ``obj`` (a JSON value) on every rank."""
        ...


class GroupCoordinator:
    """A :class:`Coordinator` over a torch.distributed process group (the default group unless given).

    A call that does not complete within the group's timeout raises (torch's DistBackendError, a
    RuntimeError), so the group's timeout bounds how long a rank waits for a stuck or dead peer: the probe
    turns that into one line naming the phase and its pairs. Use :meth:`gloo` for a group of its own with
    a short timeout (the default group's is often 30 min, and NCCL's needs a GPU per call).
    """

    def __init__(self, group: Any = None) -> None:
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            raise DiagError("the probe needs torch.distributed initialised (init_process_group) in every rank")
        self._dist = dist
        self._group = group
        self._rank = dist.get_rank(group)
        self._world_size = dist.get_world_size(group)

    @classmethod
    def gloo(cls, timeout_s: float) -> GroupCoordinator:
        """A new gloo group of every rank of the job with its own timeout. Collective: every rank calls it."""
        import torch.distributed as dist

        return cls(dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s)))

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._world_size

    def barrier(self) -> None:
        self._dist.barrier(group=self._group)

    def all_gather_object(self, obj: Any) -> list[Any]:
        from diag.transports import messages

        return messages.all_gather(obj, group=self._group)

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        from diag.transports import messages

        return messages.broadcast(obj, src, group=self._group)


# torch's errors open with the C++ source position ("[/path/pair.cc:553] Connection closed by peer ...")
_SOURCE_POSITION = re.compile(r"^\[[^\]]*:\d+\]\s*")


def first_sentence(exc: BaseException) -> str:
    """The exception's first sentence, without torch's source position (its advice, "This is typically
    caused by ...", never helps here: diag names the node itself)."""
    lines = str(exc).strip().splitlines()
    if not lines:
        return type(exc).__name__
    return _SOURCE_POSITION.sub("", lines[0]).split(". ")[0][:200]

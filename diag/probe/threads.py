"""The probe's ranks as threads of one process: how the lab measures its hosts from outside their namespaces
with the same probe the in-place job runs on its nodes (diag/lab/measure.py).

Each thread is one rank: ``setup(rank)`` first (the lab joins that host's network namespace there: setns is
per thread, so the thread's sockets and the tools it starts live on that host), then ``body(coordinator)``.
The coordinator meets every rank at a barrier per call, as a process group does; a rank that does not
arrive within ``timeout_s`` breaks the barrier and every waiting rank raises (the probe turns that into one
line naming the flows under way). What a rank gathers is a copy, as it would be between processes.
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable
from typing import Any

from diag.errors import DiagError


class ThreadRanks:
    """``size`` ranks in one process; ``coordinator(rank)`` is rank ``rank``'s probe.Coordinator."""

    def __init__(self, size: int, timeout_s: float) -> None:
        self.size = size
        self._slots: list[Any] = [None] * size
        self._meet = threading.Barrier(size, timeout=timeout_s)

    def coordinator(self, rank: int) -> RankThread:
        return RankThread(self, rank)

    def barrier(self) -> None:
        self._meet.wait()

    def all_gather(self, rank: int, obj: Any) -> list[Any]:
        self._slots[rank] = obj
        self._meet.wait()
        gathered = copy.deepcopy(self._slots)
        self._meet.wait()   # nobody writes the next call's slot before every rank has read this one
        return gathered

    def abort(self) -> None:
        self._meet.abort()


class RankThread:
    """One rank's view (the probe's Coordinator protocol)."""

    def __init__(self, ranks: ThreadRanks, rank: int) -> None:
        self._ranks = ranks
        self._rank = rank

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._ranks.size

    def barrier(self) -> None:
        self._ranks.barrier()

    def all_gather_object(self, obj: Any) -> list[Any]:
        return self._ranks.all_gather(self._rank, obj)

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        return self.all_gather_object(obj)[src]


def run_ranks(size: int, body: Callable[[RankThread], Any], timeout_s: float,
              setup: Callable[[int], None] | None = None) -> list[Any]:
    """body(coordinator) on one thread per rank, after setup(rank) on that thread; every rank's result. The
    first exception any rank raised is raised here (a rank that fails aborts the others' waits: they fail at
    once); ranks still running after timeout_s are one line."""
    ranks = ThreadRanks(size, timeout_s)
    results: list[Any] = [None] * size
    errors: list[BaseException] = []   # in the order they happened: the first is the cause
    lock = threading.Lock()

    def rank_main(rank: int) -> None:
        try:
            if setup is not None:
                setup(rank)
            results[rank] = body(ranks.coordinator(rank))
        except BaseException as exc:  # handed to the caller below
            with lock:
                errors.append(exc)
            ranks.abort()

    threads = [threading.Thread(target=rank_main, args=(rank,), name=f"probe-rank-{rank}", daemon=True)
               for rank in range(size)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout_s
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    if any(thread.is_alive() for thread in threads):
        ranks.abort()
        raise DiagError(f"a probe rank did not finish in {timeout_s:.0f} s")
    if errors:
        raise errors[0]
    return results


__all__ = ["RankThread", "ThreadRanks", "run_ranks"]

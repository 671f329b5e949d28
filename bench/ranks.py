"""Collect what spawned rank processes report, for the benches and the tests that run ranks in-process."""

from __future__ import annotations

import queue
import time
from collections.abc import Sequence
from multiprocessing.process import BaseProcess
from typing import Any


def collect_by_rank(processes: Sequence[BaseProcess], results: Any, world_size: int, timeout_s: float,
                    join_s: float) -> dict[int, tuple[str, Any]]:
    """(status, value) by rank from ``results`` (a queue of (rank, status, value)) until every rank reported,
    every process is gone, or ``timeout_s`` passed; then each process gets ``join_s`` to exit and is killed
    after that. Ranks that never reported are absent."""
    outcome: dict[int, tuple[str, Any]] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while len(outcome) < world_size and time.monotonic() < deadline:
            try:
                rank, status, value = results.get(timeout=0.2)
            except queue.Empty:
                if all(not p.is_alive() for p in processes) and results.empty():
                    break
                continue
            outcome[rank] = (status, value)
    finally:
        for process in processes:
            process.join(timeout=join_s)
            if process.is_alive():
                process.kill()
                process.join()
    return outcome

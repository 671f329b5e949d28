"""Shared fixtures of the raw-transport tests: run a function on N spawned ranks over loopback."""

from __future__ import annotations

import multiprocessing
import os
import socket
import traceback
from collections.abc import Callable
from typing import Any

RANK_TIMEOUT_S = 60.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _rank_main(fn: Callable[..., Any], rank: int, world_size: int, port: int, args: tuple[Any, ...],
               results: Any) -> None:
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
                       "WORLD_SIZE": str(world_size)})
    os.environ.pop("GLOO_SOCKET_IFNAME", None)
    try:
        results.put((rank, "ok", fn(rank, world_size, *args)))
    except BaseException as exc:  # report everything, the parent decides
        results.put((rank, "error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))


def run_ranks(fn: Callable[..., Any], world_size: int, *args: Any, timeout_s: float = RANK_TIMEOUT_S,
              port: int | None = None) -> list[tuple[str, Any]]:
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` spawned processes; -> [(status, value)] by rank.
    Processes still alive after ``timeout_s`` are killed and reported as "hung"."""
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    port = port or free_port()
    processes = [context.Process(target=_rank_main, args=(fn, rank, world_size, port, args, results))
                 for rank in range(world_size)]
    for process in processes:
        process.start()
    outcome: dict[int, tuple[str, Any]] = {}
    try:
        import queue
        import time

        deadline = time.monotonic() + timeout_s
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
            process.join(timeout=5)
            if process.is_alive():
                process.kill()
                process.join()
    return [outcome.get(rank, ("hung", None)) for rank in range(world_size)]


def assert_all_ok(outcome: list[tuple[str, Any]]) -> list[Any]:
    problems = [f"rank {rank}: {status}: {value}" for rank, (status, value) in enumerate(outcome) if status != "ok"]
    assert not problems, "\n".join(problems)
    return [value for _status, value in outcome]

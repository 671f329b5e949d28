"""Shared fixtures of the raw-transport tests: run a function on N spawned ranks over loopback."""

from __future__ import annotations

import logging
import os
import traceback
from collections.abc import Callable
from typing import Any

from bench.ranks import collect_by_rank
from tests.common import free_port, rank_processes

RANK_TIMEOUT_S = 60.0


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
    context = rank_processes()
    results = context.Queue()
    port = port or free_port()
    processes = [context.Process(target=_rank_main, args=(fn, rank, world_size, port, args, results))
                 for rank in range(world_size)]
    for process in processes:
        process.start()
    outcome = collect_by_rank(processes, results, world_size, timeout_s, join_s=5)
    return [outcome.get(rank, ("hung", None)) for rank in range(world_size)]


def assert_all_ok(outcome: list[tuple[str, Any]]) -> list[Any]:
    problems = [f"rank {rank}: {status}: {value}" for rank, (status, value) in enumerate(outcome) if status != "ok"]
    assert not problems, "\n".join(problems)
    return [value for _status, value in outcome]


def seeded_block(rank: int, iteration: int, nbytes: int) -> Any:
    """Bytes rank ``rank`` contributes in ``iteration``: differ per rank, iteration and position."""
    import torch

    generator = torch.Generator().manual_seed(1_000_003 * iteration + rank)
    return torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=generator)


def make_transport(rank: int, world_size: int, knobs: dict[str, Any], timeout_s: float = 30.0,
                   store: Any = None) -> Any:
    from diag.spec import SweepSpec
    from diag.transports.raw import create_transport

    # algo and order stay in the knobs too: given explicitly, they switch that piece of --emulate gloo
    spec = SweepSpec(backend="raw", algo=knobs.get("algo", "ring"), order=knobs.get("order", "recv-first"),
                     knobs=dict(knobs))
    return create_transport(spec, rank, world_size, timeout_s, store=store)


def check_all_gather(transport: Any, rank: int, world_size: int, nbytes: int, iterations: int = 2,
                     dtype: Any = None) -> int:
    """Run all_gather ``iterations`` times with fresh data; -> number of wrong bytes (0 = correct)."""
    import torch

    wrong = 0
    element = torch.empty((), dtype=dtype or torch.uint8).element_size()
    count = max(1, nbytes // element) if nbytes >= element else 0
    for iteration in range(iterations):
        blocks = [seeded_block(r, iteration, count * element) for r in range(world_size)]
        inp = blocks[rank].view(dtype or torch.uint8).clone()
        out = torch.full((world_size * count,), 0, dtype=dtype or torch.uint8)
        transport.all_gather(out, inp)
        wrong += int(out.view(torch.uint8).ne(torch.cat(blocks)).sum().item())
    return wrong


class LogCollector(logging.Handler):
    """Keeps the messages of a logger it is added to (the raw transport logs to "diag.raw")."""

    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())

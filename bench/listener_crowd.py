"""A crowd at the raw transport's door: silent, garbage and partial-HELLO strays during rendezvous change nothing.

    python -m bench.listener_crowd --silent 500 --garbage 500 --partial 500 [--world-size 3] [--size 1M]

Runs the raw transport twice on loopback, N ranks each (spawned processes, env:// rendezvous): once alone
and once with a crowd. For the crowded run the last rank waits before it connects while the crowd opens
``--silent`` connections that send nothing, ``--garbage`` connections that send random bytes and
``--partial`` connections that send 28 of a HELLO's 29 bytes (and then nothing: a stray that evicting by
bytes received would have kept over a real rank) to the listener of every rank that accepts (all but the
last), read from the TCPStore as a stranger on the same network could. The silent and partial ones stay
open until every rank is done. Then the last rank connects; every rank runs
all_gather with seeded data and counts wrong bytes. It prints both runs: outcome, wrong bytes, rendezvous
seconds, median busbw, and what happened to the crowd's connections. Exit code 1 if either run failed or
any byte was wrong.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import selectors
import socket
import statistics
import sys
import threading
import time
from datetime import timedelta
from typing import Any

from bench.ranks import collect_by_rank

READY_KEY = "bench/crowd_ready"
STORE_PREFIX = "diag_raw/1"   # the first raw transport generation on a fresh store (transport.py)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _rank(rank: int, world_size: int, port: int, gated: bool, size: int, iters: int, timeout_s: float,
          results: Any) -> None:
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
                       "WORLD_SIZE": str(world_size)})
    os.environ.pop("GLOO_SOCKET_IFNAME", None)
    try:
        import torch

        from diag.spec import SweepSpec
        from diag.transports.raw import create_transport
        from diag.transports.raw.transport import rendezvous_store

        store = rendezvous_store(rank, world_size, timeout_s)
        if gated and rank == world_size - 1:
            store.wait([READY_KEY], timedelta(seconds=timeout_s))
        started = time.monotonic()
        transport = create_transport(SweepSpec(backend="raw", algo="ring"), rank, world_size, timeout_s, store=store)
        rendezvous_s = time.monotonic() - started
        wrong, times = 0, []
        for iteration in range(iters):
            blocks = [torch.randint(0, 256, (size,), dtype=torch.uint8,
                                    generator=torch.Generator().manual_seed(1_000_003 * iteration + r))
                      for r in range(world_size)]
            out = torch.zeros(world_size * size, dtype=torch.uint8)
            transport.barrier()
            t0 = time.perf_counter()
            transport.all_gather(out, blocks[rank])
            times.append(time.perf_counter() - t0)
            wrong += int(out.ne(torch.cat(blocks)).sum().item())
        transport.barrier()
        transport.close()
        results.put((rank, "ok", {"wrong": wrong, "rendezvous_s": rendezvous_s, "times_s": times}))
    except BaseException as exc:  # reported to the parent, which decides
        results.put((rank, "error", f"{type(exc).__name__}: {exc}"))


class Crowd:
    """Silent and garbage clients of the ranks' listeners (found in the store, as a stranger would)."""

    def __init__(self, port: int, world_size: int, silent: int, garbage: int, timeout_s: float,
                 partial: int = 0) -> None:
        self.port, self.world_size, self.silent, self.garbage = port, world_size, silent, garbage
        self.partial = partial
        self.timeout_s = timeout_s
        self.stats: dict[str, int] = {"opened": 0, "connect_failed": 0}
        self.finished = threading.Event()   # set when the ranks are done
        self.error: str | None = None
        self._sockets: list[tuple[socket.socket, bool]] = []
        self._thread = threading.Thread(target=self._run, name="crowd", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def join(self) -> None:
        self._thread.join(self.timeout_s + 30)

    def _run(self) -> None:
        import torch.distributed as dist

        store = None
        try:
            store = dist.TCPStore("127.0.0.1", self.port, is_master=False, timeout=timedelta(seconds=self.timeout_s))
            targets = []
            for rank in range(self.world_size - 1):  # the last rank accepts from nobody
                host, port = bytes(store.get(f"{STORE_PREFIX}/addr/{rank}")).decode().rsplit(":", 1)
                targets.append((host, int(port)))
            for target in targets:
                self._open(target)
            store.set(READY_KEY, "1")
            self.finished.wait(self.timeout_s + 60)  # the silent ones stay open for the whole run
        except BaseException as exc:
            self.error = f"{type(exc).__name__}: {exc}"
            with contextlib.suppress(Exception):
                store.set(READY_KEY, "1")  # never leave the gated rank waiting
        finally:
            for sock, _silent in self._sockets:
                sock.close()

    def _open(self, target: tuple[str, int]) -> None:
        """Open all clients of one listener at once (non-blocking connects), send the garbage and partial HELLOs."""
        from diag.transports.raw import wire

        partial_hello = wire.pack_hello(self.world_size - 1, wire.ROLE_UP, 0)[:-1]
        selector = selectors.DefaultSelector()
        kinds = ["silent"] * self.silent + ["garbage"] * self.garbage + ["partial"] * self.partial
        for kind in kinds:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setblocking(False)
            sock.connect_ex(target)
            selector.register(sock, selectors.EVENT_WRITE, kind)
        deadline = time.monotonic() + 15
        while selector.get_map() and time.monotonic() < deadline:
            for key, _ in selector.select(timeout=0.2):
                sock, kind = key.fileobj, key.data
                selector.unregister(sock)
                if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) != 0:
                    self.stats["connect_failed"] += 1
                    sock.close()
                    continue
                self.stats["opened"] += 1
                with contextlib.suppress(OSError):
                    if kind == "garbage":
                        sock.send(b"GET / HTTP/1.1\r\n\r\n" + os.urandom(100))
                    elif kind == "partial":
                        sock.send(partial_hello)
                self._sockets.append((sock, kind != "garbage"))
        for key in list(selector.get_map().values()):
            self.stats["connect_failed"] += 1
            key.fileobj.close()
        selector.close()


def run_once(world_size: int, silent: int, garbage: int, size: int, iters: int, timeout_s: float,
             partial: int = 0) -> dict[str, Any]:
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    port = free_port()
    gated = silent + garbage + partial > 0
    processes = [context.Process(target=_rank, args=(r, world_size, port, gated, size, iters, timeout_s, results))
                 for r in range(world_size)]
    for process in processes:
        process.start()
    crowd = Crowd(port, world_size, silent, garbage, timeout_s, partial) if gated else None
    if crowd is not None:
        crowd.start()
    try:
        outcome = collect_by_rank(processes, results, world_size, timeout_s + 60, join_s=10)
    finally:
        if crowd is not None:
            crowd.finished.set()
            crowd.join()
    errors = {r: v for r, (s, v) in outcome.items() if s != "ok"}
    missing = [r for r in range(world_size) if r not in outcome]
    ok = {r: v for r, (s, v) in outcome.items() if s == "ok"}
    summary: dict[str, Any] = {
        "silent": silent, "garbage": garbage, "partial": partial, "world_size": world_size, "size_bytes": size,
        "ok": not errors and not missing, "errors": {**{str(r): v for r, v in errors.items()},
                                                     **{str(r): "no result (hung)" for r in missing}},
        "wrong_bytes": sum(v["wrong"] for v in ok.values()),
        "rendezvous_s": round(max((v["rendezvous_s"] for v in ok.values()), default=0.0), 3),
    }
    if ok and len(ok) == world_size:
        times = [max(ok[r]["times_s"][i] for r in ok) for i in range(iters)]
        median = statistics.median(times)
        summary["busbw_MBps"] = round(world_size * size * (world_size - 1) / world_size / median / 1e6, 1)
    if crowd is not None:
        summary["crowd"] = crowd.stats
        summary["crowd_error"] = crowd.error
    return summary


def main(argv: list[str] | None = None) -> int:
    from diag.units import parse_size

    parser = argparse.ArgumentParser(prog="python -m bench.listener_crowd", description=__doc__.splitlines()[0])
    parser.add_argument("--silent", type=int, default=500)
    parser.add_argument("--garbage", type=int, default=500)
    parser.add_argument("--partial", type=int, default=500, help="clients that send 28 of a HELLO's 29 bytes")
    parser.add_argument("--world-size", type=int, default=3)
    parser.add_argument("--size", default="1M", help="per-rank all_gather size (default 1M)")
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=60.0)
    args = parser.parse_args(argv)
    size = parse_size(args.size)
    alone = run_once(args.world_size, 0, 0, size, args.iters, args.timeout)
    crowded = run_once(args.world_size, args.silent, args.garbage, size, args.iters, args.timeout, args.partial)
    print(json.dumps({"alone": alone, "crowded": crowded}, indent=1))
    good = all(run["ok"] and run["wrong_bytes"] == 0 for run in (alone, crowded)) and crowded.get("crowd_error") is None
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main())

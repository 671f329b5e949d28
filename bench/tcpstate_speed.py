"""Benchmark: the TCP state kernel (diag.capture._ctcp) fed a capture at once and in chunks, in one run.

    python -m bench.tcpstate_speed FILE [FILE ...] [--repeat 5]

Reads the capture once (one chunk: connections and handshakes), then runs the TCP state pass with all
packets in one feed and in 1 M-row chunks with 1 M segment ends a direction in memory (as `diag analyze`
feeds a big file), alternately, --repeat times each, and prints CPU (process time, all threads) and wall
time: best and median, and the ratio of the medians. Both arrays are compared once (they must be identical).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from diag.capture import native, tcpstate
from diag.capture.source import Chunk, OneChunk, Pass, Streamer


def tcp_inputs(paths: Sequence[str | os.PathLike[str]]
               ) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(columns, conn, direction, wscale, handshake RTTs) of the captures as one chunk: what the TCP state
    (tcpstate.analyze_packets, the _ctcp kernel) reads, for this bench and the tests that hold the kernel to its twin."""
    streamer = Streamer(OneChunk(paths))
    streamer.run(Pass.CONNECTIONS, lambda chunk: None)
    streamer.handshake_rtts()
    ids: list[Chunk] = []
    streamer.run(Pass.RUNS, ids.append)
    conn = ids[0].conn if ids else np.zeros(0, np.int32)
    direction = ids[0].direction if ids else np.zeros(0, np.int8)
    return streamer.source.chunk.columns, conn, direction, streamer.wscale, streamer.first_rtt


def _timed(fn: Callable[..., Any], into: list[tuple[float, float]]) -> Callable[..., Any]:
    def wrapper(*args: Any) -> Any:
        cpu, wall = time.process_time(), time.perf_counter()
        out = fn(*args)
        into.append((time.process_time() - cpu, time.perf_counter() - wall))
        return out
    return wrapper


def _line(label: str, rows: list[tuple[float, float]]) -> str:
    cpu, wall = [r[0] for r in rows], [r[1] for r in rows]
    return (f"  {label:26s} CPU best {min(cpu):.3f} s, median {statistics.median(cpu):.3f} s | "
            f"wall best {min(wall):.3f} s, median {statistics.median(wall):.3f} s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.tcpstate_speed",
                                     description=(__doc__ or "").splitlines()[0])
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    kernel = native.kernel("_ctcp")
    if kernel is None:
        print("diag.capture._ctcp is not built: nothing to time", file=sys.stderr)
        return 1
    cols, conn, direction, wscale, first_rtt = tcp_inputs(args.files)
    n = cols["ts_ns"].size
    engines = {"one feed": lambda *a: tcpstate.analyze_packets_native(kernel, *a),
               "chunks": lambda *a: tcpstate.analyze_packets_native(kernel, *a, chunk_rows=1 << 20,
                                                                    spill_window=1 << 20)}
    state: dict[str, list[tuple[float, float]]] = {name: [] for name in engines}
    states: dict[str, tcpstate.PacketState] = {}
    for _ in range(args.repeat):
        for name, engine in engines.items():
            states.setdefault(name, _timed(engine, state[name])(cols, conn, direction, wscale, first_rtt))
    differ = [f.name for f in dataclasses.fields(tcpstate.PacketState)
              if not np.array_equal(getattr(states["one feed"], f.name), getattr(states["chunks"], f.name))]
    print(f"{', '.join(map(str, args.files))}: {n:,} packets; {args.repeat} runs of each engine, alternated; "
          f"1-minute load {os.getloadavg()[0]:.2f}")
    for name in engines:
        print(_line(f"{name} state pass", state[name]))
    c_cpu = statistics.median(r[0] for r in state["one feed"])
    np_cpu = statistics.median(r[0] for r in state["chunks"])
    c_wall = statistics.median(r[1] for r in state["one feed"])
    np_wall = statistics.median(r[1] for r in state["chunks"])
    print(f"  state pass: chunks / one feed, medians: CPU {np_cpu / c_cpu:.2f}x, wall {np_wall / c_wall:.2f}x")
    print(f"  one feed: {n / c_wall / 1e6:.1f} M packets/s (wall)")
    print("  arrays identical" if not differ else f"  ARRAYS DIFFER: {', '.join(differ)}")
    return 0 if not differ else 1


if __name__ == "__main__":
    sys.exit(main())

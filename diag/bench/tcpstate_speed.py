"""Benchmark: the TCP state pass in C (diag.capture._ctcp) against its numpy twin, in one run.

    python -m diag.bench.tcpstate_speed FILE [FILE ...] [--repeat 5]

Reads the capture once, then runs `build_packets` (connections, handshakes and the TCP state pass) with
the kernel and with the numpy twin alternately, --repeat times each, and prints CPU (process time, all
threads) and wall time of `build_packets` and of the state pass alone (`analyze_packets`): best and
median, and the ratio of the medians. Both engines' arrays are compared once (they must be identical).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from diag.capture import flows, native, tcpstate


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
    parser = argparse.ArgumentParser(prog="python -m diag.bench.tcpstate_speed",
                                     description=(__doc__ or "").splitlines()[0])
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    kernel = native.kernel("_ctcp")
    if kernel is None:
        print("diag.capture._ctcp is not built or DIAG_NATIVE=0: nothing to compare", file=sys.stderr)
        return 1
    cols, endpoints, results = flows.read_files(args.files)
    n = cols["ts_ns"].size
    # build_packets passes keep_sequence (True) after the five inputs: both engines then fill every field.
    engines = {"C kernel": lambda *a: tcpstate.analyze_packets_native(kernel, *a[:5], keep_sequence=a[5]),
               "numpy twin": lambda *a: tcpstate._analyze_packets_numpy(*a[:5])}
    build: dict[str, list[tuple[float, float]]] = {name: [] for name in engines}
    state: dict[str, list[tuple[float, float]]] = {name: [] for name in engines}
    states: dict[str, tcpstate.PacketState] = {}
    real = flows.analyze_packets
    try:
        for _ in range(args.repeat):
            for name, engine in engines.items():
                flows.analyze_packets = _timed(engine, state[name])
                cpu, wall = time.process_time(), time.perf_counter()
                packets = flows.build_packets(cols, endpoints, results)
                build[name].append((time.process_time() - cpu, time.perf_counter() - wall))
                states.setdefault(name, packets.state)
                del packets
    finally:
        flows.analyze_packets = real
    differ = [f.name for f in dataclasses.fields(tcpstate.PacketState)
              if not np.array_equal(getattr(states["C kernel"], f.name), getattr(states["numpy twin"], f.name))]
    print(f"{', '.join(map(str, args.files))}: {n:,} packets; {args.repeat} runs of each engine, alternated; "
          f"1-minute load {os.getloadavg()[0]:.2f}")
    for name in engines:
        print(_line(f"{name} build_packets", build[name]))
        print(_line(f"{name} state pass", state[name]))
    for label, rows in (("build_packets", build), ("state pass", state)):
        c_cpu = statistics.median(r[0] for r in rows["C kernel"])
        np_cpu = statistics.median(r[0] for r in rows["numpy twin"])
        c_wall = statistics.median(r[1] for r in rows["C kernel"])
        np_wall = statistics.median(r[1] for r in rows["numpy twin"])
        print(f"  {label}: numpy / C, medians: CPU {np_cpu / c_cpu:.1f}x, wall {np_wall / c_wall:.1f}x")
    print(f"  C state pass: {n / statistics.median(r[1] for r in state['C kernel']) / 1e6:.1f} M packets/s (wall)")
    print("  arrays identical" if not differ else f"  ARRAYS DIFFER: {', '.join(differ)}")
    return 0 if not differ else 1


if __name__ == "__main__":
    sys.exit(main())

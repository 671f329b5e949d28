"""The capture reader's speed: the whole file into columns against the same file in chunks, in one process.

    python -m bench.reader_speed FILE [--repeat 5]

Times ``reader.read_capture(FILE)`` (file -> columns: one chunk in memory) and ``reader.stream_capture``
(the chunks `diag analyze` reads a file in, each handed on and dropped), alternately, after the memory
settings `diag analyze` uses. Prints CPU
time (process: every thread) and wall time, best and median of --repeat runs each, and the ratios. The
file should be in the page cache (the first, untimed read puts it there). The first read of a process also
pays the page faults of its fresh column memory; it is reported on its own line.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.reader_speed", description=__doc__.split("\n\n")[0])
    parser.add_argument("file", help="a capture (pcap, pcapng, optionally .gz)")
    parser.add_argument("--repeat", type=int, default=5, help="timed reads per engine (default 5)")
    args = parser.parse_args(argv)

    from diag.cli.memory import tune_for_one_shot_analysis

    tune_for_one_shot_analysis()
    from diag.capture import native, reader

    engines = {"whole file": lambda: reader.read_capture(args.file).packets,
               "chunks": lambda: _streamed_rows(reader, args.file)}
    if native.kernel("_cpcap") is None:
        print("the C kernel diag.capture._cpcap is not built: "
              "python -c 'import setuptools; setuptools.setup()' build_ext --inplace", file=sys.stderr)
        return 1
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in engines}
    packets = 0
    for turn in range(args.repeat + 1):
        for name, read in engines.items():
            cpu0, wall0 = time.process_time(), time.perf_counter()
            packets = read()
            cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
            if turn == 0:
                print(f"first read of the process, {name}: cpu {cpu:.3f} s, wall {wall:.3f} s (fresh memory)")
            else:
                times[name].append((cpu, wall))
    print(f"{args.file}: {packets:,} packets, {args.repeat} reads each, alternating; "
          f"load average {os.getloadavg()[0]:.2f}")
    medians = {}
    for name, runs in times.items():
        cpu = [c for c, _ in runs]
        wall = [w for _, w in runs]
        medians[name] = (statistics.median(cpu), statistics.median(wall))
        print(f"{name:>11}: cpu best {min(cpu):.3f} s median {medians[name][0]:.3f} s | wall best {min(wall):.3f} s "
              f"median {medians[name][1]:.3f} s = {packets / medians[name][1] / 1e6:.1f} M packets/s")
    whole, chunks = medians["whole file"], medians["chunks"]
    print(f"chunks / whole file (medians): cpu {chunks[0] / whole[0]:.2f}x, wall {chunks[1] / whole[1]:.2f}x")
    return 0


def _streamed_rows(reader: Any, path: str) -> int:
    rows = 0

    def count(chunk: Any) -> None:
        nonlocal rows
        rows += chunk.rows

    reader.stream_capture(path, count)
    return rows


if __name__ == "__main__":
    sys.exit(main())

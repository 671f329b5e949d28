"""A/B of `diag analyze FILE --json` between two source trees, run alternately (the machine is shared).

    python docs/analyzer-ab.py OLD_TREE,NEW_TREE PAIRS [FILE]      (default FILE: bench.pcap)

Each run is a fresh process with PYTHONPATH set to the tree; the order alternates per pair so drifting load
hits both alike. Prints per tree the median and minimum of CPU time (user + sys of all threads, from
wait4), of wall time, the largest peak RSS, and the CPU ratio of each pair. It only times: compare the
JSON of the two trees separately (`cmp`).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time


def run_once(tree: str, pcap: str) -> tuple[float, float, float]:
    """(CPU seconds, wall seconds, peak RSS MB) of one `diag analyze` process."""
    env = dict(os.environ, PYTHONPATH=tree)
    start = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-m", "diag", "analyze", pcap, "--json"], env=env,
                             stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"diag analyze failed under {tree}")
    return usage.ru_utime + usage.ru_stime, wall, usage.ru_maxrss / 1024


def main() -> int:
    if len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    trees = sys.argv[1].split(",")
    pairs = int(sys.argv[2])
    pcap = sys.argv[3] if len(sys.argv) > 3 else "bench.pcap"
    results: dict[str, list[tuple[float, float, float]]] = {tree: [] for tree in trees}
    for index in range(pairs):
        for tree in trees if index % 2 == 0 else trees[::-1]:
            results[tree].append(run_once(tree, pcap))
    for tree, runs in results.items():
        cpu, wall, rss = ([run[k] for run in runs] for k in range(3))
        print(f"{tree}: cpu median {statistics.median(cpu):.3f} s (min {min(cpu):.3f}), wall median "
              f"{statistics.median(wall):.3f} s (min {min(wall):.3f}), peak RSS max {max(rss):.0f} MB")
    if len(trees) == 2:
        first, second = ([run[0] for run in results[tree]] for tree in trees)
        print("CPU ratio first/second per pair:",
              " ".join(f"{a / b:.2f}" for a, b in zip(first, second, strict=True)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

#!/usr/bin/env python3
"""Benchmark of the raw-TCP reference (docs/raw-tcp.md). Not a test: it prints figures, asserts nothing.

  python docs/raw-tcp-bench.py loopback [--nproc 2,3,4] [--sizes 8M,16M]   raw ring vs gloo, same run
  python docs/raw-tcp-bench.py knobs [--lab NAME]                          what each knob does to N=2
  python docs/raw-tcp-bench.py lab --lab NAME [--nproc 2,3,4,5,6]          raw ring vs single-stream goodput

Every figure comes from `diag sweep` records (busbw of the median iteration).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from diag.records import load_records

KNOB_VARIANTS: list[tuple[str, list[str]]] = [
    ("default (split, duplex, no notify)", []),
    ("--conn shared", ["--conn", "shared"]),
    ("--handshake notify", ["--handshake", "notify"]),
    ("--conn shared --handshake notify --order send-first", ["--conn", "shared", "--handshake", "notify",
                                                             "--order", "send-first"]),
    ("--io alternate", ["--io", "alternate"]),
    ("--chunks 2", ["--chunks", "2"]),
    ("--chunks 16", ["--chunks", "16"]),
    ("--streams 2", ["--streams", "2"]),
    ("--sockbuf 256K", ["--sockbuf", "256K"]),
    ("--nodelay off", ["--nodelay", "off"]),
    ("--emulate gloo", ["--emulate", "gloo"]),
]


def sweep(work: Path, tag: str, args: list[str]) -> dict[tuple[int, int], float]:
    """Run one `diag sweep`; -> {(world_size, size_bytes): busbw_Bps}."""
    out = work / f"{tag}.jsonl"
    command = [sys.executable, "-m", "diag", "sweep", "--out", str(out), "--run-dir", str(work / tag), *args]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-2000:]}")
    return {(r.world_size, r.size_bytes): r.busbw_Bps for r in load_records(out).records}


def mbs(value: float) -> str:
    return f"{value / 1e6:8.1f}"


def loopback(options: argparse.Namespace, work: Path) -> None:
    common = ["--nproc", options.nproc, "--sizes", options.sizes, "--iters", str(options.iters), "--warmup", "2"]
    gloo = sweep(work, "gloo", ["--backend", "gloo", *common])
    raw = sweep(work, "raw", ["--backend", "raw", "--algo", "ring", *common])
    print(f"{'N':>3} {'size':>10} {'gloo MB/s':>10} {'raw MB/s':>10} {'raw/gloo':>9}")
    for key in sorted(raw):
        if key in gloo:
            print(f"{key[0]:>3} {key[1]:>10} {mbs(gloo[key]):>10} {mbs(raw[key]):>10} {raw[key] / gloo[key]:9.2f}")


def knobs(options: argparse.Namespace, work: Path) -> None:
    where = ["--lab", options.lab] if options.lab else []
    common = ["--backend", "raw", "--nproc", "2", "--sizes", options.sizes, "--iters", str(options.iters),
              "--warmup", "2", *where]
    print(f"{'knobs at N=2':<55} " + " ".join(f"{size:>12}" for size in options.sizes.split(",")))
    for index, (label, extra) in enumerate(KNOB_VARIANTS):
        result = sweep(work, f"knob{index}", [*common, *extra])
        print(f"{label:<55} " + " ".join(f"{mbs(v):>12}" for _k, v in sorted(result.items())))


def lab(options: argparse.Namespace, work: Path) -> None:
    if not options.lab:
        raise SystemExit("lab mode needs --lab NAME (create it with `diag lab up --hosts 6 --rate 1gbit`)")
    status = subprocess.run([sys.executable, "-m", "diag", "lab", "status", "--name", options.lab, "--measure",
                             "--json"], capture_output=True, text=True)
    if status.returncode != 0:
        raise SystemExit(status.stderr)
    measured = json.loads(status.stdout)
    single = _find_number(measured, "single_stream_Bps")
    raw = sweep(work, "raw-lab", ["--backend", "raw", "--algo", "ring", "--lab", options.lab, "--nproc",
                                  options.nproc, "--sizes", options.sizes, "--iters", str(options.iters),
                                  "--warmup", "2"])
    print(f"single-stream goodput h0->h1: {mbs(single)} MB/s")
    print(f"{'N':>3} {'size':>10} {'raw MB/s':>10} {'raw/single':>11}")
    for key in sorted(raw):
        print(f"{key[0]:>3} {key[1]:>10} {mbs(raw[key]):>10} {raw[key] / single:11.2f}")


def _find_number(data: object, key: str) -> float:
    if isinstance(data, dict):
        if isinstance(data.get(key), (int, float)):
            return float(data[key])
        for value in data.values():
            try:
                return _find_number(value, key)
            except KeyError:
                pass
    if isinstance(data, list):
        for value in data:
            try:
                return _find_number(value, key)
            except KeyError:
                pass
    raise KeyError(key)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=("loopback", "knobs", "lab"))
    parser.add_argument("--nproc", default=None)
    parser.add_argument("--sizes", default=None)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--lab", default=None)
    options = parser.parse_args()
    options.nproc = options.nproc or ("2,3,4" if options.mode == "loopback" else "2,3,4,5,6")
    options.sizes = options.sizes or ("8M,16M" if options.mode == "loopback" else "16M,32M")
    with tempfile.TemporaryDirectory(prefix="diag-raw-bench-") as scratch:
        {"loopback": loopback, "knobs": knobs, "lab": lab}[options.mode](options, Path(scratch))


if __name__ == "__main__":
    main()

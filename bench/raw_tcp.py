#!/usr/bin/env python3
"""Benchmark of the raw-TCP reference (docs/raw-tcp.md). Not a test: it prints figures, asserts nothing.

  python -m bench.raw_tcp lab                       raw TCP against gloo on the lab, all in one run:
        lab up (6 hosts, 200mbit), single-stream goodput h0->h1, then for N = 2..6 at 16 MiB per rank:
        raw ring busbw, gloo all_gather busbw, a ring of N plain TCP flows (iperf3, the machine's
        ceiling for N shaped links at once), ratios; the lab is always torn down
  python -m bench.raw_tcp loopback [--nproc 2,3,4] [--sizes 8M,16M]   raw ring vs gloo, same run
  python -m bench.raw_tcp knobs                     what each knob does to N=2 (own lab, as `lab`)
  python -m bench.raw_tcp model                     the gloo protocol model against gloo:
        lab up (4 hosts, 200mbit), link goodput, then at equal D = (N-1) x per-rank size: gloo and
        `--emulate gloo` for N = 2, 3, 4, and at N=2 each knob that switches one piece of the model
  python -m bench.raw_tcp ring [--nproc 2,...,8]    raw ring busbw against the machine's own
        limit, the ring pattern driven by iperf3 (h_i -> h_(i+1 mod N), every edge at once), per N on one
        lab of max(N) hosts at 200mbit: pattern, raw sweep, pattern again; raw / pattern per N

`--lab NAME` uses an existing lab instead of creating one (then it is left up). Every busbw comes from
`diag sweep` records (median iteration). The load average is printed with each row: other work on the
machine makes the figures noisy, so compare ratios from one run.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from diag.records import load_records

KNOB_VARIANTS: list[tuple[str, list[str]]] = [
    ("default (split, duplex, no notify, 1 MiB pieces)", []),
    ("--conn shared", ["--conn", "shared"]),
    ("--handshake notify", ["--handshake", "notify"]),
    ("--conn shared --handshake notify --order send-first", ["--conn", "shared", "--handshake", "notify",
                                                             "--order", "send-first"]),
    ("--io alternate", ["--io", "alternate"]),
    ("--chunks 1", ["--chunks", "1"]),
    ("--chunks 2", ["--chunks", "2"]),
    ("--chunks 64", ["--chunks", "64"]),
    ("--streams 2", ["--streams", "2"]),
    ("--sockbuf 256K", ["--sockbuf", "256K"]),
    ("--nodelay off", ["--nodelay", "off"]),
    ("--emulate gloo", ["--emulate", "gloo"]),
]
IPERF_PORT = 5301
# One piece of the gloo model switched at a time (docs/raw-tcp.md, "The gloo protocol model").
MODEL_KNOBS: list[tuple[str, list[str]]] = [
    ("--order recv-first (receive posted before send)", ["--order", "recv-first"]),
    ("--notice own-conn (notices on their own socket)", ["--notice", "own-conn"]),
    ("--conn split (one socket per direction)", ["--conn", "split"]),
    ("--skew-us 2000 (rank 1 starts 2 ms late)", ["--skew-us", "2000"]),
]


def load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def sweep(work: Path, tag: str, args: list[str]) -> dict[tuple[int, int], float]:
    """Run one `diag sweep`; -> {(world_size, size_bytes): busbw_Bps}."""
    out = work / f"{tag}.jsonl"
    command = [sys.executable, "-m", "diag", "sweep", "--out", str(out), "--run-dir", str(work / tag), "--quiet",
               *args]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-2000:]}")
    return {(r.world_size, r.size_bytes): r.busbw_Bps for r in load_records(out).records}


def mbs(value: float) -> str:
    return f"{value / 1e6:.1f}"


@contextlib.contextmanager
def bench_lab(options: argparse.Namespace) -> Iterator[object]:
    """--lab NAME: that lab as it is; else a lab of our own, always torn down."""
    from diag.lab import LabConfig, lab_session, load_lab

    if options.lab:
        yield load_lab(options.lab)
        return
    hosts = max(6, *(int(n) for n in (options.nproc or "2").split(",")))
    config = LabConfig(name=f"rb{os.getpid() % 100000}", hosts=hosts, rate=options.rate)
    with lab_session(config) as lab:
        yield lab


def ring_ceiling_Bps(lab: object, n: int, seconds: float) -> float | None:
    """Slowest flow of N iperf3 flows h_i -> h_(i+1 mod N) at once: what N shaped links carry together on
    this machine (the ring all_gather waits for its slowest link). None without iperf3."""
    from diag.errors import DiagError
    from diag.lab import measure_ring_pattern

    if shutil.which("iperf3") is None:
        return None
    try:
        return measure_ring_pattern(lab, n, seconds).min_edge_Bps
    except DiagError:
        return None


def lab_comparison(options: argparse.Namespace, work: Path) -> None:
    from diag.lab import measure_link

    sizes = options.sizes or "16M"
    common = ["--sizes", sizes, "--iters", str(options.iters), "--warmup", "2"]
    with bench_lab(options) as lab:
        print(f"lab {lab.name}: {len(lab.hosts)} hosts, rate {options.rate if not options.lab else 'as configured'}; "
              f"load {load()}")
        link = measure_link(lab, 0, 1, seconds=2.0)
        single = link.single_stream_Bps
        print(f"single-stream goodput h0->h1: {mbs(single)} MB/s; both ways at once: "
              f"{mbs(link.bidir_Bps[0])} / {mbs(link.bidir_Bps[1])} MB/s")
        print(f"{'N':>2} {'size':>9} {'raw':>6} {'raw/single':>10} {'gloo':>6} {'gloo/single':>11} {'raw/gloo':>8} "
              f"{'ring-ceiling':>12} {'raw/ceiling':>11}  load (MB/s = busbw; ceiling = slowest of N iperf3 flows)")
        for n in [int(x) for x in options.nproc.split(",")]:
            where = ["--lab", lab.name, "--nproc", str(n)]
            before = load()
            raw = sweep(work, f"raw{n}", ["--backend", "raw", "--algo", "ring", *where, *common])
            gloo = sweep(work, f"gloo{n}", ["--backend", "gloo", *where, *common])
            ceiling = ring_ceiling_Bps(lab, n, 3.0)
            for key in sorted(raw):
                g = gloo.get(key, 0.0)
                print(f"{n:>2} {key[1]:>9} {mbs(raw[key]):>6} {raw[key] / single:>10.2f} {mbs(g):>6} "
                      f"{g / single:>11.2f} {raw[key] / g if g else float('nan'):>8.2f} "
                      f"{mbs(ceiling) if ceiling else '-':>12} "
                      f"{raw[key] / ceiling if ceiling else float('nan'):>11.2f}  {before} -> {load()}", flush=True)
        again = measure_link(lab, 0, 1, seconds=2.0)
        print(f"single-stream goodput h0->h1 again at the end: {mbs(again.single_stream_Bps)} MB/s; load {load()}")


def ring_against_limit(options: argparse.Namespace, work: Path) -> None:
    """Raw ring busbw / the iperf3 ring pattern's mean edge goodput, per N, on one lab."""
    from diag.lab import measure_link, measure_ring_pattern

    sizes = options.sizes or "16M"
    common = ["--op", "all_gather", "--sizes", sizes, "--iters", str(options.iters), "--warmup", "1"]
    with bench_lab(options) as lab:
        link = measure_link(lab, 0, 1, seconds=2.0, tool="iperf3")
        single = link.single_stream_Bps
        print(f"lab {lab.name}: {len(lab.hosts)} hosts; iperf3 single stream h0->h1 {mbs(single)} MB/s; load {load()}")
        print(f"{'N':>2} {'raw':>6} {'pat1':>6} {'pat2':>6} {'slow':>6} {'raw/pat':>7} {'raw/single':>10} "
              f"{'pat/single':>10}  load before -> after (MB/s; raw = busbw of the median iteration; pat1/pat2 = "
              f"mean edge of the iperf3 ring pattern before/after the sweep; slow = slowest edge)")
        for n in [int(x) for x in options.nproc.split(",")]:
            before = load()
            first = measure_ring_pattern(lab, n, options.seconds)
            raw = sweep(work, f"ring{n}", ["--backend", "raw", "--algo", "ring", "--lab", lab.name,
                                           "--nproc", str(n), *common])
            second = measure_ring_pattern(lab, n, options.seconds)
            pattern = (first.mean_edge_Bps + second.mean_edge_Bps) / 2
            slowest = min(first.min_edge_Bps, second.min_edge_Bps)
            for (_n, _size), busbw in sorted(raw.items()):
                print(f"{n:>2} {mbs(busbw):>6} {mbs(first.mean_edge_Bps):>6} {mbs(second.mean_edge_Bps):>6} "
                      f"{mbs(slowest):>6} {busbw / pattern:>7.2f} {busbw / single:>10.2f} {pattern / single:>10.2f}"
                      f"  {before} -> {load()}", flush=True)


def loopback(options: argparse.Namespace, work: Path) -> None:
    common = ["--nproc", options.nproc or "2,3,4", "--sizes", options.sizes or "8M,16M",
              "--iters", str(options.iters), "--warmup", "2"]
    print(f"load {load()}")
    gloo = sweep(work, "gloo", ["--backend", "gloo", *common])
    raw = sweep(work, "raw", ["--backend", "raw", "--algo", "ring", *common])
    print(f"{'N':>3} {'size':>10} {'gloo MB/s':>10} {'raw MB/s':>10} {'raw/gloo':>9}")
    for key in sorted(raw):
        if key in gloo:
            print(f"{key[0]:>3} {key[1]:>10} {mbs(gloo[key]):>10} {mbs(raw[key]):>10} {raw[key] / gloo[key]:9.2f}")
    print(f"load {load()}")


def knobs(options: argparse.Namespace, work: Path) -> None:
    sizes = options.sizes or "16M"
    with bench_lab(options) as lab:
        common = ["--backend", "raw", "--nproc", "2", "--sizes", sizes, "--iters", str(options.iters),
                  "--warmup", "2", "--lab", lab.name]
        print(f"{'knobs at N=2':<55} " + " ".join(f"{size:>8}" for size in sizes.split(",")) + "  load")
        for index, (label, extra) in enumerate(KNOB_VARIANTS):
            result = sweep(work, f"knob{index}", [*common, *extra])
            print(f"{label:<55} " + " ".join(f"{mbs(v):>8}" for _k, v in sorted(result.items())) + f"  {load()}",
                  flush=True)


def model(options: argparse.Namespace, work: Path) -> None:
    from diag.lab import measure_link

    volumes = (options.sizes or "16M,32M").split(",")
    nprocs = [int(x) for x in (options.nproc or "2,3,4").split(",")]
    with bench_lab(options) as lab:
        link = measure_link(lab, 0, 1, seconds=2.0).single_stream_Bps
        print(f"lab {lab.name}: {len(lab.hosts)} hosts; single-stream goodput h0->h1 {mbs(link)} MB/s; load {load()}")
        print(f"{'N':>2} {'D':>4} {'gloo':>6} {'/link':>6} {'model':>6} {'/link':>6} {'model/gloo':>10}  load "
              "(MB/s = busbw of the median iteration; model = --emulate gloo)")
        from diag.units import parse_size

        for volume in volumes:
            for n in nprocs:
                if n > 2 and volume != volumes[0]:
                    continue
                size = str(parse_size(volume) // (n - 1))
                common = ["--lab", lab.name, "--nproc", str(n), "--sizes", size, "--iters", str(options.iters),
                          "--warmup", "2", "--dtype", "uint8"]
                gloo = next(iter(sweep(work, f"gloo{n}-{volume}", ["--backend", "gloo", *common]).values()))
                emulated = next(iter(sweep(work, f"model{n}-{volume}",
                                           ["--backend", "raw", "--emulate", "gloo", *common]).values()))
                print(f"{n:>2} {volume:>4} {mbs(gloo):>6} {gloo / link:>6.2f} {mbs(emulated):>6} "
                      f"{emulated / link:>6.2f} {emulated / gloo:>10.2f}  {load()}", flush=True)
        size = volumes[0]
        common = ["--lab", lab.name, "--nproc", "2", "--sizes", size, "--iters", str(options.iters), "--warmup", "2",
                  "--dtype", "uint8", "--backend", "raw", "--emulate", "gloo"]
        print(f"N=2, D={size}: --emulate gloo with one piece switched       MB/s  /link  load")
        for index, (label, extra) in enumerate(MODEL_KNOBS):
            value = next(iter(sweep(work, f"modelknob{index}", [*common, *extra]).values()))
            print(f"  {label:<52} {mbs(value):>6} {value / link:>6.2f}  {load()}", flush=True)
        print(f"single-stream goodput h0->h1 at the end: {mbs(measure_link(lab, 0, 1, seconds=2.0).single_stream_Bps)} "
              f"MB/s; load {load()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=("lab", "loopback", "knobs", "model", "ring"))
    parser.add_argument("--nproc", default=None, help="world sizes (lab: 2,3,4,5,6; loopback: 2,3,4)")
    parser.add_argument("--sizes", default=None, help="per-rank sizes (lab/knobs: 16M; loopback: 8M,16M); "
                                                      "model: volumes D (16M,32M)")
    parser.add_argument("--iters", type=int, default=5, help="timed iterations per row (default 5)")
    parser.add_argument("--rate", default="200mbit", help="rate of the lab this script creates (default 200mbit)")
    parser.add_argument("--lab", default=None, help="use this existing lab instead of creating one")
    parser.add_argument("--seconds", type=float, default=3.0, help="ring: length of each iperf3 pattern (default 3)")
    options = parser.parse_args()
    if options.mode == "lab":
        options.nproc = options.nproc or "2,3,4,5,6"
    if options.mode == "ring":
        options.nproc = options.nproc or "2,3,4,5,6,7,8"
    with tempfile.TemporaryDirectory(prefix="diag-raw-bench-") as scratch:
        modes = {"loopback": loopback, "knobs": knobs, "lab": lab_comparison, "model": model, "ring": ring_against_limit}
        modes[options.mode](options, Path(scratch))


if __name__ == "__main__":
    main()

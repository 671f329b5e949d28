"""Exports a simulator reads: Vidur's collective profiles and an ASTRA-sim analytical network config.

Vidur (microsoft/vidur) trains its communication predictor on profiling CSVs, one per collective, in the
layout its profiler (vidur/profiling/collectives/main.py) writes: pandas' unnamed index, then
``time_stats.<op>.{min,max,mean,median,std}`` in milliseconds, ``rank``, ``num_workers``, ``size`` (bytes: its
fp16 element count x 2), ``collective``, ``devices_per_node``, ``max_devices_per_node``. Its predictor
(vidur/execution_time_predictor/sklearn_execution_time_predictor.py) reads ``all_reduce.csv`` rows with
num_workers == devices_per_node == the tensor-parallel size, and ``send_recv.csv`` rows with devices_per_node 1
(pipeline stages on different nodes) or 2 (one node), and learns ``time_stats.<op>.median`` against
``size / embedding_dim / 2`` tokens. diag writes, from a series' model, one row per (N, size) on Vidur's own
size grid: mean = the model's mean, median and min/max = the prediction's median and 95% interval, std = the
predictive draws' spread. Since Vidur models tensor parallelism inside one node, all_reduce rows carry
devices_per_node = num_workers (so its filter reads them), and send_recv rows are written for 1 and 2 devices per
node alike: the times are TCP between hosts whatever that label says. all_gather.csv has the same layout
(Vidur's profiler can time all_gather; its predictor does not read it).

ASTRA-sim's analytical network backend (astra-sim/astra-network-analytical, NetworkParser) reads a YAML file of
per-dimension lists: ``topology`` (Ring, Switch, FullyConnected), ``npus_count`` (> 1), ``bandwidth`` (GB/s per
link and direction, GB = 2^30 bytes, > 0) and ``latency`` (ns per hop, >= 0). A message of m bytes costs
hops x latency + m / bandwidth; a Switch is two hops (NPU -> switch -> NPU), a Ring or FullyConnected
neighbour one. diag fits them from a series' ring all_gather (the raw-TCP reference by default): bandwidth
= 1/beta, latency = alpha / hops. It cannot express the ramp (TCP not yet at rate), gloo's N=2 turn-taking, or
the spread of the samples: those stay in model.json and Vidur's tables.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Sequence
from pathlib import Path

from diag.errors import DiagError
from diag.model.core import Model, SeriesModel

# Vidur's profiling grid, in fp16 elements (vidur/profiling/utils get_collectives_sizes_to_profile): 1Ki..512Ki
# in steps of 4Ki, then 16Ki steps to 8Mi, then 64Ki steps to 64Mi; its size column is elements x 2 bytes.
VIDUR_GRID = ((1024, 512 * 1024, 4 * 1024), (512 * 1024, 8 * 1024 * 1024, 16 * 1024),
              (8 * 1024 * 1024, 64 * 1024 * 1024, 64 * 1024))
VIDUR_ELEMENT_BYTES = 2
# Vidur's default --max_collective_size (4096 x 8192 elements) in bytes.
VIDUR_MAX_BYTES = 4096 * 8192 * VIDUR_ELEMENT_BYTES
VIDUR_STATS = ("min", "max", "mean", "median", "std")
VIDUR_OPS = ("all_reduce", "send_recv", "all_gather")
# ASTRA-sim: GB is 2^30 bytes (NetworkFunction.cpp bw_GBps_to_Bpns); hops per message by topology.
ASTRA_GB = 1 << 30
ASTRA_HOPS = {"Switch": 2, "Ring": 1, "FullyConnected": 1}


def vidur_sizes(max_bytes: int = VIDUR_MAX_BYTES) -> list[int]:
    elements = sorted({e for start, stop, step in VIDUR_GRID for e in range(start, stop + 1, step)})
    return [e * VIDUR_ELEMENT_BYTES for e in elements if e * VIDUR_ELEMENT_BYTES <= max_bytes]


def vidur_header(op: str) -> list[str]:
    return ["", *(f"time_stats.{op}.{s}" for s in VIDUR_STATS), "rank", "num_workers", "size", "collective",
            "devices_per_node", "max_devices_per_node"]


def vidur_table(model: SeriesModel, world_sizes: Sequence[int], sizes: Sequence[int]) -> str:
    """One Vidur profiling CSV for one series' op (times in ms)."""
    op = model.op
    # Vidur profiles send_recv between two workers only; all_reduce as tensor parallelism inside one "node"
    layout = [(2, dpn) for dpn in (1, 2)] if op == "send_recv" else [(n, n) for n in world_sizes]
    most = max(d for _, d in layout)
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(vidur_header(op))
    index = 0
    for n, devices in layout:
        for size in sizes:
            p = model.predict(n, size)
            ms = [p.low_s * 1e3, p.high_s * 1e3, p.time_s * 1e3, p.median_s * 1e3, p.std_s * 1e3]
            writer.writerow([index, *(repr(v) for v in ms), 0, n, size, op, devices, most])
            index += 1
    return out.getvalue()


def write_vidur(model: Model, out_dir: Path, series: str | None, world_sizes: Sequence[int] | None,
                max_bytes: int = VIDUR_MAX_BYTES) -> tuple[list[tuple[Path, str]], list[str]]:
    """all_reduce.csv, send_recv.csv, all_gather.csv for the ops ``series`` has a model of: ((path, text) per
    file, what was not written and why)."""
    chosen = _one_series(model, series, VIDUR_OPS)
    sizes = vidur_sizes(max_bytes)
    files, missing = [], []
    for op in VIDUR_OPS:
        hits = [m for m in model.series_models if m.series == chosen and m.op == op]
        if not hits:
            missing.append(f"{op}.csv not written: no {op} model of {chosen} (measure {op}, e.g. the profile step)")
            continue
        ns = list(world_sizes) if world_sizes else hits[0].world_sizes
        outside = [n for n in ns if not hits[0].structure.pairwise and not min(hits[0].world_sizes) <= n
                   <= max(hits[0].world_sizes)]
        if outside:
            missing.append(f"{op}.csv: num_workers {','.join(map(str, outside))} extrapolated (measured "
                           f"N={','.join(map(str, hits[0].world_sizes))})")
        files.append((out_dir / f"{op}.csv", vidur_table(hits[0], ns, sizes)))
    return files, missing


def astra_network(model: Model, series: str | None = None, npus: int | None = None,
                  topology: str = "Switch") -> tuple[str, SeriesModel]:
    """ASTRA-sim analytical network YAML from a series' all_gather model (default: the raw-TCP ring)."""
    if topology not in ASTRA_HOPS:
        raise DiagError(f"--topology {topology!r}: ASTRA-sim's analytical network knows {', '.join(ASTRA_HOPS)}")
    candidates = [m for m in model.series_models if m.op == "all_gather"]
    try:
        hits = model.select("all_gather", series or "raw:ring")
    except DiagError:
        have = ", ".join(m.series for m in candidates) or "none"
        raise DiagError(f"no model of {series or 'the raw-TCP reference (raw:ring)'} all_gather to fit the network "
                        f"from; name a series with --series (all_gather models: {have})") from None
    m = hits[0]
    beta = m.terms.beta_s_per_byte
    if beta <= 0:
        raise DiagError(f"{m.series} all_gather has no per-byte cost (time does not grow with size): no bandwidth "
                        "to write; sweep larger sizes")
    count = npus or max(m.world_sizes)
    if count < 2:
        raise DiagError("--npus must be at least 2 (ASTRA-sim needs npus_count > 1)")
    bandwidth_GBps = 1.0 / beta / ASTRA_GB
    latency_ns = m.terms.alpha_s * 1e9 / ASTRA_HOPS[topology]
    lines = [
        "# ASTRA-sim analytical network config (astra-network-analytical NetworkParser), written by diag model export",
        f"# fitted from {m.series} all_gather ({m.structure.algorithm}: L = {m.structure.text[0]} steps of "
        f"m = {m.structure.text[1]} bytes) over N={','.join(map(str, m.world_sizes))}",
        f"# bandwidth = 1/beta = {1 / beta:.6g} B/s per link and direction (ASTRA-sim's GB is 2^30 bytes)",
        f"# latency = alpha / {ASTRA_HOPS[topology]} hop(s) of a {topology} = {m.terms.alpha_s * 1e6:.4g} us per step",
        "# not expressible here: TCP's ramp below full rate, the N=2 turn-taking penalty, the samples' spread",
        f"topology: [ {topology} ]",
        f"npus_count: [ {count} ]",
        f"bandwidth: [ {bandwidth_GBps:.9g} ]  # GB/s",
        f"latency: [ {latency_ns:.6g} ]  # ns",
    ]
    return "\n".join(lines) + "\n", m


def _one_series(model: Model, series: str | None, ops: Iterable[str]) -> str:
    of_ops = [m for m in model.series_models if m.op in set(ops)]
    labels = list(dict.fromkeys(m.series for m in of_ops))
    if series is not None:
        for op in ops:
            try:
                return model.select(op, series)[0].series
            except DiagError:
                continue
        raise DiagError(f"no model of {series} for {', '.join(ops)}; the model file has: {', '.join(labels) or 'none'}")
    if len(labels) != 1:
        raise DiagError(f"{len(labels)} series have models of {', '.join(ops)}: name one with --series "
                        f"({', '.join(labels) or 'none'})")
    return labels[0]

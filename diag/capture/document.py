"""The `diag analyze --json` document: its parameters, and the objects of a connection, a host and a file.

The JSON shape is a contract with the report (see docs/analyzer.md); keys are only ever added, never renamed.
The numbers come from the one aggregation (aggregation.py) fed by the passes over a packet source
(source.py); this module only assembles them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from diag.capture.pcapfile import SKIP_WORDS, UNSUPPORTED_LINKTYPE_PREFIX, ReadResult
from diag.capture.quantile import OrderStats, np_median, np_percentile
from diag.capture.tcpstate import PacketState
from diag.capture.turns import CONTROL_MAX_BYTES, summarize

if TYPE_CHECKING:
    from diag.capture.aggregation import Direction

ANALYSIS_SCHEMA = 1
# A direction is busy between two of its data packets closer than this; a longer silence is an idle gap.
IDLE_GAP_S = 0.002
DEFAULT_BIN_S = 0.01
# Throughput series longer than this are re-binned coarser so a long capture keeps a bounded JSON size.
MAX_BINS = 20_000
SEGMENT_SIZE_EDGES = [1, 65, 129, 257, 513, 1025, 1449, 1501, 2897, 4097, 8193, 16385, 32769, 65536, 1 << 20]
DEFAULT_MSS = 1448
# Duplex busy runs (run_gap_s): a stream's silence ends a run when longer than CADENCE_FACTOR times the
# CADENCE_QUANTILE-th percentile gap between its bulk segments and PACING_PACKETS times their median gap,
# never beyond MAX_RUN_GAP_S, and only when CADENCE_MIN_GAPS bulk gaps give a cadence at all.
CADENCE_QUANTILE = 95
CADENCE_FACTOR = 3.0
PACING_PACKETS = 16
CADENCE_MIN_GAPS = 20
MAX_RUN_GAP_S = 0.05
# A direction with data in flight stays busy through a silence of up to this many times its 95th percentile
# data -> ACK RTT (busy.stall_limit_s); longer is a stall (a retransmission timeout, an ACK not captured).
STALL_RTT_FACTOR = 2.0


def size_histogram(sizes: np.ndarray, top: int) -> np.ndarray:
    """Data segments per SEGMENT_SIZE_EDGES bin (the last bin closed; sizes above the last edge left out), of
    sizes whose largest is top: the sizes at least each edge up to the largest, counted (a comparison per
    edge reached costs less than a binary search per segment)."""
    last = SEGMENT_SIZE_EDGES[-1]
    in_range = sizes if top <= last else sizes[sizes <= last]
    # at_least[k]: sizes >= edge k; the last entry stays 0, so the last bin holds the last edge too
    at_least = np.zeros(len(SEGMENT_SIZE_EDGES), dtype=np.int64)
    for k, edge in enumerate(SEGMENT_SIZE_EDGES[:-1]):
        if edge > top:
            break
        at_least[k] = in_range.size if edge <= 1 else np.count_nonzero(in_range >= edge)
    return at_least[:-1] - at_least[1:]


@dataclass
class Packets:
    """All files merged into one time-ordered packet table plus its TCP state: what --plot draws."""

    cols: dict[str, np.ndarray]
    state: PacketState
    conn_a: np.ndarray        # endpoint id of each connection's side "a" (sender of its first packet)
    conn_b: np.ndarray
    endpoints: list[tuple[str, int]]
    wscale: np.ndarray        # [conn, dir] -> shift, -1 unknown
    mss: np.ndarray           # [conn, dir] -> MSS announced by dir's sender in its SYN, 0 unknown
    syn_seen: np.ndarray      # [conn, dir]


def endpoint_text(endpoints: list[tuple[str, int]], index: int) -> str:
    address, port = endpoints[index]
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


# --- objects -------------------------------------------------------------------------------------


# The JSON's names of the verdict counts (source.VERDICTS), in its key order.
VERDICT_KEYS = ("retransmissions", "fast_retransmissions", "spurious_retransmissions", "out_of_order",
                "lost_segments", "dup_acks", "zero_windows", "window_full")


def _stats_ms(stats: OrderStats) -> dict[str, Any]:
    if stats.n == 0:
        return {"median": None, "p95": None, "n": 0}

    def to_ms(v: Any) -> Any:
        return v / 1e6

    return {"median": np_median(stats, to_ms), "p95": np_percentile(stats, 95, to_ms), "n": int(stats.n)}


def direction_json(out: Direction, peer: Direction, scale: int, mss_known: int, syn_seen: bool, idle_gap_s: float,
                   throughput: dict[str, Any] | None) -> dict[str, Any]:
    """One direction's object from its aggregated numbers; scale: its window scale (-1: unknown), mss_known
    (0: unknown), throughput: its series, where asked."""
    first_ts = float(np.int64(out.first_ns) / 1e9) if out.first_ns is not None else None
    last_ts = float(np.int64(out.last_ns) / 1e9) if out.last_ns is not None else None
    span = (last_ts - first_ts) if first_ts is not None and last_ts is not None else 0.0
    starts, ends = out.idle.arrays()
    active_s = float((ends - starts).sum())
    idle = out.idle.idle_gaps()
    scale_lower_bound = None
    if scale < 0 and out.in_flight.n and peer.raw_positive_max > 0:
        assert out.in_flight_max is not None
        ratio = float(out.in_flight_max) / float(peer.raw_positive_max)
        scale_lower_bound = max(0, int(np.ceil(np.log2(ratio)))) if ratio > 1 else 0
    unique = out.unique
    flight = out.in_flight
    result: dict[str, Any] = {
        "packets": out.packets,
        "data_packets": out.data_packets,
        "payload_bytes": out.payload_bytes,
        "unique_payload_bytes": unique,
        **{key: out.verdicts[k] for k, key in enumerate(VERDICT_KEYS)},
        "first_ts": first_ts,
        "last_ts": last_ts,
        "goodput_Bps": unique / span if span > 0 else 0.0,
        "active_s": active_s,
        "active_goodput_Bps": unique / active_s if active_s > 0 else 0.0,
        "rtt_ms": _stats_ms(out.rtt),
        "ts_rtt_ms": _stats_ms(out.ts_rtt),
        "idle_gaps": {"threshold_s": idle_gap_s, "count": int(idle.size), "total_s": float(idle.sum()),
                      "max_s": float(idle.max()) if idle.size else 0.0},
        "segment_sizes": {
            "edges": SEGMENT_SIZE_EDGES,
            "counts": out.segment_counts.tolist(),
            "max_bytes": out.max_size,
            "mss": mss_known or None,
            "super_segments": out.super_segments,
        },
        "window": {
            "scale": scale if scale >= 0 else None,
            "scale_lower_bound": scale_lower_bound,
            "min_bytes": out.window_min,
            "median_bytes": np_median(out.window) if out.window.n else None,
            "max_bytes": out.window_max,
            "raw_max": out.raw_max,
        },
        "bytes_in_flight": {
            "median": np_median(flight) if flight.n else None,
            "p95": np_percentile(flight, 95) if flight.n else None,
            "max": out.in_flight_max,
        },
        "acks": {"pure": out.pure_acks, "piggybacked": out.piggybacked},
        "syn_seen": syn_seen,
    }
    if throughput is not None:
        result["throughput"] = throughput
    return result


def connection_json(c: int, a: str, b: str, dirs: dict[str, Any], dup: dict[str, Any], turns: dict[str, Any],
                    tunnel: list[str] | None = None) -> dict[str, Any]:
    """One connection's object from its directions, its duplex() and its turns; tunnel: the encapsulations its
    packets came through (None: none; a and b are then the inner TCP's endpoints)."""
    return {
        "stream": c,
        "a": a,
        "b": b,
        "tunnel": tunnel,
        "directions": dirs,
        "duplex_overlap": dup["duplex_overlap"],
        "active_s": dup["active_s"],
        "overlap_s": dup["overlap_s"],
        "overlap_Bps": {"a->b": dup["x_overlap_Bps"], "b->a": dup["y_overlap_Bps"]},
        "alone_Bps": {"a->b": dup["x_alone_Bps"], "b->a": dup["y_alone_Bps"]},
        "run_gap_s": {"a->b": dup["x_gap_s"], "b->a": dup["y_gap_s"]},
        "turns": turns,
    }


def median_s(stats_ms: dict[str, Any]) -> float | None:
    """An RTT statistic's median in seconds (None when unknown or zero)."""
    median = stats_ms.get("median")
    return median / 1e3 if median else None


def host_json(address: str, tx_bytes: int, rx_bytes: int, dup: dict[str, Any], seen: bool) -> dict[str, Any]:
    """One host's object from its transmit-vs-receive duplex()."""
    return {
        "address": address,
        "tx_bytes": tx_bytes,
        "rx_bytes": rx_bytes,
        # null where the capture does not see this host's NIC: the traffic seen is only part of it
        "duplex_overlap": dup["duplex_overlap"] if seen else None,
        "nic_observed": seen,
        "seen_traffic_overlap": dup["duplex_overlap"],
        "tx_Bps_overlap": dup["x_overlap_Bps"],
        "rx_Bps_overlap": dup["y_overlap_Bps"],
        "tx_Bps_alone": dup["x_alone_Bps"],
        "rx_Bps_alone": dup["y_alone_Bps"],
        "active_s": dup["active_s"],
        "overlap_s": dup["overlap_s"],
    }


# --- phases ----------------------------------------------------------------------------------------


def phases_from_records(paths: Sequence[str | os.PathLike[str]]) -> list[dict[str, Any]]:
    """One phase per timed iteration of every record (wall-clock windows), sorted by start."""
    from diag.records import load_records

    phases = []
    for path in paths:
        for record in load_records(path).records:
            windows = record.iter_windows_ns or [[record.t_start_ns, record.t_end_ns]]
            for iteration, (start, end) in enumerate(windows):
                phases.append({
                    "backend": record.backend, "algo": record.algo, "op": record.op,
                    "world_size": record.world_size, "size_bytes": record.size_bytes,
                    "iteration": iteration if record.iter_windows_ns else None,
                    "t_start_ns": int(start), "t_end_ns": int(end),
                })
    phases.sort(key=lambda ph: ph["t_start_ns"])
    return phases


def _capture_meta(path: Path) -> dict[str, Any] | None:
    for candidate in (Path(str(path) + ".capture.json"), path.with_suffix(".capture.json")):
        if candidate.is_file():
            try:
                return json.loads(candidate.read_text())
            except (OSError, json.JSONDecodeError):
                return None
    return None


NO_PHASE_PACKETS = ("no packet falls inside any record's iteration window: were the records and the capture "
                    "made on the same machine, at the same time?")


def document(paths: Sequence[str | os.PathLike[str]], results: list[ReadResult], tcp_packets: list[int],
             connections: list[dict[str, Any]], hosts: list[dict[str, Any]], observed: set[str],
             phases_out: list[dict[str, Any]], extra_warnings: list[str], bin_s: float,
             idle_gap_s: float, omitted: dict[str, dict[str, int]] | None = None) -> dict[str, Any]:
    """The `diag analyze --json` object around the aggregations' connections, hosts and phases.

    tcp_packets: each file's TCP rows (a ReadResult read chunk by chunk holds no columns to count).
    omitted: "connections_omitted" / "hosts_omitted" where a capture has more than are listed in full
    (source.MAX_LISTED_CONNECTIONS); each follows its list."""
    warnings: list[str] = []
    files = []
    dropped_total: int | None = None
    for path, result, packets in zip(paths, results, tcp_packets, strict=True):
        meta = _capture_meta(Path(path))
        dropped = meta.get("kernel_dropped") if meta else None
        if dropped is not None:
            dropped_total = (dropped_total or 0) + int(dropped)
        files.append({"path": str(path), "format": result.file_format, "linktypes": result.linktypes,
                      "snaplen": result.snaplen, "frames": result.frames, "tcp_packets": packets,
                      "skipped": result.skipped, "capture": meta})
        warnings.extend(result.warnings)
        others = {k: v for k, v in result.skipped.items() if not k.startswith(UNSUPPORTED_LINKTYPE_PREFIX)}
        if others:  # (link types: the reader's warning names them in words)
            warnings.append(f"{path}: skipped " + ", ".join(f"{v} {SKIP_WORDS.get(k, k)}" for k, v in sorted(others.items())))
    flagged = bool(dropped_total) or any("truncated_record" in r.skipped for r in results)
    if dropped_total:
        warnings.append(f"the kernel dropped {dropped_total} packets during capture: counts are lower bounds "
                        "and retransmission/dup-ACK numbers may be wrong")
    warnings.extend(extra_warnings)
    return {
        "schema": ANALYSIS_SCHEMA,
        "files": files,
        "capture": {"kernel_dropped": dropped_total, "flagged": flagged, "packets": int(sum(tcp_packets)),
                    "frames": int(sum(r.frames for r in results))},
        "parameters": {"bin_s": bin_s, "idle_gap_s": idle_gap_s, "cadence_factor": CADENCE_FACTOR,
                       "cadence_quantile": CADENCE_QUANTILE, "pacing_packets": PACING_PACKETS,
                       "max_run_gap_s": MAX_RUN_GAP_S, "stall_rtt_factor": STALL_RTT_FACTOR,
                       "control_max_bytes": CONTROL_MAX_BYTES},
        "capture_point": sorted(observed),
        "connections": connections,
        **({"connections_omitted": omitted["connections_omitted"]}
           if omitted and "connections_omitted" in omitted else {}),
        "hosts": hosts,
        **({"hosts_omitted": omitted["hosts_omitted"]} if omitted and "hosts_omitted" in omitted else {}),
        "phases": phases_out,
        "turn_summary": summarize(phases_out),
        "warnings": warnings,
    }

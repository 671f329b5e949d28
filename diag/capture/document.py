"""The `diag analyze --json` document's writer: its parameters, and the objects of a direction, a connection,
a host and a file, built as the typed document (diag/analysisdoc.py, its one definition).

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

from diag import analysisdoc as doc
from diag.analysisdoc import ANALYSIS_SCHEMA, DIRECTIONS, Analysis, PhaseKey
from diag.capture.busy import (
    CADENCE_FACTOR,
    CADENCE_QUANTILE,
    MAX_RUN_GAP_S,
    PACING_PACKETS,
    STALL_RTT_FACTOR,
    duplex,
)
from diag.capture.pcapfile import SKIP_WORDS, UNSUPPORTED_LINKTYPE_PREFIX, ReadResult
from diag.capture.quantile import OrderStats, np_median, np_percentile
from diag.capture.tcpstate import PacketState
from diag.capture.turns import CONTROL_MAX_BYTES, summarize

if TYPE_CHECKING:
    from diag.capture.aggregation import Aggregation, Direction
# A direction is busy between two of its data packets closer than this; a longer silence is an idle gap.
IDLE_GAP_S = 0.002
DEFAULT_BIN_S = 0.01
# Throughput series longer than this are re-binned coarser so a long capture keeps a bounded JSON size.
MAX_BINS = 20_000
SEGMENT_SIZE_EDGES = [1, 65, 129, 257, 513, 1025, 1449, 1501, 2897, 4097, 8193, 16385, 32769, 65536, 1 << 20]


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


def _stats_ms(stats: OrderStats) -> doc.Stats:
    if stats.n == 0:
        return doc.Stats(None, None, 0)

    def to_ms(v: Any) -> Any:
        return v / 1e6

    return doc.Stats(np_median(stats, to_ms), np_percentile(stats, 95, to_ms), int(stats.n))


def direction_document(out: Direction, peer: Direction, scale: int, mss_known: int, syn_seen: bool,
                       idle_gap_s: float, throughput: doc.Throughput | None) -> doc.Direction:
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
    return doc.Direction(   # the verdict counts in source.VERDICTS's order, the document's retransmissions..window_full
        out.packets, out.data_packets, out.payload_bytes, unique, *out.verdicts,
        first_ts=first_ts, last_ts=last_ts, goodput_Bps=unique / span if span > 0 else 0.0, active_s=active_s,
        active_goodput_Bps=unique / active_s if active_s > 0 else 0.0,
        rtt_ms=_stats_ms(out.rtt), ts_rtt_ms=_stats_ms(out.ts_rtt),
        idle_gaps=doc.IdleGaps(idle_gap_s, int(idle.size), float(idle.sum()),
                                  float(idle.max()) if idle.size else 0.0),
        segment_sizes=doc.SegmentSizes(SEGMENT_SIZE_EDGES, out.segment_counts.tolist(), out.max_size,
                                          mss_known or None, out.super_segments),
        window=doc.Window(scale if scale >= 0 else None, scale_lower_bound, out.window_min,
                             np_median(out.window) if out.window.n else None, out.window_max, out.raw_max),
        bytes_in_flight=doc.InFlight(np_median(flight) if flight.n else None,
                                        np_percentile(flight, 95) if flight.n else None, out.in_flight_max),
        acks=doc.Acks(out.pure_acks, out.piggybacked), syn_seen=syn_seen, throughput=throughput)


def connection_document(c: int, a: str, b: str, dirs: dict[str, doc.Direction], dup: dict[str, Any],
                        turns: doc.Turns, tunnel: list[str] | None = None) -> doc.Connection:
    """One connection's object from its directions, its duplex() and its turns; tunnel: the encapsulations its
    packets came through (None: none; a and b are then the inner TCP's endpoints)."""
    return doc.Connection(
        c, a, b, tunnel, dirs, dup["duplex_overlap"], dup["active_s"], dup["overlap_s"],
        overlap_Bps={"a->b": dup["x_overlap_Bps"], "b->a": dup["y_overlap_Bps"]},
        alone_Bps={"a->b": dup["x_alone_Bps"], "b->a": dup["y_alone_Bps"]},
        run_gap_s={"a->b": dup["x_gap_s"], "b->a": dup["y_gap_s"]}, turns=turns)


def median_s(stats_ms: doc.Stats) -> float | None:
    """An RTT statistic's median in seconds (None when unknown or zero)."""
    return stats_ms.median / 1e3 if stats_ms.median else None


def host_document(address: str, tx_bytes: int, rx_bytes: int, dup: dict[str, Any], seen: bool) -> doc.Host:
    """One host's object from its transmit-vs-receive duplex(); its duplex_overlap null where the capture does
    not see its NIC (the traffic seen is only part of it)."""
    return doc.Host(address, tx_bytes, rx_bytes, dup["duplex_overlap"] if seen else None, seen,
                       dup["duplex_overlap"], dup["x_overlap_Bps"], dup["y_overlap_Bps"], dup["x_alone_Bps"],
                       dup["y_alone_Bps"], dup["active_s"], dup["overlap_s"])


# --- phases ----------------------------------------------------------------------------------------


def phases_from_records(paths: Sequence[str | os.PathLike[str]]) -> list[PhaseKey]:
    """One phase per timed iteration of every record (wall-clock windows; a trial's block: its trial and arm),
    sorted by start."""
    from diag.records import load_records

    phases = []
    for path in paths:
        for record in load_records(path).records:
            windows = record.iter_windows_ns or [[record.t_start_ns, record.t_end_ns]]
            for iteration, (start, end) in enumerate(windows):
                phases.append(PhaseKey(record.backend, record.algo, record.op, record.world_size,
                                       record.size_bytes, iteration if record.iter_windows_ns else None,
                                       int(start), int(end), extra=_block_of(record)))
    phases.sort(key=lambda ph: ph.t_start_ns)
    return phases


def _block_of(record: Any) -> dict[str, Any]:
    """A trial's block names its trial and arm in its phases (diag trial's duplex overlap per arm)."""
    return {k: record.block.get(k) for k in ("trial", "arm")} if record.block else {}


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
             connections: list[doc.Connection], hosts: list[doc.Host], observed: set[str],
             phases: list[doc.Phase], extra_warnings: list[str], bin_s: float, idle_gap_s: float,
             connections_omitted: doc.Omitted | None = None,
             hosts_omitted: doc.Omitted | None = None) -> Analysis:
    """The `diag analyze --json` document around the aggregations' connections, hosts and phases.

    tcp_packets: each file's TCP rows (a ReadResult read chunk by chunk holds no columns to count).
    connections_omitted / hosts_omitted: where a capture has more than are listed in full
    (source.MAX_LISTED_CONNECTIONS)."""
    warnings: list[str] = []
    files = []
    dropped_total: int | None = None
    for path, result, packets in zip(paths, results, tcp_packets, strict=True):
        meta = _capture_meta(Path(path))
        dropped = meta.get("kernel_dropped") if meta else None
        if dropped is not None:
            dropped_total = (dropped_total or 0) + int(dropped)
        files.append(doc.CaptureFile(str(path), result.file_format, result.linktypes, result.snaplen,
                                        result.frames, packets, result.skipped, meta))
        warnings.extend(result.warnings)
        others = {k: v for k, v in result.skipped.items() if not k.startswith(UNSUPPORTED_LINKTYPE_PREFIX)}
        if others:  # (link types: the reader's warning names them in words)
            warnings.append(f"{path}: skipped " + ", ".join(f"{v} {SKIP_WORDS.get(k, k)}" for k, v in sorted(others.items())))
    flagged = bool(dropped_total) or any("truncated_record" in r.skipped for r in results)
    if dropped_total:
        warnings.append(f"the kernel dropped {dropped_total} packets during capture: counts are lower bounds "
                        "and retransmission/dup-ACK numbers may be wrong")
    warnings.extend(extra_warnings)
    return Analysis(
        ANALYSIS_SCHEMA, files,
        doc.CaptureSummary(dropped_total, flagged, int(sum(tcp_packets)), int(sum(r.frames for r in results))),
        doc.Parameters(bin_s, idle_gap_s, CADENCE_FACTOR, CADENCE_QUANTILE, PACING_PACKETS, MAX_RUN_GAP_S,
                          STALL_RTT_FACTOR, CONTROL_MAX_BYTES),
        sorted(observed), connections, connections_omitted, hosts, hosts_omitted, phases, summarize(phases),
        warnings)


def aggregation_document(agg: Aggregation, observed: set[str] | None = None
                         ) -> tuple[list[doc.Connection], list[doc.Host]]:
    """An aggregation's connections and hosts; observed: the addresses whose NIC the capture sees (None: the
    aggregation's own capture point, for the whole capture)."""
    if agg.rows == 0:
        return [], []
    streamer, top = agg.top.streamer, agg.top
    connections = []
    for c in sorted(agg.connections):
        conn = agg.connections[c]
        t0, _t1, bin_s, _bins = agg.bins(conn)
        dirs = {}
        for d, name in enumerate(DIRECTIONS):
            series = conn.dirs[d].series
            throughput = (doc.Throughput(bin_s, t0, [round(float(v) / bin_s, 1) for v in series])
                          if top.with_series and series is not None else None)
            dirs[name] = direction_document(conn.dirs[d], conn.dirs[1 - d], int(streamer.wscale[c, d]),
                                            streamer.mss_of(c, d), bool(streamer.syn_seen[c, d]), top.idle_gap_s,
                                            throughput)
        dup = duplex(conn.dirs[0].stream, conn.dirs[1].stream)
        rtts = tuple(median_s(dirs[name].rtt_ms) for name in DIRECTIONS)
        assert conn.turns is not None
        turns = conn.turns.document((dup["x_active_s"], dup["y_active_s"]), dup["overlap_s"], dup["active_s"], rtts)
        connections.append(connection_document(c, endpoint_text(streamer.endpoints, streamer.connections.conn_a[c]),
                                               endpoint_text(streamer.endpoints, streamer.connections.conn_b[c]),
                                               dirs, dup, turns, streamer.tunnel_of(c)))
    names = streamer.addresses
    seen = agg.observed_addresses() if observed is None else observed
    hosts = [host_document(names[i], agg.hosts[i].tx.bytes, agg.hosts[i].rx.bytes,
                           duplex(agg.hosts[i].tx, agg.hosts[i].rx), names[i] in seen)
             for i in sorted(agg.hosts, key=lambda i: names[i])]
    return connections, hosts

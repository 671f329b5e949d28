"""Connections, per-direction metrics, duplex overlap, hosts and sweep phases: the `diag analyze` object.

Everything here works on the columns from reader.py and the per-packet flags from tcpstate.py. The JSON
shape is a contract with the report (see docs/analyzer.md); keys are only ever added, never renamed.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from diag.capture.reader import ACK, FIN, RST, SYN, ReadResult, read_capture
from diag.capture.tcpstate import PacketState, analyze_packets, group_order
from diag.capture.turns import CONTROL_MAX_BYTES, connection_turns, summarize

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
# Rows per block where _bytes_inside binary-searches unsorted times.
INSIDE_BLOCK = 1 << 18
# The reader's columns that the aggregation, the phases and the plots read (the TCP state pass reads all).
AGGREGATE_COLUMNS = ("ts_ns", "src", "dst", "plen", "win", "flags")


@dataclass
class Packets:
    """All files merged into one time-ordered packet table plus analysis state."""

    cols: dict[str, np.ndarray]
    state: PacketState
    conn_a: np.ndarray        # endpoint id of each connection's side "a" (sender of its first packet)
    conn_b: np.ndarray
    endpoints: list[tuple[str, int]]
    wscale: np.ndarray        # [conn, dir] -> shift, -1 unknown
    mss: np.ndarray           # [conn, dir] -> MSS announced by dir's sender in its SYN, 0 unknown
    syn_seen: np.ndarray      # [conn, dir]


def _endpoint(endpoints: list[tuple[str, int]], index: int) -> str:
    address, port = endpoints[index]
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def load_packets(paths: Sequence[str | os.PathLike[str]]) -> tuple[Packets, list[ReadResult]]:
    cols, endpoints, results = read_files(paths)
    return build_packets(cols, endpoints, results), results


def read_files(paths: Sequence[str | os.PathLike[str]]
               ) -> tuple[dict[str, np.ndarray], list[tuple[str, int]], list[ReadResult]]:
    """Every file's columns merged into one table (file order) with one endpoint numbering."""
    results: list[ReadResult] = []
    frame = 1
    for path in paths:
        result = read_capture(path, first_frame=frame)
        frame += result.frames
        results.append(result)
    if len(results) == 1:  # one file: its endpoint ids and columns are already final (no copy)
        cols, endpoints = results[0].columns, list(results[0].endpoints)
    else:
        cols, endpoints = _merge(results)
    return cols, endpoints, results


def build_packets(cols: dict[str, np.ndarray], endpoints: list[tuple[str, int]],
                  results: list[ReadResult], keep_sequence: bool = True) -> Packets:
    """Connections, directions, handshakes and the per-packet TCP state of the merged table.

    keep_sequence: keep each packet's relative sequence numbers (state.seq_rel/end_rel; only the plots
    draw them, and they are 16 bytes a packet)."""
    conn, direction, conn_a, conn_b, wscale, mss, syn_seen, first_rtt = connections(cols, endpoints, results)
    state = analyze_packets(cols, conn, direction, wscale, first_rtt, keep_sequence)
    return Packets(cols, state, conn_a, conn_b, endpoints, wscale, mss, syn_seen)


def connections(cols: dict[str, np.ndarray], endpoints: list[tuple[str, int]], results: list[ReadResult]
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray,
                           np.ndarray]:
    """(conn, direction, conn_a, conn_b, wscale, mss, syn_seen, first_rtt): everything analyze_packets needs
    besides the columns (the tests feed the same inputs to the C kernel and its numpy twin)."""
    n = cols["ts_ns"].size
    src, dst = cols["src"], cols["dst"]  # int32 endpoint ids: no int64 copies of the two columns
    first_index, conn = _pair_ids(src, dst, len(endpoints))
    if first_index.size > 1:
        # Number connections in order of first appearance, as tshark's tcp.stream does.
        rank = np.empty(first_index.size, dtype=np.int32)
        rank[np.argsort(first_index, kind="stable")] = np.arange(first_index.size)
        conn = rank[conn]
    conn = conn.astype(np.int32, copy=False)
    first_of_conn = np.sort(first_index)
    conn_a32, conn_b32 = src[first_of_conn], dst[first_of_conn]
    conn_a, conn_b = conn_a32.astype(np.int64), conn_b32.astype(np.int64)
    # int8/int32 rather than int64: these two live as long as the analysis, one entry per packet.
    if conn_a32.size == 1:  # one connection: no per-packet lookup of its first sender
        direction = (src != conn_a32[0]).astype(np.int8)
    else:
        direction = (src != conn_a32[conn]).astype(np.int8) if n else np.zeros(0, np.int8)
    del src, dst
    nconn = first_index.size
    wscale, mss, syn_seen, first_rtt = _handshakes(results, cols, conn, direction, conn_a, nconn)
    return conn, direction, conn_a, conn_b, wscale, mss, syn_seen, first_rtt


def _merge(results: list[ReadResult]) -> tuple[dict[str, np.ndarray], list[tuple[str, int]]]:
    """Several files -> one column set with shared endpoint ids, in time order (mergecap semantics)."""
    # Merge endpoints across files by (address, port).
    ids: dict[tuple[str, int], int] = {}
    parts: dict[str, list[np.ndarray]] = {name: [] for name in results[0].columns}
    for result in results:
        remap = np.array([ids.setdefault(ep, len(ids)) for ep in result.endpoints] or [0], dtype=np.int32)
        for name, column in result.columns.items():
            if name in ("src", "dst"):
                column = remap[column] if column.size else column
            parts[name].append(column)
    endpoints = list(ids)  # dicts keep insertion order, which is id order
    cols = {name: np.concatenate(values) for name, values in parts.items()}
    del parts
    order = np.argsort(cols["ts_ns"], kind="stable")  # one stream in time order (stable for equal stamps)
    return {name: values[order] for name, values in cols.items()}, endpoints


def _pair_ids(src: np.ndarray, dst: np.ndarray, nendpoints: int) -> tuple[np.ndarray, np.ndarray]:
    """(first row of each unordered endpoint pair, pair index of every row), pairs in sorted key order.

    With a modest number of endpoints the pair key indexes a table directly (linear time); otherwise
    np.unique sorts the keys.
    """
    if nendpoints == 2 and src.size and bool((src != dst).all()):
        # Two endpoints and no packet from one to itself: one connection (a capture of one flow).
        return np.zeros(1, dtype=np.int64), np.zeros(src.size, dtype=np.int32)
    low, high = np.minimum(src, dst), np.maximum(src, dst)
    if 0 < nendpoints <= 2048:
        key = low.astype(np.int32, copy=False) * np.int32(nendpoints) + high  # < 2048**2: fits int32
        present = np.zeros(nendpoints * nendpoints, dtype=bool)
        present[key] = True
        keys = np.flatnonzero(present)
        if keys.size == 1:
            return np.zeros(1, dtype=np.int64), np.zeros(key.size, dtype=np.int32)
        lookup = np.zeros(present.size, dtype=np.int32)
        lookup[keys] = np.arange(keys.size)
        conn = lookup[key]
        del key, lookup
        order = group_order(conn, keys.size)
        starts = np.flatnonzero(np.r_[True, conn[order][1:] != conn[order][:-1]])
        return order[starts].astype(np.int64), conn
    pair = low.astype(np.int64) << 32 | high
    _, first_index, conn = np.unique(pair, return_index=True, return_inverse=True)
    return first_index, conn.ravel().astype(np.int32)


def _handshakes(results: list[ReadResult], cols: dict[str, np.ndarray], conn: np.ndarray, direction: np.ndarray,
                conn_a: np.ndarray, nconn: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Window scale, MSS and handshake RTT per connection from the SYNs (RFC 7323: both must offer WS)."""
    wscale = np.full((nconn, 2), -1, dtype=np.int64)
    mss = np.zeros((nconn, 2), dtype=np.int64)
    syn_seen = np.zeros((nconn, 2), dtype=bool)
    offered: dict[tuple[int, int], int | None] = {}
    syn_time = np.zeros(nconn, dtype=np.int64)
    if not nconn:
        return wscale, mss, syn_seen, np.zeros(0, dtype=np.int64)
    frame_to_row = {}
    syn_frames = np.array([s.frame for r in results for s in r.syns], dtype=np.int64)
    if syn_frames.size:
        rows = np.flatnonzero(np.isin(cols["frame"], syn_frames))
        frame_to_row = dict(zip(cols["frame"][rows].tolist(), rows.tolist(), strict=True))
    for result in results:
        for syn in result.syns:
            row = frame_to_row.get(syn.frame)
            if row is None:
                continue
            c, d = int(conn[row]), int(direction[row])
            syn_seen[c, d] = True
            offered[(c, d)] = syn.wscale
            if syn.mss:
                mss[c, d] = syn.mss
            if not syn.flags & ACK:
                # the most recent SYN without ACK (Wireshark's ts_mru_syn is set only for a connection
                # request, never for the SYN-ACK): the handshake RTT runs from the client's SYN
                syn_time[c] = syn.ts_ns
    for c in range(nconn):
        if syn_seen[c, 0] and syn_seen[c, 1]:
            ws0, ws1 = offered.get((c, 0)), offered.get((c, 1))
            if ws0 is not None and ws1 is not None:
                wscale[c, 0], wscale[c, 1] = ws0, ws1
            else:  # one side did not offer scaling: neither direction scales
                wscale[c, 0] = wscale[c, 1] = 0
    # Handshake RTT: most recent SYN to the first non-SYN ACK after it (tshark's ts_first_rtt).
    first_rtt = np.zeros(nconn, dtype=np.int64)
    flags, ts = cols["flags"], cols["ts_ns"]
    for c in np.flatnonzero(syn_seen.all(axis=1)).tolist():
        def completes(lo: int, hi: int, c: int = c) -> np.ndarray:
            hit = ((flags[lo:hi] & ACK) != 0) & ((flags[lo:hi] & SYN) == 0) & (ts[lo:hi] >= syn_time[c])
            return hit if nconn == 1 else hit & (conn[lo:hi] == c)

        row = _first_where(ts.size, completes)
        if row >= 0:
            first_rtt[c] = int(ts[row] - syn_time[c])
    return wscale, mss, syn_seen, first_rtt


def _first_where(n: int, test: Callable[[int, int], np.ndarray]) -> int:
    """The first of rows 0..n-1 where test(lo, hi) (a boolean array for rows lo..hi-1) holds, else -1.

    Scanned in growing windows: the handshake that a test looks for is near the start of its connection,
    so the work is bounded by the distance to it, not by the capture's length."""
    lo, step = 0, 4096
    while lo < n:
        hi = min(n, lo + step)
        hit = np.flatnonzero(test(lo, hi))
        if hit.size:
            return lo + int(hit[0])
        lo, step = hi, step * 4
    return -1


# --- busy intervals --------------------------------------------------------------------------------


def busy_intervals(ts_s: np.ndarray, idle_gap_s: float) -> tuple[np.ndarray, np.ndarray]:
    """Sorted data-packet times -> (starts, ends) of busy runs (gaps <= idle_gap_s join a run)."""
    if ts_s.size == 0:
        return np.zeros(0), np.zeros(0)
    breaks = np.flatnonzero(np.diff(ts_s) > idle_gap_s)
    starts = np.concatenate([ts_s[:1], ts_s[breaks + 1]])
    ends = np.concatenate([ts_s[breaks], ts_s[-1:]])
    return starts, ends


def _coverage(lists: Sequence[tuple[np.ndarray, np.ndarray]]) -> tuple[float, float]:
    """(length covered by all lists at once, length covered by any) for disjoint sorted interval lists."""
    times = np.concatenate([np.concatenate([s, e]) for s, e in lists])
    if times.size == 0:
        return 0.0, 0.0
    steps = np.concatenate([np.concatenate([np.ones(s.size), -np.ones(e.size)]) for s, e in lists])
    order = np.lexsort((-steps, times))  # starts before ends at the same instant
    times, steps = times[order], steps[order]
    depth = np.cumsum(steps)[:-1]
    lengths = np.diff(times)
    return float(lengths[depth >= len(lists)].sum()), float(lengths[depth >= 1].sum())


def _bytes_inside(ts_s: np.ndarray, nbytes: np.ndarray, intervals: tuple[np.ndarray, np.ndarray]) -> float:
    """Sum of nbytes over the times inside any of the (disjoint, sorted, closed) intervals."""
    starts, ends = intervals
    if starts.size == 0:
        return 0.0
    if starts.size * 8 < ts_s.size and ts_s.size > 1 and bool((ts_s[1:] >= ts_s[:-1]).all()):
        # Few intervals, sorted times: each interval covers one run of the times, and a running sum of the
        # bytes gives each run's total as a difference. The byte counts are whole numbers, so every partial
        # sum is exact in float64 (below 2**53) and the total equals the sum of the selected elements.
        first = np.searchsorted(ts_s, starts, side="left")
        stop = np.searchsorted(ts_s, ends, side="right")
        running = np.empty(nbytes.size + 1)
        running[0] = 0.0
        np.cumsum(nbytes, out=running[1:])
        return float((running[stop] - running[first]).sum())
    # In blocks, so the temporaries stay small (this runs beside the connections' analysis); the byte counts
    # are whole numbers, so the blocks' float sums add up exactly to the one sum of every selected element.
    total = 0.0
    for lo in range(0, ts_s.size, INSIDE_BLOCK):
        times = ts_s[lo:lo + INSIDE_BLOCK]
        j = np.searchsorted(starts, times, side="right") - 1
        # Gather with the index clamped, then mask: boolean-compressing millions of rows twice costs more.
        inside = (j >= 0) & (times <= ends[np.maximum(j, 0)])
        total += float(nbytes[lo:lo + INSIDE_BLOCK][inside].sum())
    return total


def run_gap_s(ts_s: np.ndarray, nbytes: np.ndarray, idle_gap_s: float) -> float:
    """The silence that ends a busy run of this stream: idle_gap_s, or longer where the stream's own cadence
    says that a silence of that length is part of moving data.

    A shaped sender is bursty. tbf lets a bucket of frames go at once and then waits for tokens; and when a
    sender pauses for a moment (a full window, a thread descheduled on a loaded host), the bucket refills and
    the next frames leave as a burst: a stream that never stops moving data is silent for several packet
    times now and then -- at 20 Mbit/s with an 8-frame bucket, ~5 ms. So a silence ends a run only when it is
    longer than all of: idle_gap_s, CADENCE_FACTOR times the CADENCE_QUANTILE-th percentile gap (the
    bursts' period, when bursts are short) and PACING_PACKETS times the median gap (the time to send that
    many packets at the stream's usual pace), at most MAX_RUN_GAP_S. The gaps are those between consecutive
    bulk segments (larger than a control frame): a trickle of notices has none and keeps idle_gap_s."""
    if ts_s.size < CADENCE_MIN_GAPS + 1:
        return idle_gap_s
    bulk = nbytes > CONTROL_MAX_BYTES
    pairs = bulk[:-1] & bulk[1:]
    npairs = int(np.count_nonzero(pairs))
    if npairs < CADENCE_MIN_GAPS:
        return idle_gap_s
    gaps = np.diff(ts_s) if npairs == pairs.size else np.diff(ts_s)[pairs]
    k_median, k_cadence = (gaps.size - 1) // 2, int((gaps.size - 1) * CADENCE_QUANTILE / 100)
    gaps.partition([k_median, k_cadence])  # gaps is this function's own array: in place, no copy
    gap = max(idle_gap_s, CADENCE_FACTOR * float(gaps[k_cadence]), PACING_PACKETS * float(gaps[k_median]))
    return min(gap, MAX_RUN_GAP_S)


def duplex(ts_x: np.ndarray, bytes_x: np.ndarray, ts_y: np.ndarray, bytes_y: np.ndarray,
           idle_gap_s: float) -> dict[str, Any]:
    """Fraction of the busy time in which both streams carry data, and each one's rate overlapping vs alone.

    A stream is busy from one data packet to the next while they are no more than run_gap_s() apart; the
    result also holds each stream's busy time (x_active_s, y_active_s) and run gap (x_gap_s, y_gap_s).
    bytes_x, bytes_y: payload byte counts (whole numbers, as float64)."""
    # A host that sends and receives every data packet (one address: loopback) has one stream both ways:
    # its second half is the first one again.
    same = ts_y is ts_x and bytes_y is bytes_x
    gap_x = run_gap_s(ts_x, bytes_x, idle_gap_s)
    gap_y = gap_x if same else run_gap_s(ts_y, bytes_y, idle_gap_s)
    ix = busy_intervals(ts_x, gap_x)
    iy = ix if same else busy_intervals(ts_y, gap_y)
    both, either = _coverage([ix, iy])
    active_x, _ = _coverage([ix])
    active_y = active_x if same else _coverage([iy])[0]
    over_x = _bytes_inside(ts_x, bytes_x, iy)
    over_y = over_x if same else _bytes_inside(ts_y, bytes_y, ix)
    return duplex_result(both, either, (active_x, active_y), (over_x, over_y),
                         (float(bytes_x.sum()), float(bytes_y.sum())), (gap_x, gap_y))


def duplex_result(both: float, either: float, active: tuple[float, float], over: tuple[float, float],
                  total: tuple[float, float], gaps: tuple[float, float]) -> dict[str, Any]:
    """duplex()'s object from its parts (stream.py builds it from streamed parts): the time both and either
    stream are busy, each one's busy time, bytes sent inside the other's busy runs, bytes, and run gap."""
    (active_x, active_y), (over_x, over_y), (total_x, total_y) = active, over, total
    alone_x_s, alone_y_s = active_x - both, active_y - both
    return {
        "duplex_overlap": both / either if either > 0 else 0.0,
        "active_s": either,
        "overlap_s": both,
        "x_overlap_Bps": over_x / both if both > 0 else 0.0,
        "y_overlap_Bps": over_y / both if both > 0 else 0.0,
        "x_alone_Bps": (total_x - over_x) / alone_x_s if alone_x_s > 0 else 0.0,
        "y_alone_Bps": (total_y - over_y) / alone_y_s if alone_y_s > 0 else 0.0,
        "x_active_s": active_x,
        "y_active_s": active_y,
        "x_gap_s": gaps[0],
        "y_gap_s": gaps[1],
    }


# --- aggregation -----------------------------------------------------------------------------------


def _stats_ms(values_ns: np.ndarray) -> dict[str, Any]:
    if values_ns.size == 0:
        return {"median": None, "p95": None, "n": 0}
    ms = values_ns / 1e6
    return {"median": float(np.median(ms)), "p95": float(np.percentile(ms, 95)), "n": int(ms.size)}


def _series(ts_s: np.ndarray, weights: np.ndarray, t0: float, t1: float, bin_s: float) -> dict[str, Any]:
    bins = max(1, int(np.ceil((t1 - t0) / bin_s + 1e-9)))
    if bins > MAX_BINS:
        bin_s = (t1 - t0) / MAX_BINS
        bins = MAX_BINS
    # The same operations as np.minimum(((ts_s - t0) / bin_s).astype(np.int64), bins - 1), in place.
    scaled = np.subtract(ts_s, t0)
    np.divide(scaled, bin_s, out=scaled)
    index = scaled.astype(np.int64)
    del scaled
    np.minimum(index, bins - 1, out=index)
    counts = np.bincount(index, weights=weights, minlength=bins) if ts_s.size else np.zeros(bins)
    return {"bin_s": bin_s, "t0": t0, "Bps": [round(float(v) / bin_s, 1) for v in counts]}


def _count(flag: np.ndarray, rows: np.ndarray) -> int:
    """How many of rows have flag set; count_nonzero on the gathered bools is several times faster than sum."""
    return int(np.count_nonzero(flag[rows]))


def _histogram(values: np.ndarray, edges: list[int]) -> list[int]:
    """np.histogram's counts (last bin closed) for non-negative integer values below ~1 MiB: one count per
    value (bincount), then summed per bin - linear time, no sort or binary search per value."""
    per_value = np.bincount(values, minlength=edges[-1] + 1)
    # reduceat's last bin runs to the end of the slice, so it includes the closing edge as np.histogram does.
    return np.add.reduceat(per_value[:edges[-1] + 1], edges[:-1]).tolist()


def _direction(p: Packets, rows: np.ndarray, rev_rows: np.ndarray, c: int, d: int, t0: float, t1: float,
               bin_s: float, idle_gap_s: float, with_series: bool, whole: bool = False
               ) -> tuple[dict[str, Any], np.ndarray, np.ndarray]:
    """The direction's JSON object, and its data packets' times (s) and payload bytes (float), which the
    connection's duplex and turn analysis use next. whole: rows are all of the direction's packets (not
    one phase's)."""
    cols, st = p.cols, p.state
    ts_ns = cols["ts_ns"]
    plen = cols["plen"][rows]  # int32: its sum accumulates in int64 all the same
    flags = cols["flags"][rows]
    data = plen > 0
    unique = int(st.new_bytes[rows].sum())
    # Seconds only for the first and last packet and the data packets: no float copy of every row.
    first_ts = float(ts_ns[rows[0]] / 1e9) if rows.size else None
    last_ts = float(ts_ns[rows[-1]] / 1e9) if rows.size else None
    span = (last_ts - first_ts) if first_ts is not None and last_ts is not None else 0.0
    data_rows = rows[data]
    data_ts = ts_ns[data_rows] / 1e9
    starts, ends = busy_intervals(data_ts, idle_gap_s)
    active_s = float((ends - starts).sum())
    gaps = np.diff(data_ts)
    idle = gaps[gaps > idle_gap_s]
    del gaps  # each array of millions of rows is freed once used: they add up to the analysis's peak memory
    sizes = plen[data]
    payload_bytes = int(plen.sum())
    del plen
    mss = int(p.mss[c, d]) or DEFAULT_MSS
    # RTT samples measure this direction's data: ACK RTTs are attributed to the ACKing (reverse) packets.
    if not whole or np.any(data):
        ack_rtt = st.ack_rtt_ns[rev_rows]
        rtt_ms = _stats_ms(ack_rtt[ack_rtt >= 0])
        del ack_rtt
    else:  # an ACK RTT measures a data segment: a direction that never sent data has none (no gather)
        rtt_ms = _stats_ms(np.zeros(0, dtype=np.int64))
    ts_rtt = st.ts_rtt_ns[rev_rows]
    ts_rtt_ms = _stats_ms(ts_rtt[ts_rtt >= 0])
    del ts_rtt
    not_syn = (flags & SYN) == 0
    every = bool(not_syn.all())  # no SYN among the rows (the usual case): no compress
    win_sent = st.window_bytes[rows] if every else st.window_bytes[rows][not_syn]
    # min and max first: the median then partitions this copy in place
    window_stats = ((int(win_sent.min()), float(np.median(win_sent, overwrite_input=True)), int(win_sent.max()))
                    if win_sent.size else (None, None, None))
    del win_sent
    # Bytes in flight are defined on data packets only (-1 elsewhere, and where no ACK came back yet).
    in_flight = st.in_flight[data_rows]
    del data_rows
    in_flight = in_flight[in_flight >= 0]
    scale = int(p.wscale[c, d])
    raw_win = cols["win"][rows] if every else cols["win"][rows][not_syn]
    raw_max = int(raw_win.max()) if raw_win.size else None
    del raw_win
    # The receiver's window advertised to this direction bounds its in-flight bytes: when the SYNs were
    # missed, the smallest shift that makes the largest in-flight fit is a lower bound on the peer's scale.
    scale_lower_bound = None
    if scale < 0 and in_flight.size:
        rev_raw = cols["win"][rev_rows]
        rev_raw = rev_raw[rev_raw > 0]
        if rev_raw.size:
            ratio = float(in_flight.max()) / float(rev_raw.max())
            scale_lower_bound = max(0, int(np.ceil(np.log2(ratio)))) if ratio > 1 else 0
    in_flight_max = int(in_flight.max()) if in_flight.size else None
    # in_flight is this function's own copy: partitioned in place rather than copied twice more
    in_flight_median = float(np.median(in_flight, overwrite_input=True)) if in_flight.size else None
    in_flight_p95 = float(np.percentile(in_flight, 95, overwrite_input=True)) if in_flight.size else None
    del in_flight
    out: dict[str, Any] = {
        "packets": int(rows.size),
        "data_packets": int(np.count_nonzero(data)),
        "payload_bytes": payload_bytes,
        "unique_payload_bytes": unique,
        "retransmissions": _count(st.retransmission, rows),
        "fast_retransmissions": _count(st.fast_retransmission, rows),
        "spurious_retransmissions": _count(st.spurious_retransmission, rows),
        "out_of_order": _count(st.out_of_order, rows),
        "lost_segments": _count(st.lost_segment, rows),
        "dup_acks": _count(st.dup_ack, rows),
        "zero_windows": _count(st.zero_window, rows),
        "window_full": _count(st.window_full, rows),
        "first_ts": first_ts,
        "last_ts": last_ts,
        "goodput_Bps": unique / span if span > 0 else 0.0,
        "active_s": active_s,
        "active_goodput_Bps": unique / active_s if active_s > 0 else 0.0,
        "rtt_ms": rtt_ms,
        "ts_rtt_ms": ts_rtt_ms,
        "idle_gaps": {"threshold_s": idle_gap_s, "count": int(idle.size), "total_s": float(idle.sum()),
                      "max_s": float(idle.max()) if idle.size else 0.0},
        "segment_sizes": {
            "edges": SEGMENT_SIZE_EDGES,
            "counts": _histogram(sizes, SEGMENT_SIZE_EDGES) if sizes.size and sizes.min() >= 0 else
            np.histogram(sizes, bins=SEGMENT_SIZE_EDGES)[0].tolist() if sizes.size else
            [0] * (len(SEGMENT_SIZE_EDGES) - 1),
            "max_bytes": int(sizes.max()) if sizes.size else 0,
            "mss": int(p.mss[c, d]) or None,
            "super_segments": int((sizes > mss).sum()),
        },
        "window": {
            "scale": scale if scale >= 0 else None,
            "scale_lower_bound": scale_lower_bound,
            "min_bytes": window_stats[0],
            "median_bytes": window_stats[1],
            "max_bytes": window_stats[2],
            "raw_max": raw_max,
        },
        "bytes_in_flight": {
            "median": in_flight_median,
            "p95": in_flight_p95,
            "max": in_flight_max,
        },
        "acks": {
            "pure": int((((flags & ACK) != 0) & ~data & ((flags & (SYN | FIN | RST)) == 0)).sum()),
            "piggybacked": int((((flags & ACK) != 0) & data).sum()),
        },
        "syn_seen": bool(p.syn_seen[c, d]),
    }
    data_bytes = sizes.astype(np.float64)
    if with_series:
        out["throughput"] = _series(data_ts, data_bytes, t0, t1, bin_s)
    return out, data_ts, data_bytes


def aggregate(p: Packets, rows: np.ndarray, bin_s: float, idle_gap_s: float,
              with_series: bool = True, hosts: list[dict[str, Any]] | None = None,
              window: tuple[float, float] | None = None, observed: set[str] | None = None
              ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Connections and hosts over the packet rows given (time order); ``hosts`` if already computed.

    ``window``: the repetition's wall-clock window (seconds) when the rows are one phase; ``observed``: the
    addresses whose NIC the capture sees (capture_point(); None: judged from these rows)."""
    st = p.state
    if rows.size == 0:
        return [], []
    whole = rows.size == st.conn.size  # rows are sorted and unique: all of them
    groups = (_rows_by_direction(st.conn, st.direction, rows) if whole
              else _rows_by_direction(st.conn[rows], st.direction[rows], rows))
    connections = []
    empty = np.zeros(0, dtype=np.int64)
    # Hosts need only the columns: they run on a second core while the connections are computed here
    # (numpy releases the GIL in the bulk work, so two threads nearly halve the wall time on two cores).
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="diag-hosts") as pool:
        hosts_future = (pool.submit(_hosts, p.cols, p.endpoints, rows, idle_gap_s, observed)
                        if hosts is None else None)
        for c in sorted({k // 2 for k in groups}):
            connections.append(_connection(p, c, groups.get(2 * c, empty), groups.get(2 * c + 1, empty),
                                           bin_s, idle_gap_s, with_series, window, whole))
        return connections, hosts if hosts_future is None else hosts_future.result()


def _rows_by_direction(conn: np.ndarray, direction: np.ndarray, rows: np.ndarray) -> dict[int, np.ndarray]:
    """(connection * 2 + direction) -> its rows, in time order: a stable counting/radix order of one key,
    or for a few connections one scan per direction (no permutation of every row, no key copies)."""
    ndirections = 2 * (int(conn.max()) + 1)
    if ndirections <= 8:
        whole = rows.size == 0 or (int(rows[0]) == 0 and int(rows[-1]) == rows.size - 1)  # rows = 0..n-1
        found = {}
        for key in range(ndirections):
            same = direction == key % 2
            hit = np.flatnonzero(same if ndirections == 2 else same & (conn == key // 2))
            if hit.size:
                found[key] = hit if whole else rows[hit]
        return found
    row_key = conn.astype(np.int64) * 2 + direction
    order = group_order(row_key, ndirections)
    sorted_rows = rows[order]
    key = row_key[order]
    del row_key
    bounds = np.flatnonzero(np.diff(key)) + 1
    return {int(key[s]): sorted_rows[s:e] for s, e in zip(np.r_[0, bounds], np.r_[bounds, key.size], strict=True)}


def _connection(p: Packets, c: int, ab: np.ndarray, ba: np.ndarray, bin_s: float, idle_gap_s: float,
                with_series: bool, window: tuple[float, float] | None = None, whole: bool = False
                ) -> dict[str, Any]:
    cols = p.cols
    # min/max of the int64 nanoseconds, then seconds: no float copy of every timestamp
    t0 = float(min(cols["ts_ns"][ab].min(initial=np.iinfo(np.int64).max),
                   cols["ts_ns"][ba].min(initial=np.iinfo(np.int64).max))) / 1e9
    t1 = float(max(cols["ts_ns"][ab].max(initial=np.iinfo(np.int64).min),
                   cols["ts_ns"][ba].max(initial=np.iinfo(np.int64).min))) / 1e9
    a_to_b, x_ts, x_b = _direction(p, ab, ba, c, 0, t0, t1, bin_s, idle_gap_s, with_series, whole)
    b_to_a, y_ts, y_b = _direction(p, ba, ab, c, 1, t0, t1, bin_s, idle_gap_s, with_series, whole)
    dirs = {"a->b": a_to_b, "b->a": b_to_a}
    dup = duplex(x_ts, x_b, y_ts, y_b, idle_gap_s)
    gaps = (dup["x_gap_s"], dup["y_gap_s"])
    rtts = (median_s(a_to_b["rtt_ms"]), median_s(b_to_a["rtt_ms"]))
    turns = connection_turns((x_ts, y_ts), (x_b, y_b), (dup["x_active_s"], dup["y_active_s"]), dup["overlap_s"],
                             dup["active_s"], gaps, rtts, window)
    return connection_json(c, _endpoint(p.endpoints, int(p.conn_a[c])), _endpoint(p.endpoints, int(p.conn_b[c])),
                           dirs, dup, turns)


def connection_json(c: int, a: str, b: str, dirs: dict[str, Any], dup: dict[str, Any], turns: dict[str, Any]
                    ) -> dict[str, Any]:
    """One connection's object from its directions, duplex() and turns (in memory here, or streamed)."""
    return {
        "stream": c,
        "a": a,
        "b": b,
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


def capture_point(cols: dict[str, np.ndarray], endpoints: list[tuple[str, int]]) -> set[str]:
    """Addresses whose NIC the capture sees: those that send or receive every TCP packet captured.

    A capture on one host's interface holds only that host's traffic, so its address is in every packet; a
    host seen only through its traffic with that one (a ring neighbour at N>=3) may send and receive much
    more elsewhere, and its transmit-vs-receive overlap here says nothing about its NIC. With only two
    addresses in the capture both qualify: the capture cannot tell one end of the link from the other."""
    src, dst = cols["src"], cols["dst"]
    if src.size == 0:
        return set()
    # Only the first packet's two addresses can be in every packet: one table lookup per packet for each.
    seen = set()
    for address in {endpoints[int(src[0])][0], endpoints[int(dst[0])][0]}:
        has = np.array([a == address for a, _port in endpoints], dtype=bool)
        if bool(np.all(has[src] | has[dst])):
            seen.add(address)
    return seen


def _hosts(cols: dict[str, np.ndarray], endpoints: list[tuple[str, int]], rows: np.ndarray,
           idle_gap_s: float, observed: set[str] | None = None) -> list[dict[str, Any]]:
    """Per address: its transmit vs receive over all its connections (rows are in time order).

    Needs only the reader's columns, so analyze() runs it beside the TCP state machine. ``observed``: the
    addresses whose NIC the capture sees (capture_point); None: judged from these rows."""
    whole = rows.size == cols["src"].size  # rows = 0..n-1 (they are sorted and unique)
    # Over the whole capture a boolean mask selects the data packets: no index array of every packet.
    data: np.ndarray = cols["plen"] > 0 if whole else rows[cols["plen"][rows] > 0]
    if observed is None:
        observed = capture_point(cols if whole else {"src": cols["src"][rows], "dst": cols["dst"][rows]}, endpoints)
    # Integer address ids per endpoint, so the per-packet work is integer compares, not string objects.
    names = sorted({address for address, _port in endpoints})
    address_id = {address: i for i, address in enumerate(names)}
    endpoint_address = np.array([address_id[address] for address, _port in endpoints] or [0], dtype=np.int32)
    ts_s = cols["ts_ns"][data] / 1e9
    plen = cols["plen"][data].astype(np.float64)
    hosts = []
    one_address = len(names) == 1  # loopback: the one host sends and receives every data packet
    if one_address:
        present = np.zeros(1 if ts_s.size else 0, dtype=np.int64)
    else:
        src_addr = endpoint_address[cols["src"][data]]
        dst_addr = endpoint_address[cols["dst"][data]]
        counts = np.bincount(src_addr, minlength=len(names)) + np.bincount(dst_addr, minlength=len(names))
        present = np.flatnonzero(counts) if ts_s.size else np.zeros(0, np.int64)
    del data
    for index in present.tolist():
        if one_address:
            tx_ts, tx_plen = rx_ts, rx_plen = ts_s, plen
        else:
            tx, rx = src_addr == index, dst_addr == index
            # A host that sends and receives every data packet needs no copies.
            tx_ts, tx_plen = (ts_s, plen) if tx.all() else (ts_s[tx], plen[tx])
            rx_ts, rx_plen = (ts_s, plen) if rx.all() else (ts_s[rx], plen[rx])
        dup = duplex(tx_ts, tx_plen, rx_ts, rx_plen, idle_gap_s)
        hosts.append(host_json(names[index], int(tx_plen.sum()), int(rx_plen.sum()), dup, names[index] in observed))
    return hosts


def host_json(address: str, tx_bytes: int, rx_bytes: int, dup: dict[str, Any], seen: bool) -> dict[str, Any]:
    """One host's object from its transmit-vs-receive duplex() (in memory here, or streamed)."""
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


def analyze_files(paths: Sequence[str | os.PathLike[str]], records: Sequence[str | os.PathLike[str]] | None = None,
                  bin_s: float = DEFAULT_BIN_S, idle_gap_s: float = IDLE_GAP_S,
                  with_series: bool = True) -> dict[str, Any]:
    """The `diag analyze --json` object for these capture files (and sweep phases from records)."""
    return analyze(paths, records, bin_s, idle_gap_s, with_series, keep_sequence=False)[0]


def analyze(paths: Sequence[str | os.PathLike[str]], records: Sequence[str | os.PathLike[str]] | None = None,
            bin_s: float = DEFAULT_BIN_S, idle_gap_s: float = IDLE_GAP_S,
            with_series: bool = True, keep_sequence: bool = True) -> tuple[dict[str, Any], Packets | None]:
    """analyze_files plus the packet table (for plots; keep_sequence=False leaves out the relative
    sequence numbers, which only the plots draw)."""
    from diag.errors import DiagError

    if not paths:
        raise DiagError("give at least one capture file")
    if bin_s <= 0 or idle_gap_s <= 0:
        raise DiagError("--bin and --idle-gap must be positive seconds")
    if not keep_sequence:
        from diag.capture import stream

        if stream.should_stream(paths):
            try:
                return stream.analyze_streaming(paths[0], records, bin_s, idle_gap_s, with_series), None
            except stream.Fallback as why:  # this file cannot be streamed to the same result
                import sys

                print(f"diag analyze: {paths[0]}: {why}, so it is analyzed in memory (~170 bytes a packet)",
                      file=sys.stderr)
    cols, endpoints, results = read_files(paths)
    n = cols["ts_ns"].size
    rows = np.arange(n)
    packets = build_packets(cols, endpoints, results, keep_sequence)
    # The TCP state is settled: the aggregation and the plots read only AGGREGATE_COLUMNS; the rest (a third
    # of the columns' bytes) is freed before the aggregation's temporaries are made.
    for name in [name for name in packets.cols if name not in AGGREGATE_COLUMNS]:
        del packets.cols[name]
    del cols
    # The hosts (they need only the columns) are computed by aggregate on a second core beside the
    # connections, not beside the TCP state machine: there their temporaries added ~140 MB to the peak.
    connections, hosts = aggregate(packets, rows, bin_s, idle_gap_s, with_series)
    observed = {host["address"] for host in hosts if host["nic_observed"]}
    phases_out = []
    extra_warnings = []
    if records:
        phases = phases_from_records(records)
        ts = packets.cols["ts_ns"]
        sorted_ts = np.all(np.diff(ts) >= 0) if n > 1 else True
        order = rows if sorted_ts else np.argsort(ts, kind="stable")
        ts_sorted = ts[order]
        attributed = 0
        for phase in phases:
            lo = np.searchsorted(ts_sorted, phase["t_start_ns"], side="left")
            hi = np.searchsorted(ts_sorted, phase["t_end_ns"], side="right")
            sub = np.sort(order[lo:hi])
            attributed += int(sub.size)
            window = (phase["t_start_ns"] / 1e9, phase["t_end_ns"] / 1e9)
            conns, hs = aggregate(packets, sub, bin_s, idle_gap_s, with_series, window=window, observed=observed)
            phases_out.append({"phase": phase, "packets": int(sub.size), "connections": conns, "hosts": hs})
        if phases and attributed == 0 and n:
            extra_warnings.append(NO_PHASE_PACKETS)
    out = document(paths, results, [r.packets for r in results], connections, hosts, observed, phases_out,
                   extra_warnings, bin_s, idle_gap_s)
    if not keep_sequence:
        from diag.capture import stream

        if stream.mode() == "check" and stream.can_stream(paths):
            stream.check(out, paths[0], records, bin_s, idle_gap_s, with_series)
    return out, packets


NO_PHASE_PACKETS = ("no packet falls inside any record's iteration window: were the records and the capture "
                    "made on the same machine, at the same time?")


def document(paths: Sequence[str | os.PathLike[str]], results: list[ReadResult], tcp_packets: list[int],
             connections: list[dict[str, Any]], hosts: list[dict[str, Any]], observed: set[str],
             phases_out: list[dict[str, Any]], extra_warnings: list[str], bin_s: float,
             idle_gap_s: float) -> dict[str, Any]:
    """The `diag analyze --json` object around the aggregations (in memory here, or stream.py's).

    tcp_packets: each file's TCP rows (a streamed ReadResult holds no columns to count)."""
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
        if result.skipped:
            warnings.append(f"{path}: skipped " + ", ".join(f"{v} {k}" for k, v in sorted(result.skipped.items())))
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
                       "max_run_gap_s": MAX_RUN_GAP_S,
                       "control_max_bytes": CONTROL_MAX_BYTES},
        "capture_point": sorted(observed),
        "connections": connections,
        "hosts": hosts,
        "phases": phases_out,
        "turn_summary": summarize(phases_out),
        "warnings": warnings,
    }

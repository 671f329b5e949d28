"""A stream of data packets (a direction, or a host's transmit or receive) and its busy runs: the duplex
overlap of two streams (definitions, with the figures behind them: docs/analyzer.md, "Duplex overlap").

A stream is busy from one event to the next while they are at most its run gap apart: idle_gap_s, or longer
where its own cadence says such a silence is part of moving data (a shaped sender is bursty): longer than
all of idle_gap_s, CADENCE_FACTOR times the CADENCE_QUANTILE-th percentile gap between consecutive bulk
segments and PACING_PACKETS times their median gap, at most MAX_RUN_GAP_S. A direction's events are those of
its flight (its data packets, and the peer's ACKs of new bytes of it: flight_events); its runs also go on
across a longer silence with data in flight, up to the stall limit (stall_limit_s), and each lasts until its
sender has the ACK (round_trip_s added), so that where the capture is taken does not matter. A host's
transmit and receive are busy while its data passes, and while a connection direction it sends (receives)
is busy. Fed chunk by chunk by the passes (source.Pass), in file order.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from diag.capture.quantile import OrderStats, np_median, np_percentile
from diag.capture.source import Pass
from diag.capture.turns import CONTROL_MAX_BYTES
from diag.units import ETHERNET_MSS

DEFAULT_MSS = ETHERNET_MSS   # a direction whose SYN was not captured
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


def coverage(lists: Sequence[tuple[np.ndarray, np.ndarray]]) -> tuple[float, float]:
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


def union(lists: Sequence[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """The disjoint sorted intervals covered by any of the interval lists (touching intervals merge)."""
    starts = np.concatenate([s for s, _ in lists])
    ends = np.concatenate([e for _, e in lists])
    if starts.size == 0:
        return np.zeros(0), np.zeros(0)
    order = np.argsort(starts, kind="stable")
    starts, reach = starts[order], np.maximum.accumulate(ends[order])
    first = np.flatnonzero(np.r_[True, starts[1:] > reach[:-1]])
    return starts[first], reach[np.r_[first[1:] - 1, starts.size - 1]]


def stall_limit_s(run_gap_s: float, rtt_p95_s: float | None, round_trip: float = 0.0) -> float:
    """The longest silence a direction with data in flight is still busy through: STALL_RTT_FACTOR times its
    path's RTT -- the 95th percentile of its data -> ACK RTT at the capture point plus the round trip from
    there to its sender (round_trip_s) --, never less than its run gap. A sender whose data moves hears an
    ACK of new data within about one RTT of sending (upstream of a bottleneck that RTT holds the queueing
    delay); twice the RTT is where its tail loss probe fires (RFC 8985) and below its retransmission timeout
    (at least 200 ms on Linux)."""
    path_rtt = (rtt_p95_s or 0.0) + round_trip
    return max(run_gap_s, STALL_RTT_FACTOR * path_rtt)


def round_trip_s(toward_sender: Sequence[OrderStats]) -> float:
    """The round trip from the capture point to a direction's sender and back, in seconds: the smallest
    median of the given RTTs of packets toward the sender answered by it (the reverse direction's data ->
    ACK RTT and its TSval -> echo RTT at the capture point, in ns); 0 when none is known."""
    medians = [np_median(stats) for stats in toward_sender if stats.n]
    return min(medians) / 1e9 if medians else 0.0


def p95_s(stats: OrderStats) -> float | None:
    """The 95th percentile of ns values in seconds (None without values)."""
    return np_percentile(stats, 95) / 1e9 if stats.n else None


Flying = Callable[[np.ndarray], np.ndarray]


def flight_events(ts_ns: np.ndarray, in_flight: np.ndarray, own_data: np.ndarray, acks: np.ndarray,
                  acked_flight: np.ndarray) -> tuple[np.ndarray, Flying]:
    """The events of one direction's flight among a chunk's rows, in file order: its data packets (rows
    own_data, whose in_flight the chunk's TCP state holds) and the peer's ACKs of new bytes of it (rows acks,
    with the flight each left: the state's peer_in_flight).
    -> (their times in seconds, flying(indexes): whether data was in flight after those events). Only the
    events before a silence longer than the run gap are asked (a few), so the flight is looked up only for
    them; flying reads this chunk's state, so it is used before the next chunk."""
    if not acks.size:
        return ts_ns[own_data] / 1e9, lambda at: in_flight[own_data[at]] != 0  # -1 (unknown) counts as flying
    merged = np.concatenate([own_data, acks])
    order = np.argsort(merged, kind="stable")  # two sorted runs: a merge

    def flying(at: np.ndarray) -> np.ndarray:
        which = order[at]
        ack = which >= own_data.size
        out = np.empty(which.size, dtype=bool)
        out[ack] = acked_flight[which[ack] - own_data.size] != 0
        out[~ack] = in_flight[own_data[which[~ack]]] != 0
        return out

    return ts_ns[merged[order]] / 1e9, flying


def duplex_result(both: float, either: float, active: tuple[float, float], over: tuple[float, float],
                  total: tuple[float, float], gaps: tuple[float, float]) -> dict[str, Any]:
    """duplex()'s object from its parts: the time both and either stream are busy, each one's busy time,
    bytes sent inside the other's busy runs, bytes, and run gap."""
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


def _gaps(previous: float | None, ts: np.ndarray) -> np.ndarray:
    """np.diff of previous and ts (the gap before each time; None: between ts's times only), without copying
    ts behind previous first."""
    if previous is None:
        return np.diff(ts)
    gaps = np.empty(ts.size)
    gaps[0] = ts[0] - previous
    np.subtract(ts[1:], ts[:-1], out=gaps[1:])
    return gaps


class BusyRuns:
    """Busy runs (starts, ends) of times in file order at a fixed gap, built chunk by chunk; with keep_gaps
    also the silences that end them. Times given with whether data was in flight after each (add's flying)
    also note, per silence, whether data was in flight across it: arrays(stall_s) then joins the runs across
    such silences of at most stall_s."""

    def __init__(self, gap: float, keep_gaps: bool = False) -> None:
        self.gap = gap
        self.starts: list[np.ndarray] = []
        self.ends: list[np.ndarray] = []
        self.idle: list[np.ndarray] = []
        self.flying: list[np.ndarray] = []  # per silence: data in flight across it (times given with flying)
        self.keep_gaps = keep_gaps
        self.last: float | None = None
        self.last_flying = False

    def add(self, ts: np.ndarray, flying: Flying | None = None) -> None:
        """ts: times in file order; flying: whether data was in flight after the events at given indexes."""
        if ts.size == 0:
            return
        if self.last is None:
            self.starts.append(ts[:1])
        gaps = _gaps(self.last, ts)
        breaks = np.flatnonzero(gaps > self.gap)
        if breaks.size:
            after = breaks if self.last is not None else breaks + 1  # the time after each break
            ends = ts[np.maximum(after - 1, 0)]
            if after[0] == 0:
                ends[0] = self.last
            self.ends.append(ends)
            self.starts.append(ts[after])
            if self.keep_gaps:
                self.idle.append(gaps[breaks])
            if flying is not None:  # the event before each silence: base[k] (the last one carried over)
                if self.last is None:
                    self.flying.append(flying(breaks))
                else:
                    flags = np.full(breaks.size, self.last_flying)
                    inside = breaks >= 1
                    flags[inside] = flying(breaks[inside] - 1)
                    self.flying.append(flags)
        self.last = float(ts[-1])
        if flying is not None:
            self.last_flying = bool(flying(np.array([ts.size - 1]))[0])

    def arrays(self, stall_s: float | None = None) -> tuple[np.ndarray, np.ndarray]:
        if self.last is None:
            return np.zeros(0), np.zeros(0)
        starts = np.concatenate(self.starts)
        ends = np.concatenate([*self.ends, np.array([self.last])])
        if stall_s is not None and self.flying:
            flying = np.concatenate(self.flying)
            keep = ~(flying & (starts[1:] - ends[:-1] <= stall_s))  # a silence in flight and short: one run
            starts, ends = starts[np.r_[True, keep]], ends[np.r_[keep, True]]
        return starts, ends

    def idle_gaps(self) -> np.ndarray:
        return np.concatenate(self.idle) if self.idle else np.zeros(0)


class DataStream:
    """The data packets of one direction, or one host's transmit or receive."""

    def __init__(self, idle_gap_s: float, mss: int = DEFAULT_MSS) -> None:
        self.idle_gap_s = idle_gap_s
        self.mss = max(int(mss), 1)
        self._last_segments = 1
        self.n = 0
        self.bytes = 0
        self.pairs = 0
        self.gaps = OrderStats(np.float64)
        self._last_ts: float | None = None
        self._last_bulk = False
        self.run_gap = idle_gap_s
        self.runs: BusyRuns | None = None
        self.intervals: tuple[np.ndarray, np.ndarray] = (np.zeros(0), np.zeros(0))
        self.intervals_ordered = True  # each run starts after the one before ended (add_overlap's fast path)
        self.bytes_inside_other = 0

    def _bulk_gaps(self, ts: np.ndarray, nbytes: np.ndarray, mss: np.ndarray | None = None) -> np.ndarray:
        """The gaps after bulk segments followed by bulk segments, per wire segment: a super-segment (TSO/GSO
        on the sender's side, GRO on the receiver's) stands for the k = size / MSS segments it is cut into,
        and the gap after it for k gaps of a k-th of it. (Without that, a sender-side capture of 64 KiB
        messages sent as one super-segment and a tail segment each read a ping-pong's period as its
        cadence: a 50 ms run gap that joined the turns.) mss: each packet's connection's (a host's streams
        carry several), else the stream's own. Segments per packet: 1 unless the chunk holds a super-segment."""
        bulk = nbytes > CONTROL_MAX_BYTES
        limit = self.mss if mss is None else mss
        supers = int(nbytes.max()) > limit if mss is None else bool(np.any(nbytes > mss))
        segments = (nbytes + (limit - 1)) // limit if supers else None
        gaps = _gaps(self._last_ts, ts)
        if self._last_ts is None:
            pairs = bulk[:-1] & bulk[1:]
        else:
            pairs = np.empty(bulk.size, dtype=bool)
            pairs[0] = self._last_bulk and bool(bulk[0])
            np.logical_and(bulk[:-1], bulk[1:], out=pairs[1:])
        gaps = gaps[pairs]
        if supers or self._last_segments > 1:
            every = np.ones(ts.size, dtype=np.int64) if segments is None else segments
            before = every[:-1] if self._last_ts is None else np.concatenate([[self._last_segments], every[:-1]])
            before = before[pairs]
            gaps = np.repeat(gaps / before, before)
        self._last_ts, self._last_bulk = float(ts[-1]), bool(bulk[-1])
        self._last_segments = int(segments[-1]) if segments is not None else 1
        return gaps

    def count(self, ts: np.ndarray, nbytes: np.ndarray, mss: np.ndarray | None = None) -> None:
        if ts.size == 0:
            return
        self.n += int(ts.size)
        self.bytes += int(nbytes.sum())
        gaps = self._bulk_gaps(ts, nbytes, mss)
        self.pairs += int(gaps.size)
        self.gaps.add(gaps)

    def plan(self) -> None:
        """After Pass.COUNTS: the ranks of the bulk gaps whose values set the run gap."""
        self._last_ts = None
        if self.n >= CADENCE_MIN_GAPS + 1 and self.pairs >= CADENCE_MIN_GAPS:
            m = self.pairs
            self.gaps.want([(m - 1) // 2, int((m - 1) * CADENCE_QUANTILE / 100)])

    def collect_gaps(self, ts: np.ndarray, nbytes: np.ndarray, mss: np.ndarray | None = None) -> None:
        if ts.size and self.n >= CADENCE_MIN_GAPS + 1 and self.pairs >= CADENCE_MIN_GAPS:
            self.gaps.collect(self._bulk_gaps(ts, nbytes, mss))

    def settle_gap(self) -> None:
        """After Pass.CADENCE: the run gap (see the module docstring)."""
        if self.n < CADENCE_MIN_GAPS + 1 or self.pairs < CADENCE_MIN_GAPS:
            self.run_gap = self.idle_gap_s
        else:
            m = self.pairs
            median = self.gaps.value((m - 1) // 2)
            cadence = self.gaps.value(int((m - 1) * CADENCE_QUANTILE / 100))
            gap = max(self.idle_gap_s, CADENCE_FACTOR * float(cadence), PACING_PACKETS * float(median))
            self.run_gap = min(gap, MAX_RUN_GAP_S)
        self.gaps = OrderStats(np.float64)  # its counts are no longer needed
        self.runs = BusyRuns(self.run_gap)

    def add_runs(self, ts: np.ndarray, flying: Flying | None = None) -> None:
        """Pass.RUNS: the stream's events (data packets; for a direction, the events of its flight and
        whether data was in flight after them: flight_events)."""
        assert self.runs is not None
        self.runs.add(ts, flying)

    def settle_runs(self, stall_s: float | None = None, round_trip: float = 0.0) -> None:
        """After Pass.RUNS: the busy runs, joined across silences with data in flight up to stall_s, each
        until its sender has the ACK: round_trip (round_trip_s) after its end."""
        assert self.runs is not None
        intervals = self.runs.arrays(stall_s)
        self.runs = None
        if round_trip > 0 and intervals[0].size:
            intervals = union([(intervals[0], intervals[1] + round_trip)])
        self._set_intervals(intervals)

    def join(self, others: Sequence[tuple[np.ndarray, np.ndarray]]) -> None:
        """Busy also where the given busy runs are (a host: while its connection directions are)."""
        if others:
            self._set_intervals(union([self.intervals, *others]))

    def _set_intervals(self, intervals: tuple[np.ndarray, np.ndarray]) -> None:
        self.intervals = intervals
        starts, ends = intervals
        self.intervals_ordered = bool(np.all(starts[1:] > ends[:-1]) and np.all(ends >= starts))

    def add_overlap(self, ts: np.ndarray, nbytes: np.ndarray, other: DataStream) -> None:
        starts, ends = other.intervals
        if ts.size == 0 or starts.size == 0:
            return
        if other.intervals_ordered and bool(np.all(ts[1:] >= ts[:-1])):
            self.bytes_inside_other += _bytes_inside(ts, nbytes, starts, ends)
            return
        j = np.searchsorted(starts, ts, side="right") - 1
        inside = (j >= 0) & (ts <= ends[np.maximum(j, 0)])
        self.bytes_inside_other += int(nbytes[inside].sum())


def _bytes_inside(ts: np.ndarray, nbytes: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> int:
    """add_overlap's sum where the times are in order and the runs too (each starts after the one before
    ended): the packets inside each run that can hold any are one slice of ts, found by two binary searches
    a run instead of one a packet."""
    first = int(np.searchsorted(ends, ts[0], side="left"))
    last = int(np.searchsorted(starts, ts[-1], side="right"))
    if first >= last:
        return 0
    cumulative = np.concatenate([np.zeros(1, dtype=np.int64), np.cumsum(nbytes, dtype=np.int64)])
    low = np.searchsorted(ts, starts[first:last], side="left")
    high = np.searchsorted(ts, ends[first:last], side="right")
    return int((cumulative[high] - cumulative[low]).sum())


def duplex(x: DataStream, y: DataStream) -> dict[str, Any]:
    """Fraction of the busy time in which both streams carry data, and each one's rate overlapping vs alone
    (duplex_result), from two streams whose passes are done."""
    ix, iy = x.intervals, y.intervals
    both, either = coverage([ix, iy])
    active_x, _ = coverage([ix])
    active_y = coverage([iy])[0]
    return duplex_result(both, either, (active_x, active_y),
                         (float(x.bytes_inside_other), float(y.bytes_inside_other)), (float(x.bytes), float(y.bytes)),
                         (x.run_gap, y.run_gap))


class Host:
    """A host's transmit and receive streams: one stream (rx is tx) while the capture has seen one address
    only (loopback: every data packet is that host's, sent and received), split at the first other one."""

    def __init__(self, idle_gap_s: float, one_address: bool) -> None:
        self.tx = DataStream(idle_gap_s)
        self.rx = self.tx if one_address else DataStream(idle_gap_s)

    def split(self, addresses: int) -> None:
        """Pass.COUNTS, before a chunk: a second address makes rx a stream of its own, equal to tx so far
        (every data packet so far was sent and received by this one address)."""
        if self.rx is self.tx and addresses > 1:
            self.rx = copy.deepcopy(self.tx)


def host_stream(step: Pass, host: Host, stream: DataStream, ts: np.ndarray, nbytes: np.ndarray,
                 mss: np.ndarray | None) -> None:
    """A pass's work on one of a host's streams: its data packets' times, sizes and connections' MSS."""
    if step is Pass.COUNTS:
        stream.count(ts, nbytes, mss)
    elif step is Pass.CADENCE:
        stream.collect_gaps(ts, nbytes, mss)
    elif step is Pass.RUNS:
        stream.add_runs(ts)
    elif step is Pass.OVERLAP:
        stream.add_overlap(ts, nbytes, host.rx if stream is host.tx else host.tx)

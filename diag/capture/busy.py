"""A stream of data packets (a direction, or a host's transmit or receive) and its busy runs: the duplex
overlap of two streams.

A stream is busy from one data packet to the next while they are at most its run gap apart. The run gap is
idle_gap_s, or longer where the stream's own cadence says a silence of that length is part of moving data:
a shaped sender is bursty (tbf lets a bucket of frames go at once and then waits for tokens), so a stream
that never stops moving data is silent for several packet times now and then -- at 20 Mbit/s with an
8-frame bucket, ~5 ms. So a silence ends a run only when it is longer than all of: idle_gap_s,
CADENCE_FACTOR times the CADENCE_QUANTILE-th percentile gap between consecutive bulk segments (larger than
a control frame) and PACING_PACKETS times their median gap, at most MAX_RUN_GAP_S; a trickle of notices
has no bulk gaps and keeps idle_gap_s. Fed chunk by chunk by the passes (source.Pass), in file order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from diag.capture.document import (
    CADENCE_FACTOR,
    CADENCE_MIN_GAPS,
    CADENCE_QUANTILE,
    MAX_RUN_GAP_S,
    PACING_PACKETS,
)
from diag.capture.quantile import OrderStats
from diag.capture.turns import CONTROL_MAX_BYTES


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
    also the silences that end them."""

    def __init__(self, gap: float, keep_gaps: bool = False) -> None:
        self.gap = gap
        self.starts: list[np.ndarray] = []
        self.ends: list[np.ndarray] = []
        self.idle: list[np.ndarray] = []
        self.keep_gaps = keep_gaps
        self.last: float | None = None

    def add(self, ts: np.ndarray) -> None:
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
        self.last = float(ts[-1])

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        if self.last is None:
            return np.zeros(0), np.zeros(0)
        starts = np.concatenate(self.starts)
        ends = np.concatenate([*self.ends, np.array([self.last])])
        return starts, ends

    def idle_gaps(self) -> np.ndarray:
        return np.concatenate(self.idle) if self.idle else np.zeros(0)


class DataStream:
    """The data packets of one direction, or one host's transmit or receive."""

    def __init__(self, idle_gap_s: float) -> None:
        self.idle_gap_s = idle_gap_s
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

    def _bulk_gaps(self, ts: np.ndarray, nbytes: np.ndarray) -> np.ndarray:
        bulk = nbytes > CONTROL_MAX_BYTES
        gaps = _gaps(self._last_ts, ts)
        if self._last_ts is None:
            pairs = bulk[:-1] & bulk[1:]
        else:
            pairs = np.empty(bulk.size, dtype=bool)
            pairs[0] = self._last_bulk and bool(bulk[0])
            np.logical_and(bulk[:-1], bulk[1:], out=pairs[1:])
        self._last_ts, self._last_bulk = float(ts[-1]), bool(bulk[-1])
        return gaps[pairs]

    def count(self, ts: np.ndarray, nbytes: np.ndarray) -> None:
        if ts.size == 0:
            return
        self.n += int(ts.size)
        self.bytes += int(nbytes.sum())
        gaps = self._bulk_gaps(ts, nbytes)
        self.pairs += int(gaps.size)
        self.gaps.add(gaps)

    def plan(self) -> None:
        """After Pass.COUNTS: the ranks of the bulk gaps whose values set the run gap."""
        self._last_ts = None
        if self.n >= CADENCE_MIN_GAPS + 1 and self.pairs >= CADENCE_MIN_GAPS:
            m = self.pairs
            self.gaps.want([(m - 1) // 2, int((m - 1) * CADENCE_QUANTILE / 100)])

    def collect_gaps(self, ts: np.ndarray, nbytes: np.ndarray) -> None:
        if ts.size and self.n >= CADENCE_MIN_GAPS + 1 and self.pairs >= CADENCE_MIN_GAPS:
            self.gaps.collect(self._bulk_gaps(ts, nbytes))

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

    def add_runs(self, ts: np.ndarray) -> None:
        assert self.runs is not None
        self.runs.add(ts)

    def settle_runs(self) -> None:
        assert self.runs is not None
        self.intervals = self.runs.arrays()
        starts, ends = self.intervals
        self.intervals_ordered = bool(np.all(starts[1:] > ends[:-1]) and np.all(ends >= starts))
        self.runs = None

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

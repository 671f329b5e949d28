"""Exact order statistics of a stream of numbers in two passes, in memory bounded by the values' spread.

np.median, np.percentile and np.partition need the whole array. A capture of tens of millions of packets
is read in chunks instead, twice: OrderStats counts the values per coarse bucket in the first pass, learns
which buckets hold the wanted ranks, and in the second pass counts the distinct values of those buckets
only. np_median and np_percentile then redo numpy's own arithmetic on those values, so the results are
numpy's bit for bit (byte-identical JSON), with or without a monotone transform such as ns -> ms.

    stats = OrderStats(np.int64)
    for chunk in chunks():                      # pass 1
        stats.add(chunk)
    stats.want(median_ranks(stats.n) + percentile_ranks(stats.n, 95))
    if stats.needs_pass2:
        for chunk in chunks():                  # pass 2: the same values in the same chunks' order or any
            stats.collect(chunk)
    median_ms = np_median(stats, lambda v: v / 1e6)   # == float(np.median(all_values / 1e6))

Buckets. A value's bucket is a monotone function of its float64 value (int64 values are converted first,
which rounds monotonically): its magnitude's exponent and top MANTISSA_BITS mantissa bits, mirrored for
negatives, so a bucket spans 1/256 of an octave. Exponents are counted from the smallest magnitude kept
apart: for int64 every non-zero value has its own exponent and 0 has bucket 0; for float64 all magnitudes
below 2**-64 share bucket 0 and all above 2**64 share the outermost bucket, which keeps the number of
buckets bounded (int64: at most 2 * 63 * 256 + 3, float64: 2 * 128 * 256 + 3).

Memory. Pass 1 keeps one (bucket id, count) pair per non-empty bucket: a few thousand for data spanning
10-20 octaves (RTTs 10 us..100 ms: ~3.4k, 55 KB), at most ~32k (int64) / ~66k (float64) pairs
(0.5 / 1 MB) whatever n is. Pass 2 keeps one (value, count) pair per distinct value inside the wanted
ranks' buckets (a median's or a percentile's two ranks lie in one run of one or two adjacent buckets;
pass 1 alone answers ranks 0 and n - 1, and every rank when all values are equal). For int64
a bucket of values below 2**k holds at most 2**(k-1-MANTISSA_BITS) distinct integers (RTTs below
2**27 ns = 134 ms: at most 2**18), and small integers (below 512) have a bucket each and need no pass 2.
The worst case known: float64 values that are all distinct and all inside one bucket (e.g. n uniformly
random floats in [1, 1 + 1/256)) keep n pairs in pass 2, 16 bytes each. Real data of the analyzer is far
from it: gaps between microsecond timestamps take a few distinct values per microsecond.

Zeros: -0.0 and 0.0 compare equal; where both occur a result that is zero may carry the other sign than
numpy's (whose sign depends on its partition's internals). It is == to numpy's all the same.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# Mantissa bits below the leading one that a bucket keeps: 2**8 buckets per octave.
MANTISSA_BITS = 8
_SHIFT = 52 - MANTISSA_BITS
# A bucket id is t = (the magnitude's float64 bits >> _SHIFT) - offset, at least 0 and at most the
# dtype's top id, negated for negative values. int64: 1 has id 1 (exponent 0, bias 1023), so only 0 has
# id 0. float64: magnitudes below 2**-64 all have id 0 and those from 2**64 up the top id.
_INT_OFFSET = (1023 << MANTISSA_BITS) - 1
_FLOAT_OFFSET = ((1023 - 64) << MANTISSA_BITS) - 1
_FLOAT_TOP_ID = ((1023 + 64) << MANTISSA_BITS) - _FLOAT_OFFSET
_INT_TOP_ID = ((1023 + 64) << MANTISSA_BITS) - _INT_OFFSET  # never reached: |int64| <= 2**63
# Integers up to this magnitude are exact in float64: a bucket's bounds below it compare as integers.
_EXACT_INT = float(2**53)
# Chunks smaller than this wait in a buffer and are counted together.
_BUFFER_VALUES = 4096
_DOUBLE = struct.Struct("<d")
_DOUBLE_BITS = struct.Struct("<q")
# Pass 2 counts int64 values of a bucket run with a dense bincount when the run spans at most this many.
_DENSE_SPAN = 1 << 17


def _as_double(bits: int) -> float:
    return _DOUBLE.unpack(_DOUBLE_BITS.pack(bits))[0]


def _merge_counts(keys: np.ndarray, counts: np.ndarray, new_keys: np.ndarray, new_counts: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Adds new_counts (at sorted, unique new_keys) to the sparse counts (at sorted, unique keys).
    counts is updated in place where every new key is already there (the usual case after a few chunks)."""
    if keys.size == 0:
        return new_keys, new_counts
    pos = np.searchsorted(keys, new_keys)
    inside = np.minimum(pos, keys.size - 1)
    hit = keys[inside] == new_keys
    if hit.all():
        counts[pos] += new_counts  # pos are distinct: plain fancy-index addition is exact
        return keys, counts
    counts[pos[hit]] += new_counts[hit]
    miss = ~hit
    # np.insert puts each new key before the key at its searchsorted position: the result stays sorted.
    return np.insert(keys, pos[miss], new_keys[miss]), np.insert(counts, pos[miss], new_counts[miss])


@dataclass
class _Run:
    """Adjacent non-empty buckets holding wanted ranks, and the distinct values seen in them in pass 2."""
    first_bucket: int
    last_bucket: int
    below: int  # how many values lie in buckets before first_bucket
    expected: int  # how many values pass 1 counted in these buckets
    low: float  # the smallest float64 whose bucket is first_bucket
    high: float  # the largest float64 whose bucket is last_bucket
    values: np.ndarray
    counts: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    cumulative: np.ndarray | None = None
    integer_bounds: tuple[int, int] | None = None  # low and high as integers, where int64 compare exactly

    def __post_init__(self) -> None:
        if self.values.dtype.kind == "i" and abs(self.low) < _EXACT_INT and abs(self.high) < _EXACT_INT:
            self.integer_bounds = (math.ceil(self.low), math.floor(self.high))


class OrderStats:
    """Exact order statistics of a stream of numbers in two passes; memory bounded by how spread the
    values are, not how many (see the module's docstring for the bounds and the worst case).

    Pass 1: add(chunk) for every chunk; then want(ranks) with the 0-based ranks (k-th smallest) needed.
    Pass 2, only where needs_pass2: collect(chunk) with the same values again. Then value(rank), or
    np_median / np_percentile. NaN is refused (numpy's results with NaN are NaN anyway)."""

    def __init__(self, dtype: Any = np.int64) -> None:
        self.dtype = np.dtype(dtype)
        if self.dtype not in (np.dtype(np.int64), np.dtype(np.float64)):
            raise TypeError(f"OrderStats counts int64 or float64 values, not {self.dtype}")
        self._is_float = self.dtype.kind == "f"
        self._offset = _FLOAT_OFFSET if self._is_float else _INT_OFFSET
        self._top_id = _FLOAT_TOP_ID if self._is_float else _INT_TOP_ID
        self.n = 0
        self._min: np.generic | None = None
        self._max: np.generic | None = None
        # Chunks smaller than _BUFFER_VALUES wait here (copied) and are counted together: a call costs
        # tens of microseconds, whatever the chunk's size.
        self._pending: list[np.ndarray] = []
        self._pending_size = 0
        self._pass = 1
        self._bucket_ids = np.zeros(0, dtype=np.int64)
        self._bucket_counts = np.zeros(0, dtype=np.int64)
        self._known: dict[int, np.generic] = {}  # wanted ranks whose value pass 1 already tells
        self._wanted_indexes: set[int] = set()  # indexes into _bucket_ids of the wanted ranks' buckets
        self._runs: list[_Run] = []
        self._rank_run: dict[int, _Run] = {}
        self._collected = 0  # values seen in pass 2: all of them must come again

    # --- buckets ------------------------------------------------------------------------------------

    def _as_values(self, values: np.ndarray) -> np.ndarray:
        v = np.asarray(values).reshape(-1)
        if v.dtype != self.dtype:
            if not np.can_cast(v.dtype, self.dtype, "safe"):
                raise TypeError(f"values of dtype {v.dtype} do not fit OrderStats({self.dtype})")
            v = v.astype(self.dtype)
        return v

    def _ids(self, v: np.ndarray, vmin: Any, vmax: Any, base: int) -> np.ndarray:
        """Bucket ids of v minus base (v's smallest id, so that the result indexes a bincount). vmin and
        vmax: v's extremes, which tell which of the clamping and sign steps are needed at all."""
        if self._is_float:
            mag = np.abs(v).view(np.int64)  # abs also clears the sign of -0.0
        else:
            mag = v.astype(np.float64)  # our own copy: the steps below work in place
            if vmin < 0:
                np.abs(mag, out=mag)
            mag = mag.view(np.int64)
        mag >>= _SHIFT
        low_clamp = vmin <= 0 or (self._is_float and min(abs(float(vmin)), abs(float(vmax))) < 2.0**-64)
        high_clamp = self._is_float and max(abs(float(vmin)), abs(float(vmax))) >= 2.0**64
        if not (low_clamp or high_clamp or vmin < 0):
            mag -= self._offset + base  # the common case: all positive, one subtraction
            return mag
        mag -= self._offset
        if low_clamp:
            np.maximum(mag, 0, out=mag)
        if high_clamp:
            np.minimum(mag, self._top_id, out=mag)
        if vmin < 0:
            np.negative(mag, out=mag, where=v < 0)
        mag -= base
        return mag

    def _id_of(self, value: Any) -> int:
        """_ids of one value, in Python: float() rounds an int64 as astype(np.float64) does."""
        bits = _DOUBLE_BITS.unpack(_DOUBLE.pack(abs(float(value))))[0]
        t = min(max((bits >> _SHIFT) - self._offset, 0), self._top_id)
        return -t if value < 0 else t

    def _lowest(self, bucket: int) -> float:
        """The smallest float64 whose bucket is this one."""
        if bucket > 0:
            return _as_double((bucket + self._offset) << _SHIFT)
        return -self._highest(-bucket)

    def _highest(self, bucket: int) -> float:
        """The largest float64 whose bucket is this one."""
        if bucket >= 0:
            if bucket == self._top_id and self._is_float:
                return np.inf
            return _as_double(((bucket + self._offset + 1) << _SHIFT) - 1)
        return -self._lowest(-bucket)

    # --- small chunks -------------------------------------------------------------------------------

    def _buffered(self, v: np.ndarray) -> bool:
        """Keeps a small chunk for later (True), flushing the buffer once it is full."""
        if v.size >= _BUFFER_VALUES:
            return False
        self._pending.append(v.copy())  # the caller may reuse its array; a view would pin a larger one
        self._pending_size += int(v.size)
        if self._pending_size >= _BUFFER_VALUES:
            self._flush()
        return True

    def _flush(self) -> None:
        if not self._pending:
            return
        v = self._pending[0] if len(self._pending) == 1 else np.concatenate(self._pending)
        self._pending, self._pending_size = [], 0
        if self._pass == 1:
            self._count(v)
        else:
            self._select(v)

    @property
    def min(self) -> np.generic | None:
        """The smallest value added (a numpy scalar of the dtype), None before any."""
        self._flush()
        return self._min

    @property
    def max(self) -> np.generic | None:
        """The largest value added (a numpy scalar of the dtype), None before any."""
        self._flush()
        return self._max

    # --- pass 1 -------------------------------------------------------------------------------------

    def add(self, values: np.ndarray) -> None:
        """Pass 1: counts the values per bucket, and their number, minimum and maximum."""
        if self._pass != 1:
            raise RuntimeError("add() after want(): pass 1 is over")
        v = self._as_values(values)
        if v.size == 0:
            return
        if v.size < _BUFFER_VALUES and self._is_float and np.isnan(v).any():
            raise ValueError("OrderStats: NaN among the values")  # now, not when the buffer is counted
        self.n += int(v.size)
        if not self._buffered(v):
            self._count(v)

    def _count(self, v: np.ndarray) -> None:
        vmin, vmax = v.min(), v.max()
        if vmin != vmin:  # np.min propagates NaN: this is the NaN check, for free
            raise ValueError("OrderStats: NaN among the values")
        self._min = vmin if self._min is None or vmin < self._min else self._min
        self._max = vmax if self._max is None or vmax > self._max else self._max
        lowest, highest = self._id_of(vmin), self._id_of(vmax)
        if lowest == highest:  # one bucket holds them all (ids grow with the value): no id per value
            ids, counts = np.array([lowest], dtype=np.int64), np.array([v.size], dtype=np.int64)
        else:
            per_bucket = np.bincount(self._ids(v, vmin, vmax, lowest), minlength=highest - lowest + 1)
            nonzero = np.flatnonzero(per_bucket)
            ids, counts = nonzero + lowest, per_bucket[nonzero]
        self._bucket_ids, self._bucket_counts = _merge_counts(self._bucket_ids, self._bucket_counts, ids, counts)

    def want(self, ranks: Iterable[int]) -> None:
        """After pass 1: the 0-based order statistics (k-th smallest) that value() will be asked for.
        May be called more than once before pass 2."""
        if self._collected:
            raise RuntimeError("want() after collect(): pass 2 has begun")
        self._flush()
        self._pass = 2
        ranks = sorted({int(r) for r in ranks} - self._known.keys() - self._rank_run.keys())
        if not ranks:
            return
        if ranks[0] < 0 or ranks[-1] >= self.n:
            raise IndexError(f"ranks {ranks[0]}..{ranks[-1]} outside 0..{self.n - 1}")
        cumulative = np.cumsum(self._bucket_counts)
        pending = list(self._rank_run)  # the runs are planned anew: every rank is placed again
        for rank in ranks:
            if rank == 0 or self.min == self.max:
                self._known[rank] = self.min
            elif rank == self.n - 1:
                self._known[rank] = self.max
            else:
                index = int(np.searchsorted(cumulative, rank, side="right"))
                single = self._single_value(int(self._bucket_ids[index]))
                if single is None:
                    self._wanted_indexes.add(index)
                    pending.append(rank)
                else:
                    self._known[rank] = single
        self._plan_runs(sorted(self._wanted_indexes), cumulative)
        self._rank_run = {rank: next(run for run in self._runs if run.below <= rank < run.below + run.expected)
                          for rank in pending}

    def _single_value(self, bucket: int) -> np.generic | None:
        """The bucket's one possible value (int64 buckets of small magnitudes), else None."""
        if self._is_float:
            return None
        low, high = self._lowest(bucket), self._highest(bucket)
        if abs(low) >= _EXACT_INT or abs(high) >= _EXACT_INT:
            return None
        return self.dtype.type(math.ceil(low)) if math.ceil(low) == math.floor(high) else None

    def _plan_runs(self, indexes: list[int], cumulative: np.ndarray) -> None:
        """Groups the wanted buckets (indexes into the non-empty buckets) into runs of adjacent ones: the
        buckets between two of a run are empty, so one value interval per run selects them in pass 2."""
        self._runs = []
        start = 0
        while start < len(indexes):
            end = start
            while end + 1 < len(indexes) and indexes[end + 1] == indexes[end] + 1:
                end += 1
            first, last = indexes[start], indexes[end]
            below = int(cumulative[first - 1]) if first else 0
            first_bucket, last_bucket = int(self._bucket_ids[first]), int(self._bucket_ids[last])
            self._runs.append(_Run(first_bucket, last_bucket, below, int(cumulative[last]) - below,
                                   self._lowest(first_bucket), self._highest(last_bucket),
                                   np.zeros(0, dtype=self.dtype)))
            start = end + 1

    @property
    def needs_pass2(self) -> bool:
        """False when every wanted rank is known from pass 1 (rank 0 or n-1, all values equal, a bucket
        that holds one possible value) or none was wanted."""
        return bool(self._runs)

    # --- pass 2 -------------------------------------------------------------------------------------

    def collect(self, values: np.ndarray) -> None:
        """Pass 2: the same values again (any chunking); counts the distinct values of the wanted buckets."""
        if self._pass == 1:
            self.want([])
        v = self._as_values(values)
        self._collected += int(v.size)
        if not self._runs or v.size == 0 or self._buffered(v):
            return
        self._select(v)

    def _select(self, v: np.ndarray) -> None:
        as_float = v if self._is_float else None
        for run in self._runs:
            if run.integer_bounds is not None:
                # Every int64 inside the bounds is exact in float64: compare as integers, no conversion.
                inside = (v >= run.integer_bounds[0]) & (v <= run.integer_bounds[1])
            else:
                # Buckets are a function of the float64 value: beyond 2**53 compare what they saw.
                as_float = v.astype(np.float64) if as_float is None else as_float
                inside = (as_float >= run.low) & (as_float <= run.high)
            selected = v[inside]
            if selected.size:
                self._accumulate(run, selected)

    def _accumulate(self, run: _Run, selected: np.ndarray) -> None:
        run.cumulative = None
        if not self._is_float:
            smin, smax = int(selected.min()), int(selected.max())
            if smax - smin < _DENSE_SPAN:  # a dense count over the chunk's span, no sort
                per_value = np.bincount(selected - smin, minlength=smax - smin + 1)
                nonzero = np.flatnonzero(per_value)
                run.values, run.counts = _merge_counts(run.values, run.counts,
                                                       (nonzero + smin).astype(np.int64), per_value[nonzero])
                return
        if run.values.size:
            # Values seen before (few distinct ones, many times): a binary search each instead of a sort.
            pos = np.searchsorted(run.values, selected)
            np.minimum(pos, run.values.size - 1, out=pos)
            hit = run.values[pos] == selected
            if hit.all():
                run.counts += np.bincount(pos, minlength=run.values.size)
                return
            run.counts += np.bincount(pos[hit], minlength=run.values.size)
            selected = selected[~hit]
        new_values, new_counts = np.unique(selected, return_counts=True)
        run.values, run.counts = _merge_counts(run.values, run.counts, new_values, new_counts.astype(np.int64))

    # --- results ------------------------------------------------------------------------------------

    def value(self, rank: int) -> np.generic:
        """The rank-th smallest value (0-based), as a numpy scalar of the dtype: np.partition(a, k)[k].
        rank must have been passed to want()."""
        rank = int(rank)
        self._flush()
        if rank in self._known:
            return self._known[rank]
        run = self._rank_run.get(rank)
        if run is None:
            raise KeyError(f"rank {rank} was not wanted (call want() after pass 1)")
        if run.cumulative is None:
            if self._collected != self.n:
                raise RuntimeError(f"pass 2 saw {self._collected} values, pass 1 {self.n}")
            run.cumulative = np.cumsum(run.counts)
            if not run.cumulative.size or int(run.cumulative[-1]) != run.expected:
                raise RuntimeError("pass 2 saw other values than pass 1")
        return run.values[int(np.searchsorted(run.cumulative, rank - run.below, side="right"))]

    @property
    def stored_entries(self) -> int:
        """How many (key, count) pairs this object holds, 16 bytes each (besides a buffer of at most
        _BUFFER_VALUES values from small chunks)."""
        return int(self._bucket_ids.size + sum(run.values.size for run in self._runs))

    @property
    def nbytes(self) -> int:
        """The bytes of this object's arrays, the small chunks' buffer included."""
        return int(self._bucket_ids.nbytes + self._bucket_counts.nbytes
                   + sum(run.values.nbytes + run.counts.nbytes for run in self._runs)
                   + sum(chunk.nbytes for chunk in self._pending))


# --- numpy's arithmetic on the order statistics ------------------------------------------------------


def median_ranks(n: int) -> list[int]:
    """The ranks np.median of n values reads: the middle one, or the two middle ones."""
    if n <= 0:
        return []
    return [(n - 1) // 2] if n % 2 else [n // 2 - 1, n // 2]


def _percentile_index(n: int, q: float) -> tuple[int, Any]:
    """numpy's (method linear) previous index, with -1 for "the last", and its gamma, as numpy computes
    them in _quantile / _get_indexes / _get_gamma."""
    quantile = np.true_divide(q, 100, out=...)
    if not 0.0 <= quantile <= 1.0:
        raise ValueError("Percentiles must be in the range [0, 100]")
    virtual = np.asanyarray((n - 1) * quantile)
    previous = np.floor(virtual)
    if virtual >= n - 1:
        previous = np.asanyarray(-1.0)
    previous = previous.astype(np.intp)
    gamma = np.asanyarray(np.asanyarray(virtual - previous), dtype=virtual.dtype)
    return int(previous), gamma


def percentile_ranks(n: int, q: float) -> list[int]:
    """The ranks np.percentile(a, q) (method linear) of n values reads: the two neighbours of the virtual
    index (n - 1) * q / 100, or the last value where that index reaches it."""
    if n <= 0:
        return []
    previous, _ = _percentile_index(n, q)
    return [n - 1] if previous == -1 else [previous, previous + 1]


def _values(stats: OrderStats, ranks: list[int], transform: Callable[[np.ndarray], np.ndarray] | None
            ) -> np.ndarray:
    if not ranks:
        raise ValueError("no values: numpy's median and percentile of an empty array are NaN")
    chosen = np.array([stats.value(r) for r in ranks], dtype=stats.dtype)
    # A monotone transform keeps the order: the k-th smallest of transform(a) is transform(k-th of a).
    return chosen if transform is None else np.asarray(transform(chosen))


def np_median(stats: OrderStats, transform: Callable[[np.ndarray], np.ndarray] | None = None) -> float:
    """float(np.median(transform(all values))), bit for bit. transform: elementwise, monotone
    non-decreasing, and giving an element the same result in any array (true of + - * / and casts)."""
    middle = _values(stats, median_ranks(stats.n), transform)
    # np.median is the mean of the one or two middle values (in float64 for integers); on this array of
    # exactly those values, already in order, it does that same arithmetic.
    return float(np.median(middle))


def np_percentile(stats: OrderStats, q: float, transform: Callable[[np.ndarray], np.ndarray] | None = None
                  ) -> float:
    """float(np.percentile(transform(all values), q)) (method linear), bit for bit; transform as np_median."""
    n = stats.n
    if n <= 0:
        raise ValueError("no values: numpy's percentile of an empty array is NaN")
    _, gamma = _percentile_index(n, q)
    pair = _values(stats, percentile_ranks(n, q), transform)
    below, above = pair[0], pair[-1]  # numpy scalars, as numpy's arr[previous_indexes] are
    weight = float(gamma) if type(q) in (int, float) else gamma  # numpy's weak_q
    # numpy's _lerp: from below, or back from above when the weight is at least a half. An int64 above -
    # below may wrap around (numpy warns, and wraps): the same operations wrap the same way.
    with np.errstate(over="ignore"):
        difference = above - below
        result = np.add(below, difference * weight, out=...)
        np.subtract(above, difference * (1 - weight), out=result, where=weight >= 0.5, casting="unsafe",
                    dtype=type(result.dtype))
    return float(result[()])

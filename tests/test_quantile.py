"""OrderStats (diag/capture/quantile.py): two passes over chunks give numpy's median, percentile and
partition bit for bit, in memory bounded by the values' spread."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from diag.capture import quantile
from diag.capture.quantile import (
    MANTISSA_BITS,
    OrderStats,
    median_ranks,
    np_median,
    np_percentile,
    percentile_ranks,
)

# computes in this process: may run beside an `alone` test (tests/conftest.py)
pytestmark = pytest.mark.in_process

QS = (95, 50, 0, 100, 37.5)
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
HYPOTHESIS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

int_elements = st.one_of(
    st.integers(INT64_MIN, INT64_MAX),  # the whole range: large spreads
    st.integers(-5, 5),  # many duplicates, zero, negatives
    st.integers(0, 4 << 20),  # bytes in flight
    st.sampled_from([INT64_MIN, INT64_MIN + 1, INT64_MIN + 2, -1, 0, 1, INT64_MAX - 2, INT64_MAX - 1, INT64_MAX]),
    st.integers(2**53 - 3, 2**53 + 3),  # where float64 stops holding every integer
)
float_elements = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False),  # subnormals, +-0.0, huge magnitudes
    st.sampled_from([0.0, -0.0, 1e-6, 2e-6, 5e-324, -5e-324, 2.0**-64, 2.0**64, 1.0, -1.0]),
    st.floats(0, 0.05, allow_nan=False),  # gaps in seconds
    st.integers(-3, 3).map(float),
)


def int_arrays() -> st.SearchStrategy[np.ndarray]:
    return hnp.arrays(np.int64, st.integers(1, 200), elements=int_elements)


def float_arrays() -> st.SearchStrategy[np.ndarray]:
    return hnp.arrays(np.float64, st.integers(1, 200), elements=float_elements)


def two_passes(values: np.ndarray, cuts: list[int], ranks: list[int], buffered: bool = True) -> OrderStats:
    """OrderStats of values fed in the chunks that cuts (indexes) make, in both passes. buffered=False:
    every chunk is counted on its own (small chunks are otherwise counted together)."""
    chunks = np.split(values, sorted(c % (values.size + 1) for c in cuts))
    buffer_values = quantile._BUFFER_VALUES
    quantile._BUFFER_VALUES = buffer_values if buffered else 1
    try:
        stats = OrderStats(values.dtype.type)
        for chunk in chunks:
            stats.add(chunk)
        assert stats.n == values.size
        assert stats.min == values.min() and stats.max == values.max()
        stats.want(ranks)
        if stats.needs_pass2:
            for chunk in chunks:
                stats.collect(chunk)
        stats.value(ranks[0])  # the last buffered chunk is counted
    finally:
        quantile._BUFFER_VALUES = buffer_values
    return stats


def all_ranks(n: int, extra: list[int]) -> list[int]:
    ranks = median_ranks(n) + [k % n for k in extra]
    for q in QS:
        ranks += percentile_ranks(n, q)
    return ranks


def assert_same(ours: object, numpys: object, zeros_of_both_signs: bool) -> None:
    """== and the same repr (the JSON's bytes). NaN (from infinite differences in numpy's lerp) has only
    the repr; a zero may differ in sign where the data hold both zeros (see the module's docstring)."""
    if isinstance(numpys, float) and math.isnan(numpys):
        assert isinstance(ours, float) and math.isnan(ours)
        return
    assert ours == numpys
    if not (zeros_of_both_signs and numpys == 0):
        assert repr(ours) == repr(numpys)
        assert type(ours) is type(numpys)


def both_zeros(values: np.ndarray) -> bool:
    zero = values == 0
    return bool(np.any(zero & np.signbit(values)) and np.any(zero & ~np.signbit(values)))


def check_against_numpy(values: np.ndarray, cuts: list[int], ks: list[int],
                        transform: Callable[[np.ndarray], np.ndarray] | None = None, buffered: bool = True
                        ) -> None:
    n = values.size
    stats = two_passes(values, cuts, all_ranks(n, ks), buffered)
    seen = values if transform is None else transform(values)
    signs = both_zeros(seen)
    with warnings.catch_warnings():  # numpy warns where an int64 difference in its lerp wraps around
        warnings.simplefilter("ignore", RuntimeWarning)
        assert_same(np_median(stats, transform), float(np.median(seen)), signs)
        for q in QS:
            assert_same(np_percentile(stats, q, transform), float(np.percentile(seen, q)), signs)
    for k in ks:
        assert_same(stats.value(k % n), np.partition(values, k % n)[k % n], both_zeros(values))


@HYPOTHESIS
@given(int_arrays(), st.lists(st.integers(0, 10**6), max_size=12), st.lists(st.integers(0, 10**6), max_size=4),
       st.booleans())
def test_int64_matches_numpy(values: np.ndarray, cuts: list[int], ks: list[int], buffered: bool) -> None:
    check_against_numpy(values, cuts, ks, buffered=buffered)


@HYPOTHESIS
@given(float_arrays(), st.lists(st.integers(0, 10**6), max_size=12), st.lists(st.integers(0, 10**6), max_size=4),
       st.booleans())
def test_float64_matches_numpy(values: np.ndarray, cuts: list[int], ks: list[int], buffered: bool) -> None:
    check_against_numpy(values, cuts, ks, buffered=buffered)


@HYPOTHESIS
@given(int_arrays(), st.lists(st.integers(0, 10**6), max_size=6), st.booleans())
def test_int64_ns_to_ms_matches_numpy(values: np.ndarray, cuts: list[int], buffered: bool) -> None:
    """The analyzer's np.median(values_ns / 1e6): the transform is applied to the order statistics."""
    check_against_numpy(values, cuts, [], transform=lambda v: v / 1e6, buffered=buffered)


@pytest.mark.parametrize("values", [
    np.array([7]), np.array([7, 7]), np.array([3, -2]), np.array([1, 2, 3]), np.array([2, 2, 2, 2, 2]),
    np.array([0.5]), np.array([0.25, 0.125]), np.array([3.0, 1.0, 2.0]), np.array([INT64_MIN, INT64_MAX]),
    np.array([INT64_MAX, INT64_MAX - 1, INT64_MAX]), np.array([-0.0, -0.0, 1.0]),
])
def test_small_arrays(values: np.ndarray) -> None:
    check_against_numpy(values, [1], list(range(values.size)))


def realistic(kind: str, n: int, seed: int = 7) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if kind == "in_flight_bytes":
        return np.concatenate([rng.integers(0, 4 << 20, n - n // 10), np.zeros(n // 10, dtype=np.int64)])
    if kind == "rtt_ns":
        return np.exp(rng.uniform(np.log(1e4), np.log(1e8), n)).astype(np.int64)
    if kind == "window_bytes":
        return (rng.integers(1, 65536, n) << rng.integers(0, 8, n)).astype(np.int64)
    # gaps between microsecond timestamps, in seconds; back-to-back packets 12 us apart most of the time
    steps = np.where(rng.random(n + 1) < 0.6, 12, rng.integers(1, 50_000, n + 1))
    start = 1_700_000_000_000_000_000 if kind == "gap_s_epoch" else 0
    return np.diff((start + np.cumsum(steps) * 1000) / 1e9)


@pytest.mark.parametrize("kind", ["in_flight_bytes", "rtt_ns", "window_bytes", "gap_s", "gap_s_epoch"])
def test_realistic_two_million(kind: str) -> None:
    values = realistic(kind, 2_000_000)
    n = values.size
    cuts = [*range(0, n, 100_000), 123_457, 1_500_001]
    ks = [(n - 1) // 2, int((n - 1) * 95 / 100), 1, n - 2]  # run_gap_s's ranks among them
    transform = (lambda v: v / 1e6) if kind == "rtt_ns" else None
    check_against_numpy(values, cuts, ks, transform)
    if kind == "rtt_ns":
        check_against_numpy(values, cuts, ks)
    stats = two_passes(values, cuts, all_ranks(n, ks))
    assert stats.nbytes < 1 << 20


def test_memory_few_distinct_values_in_one_bucket() -> None:
    """5M values in one bucket, 7 distinct: a handful of entries, however many values."""
    values = 1_000_000 + np.arange(5_000_000, dtype=np.int64) % 7
    stats = two_passes(values, list(range(0, values.size, 100_000)), all_ranks(values.size, []))
    assert stats.needs_pass2
    assert stats.stored_entries <= 1 + 2 * 7
    assert np_median(stats) == float(np.median(values))
    floats = values / 1e6 + 0.25
    stats = two_passes(floats, list(range(0, floats.size, 100_000)), all_ranks(floats.size, []))
    assert stats.stored_entries <= 1 + 2 * 7
    assert repr(np_percentile(stats, 95)) == repr(float(np.percentile(floats, 95)))


def test_memory_bounded_by_spread_not_count() -> None:
    """Pass 1 keeps one entry per non-empty bucket: at most 2**MANTISSA_BITS per octave of the data."""
    rng = np.random.default_rng(3)
    stats = OrderStats(np.int64)
    for _ in range(50):  # 5M RTTs of 10 us..100 ms: ~13.3 octaves
        stats.add(np.exp(rng.uniform(np.log(1e4), np.log(1e8), 100_000)).astype(np.int64))
    assert stats.stored_entries <= 14 << MANTISSA_BITS
    stats = OrderStats(np.float64)  # the most any float64 data can take
    stats.add(np.concatenate([-np.logspace(-300, 300, 200_000), [0.0], np.logspace(-300, 300, 200_000)]))
    assert stats.stored_entries <= 2 * (129 << MANTISSA_BITS) + 3


def test_memory_worst_case_distinct_floats_in_one_bucket() -> None:
    """The documented worst case: all values distinct and in one bucket, so pass 2 keeps each of them."""
    values = 1.0 + np.random.default_rng(4).random(200_000) / 512
    stats = two_passes(values, list(range(0, values.size, 50_000)), median_ranks(values.size))
    assert stats.stored_entries > values.size  # one bucket in pass 1, every value in pass 2
    assert repr(np_median(stats)) == repr(float(np.median(values)))


def test_known_without_pass_two() -> None:
    assert OrderStats().needs_pass2 is False
    stats = OrderStats(np.float64)
    stats.add(np.full(1000, 0.125))
    stats.want(median_ranks(1000) + percentile_ranks(1000, 95))
    assert not stats.needs_pass2 and np_median(stats) == 0.125
    stats = OrderStats(np.int64)  # small integers: a bucket each
    values = np.arange(1000, dtype=np.int64) % 300 - 150
    stats.add(values)
    stats.want(all_ranks(values.size, []))
    assert not stats.needs_pass2
    assert np_percentile(stats, 37.5) == float(np.percentile(values, 37.5))
    stats = OrderStats(np.float64)  # the extremes come from pass 1 (percentile 0 reads ranks 0 and 1)
    stats.add(np.array([0.3, 0.1]))
    stats.want(percentile_ranks(2, 0) + percentile_ranks(2, 100) + median_ranks(2))
    assert not stats.needs_pass2 and np_percentile(stats, 100) == 0.3 and np_percentile(stats, 0) == 0.1


def test_want_twice_and_errors() -> None:
    values = np.random.default_rng(5).normal(size=1001)
    stats = OrderStats(np.float64)
    stats.add(values)
    stats.want(median_ranks(values.size))
    stats.want([10, 990])
    for chunk in np.array_split(values, 3):
        stats.collect(chunk)
    for k in (10, 500, 990):
        assert stats.value(k) == np.partition(values, k)[k]
    with pytest.raises(KeyError):
        stats.value(11)
    with pytest.raises(RuntimeError):
        stats.want([11])
    with pytest.raises(ValueError, match="NaN"):
        OrderStats(np.float64).add(np.array([1.0, np.nan]))
    with pytest.raises(TypeError):
        OrderStats(np.int64).add(np.array([1.5]))
    with pytest.raises(IndexError):
        stats2 = OrderStats()
        stats2.add(np.arange(5))
        stats2.want([5])
    stats3 = OrderStats(np.float64)
    stats3.add(values)
    stats3.want([500])
    stats3.collect(values[:1000])  # one value short: pass 2 must see what pass 1 saw
    with pytest.raises(RuntimeError, match="pass 2"):
        stats3.value(500)
    with pytest.raises(ValueError):
        np_median(OrderStats())


def test_ranks_follow_numpy() -> None:
    assert median_ranks(1) == [0] and median_ranks(4) == [1, 2] and median_ranks(0) == []
    assert percentile_ranks(1, 95) == [0] and percentile_ranks(21, 95) == [19, 20]
    assert percentile_ranks(101, 100) == [100] and percentile_ranks(101, 0) == [0, 1]
    with pytest.raises(ValueError):
        percentile_ranks(10, 101)


@HYPOTHESIS
@given(st.one_of(st.floats(allow_nan=False), st.integers(INT64_MIN, INT64_MAX)))
def test_bucket_bounds(value: float | int) -> None:
    """The value interval that pass 2 selects for a bucket is exactly the bucket: its lowest and highest
    float64 map to it, and their neighbours outside do not."""
    stats = OrderStats(np.float64 if isinstance(value, float) else np.int64)
    bucket = stats._id_of(value)
    low, high = stats._lowest(bucket), stats._highest(bucket)
    assert low <= float(value) <= high
    float_stats = OrderStats(np.float64)  # an int64's bucket is that of its float64 value
    float_stats._offset, float_stats._top_id = stats._offset, stats._top_id
    assert float_stats._id_of(low) == bucket == float_stats._id_of(high)
    if low > -np.inf:
        assert float_stats._id_of(np.nextafter(low, -np.inf)) < bucket
    if high < np.inf:
        assert float_stats._id_of(np.nextafter(high, np.inf)) > bucket


def test_small_chunks_buffered_and_reused_arrays() -> None:
    """Small chunks wait in a buffer: a caller that refills one array for every chunk is still counted
    right, and chunks of any size mix."""
    rng = np.random.default_rng(11)
    values = rng.integers(0, 1 << 30, 50_000)
    sizes = rng.integers(1, 6000, 200)
    cuts = np.cumsum(sizes)[np.cumsum(sizes) < values.size]
    chunks = np.split(values, cuts)
    stats = OrderStats(np.int64)
    scratch = np.empty(values.size, dtype=np.int64)
    for chunk in chunks:
        scratch[:chunk.size] = chunk
        stats.add(scratch[:chunk.size])
        scratch[:chunk.size] = -1  # the caller's array changes after add() returned
    assert stats.n == values.size and stats.min == values.min() and stats.max == values.max()
    stats.want(all_ranks(values.size, [7, 49_000]))
    for chunk in chunks:
        scratch[:chunk.size] = chunk
        stats.collect(scratch[:chunk.size])
        scratch[:chunk.size] = -1
    assert repr(np_median(stats)) == repr(float(np.median(values)))
    assert repr(np_percentile(stats, 95)) == repr(float(np.percentile(values, 95)))
    assert stats.value(7) == np.partition(values, 7)[7]

"""The analyzer's shortcuts held to their definitions on random inputs: the segment-size histogram (counts at
least each edge) against a binary search a segment, add_overlap's slice sums (times and runs in order)
against a binary search a packet, busy runs fed in chunks against the same values fed at once, and the turn
analysis' lookups in chunks against one search over the times' running maximum."""

from __future__ import annotations

import numpy as np
import pytest

from diag.capture.busy import BusyRuns, DataStream, _bytes_inside
from diag.capture.document import SEGMENT_SIZE_EDGES, size_histogram
from diag.capture.turns import Searcher

EDGES = np.array(SEGMENT_SIZE_EDGES, dtype=np.int64)


@pytest.mark.parametrize("seed", range(5))
def test_size_histogram_is_the_binary_search_one(seed: int) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(400):
        pool = np.concatenate([EDGES, EDGES - 1, EDGES + 1, rng.integers(1, 1 << 21, 8)]).clip(1)
        sizes = rng.choice(pool, rng.integers(1, 60)).astype(np.int64)
        in_range = sizes[sizes <= EDGES[-1]]
        bins = np.minimum(np.searchsorted(EDGES, in_range, side="right") - 1, EDGES.size - 2)
        expected = np.bincount(bins, minlength=EDGES.size - 1)
        assert size_histogram(sizes, int(sizes.max())).tolist() == expected.tolist()


@pytest.mark.parametrize("seed", range(5))
def test_bytes_inside_ordered_runs_is_the_binary_search_sum(seed: int) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(400):
        bounds = np.sort(rng.choice(300, size=2 * int(rng.integers(1, 8)), replace=False)).astype(float)
        starts, ends = bounds[0::2], bounds[1::2]
        if rng.random() < 0.3:
            ends = starts.copy()  # runs of one packet
        ts = np.sort(rng.choice(np.concatenate([starts, ends, rng.integers(-5, 305, 30).astype(float)]),
                                int(rng.integers(1, 40))))
        nbytes = rng.integers(1, 1500, ts.size).astype(np.int64)
        j = np.searchsorted(starts, ts, side="right") - 1
        inside = (j >= 0) & (ts <= ends[np.maximum(j, 0)])
        assert _bytes_inside(ts, nbytes, starts, ends) == int(nbytes[inside].sum())


def _chunks(values: np.ndarray, rng: np.random.Generator) -> list[np.ndarray]:
    cuts = sorted(rng.choice(np.arange(1, values.size), size=min(values.size - 1, 6), replace=False)) \
        if values.size > 1 else []
    return np.split(values, cuts)


@pytest.mark.parametrize("seed", range(5))
def test_runs_and_gaps_in_chunks_are_those_of_one_chunk(seed: int) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(200):
        n = int(rng.integers(1, 80))
        ts = np.cumsum(rng.exponential(1.0, n)) + rng.normal(0, 0.5, n) * (rng.random(n) < 0.2)  # steps back
        sizes = rng.choice([48, 200, 1448], n).astype(np.int64)
        whole, chunked = BusyRuns(1.0, keep_gaps=True), BusyRuns(1.0, keep_gaps=True)
        stream_whole, stream_chunked = DataStream(0.002), DataStream(0.002)
        whole.add(ts)
        stream_whole.count(ts, sizes)
        for part in _chunks(np.arange(n), rng):
            chunked.add(ts[part])
            stream_chunked.count(ts[part], sizes[part])
        for a, b in zip([*whole.arrays(), whole.idle_gaps()], [*chunked.arrays(), chunked.idle_gaps()], strict=True):
            assert a.tolist() == b.tolist()
        assert (stream_whole.pairs, stream_whole.gaps.n) == (stream_chunked.pairs, stream_chunked.gaps.n)


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("seed", range(5))
def test_lookups_in_chunks_search_the_running_maximum(seed: int, side: str) -> None:
    """Searcher fed times that step back, with queries arriving in file order among them, in random chunks:
    each query's r is np.searchsorted over the running maximum of all the times, with a[r-1] and a[r]."""
    rng = np.random.default_rng(seed)
    for _ in range(100):
        n = int(rng.integers(1, 400))
        ts = np.cumsum(rng.exponential(1.0, n)) + rng.normal(0, 2.0, n) * (rng.random(n) < 0.1)
        where = np.sort(rng.integers(0, n, int(rng.integers(0, 30))))  # a query rides with the chunk of ts[k]
        queries = np.maximum.accumulate(ts)[where] + rng.normal(0, 0.5, where.size)
        expected = np.searchsorted(np.maximum.accumulate(ts), queries, side=side)
        searcher, got = Searcher(side), {}
        for part in _chunks(np.arange(n), rng):
            mine = np.flatnonzero((where >= part[0]) & (where <= part[-1]))
            answers = searcher.step(ts[part], queries[mine], mine.astype(np.int64))
            got.update(zip(answers.tags.tolist(), answers.r.tolist(), strict=True))
            _check_neighbours(answers, ts)
        answers = searcher.finish()
        got.update(zip(answers.tags.tolist(), answers.r.tolist(), strict=True))
        assert [got[k] for k in range(where.size)] == expected.tolist()


def _check_neighbours(answers: object, ts: np.ndarray) -> None:
    for r, has_prev, prev, has_next, nxt in zip(answers.r, answers.has_prev, answers.prev, answers.has_next,
                                                answers.next, strict=True):
        if has_prev and r >= 1:
            assert prev == ts[r - 1]
        if has_next:
            assert nxt == ts[r]

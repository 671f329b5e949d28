"""The timing loop on real gloo process groups: formulas, data checks, samples."""

from __future__ import annotations

import math

import pytest
from harness_helpers import run_rows

from diag.records import Record
from diag.spec import SweepSpec

SIZE = 3072  # divisible by 3 ranks x 4-byte elements, so no op rounds it

# Hand-computed from nccl-tests doc/PERFORMANCE.md for S = 3072 bytes:
# op -> N -> (total_bytes, bus factor, per-device volume D)
EXPECTED = {
    "all_gather": {2: (6144, 1 / 2, 3072), 3: (9216, 2 / 3, 6144)},
    "all_reduce": {2: (3072, 1.0, 3072), 3: (3072, 4 / 3, 4096)},
    "reduce_scatter": {2: (3072, 1 / 2, 1536), 3: (3072, 2 / 3, 2048)},
    "broadcast": {2: (3072, 1.0, 3072), 3: (3072, 1.0, 3072)},
    "all_to_all": {2: (3072, 1 / 2, 1536), 3: (3072, 2 / 3, 2048)},
    "send_recv": {2: (3072, 1.0, 3072), 3: (3072, 1.0, 3072)},
    "ping_pong": {2: (6144, 1.0, 6144), 3: (6144, 1.0, 6144)},
    "exchange": {2: (3072, 1.0, 3072), 3: (3072, 1.0, 3072)},
}


@pytest.mark.parametrize("world_size", [2, 3])
def test_bandwidth_formulas_for_every_op(world_size, tmp_path):
    spec = SweepSpec(ops=tuple(EXPECTED), sizes=(SIZE,), warmup=1, iters=3)
    rows = {row["op"]: Record.from_event(row) for row in run_rows(spec, world_size, tmp_path)}
    assert set(rows) == set(EXPECTED)
    for op, by_n in EXPECTED.items():
        total, factor, volume = by_n[world_size]
        row = rows[op]
        assert row.nwrong == 0, op
        assert row.size_bytes == SIZE and row.world_size == world_size
        assert row.total_bytes == total, op
        assert row.volume_bytes == volume, op
        assert row.algbw_Bps == pytest.approx(total / row.time_s), op
        assert row.busbw_Bps == pytest.approx(row.algbw_Bps * factor), op


def test_samples_are_max_over_ranks_and_windows_are_ordered(tmp_path):
    spec = SweepSpec(ops=("all_gather",), sizes=(1024, 65536), warmup=2, iters=4)
    rows = [Record.from_event(r) for r in run_rows(spec, 3, tmp_path)]
    assert [r.size_bytes for r in rows] == [1024, 65536]
    for row in rows:
        assert len(row.times_s) == 4 and len(row.rank_times_s) == 3 and len(row.warmup_times_s) == 2
        for i, t in enumerate(row.times_s):
            assert t == max(per_rank[i] for per_rank in row.rank_times_s)
        assert row.rank0_times_s == row.rank_times_s[0]
        assert row.time_s == sorted(row.times_s)[1] + (sorted(row.times_s)[2] - sorted(row.times_s)[1]) / 2
        assert row.min_s <= row.time_s <= row.p95_s <= row.max_s
        for start, end in row.iter_windows_ns:
            assert start < end
        starts = [w[0] for w in row.iter_windows_ns]
        assert starts == sorted(starts)
        assert row.t_start_ns == row.iter_windows_ns[0][0] and row.t_end_ns == row.iter_windows_ns[-1][1]
        # the timed op lies inside its wall-clock window on every rank
        assert max(row.times_s) <= max(e - s for s, e in row.iter_windows_ns) / 1e9 + 1e-3


def test_corrupted_data_is_counted(tmp_path):
    spec = SweepSpec(ops=("all_gather",), sizes=(4096,), warmup=1, iters=5)
    rows = run_rows(spec, 2, tmp_path, corrupt_rank=1)
    # one flipped element per timed iteration on rank 1
    assert rows[0]["nwrong"] == 5


def test_a_stale_output_is_caught_in_the_iteration_it_happened(tmp_path):
    # Fill and check are batched over a ring of buffers (harness.RING_DEPTH): the check of each timed
    # iteration must still see exactly that iteration's output, in the first batch and in a later one.
    # Rank 1 leaves the output of timed iterations 2 and 35 (calls 3 and 36 after one warm-up) untouched:
    # every element of those two is wrong, and nothing else is.
    from diag.harness import RING_DEPTH

    spec = SweepSpec(ops=("all_gather",), sizes=(4096,), warmup=1, iters=RING_DEPTH + 8)
    assert spec.iters > 35 and RING_DEPTH <= 35
    rows = run_rows(spec, 2, tmp_path, corrupt_rank=1, corrupt_mode="drop:3,36")
    assert rows[0]["nwrong"] == 2 * 2 * 1024


def test_pattern_check_agrees_between_numpy_and_torch_paths():
    import torch

    from diag.collectives.base import Pattern

    pattern = Pattern()
    for dtype in (torch.float32, torch.bfloat16, torch.uint8, torch.float16):  # bfloat16: torch path
        blocks = torch.empty(3 * 500, dtype=dtype)
        for j, source in enumerate((0, 4, 2)):
            pattern.fill(blocks[j * 500:(j + 1) * 500], source, 9, seed=1)
        assert pattern.count_wrong_blocks(blocks, [0, 4, 2], 9, seed=1) == 0
        assert pattern.count_wrong_blocks(blocks, [0, 4, 3], 9, seed=1) == 500  # block 2 from the wrong rank
        blocks[7] += 1
        blocks[1499] = 0
        assert pattern.count_wrong_blocks(blocks, [0, 4, 2], 9, seed=1) == 2, dtype
        assert pattern.count_wrong(blocks[:500], 0, 9, seed=1) == 1


def test_odd_sizes_round_to_whole_elements_and_say_so(tmp_path):
    spec = SweepSpec(ops=("all_gather",), sizes=(1, 4099), dtype="uint8", warmup=0, iters=2)
    rows = [Record.from_event(r) for r in run_rows(spec, 2, tmp_path)]
    assert [r.size_bytes for r in rows] == [1, 4099]
    assert all(r.nwrong == 0 for r in rows)
    spec32 = SweepSpec(ops=("all_gather",), sizes=(4099,), warmup=0, iters=2)
    (row,) = [Record.from_event(r) for r in run_rows(spec32, 2, tmp_path)]
    assert row.size_bytes == 4096 and any("rounded down" in w for w in row.warnings)
    assert math.isclose(row.algbw_Bps, 2 * 4096 / row.time_s)


def test_adaptive_rows_stop_at_their_time_budget(tmp_path):
    """A profile's rows: past `iters`, sample until the mean is known or the row's budget is spent. Here the
    mean is never known well enough (target 1e-9), so the budget decides: a small size runs many iterations
    within it, a size whose two iterations already spend it runs just those."""
    budget = 0.2
    spec = SweepSpec(ops=("all_gather",), sizes=(1024, 32 << 20), dtype="uint8", warmup=1, iters=2,
                     max_iters=400, target_sem=1e-9, row_budget_s=budget)
    small, large = (Record.from_event(r) for r in run_rows(spec, 2, tmp_path))
    assert len(small.times_s) > 8 and len(large.times_s) < len(small.times_s)
    assert sum(small.times_s) >= budget or len(small.times_s) == 400
    # it stops at the first check past the budget: at most one batch (of `iters`) over it
    assert sum(small.times_s[:-2]) < budget
    if sum(large.times_s[:2]) >= budget:
        assert len(large.times_s) == 2

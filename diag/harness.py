"""The only timing loop. Every transport (torch gloo/nccl, raw TCP) is timed here, the same way.

Per (op, size): allocate; warm up (untimed, kept apart); then for each timed iteration: fill seeded data,
optional idle gap, barrier, time the op alone on every rank, check the data (fill and check are batched
over a small ring of buffers, see RING_DEPTH). After the row, every rank's
samples are all-gathered through the transport itself and rank 0 writes the row: an iteration's time is
the max over ranks (the collective is done when its slowest rank is), as nccl-tests reports.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from diag.collectives import Buffers, Collective, make_collective
from diag.errors import DiagError
from diag.records import Record
from diag.spec import SweepSpec
from diag.stats import summarize, warnings_for
from diag.transports.base import Transport, UnsupportedOperation

TORCH_DTYPES: dict[str, torch.dtype] = {
    "uint8": torch.uint8, "int32": torch.int32, "int64": torch.int64, "float16": torch.float16,
    "bfloat16": torch.bfloat16, "float32": torch.float32, "float64": torch.float64,
}


@dataclass(frozen=True)
class RowPlan:
    op: str
    size_bytes: int      # as asked
    count: int           # elements per rank input actually used
    used_bytes: int      # count x element size


def plan_rows(spec: SweepSpec, world_size: int) -> list[RowPlan]:
    """Turn byte sizes into element counts; sizes that do not fit the dtype/op are rounded down."""
    itemsize = torch.empty(0, dtype=TORCH_DTYPES[spec.dtype]).element_size()
    rows = []
    for op in spec.ops:
        collective = make_collective(op)
        if world_size < collective.min_world_size:
            raise DiagError(f"{op} needs at least {collective.min_world_size} ranks, got {world_size}")
        unit = itemsize * (world_size if collective.divisible_by_world else 1)
        for size in spec.sizes:
            count = (size // unit) * (unit // itemsize)
            if count == 0:
                raise DiagError(
                    f"size {size} B is smaller than one {spec.dtype} element"
                    + (f" per rank x {world_size}" if collective.divisible_by_world else "")
                    + "; use a larger size or --dtype uint8"
                )
            rows.append(RowPlan(op, size, count, count * itemsize))
    return rows


def _gather_int64(transport: Transport, values: list[int]) -> list[list[int]]:
    local = torch.tensor(values, dtype=torch.int64)
    out = torch.empty(len(values) * transport.world_size, dtype=torch.int64)
    if getattr(transport, "device", None) is not None and transport.device.type == "cuda":
        local, out = local.to(transport.device), out.to(transport.device)
    transport.all_gather(out, local)
    flat = out.cpu().tolist()
    n = len(values)
    return [flat[r * n:(r + 1) * n] for r in range(transport.world_size)]


# Verification in batches: a row cycles through up to RING_DEPTH buffer sets, filled together before a batch
# of timed iterations and checked together after it, so the iterations of a batch run back to back as in a
# bare loop. Measured (docs/benchmarks.md): any work between two timed iterations, even 20 us of spinning,
# slows the next one by ~5-10% at 1 KiB on gloo; with batches only the first iteration of each batch
# follows such work. The ring is capped at RING_BYTES per rank; above it the depth is 1 (fill and check
# around every iteration), where an op takes milliseconds and the work no longer matters.
RING_DEPTH = 32
RING_BYTES = 8 << 20


def _buffer_bytes(buffers: Buffers) -> int:
    tensors = [buffers.input, buffers.output] + [v for v in buffers.scratch.values() if isinstance(v, torch.Tensor)]
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def allocate_ring(collective: Collective, spec: SweepSpec, plan: RowPlan, device: torch.device, rank: int,
                  world: int) -> list[Buffers]:
    first = collective.allocate(plan.count, TORCH_DTYPES[spec.dtype], device, rank, world)
    depth = min(RING_DEPTH, spec.iters, max(1, RING_BYTES // max(1, _buffer_bytes(first))))
    rest = [collective.allocate(plan.count, TORCH_DTYPES[spec.dtype], device, rank, world) for _ in range(depth - 1)]
    return [first, *rest]


def _no_heartbeat() -> None:
    return None


def _mean_known(transport: Transport, times_ns: list[int], target_sem: float) -> tuple[bool, float]:
    """Is the mean of the iteration times (max over ranks) known to ``target_sem`` of itself (standard error)?
    And how many seconds did those iterations take (the sum of the max over ranks)?

    Collective: every rank gathers every rank's times and computes the same answer from the same numbers,
    so all ranks stop or go on together without a vote."""
    per_rank = _gather_int64(transport, times_ns)
    times = [max(row[i] for row in per_rank) for i in range(len(times_ns))]
    spent_s = sum(times) / 1e9
    summary = summarize(times)
    if summary.n < 2 or summary.mean <= 0:
        return False, spent_s
    return summary.stdev / math.sqrt(summary.n) / summary.mean <= target_sem, spent_s


def _extend(transport: Transport, spec: SweepSpec, times_ns: list[int]) -> bool:
    """Sample on: the mean is not yet known to spec.target_sem and the row has time left in spec.row_budget_s."""
    known, spent_s = _mean_known(transport, times_ns, spec.target_sem)
    return not known and (spec.row_budget_s <= 0 or spent_s < spec.row_budget_s)


def measure_row(transport: Transport, spec: SweepSpec, plan: RowPlan, run_id: str = "",
                heartbeat: Callable[[], None] | None = None) -> Record | None:
    """Run one row on this rank; returns the Record on rank 0 and None elsewhere.

    ``heartbeat`` is called after every warm-up and timed iteration, outside the timed window: a row can
    last minutes (200 MB at 200 Mbit/s is ~10 s an iteration) and the launcher's watchdog must see progress.
    """
    beat = heartbeat or _no_heartbeat
    rank, world = transport.rank, transport.world_size
    collective: Collective = make_collective(plan.op, seed=spec.seed, order=spec.order)
    device = getattr(transport, "device", torch.device(spec.device))
    ring = allocate_ring(collective, spec, plan, device, rank, world)
    depth = len(ring)

    warmup_ns = []
    for w in range(spec.warmup):
        buffers = ring[w % depth]
        collective.fill(buffers, rank, world, -1 - w)
        transport.barrier()
        t0 = time.perf_counter_ns()
        collective.run(transport, buffers)
        transport.synchronize()
        warmup_ns.append(time.perf_counter_ns() - t0)
        beat()

    times_ns: list[int] = []
    starts_ns: list[int] = []
    ends_ns: list[int] = []
    nwrong = 0
    planned = spec.iters
    batch = 0
    while batch < planned:
        batch_iters = range(batch, min(batch + depth, planned))
        for it in batch_iters:
            collective.fill(ring[it - batch], rank, world, it)
        for it in batch_iters:
            buffers = ring[it - batch]
            if spec.gap_s > 0:
                time.sleep(spec.gap_s)
            transport.on_iteration("begin", it)
            transport.barrier()
            wall0 = time.time_ns()
            t0 = time.perf_counter_ns()
            collective.run(transport, buffers)
            transport.synchronize()
            t1 = time.perf_counter_ns()
            wall1 = time.time_ns()
            transport.on_iteration("end", it)
            times_ns.append(t1 - t0)
            starts_ns.append(wall0)
            ends_ns.append(wall1)
            beat()
        if spec.check:
            for it in batch_iters:
                nwrong += collective.count_wrong(ring[it - batch], rank, world, it)
        batch = batch_iters.stop
        if batch == planned and planned < spec.max_iters and _extend(transport, spec, times_ns):
            planned = min(spec.max_iters, planned + depth)

    n = len(times_ns)
    per_rank = _gather_int64(transport, times_ns + starts_ns + ends_ns + [nwrong])
    extra = transport.row_extra()
    del ring
    if rank != 0:
        return None

    rank_times = [[v / 1e9 for v in row[:n]] for row in per_rank]
    times_s = [max(rank_times[r][i] for r in range(world)) for i in range(n)]
    windows = [[min(row[n + i] for row in per_rank), max(row[2 * n + i] for row in per_rank)] for i in range(n)]
    summary = summarize(times_s)
    total = collective.total_bytes(plan.used_bytes, world)
    algbw = total / summary.median if summary.median > 0 else 0.0
    warnings = warnings_for(times_s)
    if plan.used_bytes != plan.size_bytes:
        warnings.append(f"size rounded down from {plan.size_bytes} B to {plan.used_bytes} B ({spec.dtype})")
    return Record(
        backend=transport.backend, algo=transport.algo, op=plan.op, world_size=world,
        size_bytes=plan.used_bytes, total_bytes=total, volume_bytes=collective.volume_bytes(plan.used_bytes, world),
        dtype=spec.dtype, count=plan.count, iters=n, warmup=spec.warmup,
        times_s=times_s, time_s=summary.median, min_s=summary.min, max_s=summary.max, mean_s=summary.mean,
        p95_s=summary.p95, stdev_s=summary.stdev,
        algbw_Bps=algbw, busbw_Bps=algbw * collective.bus_factor(world),
        nwrong=sum(row[3 * n] for row in per_rank),
        t_start_ns=windows[0][0], t_end_ns=windows[-1][1],
        rank0_times_s=rank_times[0], rank_times_s=rank_times, iter_windows_ns=windows,
        warmup_times_s=[v / 1e9 for v in warmup_ns], gap_s=spec.gap_s,
        # exchange and all_gather_p2p post in the spec's order, whatever the transport's own setting
        knobs={**transport.knobs(), **({"order": spec.order} if hasattr(collective, "order") else {})},
        hosts=transport.hosts(), extra=extra, run_id=run_id, warnings=warnings,
    )


def run_sweep(
    transport: Transport,
    spec: SweepSpec,
    emit: Callable[[Record], None],
    run_id: str = "",
    on_row_start: Callable[[RowPlan], None] | None = None,
    heartbeat: Callable[[], None] | None = None,
) -> int:
    """Run every row of the spec; rank 0 calls ``emit`` as each row finishes. Returns rows run.

    ``heartbeat`` is called after every iteration (see measure_row)."""
    plans = plan_rows(spec, transport.world_size)
    for plan in plans:
        if on_row_start is not None:
            on_row_start(plan)
        try:
            record = measure_row(transport, spec, plan, run_id, heartbeat)
        except UnsupportedOperation as exc:
            raise DiagError(f"{transport.backend}: {exc}") from exc
        if record is not None:
            emit(record)
    return len(plans)


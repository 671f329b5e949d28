"""Measurement overhead of diag's harness against a bare ``dist.all_gather`` loop, in one run.

    python -m torch.distributed.run --nproc-per-node 2 -m bench.overhead [--size 1K] [--iters 2000]

Both loops run on the same process group, interleaved in blocks so machine noise hits both alike. The
bare loop is what a careful user writes (barrier, time, all_gather); diag's is the harness (fill, barrier,
time on every rank, check). Each is summarized both ways a time can be defined: on rank 0's clock (what a
hand-written loop prints) and as the max over ranks (what a diag row reports, as nccl-tests does). The
overhead is the ratio under the same definition; the target is within 10% for both.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist

from diag.harness import measure_row, plan_rows
from diag.spec import SweepSpec
from diag.transports.torch_dist import TorchTransport
from diag.units import parse_size


def bare_loop(size_bytes: int, iters: int) -> list[float]:
    world = dist.get_world_size()
    tensor = torch.ones(size_bytes // 4)
    outputs = [torch.empty_like(tensor) for _ in range(world)]
    samples = []
    for _ in range(iters):
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_gather(outputs, tensor)
        samples.append(time.perf_counter() - t0)
    return samples


def max_over_ranks(samples: list[float]) -> list[float]:
    """Every rank's samples, gathered; an iteration's time is its slowest rank's (as a diag row)."""
    local = torch.tensor(samples, dtype=torch.float64)
    gathered = [torch.empty_like(local) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, local)
    return torch.stack(gathered).max(dim=0).values.tolist()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="1K")
    parser.add_argument("--iters", type=int, default=2000)
    parser.add_argument("--blocks", type=int, default=30)
    args = parser.parse_args()
    size = parse_size(args.size)
    transport = TorchTransport("gloo", timeout_s=60)
    per_block = max(1, args.iters // args.blocks)
    spec = SweepSpec(ops=("all_gather",), sizes=(size,), warmup=20, iters=per_block)
    (plan,) = plan_rows(spec, transport.world_size)
    bare_loop(size, 50)  # warm up the bare loop's buffers too
    bare: list[float] = []
    harness: list[float] = []
    rank0: list[float] = []
    def run_harness() -> None:
        record = measure_row(transport, spec, plan)
        if record is not None:
            harness.extend(record.times_s)
            rank0.extend(record.rank0_times_s)

    for block in range(args.blocks):  # alternate which loop goes first, so neither always follows the other
        if block % 2:
            run_harness()
            bare.extend(bare_loop(size, per_block))
        else:
            bare.extend(bare_loop(size, per_block))
            run_harness()
    bare_max = max_over_ranks(bare)
    if transport.rank == 0:
        medians = {
            ("bare", "rank 0"): statistics.median(bare), ("bare", "max"): statistics.median(bare_max),
            ("diag", "rank 0"): statistics.median(rank0), ("diag", "max"): statistics.median(harness),
        }
        print(f"size {size} B, N={transport.world_size}, {len(bare)} iterations each, interleaved in "
              f"{args.blocks} blocks")
        print(f"{'median':<28}{'bare loop':>12}{'diag':>12}{'diag/bare':>12}")
        for label, key in (("rank 0's clock", "rank 0"), ("max over ranks (diag's row)", "max")):
            b, d = medians[("bare", key)], medians[("diag", key)]
            print(f"{label:<28}{b * 1e6:>9.1f} us{d * 1e6:>9.1f} us{d / b:>12.3f}")
        print(f"diag's row vs the bare loop on rank 0's clock: "
              f"{medians[('diag', 'max')] / medians[('bare', 'rank 0')]:.3f} (a definition, not a cost)")
        print("target: diag/bare within 0.90..1.10 under each definition")
    transport.close()


if __name__ == "__main__":
    main()

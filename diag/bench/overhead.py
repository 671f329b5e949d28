"""Measurement overhead of diag's harness against a bare ``dist.all_gather`` loop, in one run.

    python -m torch.distributed.run --nproc-per-node 2 -m diag.bench.overhead [--size 1K] [--iters 2000]

Both loops run on the same process group, interleaved in blocks so machine noise hits both alike. The
bare loop is what a careful user writes (barrier, time, all_gather; rank 0's clock); diag's is the harness
(fill, barrier, time on every rank, check, max over ranks). The harness's median must stay within 10%.
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="1K")
    parser.add_argument("--iters", type=int, default=2000)
    parser.add_argument("--blocks", type=int, default=10)
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
    for _ in range(args.blocks):
        bare.extend(bare_loop(size, per_block))
        record = measure_row(transport, spec, plan)
        if record is not None:
            harness.extend(record.times_s)
            rank0.extend(record.rank0_times_s)
    if transport.rank == 0:
        bare_median = statistics.median(bare)
        diag_median = statistics.median(harness)
        print(f"size {size} B, N={transport.world_size}, {len(bare)} iterations each, interleaved")
        print(f"bare dist.all_gather loop median (rank 0 clock): {bare_median * 1e6:.1f} us")
        print(f"diag harness median (max over ranks):           {diag_median * 1e6:.1f} us")
        print(f"diag harness median, rank 0 clock only:         {statistics.median(rank0) * 1e6:.1f} us")
        print(f"diag / bare = {diag_median / bare_median:.3f}  (target: within 0.90..1.10)")
    transport.close()


if __name__ == "__main__":
    main()

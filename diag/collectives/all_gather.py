"""all_gather: every rank contributes ``count`` elements, every rank receives all N blocks.

nccl-tests: size = N x per-rank bytes; busbw = algbw x (N-1)/N (each rank must receive N-1 blocks).
"""

from __future__ import annotations

from diag.collectives.base import Buffers, Collective, clear


class AllGather(Collective):
    name = "all_gather"

    def total_bytes(self, size_bytes: int, world_size: int) -> int:
        return size_bytes * world_size

    def bus_factor(self, world_size: int) -> float:
        return (world_size - 1) / world_size

    def allocate(self, count, dtype, device, rank, world_size) -> Buffers:
        import torch

        return Buffers(
            input=torch.empty(count, dtype=dtype, device=device),
            output=torch.empty(count * world_size, dtype=dtype, device=device),
        )

    def fill(self, buffers, rank, world_size, iteration) -> None:
        self.pattern.fill(buffers.input, rank, iteration, self.seed)
        clear(buffers.output)  # a block the transport forgets to write must show up as wrong

    def run(self, transport, buffers) -> None:
        transport.all_gather(buffers.output, buffers.input)

    def count_wrong(self, buffers, rank, world_size, iteration) -> int:
        return self.pattern.count_wrong_blocks(buffers.output, list(range(world_size)), iteration, self.seed)

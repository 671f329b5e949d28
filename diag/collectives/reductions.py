"""all_reduce, reduce_scatter (sum), broadcast and all_to_all, with nccl-tests' byte counts.

  all_reduce:     size = per-rank bytes;              busbw = algbw x 2(N-1)/N
  reduce_scatter: size = per-rank input (N blocks);   busbw = algbw x (N-1)/N
  broadcast:      size = bytes broadcast;             busbw = algbw
  all_to_all:     size = per-rank input (N blocks);   busbw = algbw x (N-1)/N
"""

from __future__ import annotations

from diag.collectives.base import Buffers, Collective, clear, pattern_offset

BROADCAST_ROOT = 0


def _sum_of_offsets(world_size: int, iteration: int, seed: int) -> int:
    return sum(pattern_offset(r, iteration, seed) for r in range(world_size))


class AllReduce(Collective):
    name = "all_reduce"

    def total_bytes(self, size_bytes, world_size):
        return size_bytes

    def bus_factor(self, world_size):
        return 2 * (world_size - 1) / world_size

    def allocate(self, count, dtype, device, rank, world_size):
        import torch

        return Buffers(input=torch.empty(count, dtype=dtype, device=device))

    def fill(self, buffers, rank, world_size, iteration):
        self.pattern.fill(buffers.input, rank, iteration, self.seed)

    def run(self, transport, buffers):
        transport.all_reduce(buffers.input)

    def count_wrong(self, buffers, rank, world_size, iteration):
        # sum_r (base + off_r) = N*base + sum_r off_r: integers, exact in every dtype we allow at N <= 8
        actual = buffers.input
        base = self.pattern.base(actual.numel(), actual)
        expected = base * world_size + _sum_of_offsets(world_size, iteration, self.seed)
        return int(actual.ne(expected).sum().item())


class ReduceScatter(Collective):
    name = "reduce_scatter"
    divisible_by_world = True

    def total_bytes(self, size_bytes, world_size):
        return size_bytes

    def bus_factor(self, world_size):
        return (world_size - 1) / world_size

    def allocate(self, count, dtype, device, rank, world_size):
        import torch

        return Buffers(
            input=torch.empty(count, dtype=dtype, device=device),
            output=torch.empty(count // world_size, dtype=dtype, device=device),
        )

    def fill(self, buffers, rank, world_size, iteration):
        self.pattern.fill(buffers.input, rank, iteration, self.seed)
        clear(buffers.output)

    def run(self, transport, buffers):
        transport.reduce_scatter(buffers.output, buffers.input)

    def count_wrong(self, buffers, rank, world_size, iteration):
        chunk = buffers.output.numel()
        full = self.pattern.base(buffers.input.numel(), buffers.input)
        mine = full[rank * chunk:(rank + 1) * chunk]
        expected = mine * world_size + _sum_of_offsets(world_size, iteration, self.seed)
        return int(buffers.output.ne(expected).sum().item())


class Broadcast(Collective):
    name = "broadcast"

    def total_bytes(self, size_bytes, world_size):
        return size_bytes

    def bus_factor(self, world_size):
        return 1.0

    def allocate(self, count, dtype, device, rank, world_size):
        import torch

        return Buffers(input=torch.empty(count, dtype=dtype, device=device))

    def fill(self, buffers, rank, world_size, iteration):
        if rank == BROADCAST_ROOT:
            self.pattern.fill(buffers.input, rank, iteration, self.seed)
        else:
            clear(buffers.input)

    def run(self, transport, buffers):
        transport.broadcast(buffers.input, BROADCAST_ROOT)

    def count_wrong(self, buffers, rank, world_size, iteration):
        return self.pattern.count_wrong(buffers.input, BROADCAST_ROOT, iteration, self.seed)


class AllToAll(Collective):
    """Block j of rank r's input goes to rank j; rank r's output block i comes from rank i.

    Input element values are rank r's pattern over the whole input, so the block rank j receives from
    rank i is slice [j*chunk, (j+1)*chunk) of rank i's pattern.
    """

    name = "all_to_all"
    divisible_by_world = True

    def total_bytes(self, size_bytes, world_size):
        return size_bytes

    def bus_factor(self, world_size):
        return (world_size - 1) / world_size

    def allocate(self, count, dtype, device, rank, world_size):
        import torch

        return Buffers(
            input=torch.empty(count, dtype=dtype, device=device),
            output=torch.empty(count, dtype=dtype, device=device),
        )

    def fill(self, buffers, rank, world_size, iteration):
        self.pattern.fill(buffers.input, rank, iteration, self.seed)
        clear(buffers.output)

    def run(self, transport, buffers):
        transport.all_to_all(buffers.output, buffers.input)

    def count_wrong(self, buffers, rank, world_size, iteration):
        count = buffers.input.numel()
        chunk = count // world_size
        base = self.pattern.base(count, buffers.input)[rank * chunk:(rank + 1) * chunk]
        return self.pattern.count_wrong_blocks(buffers.output, list(range(world_size)), iteration, self.seed,
                                               base=base)

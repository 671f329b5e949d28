"""all_gather: every rank contributes ``count`` elements, every rank receives all N blocks.

nccl-tests: size = N x per-rank bytes; busbw = algbw x (N-1)/N (each rank must receive N-1 blocks).

all_gather_p2p is the same operation built by the user from point-to-point calls: every rank posts a
receive from each peer and a send to each peer in one ``torch.distributed.batch_isend_irecv``, receives
first by default (``--order``), then copies its own block. It is the workaround ``diag advise`` measures
for gloo's N=2 all_gather: posted first, a rank's ready-to-receive notice cannot queue behind its own
data (docs/raw-tcp.md, "The gloo protocol model").
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


class AllGatherP2P(AllGather):
    name = "all_gather_p2p"

    def __init__(self, seed: int = 0, order: str = "recv-first") -> None:
        super().__init__(seed)
        self.order = order

    def run(self, transport, buffers) -> None:
        blocks = buffers.output.chunk(transport.world_size)
        peers = [peer for peer in range(transport.world_size) if peer != transport.rank]
        transport.batch_p2p([(blocks[peer], peer) for peer in peers], [(buffers.input, peer) for peer in peers],
                            self.order)
        blocks[transport.rank].copy_(buffers.input)

"""Point-to-point ops between paired ranks (0,1), (2,3), ...; with an odd world size the last rank idles.

  send_recv: even rank sends S bytes to its odd partner (one-way bandwidth); size = S, busbw = algbw.
  ping_pong: even rank sends S, the partner sends S back (latency = time/2 at small S);
             size = 2S (two sequential transfers per iteration), busbw = algbw.
  exchange:  both ranks of a pair send and receive S at once (isend + irecv), in the order given by
             --order; size = S (bytes each direction carries), busbw = algbw. A full-duplex path gives
             busbw near the link rate; a path whose directions take turns gives about half.
"""

from __future__ import annotations

from diag.collectives.base import Buffers, Collective, clear, pair_peer


class _PairCollective(Collective):
    min_world_size = 2
    pairwise = True

    def bus_factor(self, world_size):
        return 1.0

    def allocate(self, count, dtype, device, rank, world_size):
        import torch

        return Buffers(
            input=torch.empty(count, dtype=dtype, device=device),
            output=torch.empty(count, dtype=dtype, device=device),
            scratch={"peer": pair_peer(rank, world_size)},
        )

    def fill(self, buffers, rank, world_size, iteration):
        self.pattern.fill(buffers.input, rank, iteration, self.seed)
        clear(buffers.output)


class SendRecv(_PairCollective):
    name = "send_recv"

    def total_bytes(self, size_bytes, world_size):
        return size_bytes

    def run(self, transport, buffers):
        peer = buffers.scratch["peer"]
        if peer is None:
            return
        if transport.rank % 2 == 0:
            transport.send(buffers.input, peer)
        else:
            transport.recv(buffers.output, peer)

    def count_wrong(self, buffers, rank, world_size, iteration):
        peer = buffers.scratch["peer"]
        if peer is None or rank % 2 == 0:
            return 0
        return self.pattern.count_wrong(buffers.output, peer, iteration, self.seed)


class PingPong(_PairCollective):
    name = "ping_pong"

    def total_bytes(self, size_bytes, world_size):
        return 2 * size_bytes

    def run(self, transport, buffers):
        peer = buffers.scratch["peer"]
        if peer is None:
            return
        if transport.rank % 2 == 0:
            transport.send(buffers.input, peer)
            transport.recv(buffers.output, peer)
        else:
            transport.recv(buffers.output, peer)
            transport.send(buffers.input, peer)

    def count_wrong(self, buffers, rank, world_size, iteration):
        peer = buffers.scratch["peer"]
        if peer is None:
            return 0
        return self.pattern.count_wrong(buffers.output, peer, iteration, self.seed)


class Exchange(_PairCollective):
    name = "exchange"

    def __init__(self, seed: int = 0, order: str = "recv-first") -> None:
        super().__init__(seed)
        self.order = order

    def total_bytes(self, size_bytes, world_size):
        return size_bytes

    def run(self, transport, buffers):
        peer = buffers.scratch["peer"]
        if peer is None:
            return
        transport.exchange(buffers.input, buffers.output, peer, self.order)

    def count_wrong(self, buffers, rank, world_size, iteration):
        peer = buffers.scratch["peer"]
        if peer is None:
            return 0
        return self.pattern.count_wrong(buffers.output, peer, iteration, self.seed)

"""Schedules: which byte ranges go to which peer, in which order, for each operation and algorithm.

All functions work on flat byte memoryviews. A block is split into ``chunks x streams`` parts; part i
travels on stream ``i % streams``, so every chunk is striped over all streams of a peer pair.

- ring (gloo's all_gather for every N, gloo/allgather.cc): N-1 steps; in step s rank r sends block (r-s)
  to r+1 and receives block (r-s-1) from r-1. A part is forwarded as soon as it arrived (``after``), so
  steps pipeline at chunk granularity. At N=2 both neighbours are the same rank, so all ops of the
  operation go to one peer. With ``gloo_waits`` (the notify protocol) the send and receive of part i in
  step s are posted only once both the send and the receive of part i in step s-1 completed: gloo posts
  op k after ``waitSend``/``waitRecv`` of op k-2 (2 chunks per block).
- pairwise: N-1 stages run one after another; in stage s rank r exchanges its own block with r+s / r-s.
- direct: every rank sends its block to all peers and receives from all at once.

``order`` decides which of a send and its matching receive a rank posts first; with ``--handshake
notify`` posting a receive sends the in-band notice, so send-first can queue the notice behind own data.
"""

from __future__ import annotations

import itertools

from diag.transports.raw.engine import RECV, SEND, Op


def part_bounds(nbytes: int, parts: int) -> list[tuple[int, int]]:
    edges = [i * nbytes // parts for i in range(parts + 1)]
    return list(itertools.pairwise(edges))


def _paired(send: Op, recv: Op, send_first: bool) -> list[Op]:
    return [send, recv] if send_first else [recv, send]


def transfer_ops(kind: int, peer: int, view: memoryview, chunks: int, streams: int,
                 after: list[Op] | None = None) -> list[Op]:
    bounds = part_bounds(len(view), chunks * streams)
    return [Op(kind, peer, view[lo:hi], stream=i % streams, after=() if after is None else (after[i],),
               total=len(view))
            for i, (lo, hi) in enumerate(bounds)]


def all_gather(algo: str, out: memoryview, rank: int, world_size: int, chunks: int, streams: int,
               send_first: bool, gloo_waits: bool = False) -> list[list[Op]]:
    """Stages for all_gather on ``out`` (world_size equal blocks, own block already in place)."""
    block = len(out) // world_size
    parts = chunks * streams
    bounds = part_bounds(block, parts)

    def part(block_index: int, i: int) -> memoryview:
        lo, hi = bounds[i]
        base = block_index * block
        return out[base + lo:base + hi]

    if world_size == 1:
        return []
    if algo == "ring":
        right = (rank + 1) % world_size
        left = (rank - 1) % world_size
        stage: list[Op] = []
        previous: list[tuple[Op, Op]] | None = None   # (send, recv) of each part in the step before
        for step in range(world_size - 1):
            send_block = (rank - step) % world_size
            recv_block = (rank - step - 1) % world_size
            current: list[tuple[Op, Op]] = []
            for i in range(parts):
                waits: tuple[Op, ...] = ()
                if previous is not None:
                    before_send, forwarded = previous[i]
                    waits = (forwarded, before_send) if gloo_waits else (forwarded,)
                send = Op(SEND, right, part(send_block, i), stream=i % streams, after=waits, total=block)
                recv = Op(RECV, left, part(recv_block, i), stream=i % streams, after=waits, total=block)
                stage.extend(_paired(send, recv, send_first))
                current.append((send, recv))
            previous = current
        return [stage]
    stages: list[list[Op]] = []
    for step in range(1, world_size):
        dst = (rank + step) % world_size
        src = (rank - step) % world_size
        ops: list[Op] = []
        for i in range(parts):
            send = Op(SEND, dst, part(rank, i), stream=i % streams, total=block)
            recv = Op(RECV, src, part(src, i), stream=i % streams, total=block)
            ops.extend(_paired(send, recv, send_first))
        stages.append(ops)
    if algo == "pairwise":
        return stages
    return [[op for stage in stages for op in stage]]   # direct


def all_to_all(out: memoryview, inp: memoryview, rank: int, world_size: int, chunks: int, streams: int,
               send_first: bool) -> list[list[Op]]:
    block = len(inp) // world_size
    ops: list[Op] = []
    for step in range(1, world_size):
        dst = (rank + step) % world_size
        src = (rank - step) % world_size
        sends = transfer_ops(SEND, dst, inp[dst * block:(dst + 1) * block], chunks, streams)
        recvs = transfer_ops(RECV, src, out[src * block:(src + 1) * block], chunks, streams)
        ops.extend(sends + recvs if send_first else recvs + sends)
    return [ops]


def broadcast(view: memoryview, rank: int, root: int, world_size: int, chunks: int,
              streams: int) -> list[list[Op]]:
    if rank == root:
        return [[op for peer in range(world_size) if peer != root
                 for op in transfer_ops(SEND, peer, view, chunks, streams)]]
    return [transfer_ops(RECV, root, view, chunks, streams)]

"""Every op a program calls, run unchanged on gloo and on diag_tcp: each rank writes what it got (digests of
the bytes, so results compare bit for bit) to OUT_DIR/<backend>-<rank>.json. No diag imports: diag_tcp is
registered by ``python -m diag.exec``, as for any user's script.

Covers: all_reduce over dtypes and reduce ops (signed zeros, NaNs, sizes over gloo's 1 MiB segments),
reduce to every root, reduce_scatter (tensor and list), all_reduce_coalesced, all_gather (list, tensor,
coalesced), broadcast, gather, scatter, all_to_all (list, unequal sizes) and all_to_all_single with explicit
splits, the object collectives, the coalescing manager; point-to-point that deadlocked while diag_tcp's
isend/irecv blocked (irecv before isend, a send-first ring at 16 MiB, batch_isend_irecv receives first, two
tags received in the other order, receive from any source); ops gloo refuses (AVG, PREMUL_SUM, BAND on
floats); and a column-then-row parallel layer on a DeviceMesh through DTensor against the same layer in
one process.
"""

import hashlib
import json
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

BACKEND = os.environ.get("DIST_BACKEND", "gloo")
dist.init_process_group(BACKEND, timeout=timedelta(seconds=float(os.environ.get("PG_TIMEOUT_S", "20"))))
rank, world = dist.get_rank(), dist.get_world_size()
out: dict = {"world": world}


def digest(tensor: torch.Tensor) -> str:
    return hashlib.sha256(tensor.detach().contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()[:20]


def values(dtype: torch.dtype, n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed * 131 + rank)
    if dtype.is_floating_point:
        x = (torch.randn(n, generator=g, dtype=torch.float64)
             * torch.exp2(torch.randint(-8, 8, (n,), generator=g).double())).to(dtype)
        x[::7] = -0.0
        x[3::11] = 0.0 if rank % 2 else -0.0
        if rank == 1:
            x[5::13] = float("nan")
        return x
    if dtype == torch.bool:
        return torch.randint(0, 2, (n,), generator=g).bool()
    low = 0 if dtype == torch.uint8 else -100
    return torch.randint(low, 100, (n,), generator=g).to(dtype)


def refused(name: str, call) -> None:
    """gloo refuses these; so must diag_tcp (a RuntimeError; the message is checked by the test)."""
    try:
        call()
        out[name] = "ran"
    except RuntimeError as exc:
        out[name] = "refused"
        out[f"{name}:message"] = str(exc)


OPS = {"sum": dist.ReduceOp.SUM, "product": dist.ReduceOp.PRODUCT, "min": dist.ReduceOp.MIN,
       "max": dist.ReduceOp.MAX, "band": dist.ReduceOp.BAND, "bor": dist.ReduceOp.BOR, "bxor": dist.ReduceOp.BXOR}
FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
INTS = (torch.int32, torch.int64, torch.uint8, torch.int8, torch.bool)
seed = 0
for dtype in FLOATS + INTS:
    for name, op in OPS.items():
        if name in ("band", "bor", "bxor") and dtype in FLOATS:
            continue
        # 300001 elements span several of gloo's 1 MiB segments per ring chunk
        for n in ((7, 300_001) if dtype in (torch.float16, torch.bfloat16) and name == "sum" else (7,)):
            seed += 1
            t = values(dtype, n, seed)
            dist.all_reduce(t, op=op)
            out[f"all_reduce {dtype} {name} {n}"] = digest(t)
zero = torch.tensor([-0.0, -0.0, 0.0])
dist.all_reduce(zero)
out["all_reduce -0.0"] = [str(v) for v in zero.tolist()]

for root in (0, world - 1):
    for dtype, name in ((torch.float16, "sum"), (torch.float32, "max"), (torch.int64, "product")):
        seed += 1
        t = values(dtype, 20_001, seed)
        dist.reduce(t, root, op=OPS[name])
        if rank == root:   # elsewhere the tensor's contents are unspecified (gloo leaves its scratch there)
            out[f"reduce {dtype} {name} to {root}"] = digest(t)

for dtype in (torch.bfloat16, torch.float32):
    seed += 1
    big = values(dtype, world * 10_003, seed)
    mine = torch.empty(10_003, dtype=dtype)
    dist.reduce_scatter_tensor(mine, big)
    out[f"reduce_scatter_tensor {dtype}"] = digest(mine)
    listed = torch.empty(10_003, dtype=dtype)
    dist.reduce_scatter(listed, list(big.chunk(world)))
    out[f"reduce_scatter list {dtype}"] = digest(listed)
    pair = [values(dtype, 5000, seed + 1), values(dtype, 77, seed + 2)]
    dist.all_reduce_coalesced(pair)
    out[f"all_reduce_coalesced {dtype}"] = [digest(t) for t in pair]
    with dist._coalescing_manager():
        a, b = values(dtype, 1000, seed + 3), values(dtype, 10, seed + 4)
        dist.all_reduce(a)
        dist.all_reduce(b)
    out[f"coalescing_manager all_reduce {dtype}"] = [digest(a), digest(b)]

x = torch.arange(6, dtype=torch.float32) + 10 * rank
gathered = [torch.empty(6) for _ in range(world)]
dist.all_gather(gathered, x)
out["all_gather"] = [digest(t) for t in gathered]
flat = torch.empty(6 * world)
dist.all_gather_into_tensor(flat, x)
out["all_gather_into_tensor"] = digest(flat)
coalesced = [[torch.empty(6), torch.empty(2, dtype=torch.float32)] for _ in range(world)]
dist.all_gather_coalesced(coalesced, [x, torch.ones(2) * rank])
out["all_gather_coalesced"] = [[digest(t) for t in lst] for lst in coalesced]
b = torch.arange(5, dtype=torch.float64) if rank == 1 else torch.zeros(5, dtype=torch.float64)
dist.broadcast(b, src=1)
out["broadcast"] = b.tolist()
into = [torch.zeros(3) for _ in range(world)] if rank == 0 else None
dist.gather(torch.full((3,), float(rank)), into, dst=0)
out["gather"] = [t.tolist() for t in into] if into else None
piece = torch.zeros(2)
dist.scatter(piece, [torch.tensor([float(i), i + 0.5]) for i in range(world)] if rank == world - 1 else None,
             src=world - 1)
out["scatter"] = piece.tolist()
sends = [torch.full((3,), float(10 * rank + peer)) for peer in range(world)]   # gloo: equal sizes only
recvs = [torch.empty(3) for peer in range(world)]
dist.all_to_all(recvs, sends)
out["all_to_all list"] = [t.tolist() for t in recvs]
in_splits = [peer + 1 for peer in range(world)]              # rank r sends peer+1 rows to each peer
out_splits = [rank + 1] * world                              # and receives rank+1 rows from each
source = torch.arange(sum(in_splits) * 2, dtype=torch.float32).view(-1, 2) + 100 * rank
target = torch.empty(sum(out_splits), 2)
dist.all_to_all_single(target, source, out_splits, in_splits)
out["all_to_all_single splits"] = target.tolist()
equal = torch.empty(2 * world)
dist.all_to_all_single(equal, torch.arange(2.0 * world) + 100 * rank, [2] * world, [2] * world)
out["all_to_all_single equal splits"] = equal.tolist()
objects = [None] * world
dist.all_gather_object(objects, {"rank": rank, "text": "x" * rank})
out["all_gather_object"] = objects
got = [None] * world if rank == 0 else None
dist.gather_object({"from": rank}, got, dst=0)
out["gather_object"] = got
one = [None]
dist.scatter_object_list(one, [{"to": i} for i in range(world)] if rank == 0 else None, src=0)
out["scatter_object_list"] = one
listed = [rank, "a"] if rank == 0 else [None, None]
dist.broadcast_object_list(listed, src=0)
out["broadcast_object_list"] = listed

seed += 1
average = values(torch.bfloat16, 50_001, seed)
dist.all_reduce(average, op=dist.ReduceOp.AVG)
out["all_reduce bfloat16 avg"] = digest(average)
refused("AVG of integers", lambda: dist.all_reduce(torch.ones(3, dtype=torch.int64), op=dist.ReduceOp.AVG))
refused("PREMUL_SUM", lambda: dist.all_reduce(torch.ones(3), op=dist._make_nccl_premul_sum(2.0)))
refused("BAND float", lambda: dist.all_reduce(torch.ones(3), op=dist.ReduceOp.BAND))
after = torch.ones(4) * (rank + 1)
dist.all_reduce(after)
out["all_reduce after refusals"] = after.tolist()

# --- point-to-point (peer pairs 0<->1; the ring runs over all ranks)
big = 16 << 20
if rank in (0, 1):
    other = 1 - rank
    if rank == 0:                                   # a receive posted long before its send
        early = torch.empty(big, dtype=torch.uint8)
        work = dist.irecv(early, other)
        out["irecv before isend: pending while the peer sleeps"] = not work.is_completed()
        work.wait()
        out["irecv before isend"] = digest(early)
    else:
        time.sleep(0.5)
        dist.isend(torch.arange(big, dtype=torch.int64).to(torch.uint8), other).wait()
    if rank == 0:                                   # two tags, received in the other order
        works = [dist.isend(torch.tensor([1.0, 1.0]), other, tag=1), dist.isend(torch.tensor([2.0]), other, tag=2)]
        for work in works:
            work.wait()
    else:
        second, first = torch.zeros(1), torch.zeros(2)
        dist.recv(second, other, tag=2)
        dist.recv(first, other, tag=1)
        out["tags 2 then 1"] = [second.tolist(), first.tolist()]
    ops = [dist.P2POp(dist.irecv, torch.empty(big, dtype=torch.uint8), other),
           dist.P2POp(dist.isend, torch.full((big,), 7 + rank, dtype=torch.uint8), other)]
    for work in dist.batch_isend_irecv(ops):      # receives listed first, as diag advise recommends
        work.wait()
    out["batch_isend_irecv receives first"] = digest(ops[0].tensor)
    if rank == 0:
        anywhere = torch.zeros(3)
        source_rank = dist.recv(anywhere, tag=5)
        out["recv from any source"] = [source_rank, anywhere.tolist()]
    else:
        dist.send(torch.tensor([4.0, 5.0, 6.0]), 0, tag=5)
ring_out = torch.full((big,), rank + 1, dtype=torch.uint8)
ring_in = torch.empty(big, dtype=torch.uint8)
works = [dist.isend(ring_out, (rank + 1) % world), dist.irecv(ring_in, (rank - 1) % world)]   # sends first
for work in works:
    work.wait()
out["send-first ring 16 MiB"] = digest(ring_in)

# --- DeviceMesh + DTensor: a column-then-row parallel layer against the same layer in one process
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module  # noqa: E402

out["group_name"] = dist.group.WORLD.group_name
mesh = init_device_mesh("cpu", (world,))


class Layer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.Linear(16, 8 * world)
        self.down = torch.nn.Linear(8 * world, 16)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(inputs)))


torch.manual_seed(0)
reference = Layer()
inputs = torch.randn(4, 16)
expected = reference(inputs)
expected.sum().backward()
parallel = Layer()
parallel.load_state_dict(reference.state_dict())
parallel = parallelize_module(parallel, mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
result = parallel(inputs)
result.sum().backward()
out["tensor parallel output"] = digest(result)
out["tensor parallel matches one process"] = bool(torch.allclose(result, expected, rtol=1e-5, atol=1e-6))
grad = parallel.up.weight.grad.full_tensor()
out["tensor parallel up.weight.grad matches one process"] = bool(
    torch.allclose(grad, reference.up.weight.grad, rtol=1e-5, atol=1e-6))

with open(os.path.join(sys.argv[1], f"{BACKEND}-{rank}.json"), "w") as handle:
    json.dump(out, handle, indent=1)
# No rank tears its pairs down while a peer may still be sending to it: stock gloo aborted a rank once ("terminate
# called without an active exception") when its peers closed first beside a busy machine.
dist.barrier()
dist.destroy_process_group()

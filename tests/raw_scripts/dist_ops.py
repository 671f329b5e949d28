"""A plain torch.distributed script (no diag imports): run unchanged on gloo and on diag_tcp."""

import json
import os
import sys

import torch
import torch.distributed as dist

dist.init_process_group(backend=os.getenv("DIST_BACKEND", "gloo"))
rank, world = dist.get_rank(), dist.get_world_size()
result = {}
x = torch.arange(5, dtype=torch.float32) + 10 * rank
gathered = [torch.empty(5) for _ in range(world)]
dist.all_gather(gathered, x)
result["all_gather"] = [t.tolist() for t in gathered]
flat = torch.empty(5 * world)
dist.all_gather_into_tensor(flat, x)
result["all_gather_into_tensor"] = flat.tolist()
rs = torch.empty(2)
dist.reduce_scatter_tensor(rs, torch.arange(2.0 * world) + rank)
result["reduce_scatter"] = rs.tolist()
a2a = torch.empty(world)
dist.all_to_all_single(a2a, torch.arange(float(world)) + 100 * rank)
result["all_to_all"] = a2a.tolist()
y = torch.arange(4, dtype=torch.int64) * (rank + 1)
dist.all_reduce(y)
result["all_reduce"] = y.tolist()
z = torch.full((3,), float(rank))
dist.all_reduce(z, op=dist.ReduceOp.MAX)
result["all_reduce_max"] = z.tolist()
b = torch.arange(6, dtype=torch.float64) if rank == 0 else torch.zeros(6, dtype=torch.float64)
dist.broadcast(b, src=0)
result["broadcast"] = b.tolist()
# A non-contiguous tensor (a transposed view) must be written in place through the view.
t = (torch.arange(6.0).reshape(2, 3) * (rank + 1)).t()
dist.broadcast(t, src=0)
result["broadcast_transposed"] = t.tolist()
if rank == 0:
    dist.send(torch.tensor([7, 8, 9]), dst=1)
elif rank == 1:
    r = torch.zeros(3, dtype=torch.int64)
    dist.recv(r, src=0)
    result["recv"] = r.tolist()
dist.barrier()
with open(os.path.join(sys.argv[1], f"{os.getenv('DIST_BACKEND', 'gloo')}-{rank}.json"), "w") as f:
    json.dump(result, f)
dist.destroy_process_group()

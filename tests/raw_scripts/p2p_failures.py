"""diag_tcp on 2 ranks with a short process-group timeout ($PG_TIMEOUT_S): what used to hang or fail
obscurely. Writes OUT_DIR/diag_tcp-<rank>.json: for each case, the error text each rank saw and how long
it took, and whether the group still worked afterwards. No diag imports (run through ``-m diag.exec``).
"""

import json
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

TIMEOUT_S = float(os.environ.get("PG_TIMEOUT_S", "3"))
dist.init_process_group(os.environ.get("DIST_BACKEND", "diag_tcp"), timeout=timedelta(seconds=TIMEOUT_S))
rank, world = dist.get_rank(), dist.get_world_size()
other = 1 - rank
out: dict = {}


def attempt(name: str, call) -> None:
    started = time.monotonic()
    try:
        call()
        out[name] = {"error": None}
    except Exception as exc:
        out[name] = {"error": str(exc), "type": type(exc).__name__}
    out[name]["seconds"] = round(time.monotonic() - started, 2)


def still_works(name: str) -> None:
    value = torch.ones(3) * (rank + 1)
    dist.all_reduce(value)
    got = torch.zeros(2)
    works = [dist.isend(torch.full((2,), float(rank)), other), dist.irecv(got, other)]
    for work in works:
        work.wait()
    out[name] = value.tolist() == [3.0, 3.0, 3.0] and got.tolist() == [float(other)] * 2
    dist.barrier()


# isend returns at once; the Work completes once the peer took the bytes
big = torch.full((16 << 20,), 5, dtype=torch.uint8)
if rank == 0:
    started = time.monotonic()
    work = dist.isend(big, 1)
    out["isend returned after s"] = round(time.monotonic() - started, 3)
    out["isend pending while the peer sleeps"] = not work.is_completed()
    work.wait()
    out["isend completed"] = work.is_completed()
else:
    time.sleep(1.0)
    dist.recv(torch.empty(16 << 20, dtype=torch.uint8), 0)
dist.barrier()

# a receive nobody sends to: bounded, and the error names the op, the peer and the tag
if rank == 0:
    attempt("irecv without a send", lambda: dist.irecv(torch.zeros(2), 1, tag=9).wait())
else:
    time.sleep(TIMEOUT_S + 1)   # busy elsewhere (not in a collective that would time out first)
dist.barrier()
still_works("works after a timed-out irecv")

# tags that do not meet: each side says which tag the other one waits for
if rank == 0:
    attempt("isend tag 4 against irecv tag 3", lambda: dist.isend(torch.zeros(2), 1, tag=4).wait())
else:
    attempt("irecv tag 3 against isend tag 4", lambda: dist.irecv(torch.zeros(2), 0, tag=3).wait())
dist.barrier()

# point-to-point sizes that differ: both sides fail at once with both sizes, the pair goes on
if rank == 0:
    attempt("isend 16 bytes to a 32-byte irecv", lambda: dist.isend(torch.zeros(4), 1, tag=7).wait())
else:
    attempt("irecv 32 bytes from a 16-byte isend", lambda: dist.irecv(torch.zeros(8), 0, tag=7).wait())
still_works("works after a size mismatch")

# torch's coalescing manager reaches the group's hooks: the receive and the send go out in one pass
mine, theirs = torch.full((1 << 20,), float(rank)), torch.empty(1 << 20)
with dist._coalescing_manager(device=torch.device("cpu"), async_ops=True) as manager:
    dist.irecv(theirs, other)
    dist.isend(mine, other)
manager.wait()
out["coalesced irecv + isend"] = bool(torch.all(theirs == float(other)))

# refused before anything moves (as gloo refuses them): the group stays usable
attempt("all_gather into outputs of the wrong size",
        lambda: dist.all_gather([torch.empty(3) for _ in range(world)], torch.ones(2)))
attempt("all_to_all_single with bad splits",
        lambda: dist.all_to_all_single(torch.empty(4), torch.arange(4.0), [3, 3], [1, 1]))
attempt("BAND on floats", lambda: dist.all_reduce(torch.ones(2), op=dist.ReduceOp.BAND))
attempt("AVG of integers", lambda: dist.all_reduce(torch.ones(2, dtype=torch.int64), op=dist.ReduceOp.AVG))
attempt("reduce to a root outside the group", lambda: dist.reduce(torch.ones(2), 5))
still_works("works after refused calls")

# ranks that disagree on a collective's size: both are told the sizes, neither calls the other dead
attempt("all_reduce with different sizes", lambda: dist.all_reduce(torch.ones(4 if rank == 0 else 8)))

with open(os.path.join(sys.argv[1], f"diag_tcp-{rank}.json"), "w") as handle:
    json.dump(out, handle, indent=1)
time.sleep(0.5)   # the peer reads its last error before this rank's sockets close
dist.destroy_process_group()

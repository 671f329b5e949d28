"""Run methods of torch's own distributed_test.py (shipped in the torch wheel) on the backend $BACKEND, all in
one launch: every rank of one torchrun runs the listed methods in turn on one default group, the way
torch's MultiProcessTestCase runs one of them per launch. Usage (under torchrun; $TEMP_DIR holds empty
``barrier`` and ``test_dir`` folders shared by the ranks):

    BACKEND=gloo torchrun --nproc-per-node 3 torch_dist_tests.py OUT_DIR test_a test_b ...

Each rank writes OUT_DIR/<backend>-<rank>.json: {method: [status, seconds, first line of the error]},
status "pass", "fail" or "skip". A plugin backend is declared the way torch's test suite expects one
(DistTestCases.backend_feature), so the DDP and subgroup methods run on it too.
"""

import json
import os
import sys
import time
import unittest
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.testing._internal import common_distributed

BACKEND = os.environ["BACKEND"]
if BACKEND not in ("gloo", "nccl", "ucc", "mpi"):
    for feature in ("gpu", "ddp", "subgroup", "plugin"):
        common_distributed.DistTestCases.backend_feature[feature].add(BACKEND)

from torch.testing._internal.common_utils import TestCase  # noqa: E402
from torch.testing._internal.distributed import distributed_test  # noqa: E402

SKIP_CODES = {skip.exit_code: skip.message for skip in common_distributed.TEST_SKIPS.values()}
TIMEOUT_S = float(os.environ.get("PG_TIMEOUT_S", "30"))


class Case(distributed_test.DistributedTest._DistTestBase, TestCase):
    pass


def main() -> None:
    out_dir, names = sys.argv[1], sys.argv[2:]
    dist.init_process_group(BACKEND, timeout=timedelta(seconds=TIMEOUT_S))
    rank, world = dist.get_rank(), dist.get_world_size()
    store = dist.distributed_c10d._get_default_store()
    results = {}
    for index, name in enumerate(names):
        if not hasattr(Case, name):
            raise SystemExit(f"distributed_test.py of torch {torch.__version__} has no method {name}")
        case = Case(name)
        case.rank = rank
        case.file_name = os.path.join(os.environ["TEMP_DIR"], "init_file")
        started = time.monotonic()
        try:
            getattr(case, name)()
            results[name] = ["pass", 0.0, ""]
        except unittest.SkipTest as exc:
            results[name] = ["skip", 0.0, str(exc).splitlines()[0] if str(exc) else ""]
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else -1
            results[name] = ["skip" if code in SKIP_CODES else "fail", 0.0, SKIP_CODES.get(code, f"exit {code}")]
        except BaseException as exc:
            text = str(exc).strip().splitlines()
            results[name] = ["fail", 0.0, f"{type(exc).__name__}: {text[0] if text else ''}"[:300]]
        results[name][1] = round(time.monotonic() - started, 2)
        # Every rank waits for the others before the next method, and the file barrier's count is made
        # the same everywhere (a method that failed on one rank may have left it behind).
        store.set(f"dt/{index}/{rank}", str(distributed_test.Barrier.barrier_id))
        keys = [f"dt/{index}/{peer}" for peer in range(world)]
        store.wait(keys, timedelta(seconds=TIMEOUT_S + 30))
        distributed_test.Barrier.barrier_id = max(int(store.get(key)) for key in keys)
        with open(os.path.join(out_dir, f"{BACKEND}-{rank}.json"), "w") as handle:
            json.dump(results, handle, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

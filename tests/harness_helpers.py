"""Real gloo process groups for harness tests: ranks are spawned processes on loopback."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch.multiprocessing as mp

from tests.common import free_port, rank_processes


class CorruptingTransport:
    """Wraps a real transport. On rank ``bad_rank``, per all_gather call of the row (warm-up included):
    ``flip`` adds 1 to the last output element every time; ``drop:K,L`` receives calls K, L, ... into a
    scratch buffer, so the real output keeps whatever was there (the traffic is unchanged: no hang)."""

    def __init__(self, inner, bad_rank: int, mode: str = "flip") -> None:
        self._inner = inner
        self._bad_rank = bad_rank
        self._mode = mode
        self._drop = {int(k) for k in mode.split(":", 1)[1].split(",")} if mode.startswith("drop:") else set()
        self._calls = 0

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def all_gather(self, output, input):
        if self._inner.rank != self._bad_rank or output.numel() <= 8:  # spare the harness's own gathers
            self._inner.all_gather(output, input)
            return
        call, self._calls = self._calls, self._calls + 1
        if call in self._drop:
            self._inner.all_gather(output.clone(), input)
            return
        self._inner.all_gather(output, input)
        if self._mode == "flip":
            output[-1] += 1


def _rank_main(rank: int, world_size: int, port: int, spec_json: str, result_dir: str, corrupt: int,
               corrupt_mode: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world_size))
    from diag.harness import measure_row, plan_rows
    from diag.spec import SweepSpec
    from diag.transports.torch_dist import TorchTransport

    spec = SweepSpec.from_dict(json.loads(spec_json))
    transport = TorchTransport("gloo", timeout_s=30)
    if corrupt >= 0:
        transport = CorruptingTransport(transport, corrupt, corrupt_mode)
    rows = []
    for plan in plan_rows(spec, world_size):
        record = measure_row(transport, spec, plan, "test")
        if record is not None:
            rows.append(record.to_event())
    transport.close()
    if rank == 0:
        Path(result_dir, "rows.json").write_text(json.dumps(rows))


def run_rows(spec, world_size: int, tmp_path: Path, corrupt_rank: int = -1, corrupt_mode: str = "flip") -> list[dict]:
    """Run every row of ``spec`` on a real gloo group of ``world_size`` ranks; rank 0's records."""
    rank_processes()    # the fork server's imports
    mp.start_processes(_rank_main, args=(world_size, free_port(), spec.to_json(), str(tmp_path), corrupt_rank,
                                         corrupt_mode),
                       nprocs=world_size, join=True, start_method="forkserver")
    return json.loads((tmp_path / "rows.json").read_text())

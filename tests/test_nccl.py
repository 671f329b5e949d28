"""NCCL through the one job, where CUDA exists (CI has no GPU: every test here says so in its skip). NCCL takes
one GPU per rank, so a machine of G GPUs runs N <= G on loopback; N > G is refused before any rank starts."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from diag.errors import EXIT_NO_DEVICE
from diag.records import load_records
from tests.common import run_diag

OPS = ("all_gather", "all_reduce", "broadcast", "reduce_scatter")


def gpus() -> int:
    import torch

    if not torch.cuda.is_available():
        pytest.skip("NCCL needs a CUDA GPU; none is visible on this machine (tests/test_sweep_cli.py checks the "
                    "refusal without CUDA)")
    return torch.cuda.device_count()


def sweep_nccl(tmp_path: Path, n: int, ops: tuple[str, ...], sizes: str) -> tuple[int, str, Path]:
    out = tmp_path / f"nccl-n{n}.jsonl"
    proc = run_diag("sweep", "--backend", "nccl", "--nproc", str(n), "--op", ",".join(ops), "--sizes", sizes,
                    "--iters", "5", "--warmup", "2", "--out", str(out), timeout=300)
    return proc.returncode, proc.stdout + proc.stderr, out


def test_every_collective_on_nccl_checks_its_data_on_the_gpu(tmp_path: Path) -> None:
    """All four collectives at N = every GPU (1 on a one-GPU machine): rows complete, data checked on the
    device (#wrong 0), the transport's device a CUDA one, times positive and bus bandwidth where data moves."""
    n = gpus()
    code, output, out = sweep_nccl(tmp_path, n, OPS, "1K,1M,64M")
    assert code == 0, output[-3000:]
    data = load_records(out)
    assert data.complete, output[-2000:]
    rows = data.records
    assert sorted({(r.op, r.size_bytes) for r in rows}) == sorted((op, s) for op in OPS
                                                                   for s in (1024, 1 << 20, 64 << 20))
    for r in rows:
        assert r.backend == "nccl" and r.world_size == n and r.nwrong == 0, r
        assert r.time_s > 0 and r.iters == 5, r
    start = data.starts[0]
    assert str(start["knobs"]["device"]).startswith("cuda"), start["knobs"]
    assert start["env"].get("nccl"), start["env"]       # the NCCL version in the fingerprint
    if n > 1:   # data crosses GPUs only with two or more ranks
        big = [r for r in rows if r.size_bytes == 64 << 20]
        assert all(r.busbw_Bps > 1e9 for r in big), [(r.op, r.busbw_Bps) for r in big]
    run_json = json.loads((out.with_name(out.stem + ".d") / "run.json").read_text())
    assert run_json["failures"] == [] and run_json["command"] == "sweep", run_json


def test_more_ranks_than_gpus_is_refused_before_any_rank_starts(tmp_path: Path) -> None:
    """NCCL refuses two ranks on one GPU deep inside the first collective; diag says it in one line, with
    exit 5 (the backend's device is absent), before it launches anything."""
    n = gpus() + 1
    started = time.monotonic()
    code, output, out = sweep_nccl(tmp_path, n, ("all_reduce",), "1K")
    took = time.monotonic() - started
    assert code == EXIT_NO_DEVICE, output[-2000:]
    err = output.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    assert "one rank per GPU" in err and f"N={n}" in err, err
    assert not out.exists()                      # nothing launched, nothing written
    assert took < 30, took                       # no launcher, no rendezvous timeout


def test_point_to_point_on_nccl_between_two_gpus(tmp_path: Path) -> None:
    n = gpus()
    if n < 2:
        pytest.skip(f"send/recv on NCCL needs two GPUs; this machine has {n}")
    code, output, out = sweep_nccl(tmp_path, 2, ("send_recv", "all_gather"), "1M,64M")
    assert code == 0, output[-3000:]
    rows = load_records(out).records
    assert {r.op for r in rows} == {"send_recv", "all_gather"}
    assert all(r.nwrong == 0 and r.busbw_Bps > 1e9 for r in rows if r.size_bytes == 64 << 20), rows

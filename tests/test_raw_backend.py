"""The diag_tcp torch.distributed backend: an unchanged script gives the same results as on gloo.

The live tests start real torchrun launches (each costs a few seconds of imports per rank); cases that used
to hang run with a process-group timeout of 3 s inside a subprocess timeout, so a regression fails fast."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.common import free_port

SPREAD = True   # its tests share no fixture: each goes to whichever worker is free (tests/conftest.py)

SCRIPTS = Path(__file__).parent / "raw_scripts"
SCRIPT = SCRIPTS / "dist_ops.py"
REPO = Path(__file__).resolve().parent.parent
VIA_EXEC = ["-m", "diag.exec"]


def _torchrun(backend: str, out: Path, via: list[str], extra_env: dict[str, str] | None = None,
              script: Path = SCRIPT, nproc: int = 2, args: list[str] | None = None, timeout: float = 420) -> None:
    env = {**os.environ, "DIST_BACKEND": backend, "BACKEND": backend, "PYTHONPATH": str(REPO), **(extra_env or {})}
    env.pop("GLOO_SOCKET_IFNAME", None)
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
               "--master-addr", "127.0.0.1", "--master-port", str(free_port()), *via, str(script), str(out),
               *(args or [])]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def _results(out: Path, backend: str, nproc: int) -> list[dict[str, Any]]:
    return [json.loads((out / f"{backend}-{rank}.json").read_text()) for rank in range(nproc)]


@pytest.mark.slow
def test_unchanged_script_gives_the_same_results_on_gloo_and_diag_tcp(tmp_path: Path) -> None:
    _torchrun("gloo", tmp_path, [])
    _torchrun("diag_tcp", tmp_path, ["-m", "diag.exec"])
    for rank in (0, 1):
        gloo = json.loads((tmp_path / f"gloo-{rank}.json").read_text())
        ours = json.loads((tmp_path / f"diag_tcp-{rank}.json").read_text())
        assert ours == gloo
        assert {"all_gather", "all_reduce", "broadcast", "reduce_scatter", "all_to_all"} <= set(ours)
    assert json.loads((tmp_path / "diag_tcp-1.json").read_text())["recv"] == [7, 8, 9]
    assert json.loads((tmp_path / "diag_tcp-1.json").read_text())["broadcast_transposed"] == [
        [0.0, 3.0], [1.0, 4.0], [2.0, 5.0]]


@pytest.mark.slow
def test_diag_exec_cli_passes_knobs_to_the_backend(tmp_path: Path) -> None:
    _torchrun("diag_tcp", tmp_path, ["--no-python", sys.executable, "-m", "diag", "exec", "--emulate", "gloo",
                                     "--"])
    ours = json.loads((tmp_path / "diag_tcp-0.json").read_text())
    assert ours["all_gather"] == [[0.0, 1.0, 2.0, 3.0, 4.0], [10.0, 11.0, 12.0, 13.0, 14.0]]


def test_exec_errors_are_one_line(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    missing = subprocess.run([sys.executable, "-m", "diag.exec", str(tmp_path / "nope.py")], env=env,
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode != 0
    assert missing.stderr.strip().count("\n") == 0 and "not found" in missing.stderr
    bad_knobs = subprocess.run([sys.executable, "-m", "diag", "exec", "--chunks", "0", "--", str(SCRIPT)],
                               env=env, capture_output=True, text=True, timeout=60)
    assert bad_knobs.returncode != 0 and "--chunks" in bad_knobs.stderr
    assert "Traceback" not in bad_knobs.stderr


def test_registering_twice_is_harmless() -> None:
    import torch.distributed as dist

    from diag.transports.raw.backend import BACKEND_NAME, register

    register()
    register()
    assert BACKEND_NAME.upper() in dist.Backend._plugins


@pytest.mark.slow
@pytest.mark.parametrize("nproc", [2, 3])
def test_every_op_a_program_calls_matches_gloo_bit_for_bit(tmp_path: Path, nproc: int) -> None:
    """backend_ops.py on gloo and on diag_tcp: every result byte the same (reductions in gloo's order, -0.0,
    NaNs, f16/bf16 rounded per step), the point-to-point patterns that used to deadlock complete, the ops gloo
    refuses are refused in one line naming op and backend, and the tensor-parallel layer on a DeviceMesh
    matches the same layer in one process (and gloo's result bit for bit)."""
    script = SCRIPTS / "backend_ops.py"
    _torchrun("gloo", tmp_path, [], script=script, nproc=nproc, extra_env={"PG_TIMEOUT_S": "60"})
    _torchrun("diag_tcp", tmp_path, VIA_EXEC, script=script, nproc=nproc, extra_env={"PG_TIMEOUT_S": "20"})
    for gloo, ours in zip(_results(tmp_path, "gloo", nproc), _results(tmp_path, "diag_tcp", nproc), strict=True):
        messages = {key: ours.pop(key) for key in list(ours) if key.endswith(":message")}
        gloo = {key: value for key, value in gloo.items() if not key.endswith(":message")}
        assert ours == gloo, {key: (gloo.get(key), ours.get(key)) for key in set(gloo) | set(ours)
                              if gloo.get(key) != ours.get(key)}
        for text in messages.values():
            assert text.startswith("diag_tcp all_reduce: ") and "\n" not in text and "object at 0x" not in text
        assert ours["tensor parallel matches one process"] and ours["tensor parallel up.weight.grad matches one process"]
        assert ours["all_reduce -0.0"] == ["-0.0", "-0.0", "0.0"]
        assert ours["AVG of integers"] == ours["PREMUL_SUM"] == ours["BAND float"] == "refused"
    rank0, rank1 = _results(tmp_path, "diag_tcp", nproc)[:2]
    assert rank0["irecv before isend: pending while the peer sleeps"]
    assert rank1["tags 2 then 1"] == [[2.0], [1.0, 1.0]]
    assert rank0["recv from any source"] == [1, [4.0, 5.0, 6.0]]
    assert rank0["group_name"] and "send-first ring 16 MiB" in rank0


@pytest.mark.slow
@pytest.mark.waits
def test_point_to_point_failures_are_bounded_precise_and_leave_the_group_usable(tmp_path: Path) -> None:
    """p2p_failures.py with a 3 s process-group timeout: a receive nobody sends to, tags that never meet and
    sizes that differ fail within the timeout naming op, peer and tag (and what the peer does wait for);
    calls refused before anything moves leave the group usable (as on gloo); ranks that disagree on a
    collective's size are both told so, neither reports the other dead."""
    _torchrun("diag_tcp", tmp_path, VIA_EXEC, script=SCRIPTS / "p2p_failures.py", extra_env={"PG_TIMEOUT_S": "3"})
    rank0, rank1 = _results(tmp_path, "diag_tcp", 2)
    assert rank0["isend returned after s"] < 0.5 and rank0["isend pending while the peer sleeps"]
    assert rank0["isend completed"]
    for case, result, wanted in (
            ("irecv without a send", rank0, "irecv from rank 1 (tag 9, 8 bytes): timed out after 3s: rank 1 has "
                                            "posted no send with tag 9"),
            ("isend tag 4 against irecv tag 3", rank0, "it does wait for this rank's sends with tag(s) 3"),
            ("irecv tag 3 against isend tag 4", rank1, "it did announce sends with tag(s) 4"),
            ("isend 16 bytes to a 32-byte irecv", rank0, "rank 1 posted a receive of 32 bytes for this send of 16"),
            ("irecv 32 bytes from a 16-byte isend", rank1, "rank 0's matching send has 16 bytes, this receive 32")):
        error = result[case]["error"]
        assert error and wanted in error and "\n" not in error, (case, error)
        assert result[case]["seconds"] < 3 + 2.5, (case, result[case])
    # Sizes that differ: whichever rank reads the other's first data header names both sizes; the other names
    # it, unless its own read of the peer's header came first (both then name the sizes). Which one is a race.
    mismatch = {0: rank0["all_reduce with different sizes"], 1: rank1["all_reduce with different sizes"]}
    sizes = {0: "rank 1 moves 32 bytes per rank in this operation where this rank moves 16",
             1: "rank 0 moves 16 bytes per rank in this operation where this rank moves 32"}
    stopped = {0: "rank 1 stopped this operation: it found", 1: "rank 0 stopped this operation: it found"}
    assert any(sizes[r] in mismatch[r]["error"] for r in (0, 1)), mismatch
    for r in (0, 1):
        error = mismatch[r]["error"]
        assert (sizes[r] in error or stopped[r] in error) and "\n" not in error, (r, error)
        assert "died" not in error and mismatch[r]["seconds"] < 3 + 2.5, (r, mismatch[r])
        for case in ("all_gather into outputs of the wrong size", "all_to_all_single with bad splits",
                     "BAND on floats", "AVG of integers", "reduce to a root outside the group"):
            op = case.split()[0] if case.split()[0] in ("all_gather", "all_to_all_single") else None
            error = result[case]["error"]
            assert error.startswith(f"diag_tcp {op or ''}") and "\n" not in error, (case, error)
        assert result["works after a size mismatch"] and result["works after refused calls"]
        assert result["coalesced irecv + isend"]
        assert result["works after a timed-out irecv"]


# Methods of torch's own distributed_test.py (in the wheel) run in one launch per backend: point-to-point,
# collectives, subgroups (new_group of all ranks, and of ranks 1 and 2), DDP on CPU. The group_* methods
# need 8 ranks and the object collectives' methods fail on gloo too in a single launch (their Foo objects
# compare unequal after the round trip), so they are not in the list; most other DDP methods need CUDA.
TORCH_METHODS = [
    "test_destroy_group", "test_get_rank_size_group", "test_destroy_full_group",
    "test_get_rank_size_full_group", "test_send_recv", "test_send_recv_any_source",
    "test_send_recv_with_tag", "test_isend", "test_irecv", "test_batch_isend_irecv_gloo",
    "test_batch_isend_irecv_gloo_tags", "test_batch_isend_irecv_op_list_err", "test_broadcast",
    "test_reduce_sum", "test_reduce_max", "test_reduce_full_group_sum", "test_all_reduce_sum",
    "test_all_reduce_sum_async", "test_all_reduce_sum_complex", "test_all_reduce_complex_unsupported_ops",
    "test_all_reduce_product", "test_all_reduce_min", "test_all_reduce_full_group_sum",
    "test_all_reduce_coalesced_sum", "test_all_reduce_coalesced_max", "test_scatter_checks",
    "test_scatter", "test_scatter_full_group", "test_gather_checks", "test_gather",
    "test_gather_full_group", "test_all_gather", "test_all_gather_full_group",
    "test_all_gather_coalesced_simple", "test_all_to_all_single_equal_split",
    "test_all_to_all_single_unequal_split", "test_all_to_all", "test_barrier",
    "test_sparse_all_reduce_sum", "test_DistributedDataParallel_requires_grad", "test_ddp_create_graph",
    "test_grads_same_across_ranks_with_no_sync", "test_get_future", "test_ddp_logging_data_cpu",
    "test_static_graph_api_cpu",
]
# (gloo, diag_tcp) where they differ, and why
KNOWN_DIFFERENCES = {
    "test_all_to_all": ("fail", "pass"),             # gloo's list all_to_all takes equal sizes only
    "test_sparse_all_reduce_sum": ("pass", "fail"),  # diag_tcp moves dense tensors only (a one-line error)
}


@pytest.mark.slow
def test_torch_distributed_test_methods_pass_as_on_gloo(tmp_path: Path) -> None:
    statuses = {}
    for backend, via in (("gloo", []), ("diag_tcp", VIA_EXEC)):
        temp = tmp_path / f"temp-{backend}"
        (temp / "barrier").mkdir(parents=True)
        (temp / "test_dir").mkdir()
        _torchrun(backend, tmp_path, via, script=SCRIPTS / "torch_dist_tests.py", nproc=3, args=TORCH_METHODS,
                  extra_env={"TEMP_DIR": str(temp), "PG_TIMEOUT_S": "30"}, timeout=420)
        ranks = _results(tmp_path, backend, 3)
        statuses[backend] = {name: {r[name][0] for r in ranks} for name in TORCH_METHODS}
    for name in TORCH_METHODS:
        gloo, ours = statuses["gloo"][name], statuses["diag_tcp"][name]
        expected = KNOWN_DIFFERENCES.get(name, ("pass", "pass"))
        assert (gloo, ours) == ({expected[0]}, {expected[1]}), (name, gloo, ours)


def test_sums_follow_gloos_ring_in_the_dtype() -> None:
    """Unit check of the order (the live tests compare with gloo itself): -0.0 + -0.0 stays -0.0, and f16 is
    rounded after every step along gloo's ring, not accumulated in f32 and rounded once."""
    from diag.transports.raw.reductions import reduce_like_gloo, ring_chunks

    zero = reduce_like_gloo([torch.tensor([-0.0]), torch.tensor([-0.0])], "sum")
    assert zero.item() == 0.0 and torch.signbit(zero).item()
    # one element, 3 ranks: the chain is x0 + (x1 + x2); 2048 + 1 rounds back to 2048 in f16, twice
    values = [torch.tensor([v], dtype=torch.float16) for v in (1.0, 2048.0, 1.0)]
    assert reduce_like_gloo(values, "sum").item() == 2048.0
    assert torch.stack(values).float().sum().half().item() == 2050.0
    # max keeps the local operand on ties (std::max): chunk 0 (elements 0-3) ends at rank 0, chunk 1 at rank 1
    signed = [torch.full((8,), -0.0), torch.full((8,), 0.0)]
    assert torch.signbit(reduce_like_gloo(signed, "max")).tolist() == [True] * 4 + [False] * 4
    assert ring_chunks(7, 4, 3) == [(0, 4), (4, 7), (7, 7)]

"""The diag_tcp torch.distributed backend: an unchanged script gives the same results as on gloo."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.common import free_port

SCRIPT = Path(__file__).parent / "raw_scripts" / "dist_ops.py"
REPO = Path(__file__).resolve().parent.parent


def _torchrun(backend: str, out: Path, via: list[str], extra_env: dict[str, str] | None = None) -> None:
    env = {**os.environ, "DIST_BACKEND": backend, "PYTHONPATH": str(REPO), **(extra_env or {})}
    env.pop("GLOO_SOCKET_IFNAME", None)
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
               "--master-addr", "127.0.0.1", "--master-port", str(free_port()), *via, str(SCRIPT), str(out)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


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

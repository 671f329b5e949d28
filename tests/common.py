"""Helpers every kind of test uses: a free loopback port, skipping without root, and the real `diag`
command line. One definition each (the other helper modules import them from here)."""

from __future__ import annotations

import multiprocessing
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


# What every rank process of the tests imports: loaded once per test worker by the fork server.
RANK_PRELOAD = ["torch", "torch.distributed", "diag.transports.raw", "diag.transports.torch_dist", "diag.harness"]


def rank_processes() -> multiprocessing.context.ForkServerContext:
    """The start method of the tests' rank processes (run on N ranks over loopback): a fork server that has
    imported torch and diag's transports once, so each rank is a fresh child of an untouched interpreter (no
    thread, no process group, no state of the test) without importing torch itself (~1.4 s of CPU a rank
    under spawn, the larger part of a small multi-rank test)."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(RANK_PRELOAD)
    return context


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def is_root() -> bool:
    return os.geteuid() == 0


def need_root() -> None:
    """Skip the calling test, with the reason, unless it runs as root."""
    if not is_root():
        pytest.skip("needs root (CAP_NET_ADMIN) for network namespaces, tc and packet capture; CI runs as root")


def run_diag(*args: str, timeout: float = 120, env: dict[str, str] | None = None
             ) -> subprocess.CompletedProcess[str]:
    """The real command line, python -m diag ..., from the repository root; ``env`` adds variables to (or
    overrides them in) this process's environment, it never replaces it."""
    return subprocess.run([sys.executable, "-m", "diag", *args], capture_output=True, text=True, timeout=timeout,
                          cwd=REPO, env={**os.environ, **(env or {})})

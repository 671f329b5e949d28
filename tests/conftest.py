"""Shared test plumbing: privilege and tool checks whose skips say why."""

from __future__ import annotations

import os
import shutil

import pytest


def is_root() -> bool:
    return os.geteuid() == 0


@pytest.fixture
def need_root() -> None:
    if not is_root():
        pytest.skip("needs root (CAP_NET_ADMIN) for network namespaces and tc; CI runs as root")


def need_tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"'{name}' is not installed (.ci/run installs it with apt)")
    return path

"""Shared test plumbing: privilege and tool checks whose skips say why."""

from __future__ import annotations

import shutil

import pytest

from tests import common


@pytest.fixture
def need_root() -> None:
    """The fixture form of common.need_root."""
    common.need_root()


def need_tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"'{name}' is not installed (.ci/run installs it with apt)")
    return path

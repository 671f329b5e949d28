"""Shared test plumbing: privilege and tool checks whose skips say why."""

from __future__ import annotations

import os
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


# --stream-check: the analyzer tests with DIAG_STREAM=check, so every in-memory analysis of one capture file is
# also streamed (diag/capture/stream.py, in 4 KiB chunks) and must give the same JSON. On in CI (env CI set),
# off by default elsewhere: it adds about half to these modules' time (the streamed passes pay per chunk).
STREAM_CHECK_MODULES = ("test_analyze", "test_turns", "test_capture_live", "test_fuzz_analyze")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--stream-check", action="store_true",
                     help="run the analyzer test modules (" + ", ".join(f"{m}*" for m in STREAM_CHECK_MODULES)
                     + ") with DIAG_STREAM=check: the streamed analysis must equal the in-memory one")


@pytest.fixture(autouse=True)
def _stream_check(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    wanted = request.config.getoption("--stream-check") or bool(os.environ.get("CI"))
    if wanted and request.node.path.name.startswith(STREAM_CHECK_MODULES):
        monkeypatch.setenv("DIAG_STREAM", "check")  # subprocesses (common.run_diag) inherit it

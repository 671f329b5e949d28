"""Shared test plumbing: privilege and tool checks whose skips say why."""

from __future__ import annotations

import os
import shutil
from typing import Any

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


@pytest.fixture(autouse=True)
def _twins_under_check(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """DIAG_NATIVE=check, set by a test (the tshark agreement tests): every capture read as one chunk in this
    process is also decoded by the reader's numpy twin, and its TCP state computed by the TCP state's twin;
    both must equal the kernels' (native_helpers.comparable; every PacketState field)."""
    if not request.node.path.name.startswith("test_analyze"):
        return
    import dataclasses

    import numpy as np

    from diag.capture import reader, source
    from tests import decode_twin, native_helpers, tcpstate_twin

    read, state = reader.read_capture, source.analyze_packets

    def checked_read(path: Any, first_frame: int = 1, decoder: Any = None) -> Any:
        result = read(path, first_frame, decoder=decoder)
        if decoder is None and os.environ.get("DIAG_NATIVE") == "check" and os.path.isfile(path):
            twin = decode_twin.read_capture(path, first_frame)
            assert native_helpers.comparable(result) == native_helpers.comparable(twin), f"twins differ on {path}"
        return result

    def checked_state(cols: Any, conn: Any, direction: Any, wscale: Any, first_rtt: Any, **kwargs: Any) -> Any:
        out = state(cols, conn, direction, wscale, first_rtt, **kwargs)
        if os.environ.get("DIAG_NATIVE") == "check":
            twin = tcpstate_twin.analyze_packets_numpy(cols, conn, direction, wscale, first_rtt)
            differ = [f.name for f in dataclasses.fields(out) if getattr(out, f.name) is not None
                      and not np.array_equal(getattr(out, f.name), getattr(twin, f.name))]
            assert not differ, f"_ctcp and its numpy twin differ in {', '.join(differ)}"
        return out

    monkeypatch.setattr(reader, "read_capture", checked_read)  # read_files' look-up
    monkeypatch.setattr(source, "analyze_packets", checked_state)

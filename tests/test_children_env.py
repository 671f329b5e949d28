"""What the tools diag starts inherit: never the raw transport's run token (tcpdump, iperf3, ss), and iperf3's
servers, which serve whoever connects first, hold no privilege (diag.lifeline)."""

from __future__ import annotations

import os
import shutil
import stat
import time
from pathlib import Path

import pytest

from diag import goodput
from diag.probe.flows import Flow, ProbeNode
from tests.common import need_root

TOKEN_VALUE = "c0ffee" * 5 + "00"


def environ_of(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(entry.split("=", 1) for entry in raw.decode(errors="replace").split("\0") if "=" in entry)


def uid_of(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[2])   # effective
    raise AssertionError(f"no Uid line for {pid}")


def test_the_token_variable_is_the_backends() -> None:
    from diag.lifeline import SECRET_ENV
    from diag.transports.raw.backend import ENV_TOKEN

    assert ENV_TOKEN in SECRET_ENV


def test_tcpdump_gets_no_token(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    need_root()
    if not shutil.which("tcpdump"):
        pytest.skip("tcpdump is not installed")
    from diag.capture import start_capture

    monkeypatch.setenv("DIAG_TCP_TOKEN", TOKEN_VALUE)
    capture = start_capture(tmp_path / "lo.pcap", "lo", tool="tcpdump")
    try:
        env = environ_of(capture._proc.pid)
    finally:
        capture.stop()
    assert "PATH" in env and "DIAG_TCP_TOKEN" not in env
    assert TOKEN_VALUE not in "".join(env.values())


@pytest.mark.parametrize("path", ["system", "private-bin"])
def test_an_iperf3_server_runs_unprivileged_and_without_the_token(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   path: str) -> None:
    """``private-bin``: root's PATH starts with a directory of root's (0700) holding a link to iperf3, as a
    node's own PATH may: iperf3 is found there as root and run by its real path as the unprivileged user."""
    need_root()
    if not goodput.iperf3_available():
        pytest.skip("iperf3 is not installed")
    from diag.probe.flows import _Iperf3Side

    if path == "private-bin":
        private = tmp_path / "bin"
        private.mkdir(mode=0o700)
        (private / "iperf3").symlink_to(shutil.which("iperf3") or "iperf3")
        monkeypatch.setenv("PATH", str(private))   # its only way to iperf3
    monkeypatch.setenv("DIAG_TCP_TOKEN", TOKEN_VALUE)
    me = ProbeNode("a", "127.0.0.1", 0)
    side = _Iperf3Side(me, {"a": me, "b": ProbeNode("b", "127.0.0.1", 1)}, [Flow("b", "a")], 1)
    try:
        proc, _port = side._start_server("127.0.0.1")
        side.servers[0] = proc
        uid, env = uid_of(proc.pid), environ_of(proc.pid)
        assert Path(f"/proc/{proc.pid}/exe").resolve().name == "iperf3"
    finally:
        side.close()
    assert uid != 0, "iperf3's server runs as root"
    assert "DIAG_TCP_TOKEN" not in env


def test_ss_gets_no_token(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The observers run ss every interval: a stand-in ss on PATH writes down the environment it got."""
    from diag.observe import start_observers

    tools = tmp_path / "bin"
    tools.mkdir()
    seen = tmp_path / "ss-env"
    fake = tools / "ss"
    fake.write_text(f"#!/bin/sh\nenv > {seen}\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("DIAG_TCP_TOKEN", TOKEN_VALUE)
    observers = start_observers([os.getpid()], tmp_path / "observe.jsonl", interval_s=0.05)
    try:
        deadline = time.monotonic() + 30
        while not seen.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        observers.stop()
    text = seen.read_text()
    assert "PATH=" in text and "DIAG_TCP_TOKEN" not in text and TOKEN_VALUE not in text

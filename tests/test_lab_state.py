"""Lab state cannot be planted: only private directories and the caller's own files are trusted, and `down`
deletes only namespaces the lab made (real namespaces, real files, real ownership)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from lab_helpers import lab_netns, requires_root, run_diag, unique_lab_name

from diag.errors import DiagError
from diag.lab import state as lab_state
from diag.lab.config import host_netns, switch_netns

NOBODY = 65534


def _lab_json(name: str, netns: list[str]) -> dict:
    hosts = [{"name": f"h{i}", "netns": ns, "address": f"10.77.0.{i + 1}", "iface": "eth0", "index": i,
              "switch_port": f"h{i}", "prefix_len": 24} for i, ns in enumerate(netns)]
    return {"name": name, "rate_bps": 1e8, "hosts": hosts, "switch_netns": switch_netns(name)}


@pytest.fixture
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    directory = tmp_path / "labs"
    monkeypatch.setenv(lab_state.STATE_DIR_ENV, str(directory))
    return directory


def test_state_directory_is_private(state_dir: Path) -> None:
    lab_state.write_state("mine", {"status": "up"})
    assert state_dir.stat().st_mode & 0o777 == 0o700
    assert (state_dir / "mine.json").stat().st_mode & 0o777 == 0o600
    assert lab_state.read_state("mine")["status"] == "up"
    # opened up by someone: its files are no longer trusted for reading ...
    os.chmod(state_dir, 0o777)
    assert lab_state.read_state("mine") is None and lab_state.known_lab_names() == []
    # ... until diag, which owns it, closes it again when it writes
    lab_state.write_state("mine", {"status": "up"})
    assert state_dir.stat().st_mode & 0o777 == 0o700 and lab_state.read_state("mine") is not None


def test_a_symlinked_directory_is_not_a_state_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(real)
    monkeypatch.setenv(lab_state.STATE_DIR_ENV, str(tmp_path / "link"))
    with pytest.raises(DiagError, match="no private lab state directory"):
        lab_state.write_state("x", {})


def test_planted_state_files_are_ignored(state_dir: Path, tmp_path: Path) -> None:
    lab_state.write_state("good", {"status": "up"})
    planted = {"status": "up", "lab": _lab_json("evil", ["victim"])}
    # writable by others
    (state_dir / "open.json").write_text(json.dumps(planted))
    os.chmod(state_dir / "open.json", 0o666)
    # a symlink to a file elsewhere
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text(json.dumps(planted))
    (state_dir / "linked.json").symlink_to(elsewhere)
    assert lab_state.read_state("open") is None
    assert lab_state.read_state("linked") is None
    if os.geteuid() == 0:  # another user's file (only root can make one here)
        (state_dir / "foreign.json").write_text(json.dumps(planted))
        os.chown(state_dir / "foreign.json", NOBODY, NOBODY)
        assert lab_state.read_state("foreign") is None
    assert lab_state.known_lab_names() == ["good"]


def test_fallback_directory_is_per_user(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(lab_state.STATE_DIR_ENV, raising=False)
    assert lab_state.state_dirs()[1].name == f"diag-labs-{os.geteuid()}"


def _ip_netns(*args: str) -> None:
    subprocess.run(["ip", "netns", *args], check=True, capture_output=True, timeout=30)


@requires_root
def test_down_deletes_only_namespaces_the_lab_made(state_dir: Path) -> None:
    name = unique_lab_name("s")
    victim = f"i11victim{os.getpid()}"
    recreated = host_netns(name, 1)
    env = {**os.environ, lab_state.STATE_DIR_ENV: str(state_dir)}
    _ip_netns("add", victim)
    _ip_netns("add", recreated)
    try:
        # a state file (trusted: ours) that lists a foreign namespace, and records another identity for h1
        lab_state.write_state(name, {"status": "up", "lab": _lab_json(name, [victim, recreated]),
                                     "netns_ids": {recreated: [0, 1]}})
        result = run_diag("lab", "down", "--name", name, env=env)
        assert result.returncode == 0, result.stderr
        assert os.path.exists(f"/run/netns/{victim}")
        assert os.path.exists(f"/run/netns/{recreated}")
        assert "not its own" in result.stderr and "not the one lab" in result.stderr
        assert lab_state.read_state(name) is None
        # without a state file, down still removes what is named as the lab's
        result = run_diag("lab", "down", "--name", name, env=env)
        assert result.returncode == 0, result.stderr
        assert lab_netns(name) == []
    finally:
        for netns in (victim, recreated):
            if os.path.exists(f"/run/netns/{netns}"):
                _ip_netns("delete", netns)

"""Per-lab state files and locks, so `down` finds everything even after the creator was SIGKILLed.

The state file is written *before* the first namespace exists (status "creating") and rewritten when
the lab is complete (status "up"). /run is a tmpfs, so a reboot (which also drops the namespaces)
forgets it; where /run is not writable we fall back to the temp directory.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

RUN_STATE_DIR = Path("/run/diag/labs")
STATE_DIR_ENV = "DIAG_LAB_STATE_DIR"     # lets tests and unusual systems put state elsewhere
STATE_SCHEMA = 1


def state_dirs() -> list[Path]:
    """Where state may live, preferred first (down and status look in all of them)."""
    override = os.environ.get(STATE_DIR_ENV)
    if override:
        return [Path(override)]
    return [RUN_STATE_DIR, Path(tempfile.gettempdir()) / "diag-labs"]


def writable_state_dir() -> Path:
    for directory in state_dirs():
        try:
            directory.mkdir(parents=True, exist_ok=True)
            probe = directory / f".probe-{os.getpid()}"
            probe.write_text("")
            probe.unlink()
            return directory
        except OSError:
            continue
    raise OSError(f"no writable lab state directory among {', '.join(map(str, state_dirs()))}")


def state_path(name: str) -> Path | None:
    """The existing state file of lab `name`, if any."""
    for directory in state_dirs():
        path = directory / f"{name}.json"
        if path.exists():
            return path
    return None


def read_state(name: str) -> dict[str, Any] | None:
    path = state_path(name)
    if path is None:
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None  # a torn write: treat as "unknown lab", down still cleans by name


def write_state(name: str, state: dict[str, Any]) -> Path:
    directory = writable_state_dir()
    path = directory / f"{name}.json"
    tmp = directory / f".{name}.json.{os.getpid()}"
    tmp.write_text(json.dumps({"schema": STATE_SCHEMA, **state}, indent=1, sort_keys=True))
    os.replace(tmp, path)   # atomic: a reader sees the old or the new file, never half of one
    return path


def remove_state(name: str) -> None:
    for directory in state_dirs():
        with contextlib.suppress(FileNotFoundError):
            (directory / f"{name}.json").unlink()


def known_lab_names() -> list[str]:
    names: set[str] = set()
    for directory in state_dirs():
        if directory.is_dir():
            names.update(path.stem for path in directory.glob("*.json") if not path.name.startswith("."))
    return sorted(names)


@contextlib.contextmanager
def lab_lock(name: str) -> Iterator[None]:
    """Serialize lab up/down across processes.

    One lock on the state directory itself (flock on its fd): no lock files to leave behind, and a
    lock dies with its holder, so a killed `up` never blocks the next one. Up and down take well under
    a second, so serializing all labs costs nothing.
    """
    del name  # one lock for all labs; the name keeps call sites explicit should that ever change
    handle = os.open(writable_state_dir(), os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield
    finally:
        os.close(handle)   # releases the lock

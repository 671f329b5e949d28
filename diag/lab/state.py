"""Per-lab state files and locks, so `down` finds everything even after the creator was SIGKILLed.

The state file is written *before* the first namespace exists (status "creating") and rewritten when
the lab is complete (status "up"). /run is a tmpfs, so a reboot (which also drops the namespaces)
forgets it; where /run is not writable we fall back to a per-user directory in the temp directory.

A state file says which namespaces `down` deletes (and whose processes it kills), so only state nobody
else can plant is trusted: a state directory must be a real directory (not a symlink) owned by the caller
and closed to everyone else (0700; diag creates it so, and tightens one of its own that is not); a state
file must be a regular file owned by the caller and writable by nobody else. Anything else is ignored, as
if absent. Files are opened without following symlinks.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from diag import safefs
from diag.errors import DiagError

RUN_STATE_DIR = Path("/run/diag/labs")
STATE_DIR_ENV = "DIAG_LAB_STATE_DIR"     # lets tests and unusual systems put state elsewhere
STATE_SCHEMA = 1
MAX_STATE_BYTES = 1 << 20               # a lab's state is a few kB


def state_dirs() -> list[Path]:
    """Where state may live, preferred first (down and status look in all of them)."""
    override = os.environ.get(STATE_DIR_ENV)
    if override:
        return [Path(override)]
    return [RUN_STATE_DIR, Path(tempfile.gettempdir()) / f"diag-labs-{os.geteuid()}"]


def _private_dir(directory: Path, create: bool) -> bool:
    """True if directory is a directory of ours that nobody else can write (creating it 0700 if asked).

    safefs's rule, with two differences for a directory only diag uses: a symlink is never followed, and
    one of ours made with a looser umask is closed (chmod 0700) rather than refused."""
    if create:
        try:
            safefs.make_dirs(directory)
        except DiagError:
            return False
        with contextlib.suppress(OSError):
            info = os.lstat(directory)
            if stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid() and info.st_mode & 0o077:
                os.chmod(directory, 0o700)  # ours, once made with a looser umask: close it
    return safefs.dir_problem(directory, follow=False) is None


def writable_state_dir() -> Path:
    for directory in state_dirs():
        if not _private_dir(directory, create=True):
            continue
        try:
            probe = directory / f".probe-{os.getpid()}"
            probe.write_text("")
            probe.unlink()
            return directory
        except OSError:
            continue
    raise DiagError(f"no private lab state directory among {', '.join(map(str, state_dirs()))} (each must be a "
                    "directory owned by you, mode 0700); remove or fix the one that is not, or set "
                    f"${STATE_DIR_ENV}")


def _trusted_dirs() -> list[Path]:
    return [d for d in state_dirs() if _private_dir(d, create=False)]


def _open_trusted(path: Path) -> int | None:
    """A read descriptor of path if it is a regular file owned by us that nobody else can write."""
    return safefs.open_trusted(path)


def state_path(name: str) -> Path | None:
    """The existing, trusted state file of lab `name`, if any."""
    for directory in _trusted_dirs():
        path = directory / f"{name}.json"
        fd = _open_trusted(path)
        if fd is not None:
            os.close(fd)
            return path
    return None


def read_state(name: str) -> dict[str, Any] | None:
    path = state_path(name)
    if path is None:
        return None
    fd = _open_trusted(path)
    if fd is None:
        return None
    try:
        with os.fdopen(fd, "rb") as handle:
            data = json.loads(handle.read(MAX_STATE_BYTES))
    except (OSError, ValueError):
        return None  # a torn write: treat as "unknown lab", down still cleans by name
    return data if isinstance(data, dict) else None


def write_state(name: str, state: dict[str, Any]) -> Path:
    directory = writable_state_dir()
    path = directory / f"{name}.json"
    # atomic: a reader sees the old or the new file, never half of one
    return safefs.write_file(path, json.dumps({"schema": STATE_SCHEMA, **state}, indent=1, sort_keys=True),
                             safefs.SECRET_MODE, tmp=directory / f".{name}.json.{os.getpid()}")


def remove_state(name: str) -> None:
    for directory in _trusted_dirs():
        with contextlib.suppress(FileNotFoundError):
            (directory / f"{name}.json").unlink()


def known_lab_names() -> list[str]:
    names: set[str] = set()
    for directory in _trusted_dirs():
        names.update(path.stem for path in directory.glob("*.json")
                     if not path.name.startswith(".") and state_path(path.stem) is not None)
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

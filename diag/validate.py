"""Checks of user input that must fail before any work starts: one line, what to do, exit code 2.

Numbers from the command line can be NaN or infinite (argparse's float accepts "nan" and "inf"), and paths
can name the wrong kind of thing; every command checks both here before it starts ranks or reads files.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from diag import safefs
from diag.errors import DiagError

# Longer than any real collective or run; larger values overflow timedelta/poll arithmetic downstream.
MAX_SECONDS = 7 * 24 * 3600.0


def seconds(value: float, flag: str, *, allow_zero: bool = False, maximum: float = MAX_SECONDS) -> float:
    """A finite duration in (0, maximum] (or [0, maximum] with allow_zero)."""
    low_ok = value >= 0 if allow_zero else value > 0
    if not (math.isfinite(value) and low_ok and value <= maximum):
        bound = ">= 0" if allow_zero else "> 0"
        raise DiagError(f"{flag} must be a number of seconds {bound} and at most {maximum:g}, got {value!r}")
    return float(value)


def port(value: int, flag: str) -> int:
    """A TCP port to listen on or connect to: 1..65535 (a larger one is an OverflowError deep in socket)."""
    if not 1 <= value <= 65535:
        raise DiagError(f"{flag} must be a TCP port between 1 and 65535, got {value}")
    return value


def output_file(path: str | os.PathLike[str], flag: str) -> Path:
    """A file diag will write or append to: not a directory, its missing directories created (0700, see
    diag.safefs), and not an existing symlink (diag never writes through one) nor someone else's file."""
    p = Path(path)
    if p.is_dir():
        raise DiagError(f"{flag} {p} is a directory; give a file path such as {p / 'out.jsonl'}")
    safefs.make_parent(p, flag)
    parent = p.parent
    if not parent.is_dir():
        raise DiagError(f"{flag} {p}: {parent} is not a directory")
    if p.is_symlink():
        raise DiagError(f"{flag} {p} is a symlink; diag does not write through symlinks: remove it or give the "
                        "real path")
    if p.exists():
        info = p.stat()
        if info.st_uid != os.geteuid() or info.st_nlink != 1:
            raise DiagError(f"{flag} {p} belongs to uid {info.st_uid} or has other hard links; diag writes only "
                            "files of yours: remove it or choose another path")
    target = p if p.exists() else parent
    if not os.access(target, os.W_OK):
        raise DiagError(f"{flag} {p}: no permission to write {target}")
    return p


def output_dir(path: str | os.PathLike[str], flag: str) -> Path:
    """A directory diag will write into: created 0700 if missing; an existing one must be the caller's and
    closed to writes by others (diag.safefs), and must not be a file."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise DiagError(f"{flag} {p} is a file, not a directory; give a directory path")
    safefs.private_dir(p, flag)
    if not os.access(p, os.W_OK):
        raise DiagError(f"{flag} {p}: no permission to write there")
    return p


def interface(name: str | None, flag: str = "--iface") -> str | None:
    """A network interface that exists on this machine (in this namespace); None or "" passes (no choice).
    gloo's own error for a missing one is a C++ exception deep in its init."""
    if not name:
        return name
    import psutil

    known = psutil.net_if_addrs()
    if name not in known:
        raise DiagError(f"network interface {name!r} ({flag}) does not exist here; choose one of: "
                        f"{', '.join(sorted(known))}")
    return name

"""Checks of user input that must fail before any work starts: one line, what to do, exit code 2.

Numbers from the command line can be NaN or infinite (argparse's float accepts "nan" and "inf"), and paths
can name the wrong kind of thing; every command checks both here before it starts ranks or reads files.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

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


def output_file(path: str | os.PathLike[str], flag: str) -> Path:
    """A file diag will write or append to: not a directory, and its directory can be made and written."""
    p = Path(path)
    if p.is_dir():
        raise DiagError(f"{flag} {p} is a directory; give a file path such as {p / 'out.jsonl'}")
    parent = p.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DiagError(f"{flag} {p}: cannot create its directory {parent} ({exc.strerror})") from None
    if not parent.is_dir():
        raise DiagError(f"{flag} {p}: {parent} is not a directory")
    target = p if p.exists() else parent
    if not os.access(target, os.W_OK):
        raise DiagError(f"{flag} {p}: no permission to write {target}")
    return p


def output_dir(path: str | os.PathLike[str], flag: str) -> Path:
    """A directory diag will write into: created if missing, must not be a file."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise DiagError(f"{flag} {p} is a file, not a directory; give a directory path")
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DiagError(f"{flag} {p}: cannot create the directory ({exc.strerror})") from None
    if not os.access(p, os.W_OK):
        raise DiagError(f"{flag} {p}: no permission to write there")
    return p

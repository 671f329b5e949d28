"""Where diag writes, and how: it runs as root, often in directories other users can write.

The rule, everywhere (run directories, records, logs, job and state files, captures, TCP_INFO samples,
reports, the lab's state):

- a directory diag creates is made 0700, so it is the caller's and nobody else can add to it;
- an existing directory diag writes into must be the caller's and not writable by group or others, else
  a one-line DiagError says what to do (an unprivileged user could otherwise plant a symlink in it and have
  root write through it);
- files are opened with O_NOFOLLOW, new ones with O_EXCL (a rewritten file is a new file renamed over the
  old one, atomically), and an existing file diag appends to must be a regular file of the caller's with
  a single link; job files, which say what ranks run and carry the run's token, are 0600.

A directory that breaks the rule is refused, never repaired: chmod or chown of a user's directory is the
user's decision. (The lab's own state directory, which diag alone uses, is tightened instead: lab/state.py.)
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
from pathlib import Path

from diag.errors import DiagError

PRIVATE_DIR_MODE = 0o700
SECRET_MODE = 0o600        # job files, anything holding the run token
OUTPUT_MODE = 0o644        # results the caller may share (the directory around them decides who can reach them)
_OPEN_FLAGS = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK   # NONBLOCK: a planted FIFO fails, never hangs


def dir_problem(path: str | os.PathLike[str], *, follow: bool = True) -> str | None:
    """Why diag must not write into directory ``path`` (None: it may): not a directory, someone else's, or
    writable by others. ``follow``: a symlink to a directory counts as that directory, if the caller owns
    the symlink (as the kernel's protected_symlinks rule: a link someone else planted is not followed)."""
    p = Path(path)
    try:
        link = os.lstat(p)
        info = os.stat(p) if follow else link
    except OSError as exc:
        return f"cannot be inspected ({exc.strerror})"
    uid = os.geteuid()
    if stat.S_ISLNK(link.st_mode) and (not follow or link.st_uid != uid):
        return f"is a symlink owned by uid {link.st_uid}, not you (uid {uid}); give the real directory"
    if not stat.S_ISDIR(info.st_mode):
        return "is not a directory"
    if info.st_uid != uid:
        return (f"belongs to uid {info.st_uid}, not you (uid {uid}); diag writes only into directories of yours: "
                f"choose another, or chown it")
    if info.st_mode & 0o022:
        return (f"can be written by group or others (mode {stat.S_IMODE(info.st_mode):o}): run chmod go-w on it "
                "or choose another")
    return None


def check_dir(path: str | os.PathLike[str], flag: str = "") -> Path:
    """``path``, an existing directory diag may write into; else DiagError naming ``flag`` and the fix."""
    problem = dir_problem(path)
    if problem is not None:
        raise DiagError(f"{flag + ' ' if flag else ''}{path} {problem}")
    return Path(path)


def make_dirs(path: str | os.PathLike[str], flag: str = "") -> list[Path]:
    """Create the missing directories of ``path`` (parents first), each 0700; existing ones are left as they
    are. Returns those created. Races with another process creating the same directory are fine."""
    p = Path(path)
    missing: list[Path] = []
    while not os.path.lexists(p):
        missing.append(p)
        if p.parent == p:
            break
        p = p.parent
    created = []
    for directory in reversed(missing):
        try:
            os.mkdir(directory, PRIVATE_DIR_MODE)
            created.append(directory)
        except FileExistsError:
            pass
        except OSError as exc:
            raise DiagError(f"{flag + ' ' if flag else ''}{path}: cannot create {directory} ({exc.strerror})") from None
    return created


def private_dir(path: str | os.PathLike[str], flag: str = "") -> Path:
    """A directory diag writes into: created 0700 (with its missing parents) if absent, else checked."""
    make_dirs(path, flag)
    return check_dir(path, flag)


def make_parent(path: str | os.PathLike[str], flag: str = "") -> Path:
    """Create ``path``'s missing parent directories (0700) for a file the caller named; returns ``path``."""
    p = Path(path)
    make_dirs(p.parent, flag)
    return p


def _blocking(fd: int) -> int:
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    return fd


def _check_own_file(fd: int, path: Path, flag: str) -> None:
    info = os.fstat(fd)
    uid = os.geteuid()
    problem = None
    if not stat.S_ISREG(info.st_mode):
        problem = "is not a regular file"
    elif info.st_uid != uid:
        problem = f"belongs to uid {info.st_uid}, not you (uid {uid}); remove it or choose another path"
    elif info.st_nlink != 1:
        problem = f"has {info.st_nlink} hard links; diag writes only files with one (remove it or choose another)"
    if problem is not None:
        os.close(fd)
        raise DiagError(f"{flag + ' ' if flag else ''}{path} {problem}")


def _open_error(path: Path, flag: str, exc: OSError) -> DiagError:
    where = f"{flag + ' ' if flag else ''}{path}"
    if exc.errno == errno.ELOOP:
        return DiagError(f"{where} is a symlink; diag does not write through symlinks: remove it or give the real path")
    if exc.errno == errno.EEXIST:
        return DiagError(f"{where} appeared while diag was creating it; is another diag writing there?")
    if exc.errno == errno.ENXIO:
        return DiagError(f"{where} is a FIFO or socket, not a file")
    return DiagError(f"{where}: cannot write ({exc.strerror})")


def create(path: str | os.PathLike[str], mode: int = OUTPUT_MODE, *, replace: bool = False, flag: str = "") -> int:
    """A new file's write descriptor (O_EXCL | O_NOFOLLOW). ``replace``: an existing entry of that name (file
    or symlink, never a directory) is unlinked first; the symlink itself goes, its target is untouched."""
    p = Path(path)
    if replace:
        with contextlib.suppress(FileNotFoundError, IsADirectoryError):
            info = os.lstat(p)
            if not stat.S_ISDIR(info.st_mode):
                os.unlink(p)
    try:
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _OPEN_FLAGS, mode)
    except OSError as exc:
        if exc.errno == errno.EISDIR or p.is_dir():
            raise DiagError(f"{flag + ' ' if flag else ''}{p} is a directory; give a file path") from None
        raise _open_error(p, flag, exc) from None
    return _blocking(fd)


def open_append(path: str | os.PathLike[str], mode: int = OUTPUT_MODE, *, flag: str = "", read: bool = False) -> int:
    """An append descriptor (O_APPEND | O_NOFOLLOW; ``read``: also readable) of a file created if missing; an
    existing one must be a regular file of the caller's with one link."""
    p = Path(path)
    access = os.O_RDWR if read else os.O_WRONLY
    try:
        fd = os.open(p, access | os.O_APPEND | os.O_CREAT | _OPEN_FLAGS, mode)
    except OSError as exc:
        if exc.errno == errno.EISDIR:
            raise DiagError(f"{flag + ' ' if flag else ''}{p} is a directory; give a file path") from None
        raise _open_error(p, flag, exc) from None
    _check_own_file(fd, p, flag)
    return _blocking(fd)


def temp_path(path: str | os.PathLike[str]) -> Path:
    """Where write_file puts ``path``'s next version before renaming it over ``path``."""
    p = Path(path)
    return p.with_name(f".{p.name}.{os.getpid()}.tmp")


def write_file(path: str | os.PathLike[str], data: str | bytes, mode: int = OUTPUT_MODE, *,
               tmp: str | os.PathLike[str] | None = None, flag: str = "") -> Path:
    """Write ``data`` to ``path`` atomically: a new file (``tmp``, default :func:`temp_path`; O_EXCL,
    O_NOFOLLOW, a planted entry of that name is removed first) renamed over ``path``. A reader sees the
    old or the new content, never half; a symlink at ``path`` is replaced, never written through."""
    p = Path(path)
    scratch = Path(tmp) if tmp is not None else temp_path(p)
    payload = data.encode() if isinstance(data, str) else data
    fd = create(scratch, mode, replace=True, flag=flag)
    try:
        view = memoryview(payload)
        while view:
            view = view[os.write(fd, view):]
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(scratch)
        raise
    os.close(fd)
    try:
        os.replace(scratch, p)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(scratch)
        if p.is_dir():
            raise DiagError(f"{flag + ' ' if flag else ''}{p} is a directory; give a file path") from None
        raise DiagError(f"{flag + ' ' if flag else ''}{p}: cannot write ({exc.strerror})") from None
    return p


def open_trusted(path: str | os.PathLike[str], *, secret: bool = False) -> int | None:
    """A read descriptor of ``path`` if it is a regular file of the caller's that nobody else can write
    (``secret``: nor read), opened without following symlinks; None otherwise (as if absent)."""
    try:
        fd = os.open(path, os.O_RDONLY | _OPEN_FLAGS)
    except OSError:
        return None
    info = os.fstat(fd)
    closed = 0o077 if secret else 0o022
    if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & closed:
        os.close(fd)
        return None
    return _blocking(fd)

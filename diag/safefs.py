"""Where diag writes, and how: it runs as root, often in directories other users can write.

The rule, everywhere (run directories, records, logs, job and state files, captures, TCP_INFO samples,
reports, the lab's state):

- a path diag writes below is walked from ``/`` one directory at a time, each opened relative to the one
  before without following a symlink (:func:`open_dir`): a symlink is followed only where it is root's or
  the caller's and sits in a directory that passed, and a directory is refused where another user can
  write it (someone else's, or group/other-writable), unless it is sticky, root's or the caller's, and the
  next step is root's or the caller's (``/tmp/mine``). So nobody else can swap a directory on the way for
  a symlink between diag's check and its write: every file is then created, opened and renamed relative
  to the directory handle the walk ended at (:class:`Dir`), never by its path again;
- a directory diag creates is made 0700, so it is the caller's and nobody else can add to it;
- an existing directory diag writes into must be the caller's and not writable by group or others, else
  a one-line DiagError says what to do (an unprivileged user could otherwise plant a symlink in it and have
  root write through it);
- files are opened with O_NOFOLLOW, new ones with O_EXCL (a rewritten file is a new file renamed over the
  old one, atomically), and an existing file diag appends to must be a regular file of the caller's with
  a single link; job files, which say what ranks run and carry the run's token, are 0600;
- a file diag reads from a place others may have touched (a node's results, the shared-directory marker)
  is opened with O_NOFOLLOW | O_NONBLOCK, must be a regular file, and is read up to a limit
  (:meth:`Dir.read_bytes`): a symlink, a FIFO or a huge file is refused, never followed, waited on or
  read whole.

A directory that breaks the rule is refused, never repaired: chmod or chown of a user's directory is the
user's decision. (The lab's own state directory, which diag alone uses, is tightened instead: lab/state.py.)
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from diag.errors import DiagError

PRIVATE_DIR_MODE = 0o700
SECRET_MODE = 0o600        # job files, anything holding the run token
OUTPUT_MODE = 0o644        # results the caller may share (the directory around them decides who can reach them)
_OPEN_FLAGS = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK   # NONBLOCK: a planted FIFO fails, never hangs
_DIR_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
MAX_SYMLINKS = 40          # as the kernel's own limit on one path (ELOOP)
READ_CHUNK = 1 << 20


def _where(flag: str, path: str | os.PathLike[str]) -> str:
    return f"{flag + ' ' if flag else ''}{path}"


def _uid_name(uid: int) -> str:
    return f"uid {uid}"


def _trusted_owner(uid: int) -> bool:
    return uid in (0, os.geteuid())


def _step_problem(parent: os.stat_result, child_uid: int) -> str | None:
    """Why someone other than root and the caller could swap the entry (owned by ``child_uid``) of directory
    ``parent`` (None: nobody else can). A sticky directory (/tmp) lets others add entries, but not rename or remove one they do
    not own, nor one in a directory they do not own: it passes for root's or the caller's own entries."""
    if not _trusted_owner(parent.st_uid):
        return (f"belongs to {_uid_name(parent.st_uid)}, who could swap what diag writes below it for a symlink; "
                "choose a directory that only you (or root) can write")
    if parent.st_mode & 0o022 and not (parent.st_mode & stat.S_ISVTX and _trusted_owner(child_uid)):
        return (f"can be written by group or others (mode {stat.S_IMODE(parent.st_mode):o}), who could swap what "
                "diag writes below it for a symlink; choose a directory that only you (or root) can write")
    return None


def _final_problem(info: os.stat_result) -> str | None:
    """Why diag must not write into this existing directory (None: it may): the caller's, closed to others."""
    uid = os.geteuid()
    if not stat.S_ISDIR(info.st_mode):
        return "is not a directory"
    if info.st_uid != uid:
        return (f"belongs to {_uid_name(info.st_uid)}, not you (uid {uid}); diag writes only into directories of "
                "yours: choose another, or chown it")
    if info.st_mode & 0o022:
        return (f"can be written by group or others (mode {stat.S_IMODE(info.st_mode):o}): run chmod go-w on it "
                "or choose another")
    return None


class Dir:
    """A directory reached by :func:`open_dir`, held open (an O_PATH descriptor): everything below it is
    created, opened, renamed and read relative to this handle, so whatever happens to the path above it
    afterwards (a parent renamed, a symlink put in its place) changes nothing diag writes or reads here.
    ``path`` is for messages and for what diag prints; it is never opened again."""

    def __init__(self, fd: int, path: str | os.PathLike[str]) -> None:
        self.fd = fd
        self.path = Path(path)

    def __enter__(self) -> Dir:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def stat(self) -> os.stat_result:
        return os.fstat(self.fd)

    # --- directories below ------------------------------------------------------------------------
    def open_dir(self, relative: str | os.PathLike[str], *, create: bool = False, flag: str = "") -> Dir:
        """A directory below this one (plain names only: no ``..``, not absolute), each step checked as the
        walk from / checks them; created 0700 where missing if ``create``."""
        parts = _plain_parts(relative)
        if parts is None:
            raise DiagError(f"{_where(flag, self.path / str(relative))}: diag walks only plain names below a "
                            "directory it holds (no '..', not absolute)")
        fd = os.dup(self.fd)
        path = self.path
        try:
            for part in parts:
                child, _ = _step(fd, part, path, create=create, flag=flag, follow=False)
                os.close(fd)
                fd, path = child, path / part
        except BaseException:
            os.close(fd)
            raise
        return Dir(fd, path)

    def private_dir(self, relative: str | os.PathLike[str], flag: str = "") -> Dir:
        """Created 0700 where missing; an existing one must be the caller's and closed to others."""
        handle = self.open_dir(relative, create=True, flag=flag)
        problem = _final_problem(handle.stat())
        if problem is not None:
            handle.close()
            raise DiagError(f"{_where(flag, handle.path)} {problem}")
        return handle

    # --- files in this directory ---------------------------------------------------------------------
    def _name(self, name: str, flag: str) -> str:
        if not name or "/" in name or name in (".", ".."):
            raise DiagError(f"{_where(flag, self.path / name)}: not a plain file name")
        return name

    def _check_entry(self, name: str, flag: str) -> None:
        """The directory must let nobody else swap the entry ``name`` (the walk checked the way here)."""
        try:
            owner = os.stat(name, dir_fd=self.fd, follow_symlinks=False).st_uid
        except FileNotFoundError:
            owner = os.geteuid()   # diag's own new file
        problem = _step_problem(self.stat(), owner)
        if problem is not None:
            raise DiagError(f"{_where(flag, self.path / name)}: {self.path} {problem}")

    def create(self, name: str, mode: int = OUTPUT_MODE, *, replace: bool = False, flag: str = "",
               read: bool = False) -> int:
        """A new file's write descriptor (O_EXCL | O_NOFOLLOW; ``read``: also readable). ``replace``: an existing
        entry of that name (file or symlink, never a directory) is unlinked first; the symlink itself goes, its
        target is untouched."""
        name = self._name(name, flag)
        path = self.path / name
        self._check_entry(name, flag)
        if replace:
            with contextlib.suppress(FileNotFoundError):
                info = os.stat(name, dir_fd=self.fd, follow_symlinks=False)
                if not stat.S_ISDIR(info.st_mode):
                    os.unlink(name, dir_fd=self.fd)
        try:
            fd = os.open(name, (os.O_RDWR if read else os.O_WRONLY) | os.O_CREAT | os.O_EXCL | _OPEN_FLAGS, mode,
                         dir_fd=self.fd)
        except OSError as exc:
            is_dir = False
            with contextlib.suppress(OSError):
                is_dir = stat.S_ISDIR(os.stat(name, dir_fd=self.fd, follow_symlinks=False).st_mode)
            if exc.errno == errno.EISDIR or is_dir:
                raise DiagError(f"{_where(flag, path)} is a directory; give a file path") from None
            raise _open_error(path, flag, exc) from None
        return _blocking(fd)

    def open_append(self, name: str, mode: int = OUTPUT_MODE, *, flag: str = "", read: bool = False) -> int:
        """An append descriptor (O_APPEND | O_NOFOLLOW; ``read``: also readable) of a file created if missing;
        an existing one must be a regular file of the caller's with one link."""
        name = self._name(name, flag)
        path = self.path / name
        self._check_entry(name, flag)
        access = os.O_RDWR if read else os.O_WRONLY
        try:
            fd = os.open(name, access | os.O_APPEND | os.O_CREAT | _OPEN_FLAGS, mode, dir_fd=self.fd)
        except OSError as exc:
            if exc.errno == errno.EISDIR:
                raise DiagError(f"{_where(flag, path)} is a directory; give a file path") from None
            raise _open_error(path, flag, exc) from None
        _check_own_file(fd, path, flag)
        return _blocking(fd)

    def write_file(self, name: str, data: str | bytes, mode: int = OUTPUT_MODE, *, tmp: str | None = None,
                   flag: str = "") -> Path:
        """Write ``data`` to ``name`` atomically: a new file (``tmp``, default ``.<name>.<pid>.tmp``; O_EXCL,
        O_NOFOLLOW, a planted entry of that name is removed first) renamed over ``name``. A reader sees the
        old or the new content, never half; a symlink at ``name`` is replaced, never written through."""
        name = self._name(name, flag)
        scratch = self._name(tmp or temp_path(name).name, flag)
        payload = data.encode() if isinstance(data, str) else data
        fd = self.create(scratch, mode, replace=True, flag=flag)
        try:
            view = memoryview(payload)
            while view:
                view = view[os.write(fd, view):]
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(scratch, dir_fd=self.fd)
            raise
        os.close(fd)
        self.rename(scratch, name, flag=flag)
        return self.path / name

    def rename(self, source: str, target: str, *, flag: str = "") -> None:
        """Rename ``source`` over ``target``, both entries of this directory (a finished temporary file into place)."""
        try:
            os.replace(source, target, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(source, dir_fd=self.fd)
            is_dir = False
            with contextlib.suppress(OSError):
                is_dir = stat.S_ISDIR(os.stat(target, dir_fd=self.fd, follow_symlinks=False).st_mode)
            if is_dir:
                raise DiagError(f"{_where(flag, self.path / target)} is a directory; give a file path") from None
            raise DiagError(f"{_where(flag, self.path / target)}: cannot write ({exc.strerror})") from None

    def remove(self, name: str) -> None:
        """Unlink the entry ``name`` (never a directory; the entry itself, a symlink is not followed)."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._name(name, ""), dir_fd=self.fd)

    def open_read(self, name: str) -> int | None:
        """A read descriptor of the regular file ``name`` (O_NOFOLLOW | O_NONBLOCK: a symlink is refused and a
        FIFO never waited on); None where there is no such regular file."""
        try:
            fd = os.open(self._name(name, ""), os.O_RDONLY | _OPEN_FLAGS, dir_fd=self.fd)
        except (OSError, DiagError):
            return None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            return None
        return fd

    def read_bytes(self, name: str, limit: int) -> bytes | None:
        """The regular file ``name``'s content, if it holds at most ``limit`` bytes; None otherwise (absent, a
        symlink, a FIFO or other special file, or too big). Never follows, never blocks, never reads more
        than ``limit + 1`` bytes."""
        fd = self.open_read(name)
        if fd is None:
            return None
        with os.fdopen(fd, "rb") as handle:
            data = handle.read(limit + 1)
        return data if len(data) <= limit else None

    def entries(self) -> list[tuple[str, os.stat_result]]:
        """(name, lstat) of every entry, sorted by name; symlinks are reported as such, never followed."""
        fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=self.fd)
        try:
            names = sorted(os.listdir(fd))
        finally:
            os.close(fd)
        out = []
        for name in names:
            with contextlib.suppress(FileNotFoundError):
                out.append((name, os.stat(name, dir_fd=self.fd, follow_symlinks=False)))
        return out


def _plain_parts(relative: str | os.PathLike[str]) -> list[str] | None:
    text = os.fspath(relative)
    if text.startswith("/") or "\0" in text:
        return None
    parts = [part for part in text.split("/") if part not in ("", ".")]
    return None if ".." in parts else parts


def _step(parent_fd: int, name: str, parent_path: Path, *, create: bool, flag: str,
          follow: bool) -> tuple[int, str | None]:
    """Open directory ``name`` in ``parent_fd`` without following a symlink; check the step. Returns (fd, None),
    or (-1, target) where ``name`` is a symlink diag may follow (``follow``: root's or the caller's, in a
    parent that lets nobody else swap it)."""
    path = parent_path / name
    parent = os.fstat(parent_fd)
    for _attempt in range(2):
        try:
            fd = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
        except FileNotFoundError:
            if not create:
                raise DiagError(f"{_where(flag, path)} does not exist") from None
            problem = _step_problem(parent, os.geteuid())   # checked before anything is made there
            if problem is not None:
                raise DiagError(f"{_where(flag, path)}: {parent_path} {problem}") from None
            try:
                os.mkdir(name, PRIVATE_DIR_MODE, dir_fd=parent_fd)
            except FileExistsError:
                pass   # another process made it in between: checked like any existing directory
            except OSError as exc:
                raise DiagError(f"{_where(flag, path)}: cannot create it ({exc.strerror})") from None
            continue
        except OSError as exc:
            if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                raise DiagError(f"{_where(flag, path)}: cannot open it ({exc.strerror})") from None
            try:
                info = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
            except OSError as again:
                raise DiagError(f"{_where(flag, path)}: cannot inspect it ({again.strerror})") from None
            if not stat.S_ISLNK(info.st_mode):
                raise DiagError(f"{_where(flag, path)} is not a directory") from None
            if not follow:
                raise DiagError(f"{_where(flag, path)} is a symlink; give the real directory") from None
            if not _trusted_owner(info.st_uid):
                raise DiagError(f"{_where(flag, path)} is a symlink owned by {_uid_name(info.st_uid)}, not you "
                                f"(uid {os.geteuid()}); give the real directory") from None
            problem = _step_problem(parent, info.st_uid)
            if problem is not None:
                raise DiagError(f"{_where(flag, path)}: {parent_path} {problem}") from None
            return -1, os.readlink(name, dir_fd=parent_fd)
        problem = _step_problem(parent, os.fstat(fd).st_uid)
        if problem is not None:
            os.close(fd)
            raise DiagError(f"{_where(flag, path)}: {parent_path} {problem}")
        return fd, None
    raise DiagError(f"{_where(flag, path)}: it keeps disappearing while diag opens it")


def open_dir(path: str | os.PathLike[str], *, create: bool = False, flag: str = "",
             follow_last: bool = True) -> Dir:
    """The directory ``path`` as a :class:`Dir`, walked from / (a relative path from the working directory,
    which the kernel names without symlinks): every step opened without following a symlink and checked
    (module docstring); a symlink root's or the caller's, in a directory that passed, is walked through
    (``follow_last`` False: not at the last step). Missing directories are made 0700 where ``create``."""
    text = os.fspath(path)
    if not text:
        raise DiagError(f"{_where(flag, '(empty path)')}: give a directory")
    start = text if text.startswith("/") else os.path.join(os.getcwd(), text)
    pending = [part for part in start.split("/") if part]
    pending.reverse()   # a stack: the next component last
    stack: list[tuple[int, Path]] = [(os.open("/", _DIR_FLAGS), Path("/"))]
    followed = 0
    try:
        while pending:
            part = pending.pop()
            if part == ".":
                continue
            if part == "..":
                if len(stack) > 1:
                    os.close(stack.pop()[0])
                continue
            fd, where = stack[-1]
            last = not pending
            child, target = _step(fd, part, where, create=create, flag=flag, follow=follow_last or not last)
            if target is None:
                stack.append((child, where / part))
                continue
            followed += 1
            if followed > MAX_SYMLINKS:
                raise DiagError(f"{_where(flag, path)}: too many symlinks on the way")
            if target.startswith("/"):
                while len(stack) > 1:
                    os.close(stack.pop()[0])
            pending.extend(reversed([p for p in target.split("/") if p]))
        fd, where = stack.pop()
        return Dir(fd, Path(text) if text else where)
    finally:
        for fd, _ in stack:
            os.close(fd)


@contextlib.contextmanager
def _parent_of(path: str | os.PathLike[str], flag: str, *, create: bool = False) -> Iterator[tuple[Dir, str]]:
    p = Path(path)
    if not p.name or p.name in (".", ".."):
        raise DiagError(f"{_where(flag, p)}: give a file path")
    with open_dir(p.parent if str(p.parent) else ".", create=create, flag=flag) as parent:
        yield parent, p.name


def dir_problem(path: str | os.PathLike[str], *, follow: bool = True) -> str | None:
    """Why diag must not write into directory ``path`` (None: it may): the way there can be swapped by
    someone else, it is not a directory, someone else's, or writable by others. ``follow``: a symlink at the
    last step counts as its directory, if it is the caller's (or root's) and sits where nobody else can swap
    it (as the kernel's protected_symlinks rule: a link someone else planted is not followed)."""
    try:
        with open_dir(path, follow_last=follow) as handle:
            return _final_problem(handle.stat())
    except DiagError as exc:
        text = str(exc)
        prefix = f"{path} "
        return text[len(prefix):] if text.startswith(prefix) else text


def check_dir(path: str | os.PathLike[str], flag: str = "") -> Path:
    """``path``, an existing directory diag may write into; else DiagError naming ``flag`` and the fix."""
    with private_handle(path, flag, create=False):
        return Path(path)


def private_handle(path: str | os.PathLike[str], flag: str = "", *, create: bool = True) -> Dir:
    """The directory ``path`` held open (:class:`Dir`): created 0700 with its missing parents where absent,
    else checked (the caller's, closed to others); the way there checked at every step. Close it when done."""
    handle = open_dir(path, create=create, flag=flag)
    problem = _final_problem(handle.stat())
    if problem is not None:
        handle.close()
        raise DiagError(f"{_where(flag, path)} {problem}")
    return handle


def make_dirs(path: str | os.PathLike[str], flag: str = "") -> list[Path]:
    """Create the missing directories of ``path`` (parents first), each 0700, walking from / (each step
    checked as :func:`open_dir` does); existing ones are left as they are. Returns those created."""
    p = Path(path)
    missing: list[Path] = []
    while not os.path.lexists(p):
        missing.append(p)
        if p.parent == p:
            break
        p = p.parent
    open_dir(path, create=True, flag=flag).close()
    return list(reversed(missing))


def private_dir(path: str | os.PathLike[str], flag: str = "") -> Path:
    """A directory diag writes into: created 0700 (with its missing parents) if absent, else checked."""
    private_handle(path, flag).close()
    return Path(path)


def make_parent(path: str | os.PathLike[str], flag: str = "") -> Path:
    """Create ``path``'s missing parent directories (0700) for a file the caller named; returns ``path``."""
    p = Path(path)
    open_dir(p.parent if str(p.parent) else ".", create=True, flag=flag).close()
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
        raise DiagError(f"{_where(flag, path)} {problem}")


def _open_error(path: Path, flag: str, exc: OSError) -> DiagError:
    where = _where(flag, path)
    if exc.errno == errno.ELOOP:
        return DiagError(f"{where} is a symlink; diag does not write through symlinks: remove it or give the real path")
    if exc.errno == errno.EEXIST:
        return DiagError(f"{where} appeared while diag was creating it; is another diag writing there?")
    if exc.errno == errno.ENXIO:
        return DiagError(f"{where} is a FIFO or socket, not a file")
    return DiagError(f"{where}: cannot write ({exc.strerror})")


def create(path: str | os.PathLike[str], mode: int = OUTPUT_MODE, *, replace: bool = False, flag: str = "",
           read: bool = False) -> int:
    """A new file's write descriptor (O_EXCL | O_NOFOLLOW; ``read``: also readable), in a directory reached by
    :func:`open_dir`. ``replace``: an existing entry of that name (file or symlink, never a directory) is
    unlinked first."""
    with _parent_of(path, flag) as (parent, name):
        return parent.create(name, mode, replace=replace, flag=flag, read=read)


def open_append(path: str | os.PathLike[str], mode: int = OUTPUT_MODE, *, flag: str = "", read: bool = False) -> int:
    """An append descriptor (O_APPEND | O_NOFOLLOW; ``read``: also readable) of a file created if missing; an
    existing one must be a regular file of the caller's with one link."""
    with _parent_of(path, flag) as (parent, name):
        return parent.open_append(name, mode, flag=flag, read=read)


def temp_path(path: str | os.PathLike[str]) -> Path:
    """Where write_file puts ``path``'s next version before renaming it over ``path``."""
    p = Path(path)
    return p.with_name(f".{p.name}.{os.getpid()}.tmp")


def write_file(path: str | os.PathLike[str], data: str | bytes, mode: int = OUTPUT_MODE, *,
               tmp: str | os.PathLike[str] | None = None, flag: str = "") -> Path:
    """Write ``data`` to ``path`` atomically (:meth:`Dir.write_file` in the directory :func:`open_dir`
    reaches): a reader sees the old or the new content, never half; a symlink at ``path`` is replaced,
    never written through. ``tmp``: the temporary file's name, in the same directory."""
    p = Path(path)
    with _parent_of(p, flag) as (parent, name):
        parent.write_file(name, data, mode, tmp=Path(tmp).name if tmp is not None else None, flag=flag)
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


def read_limited(path: str | os.PathLike[str], limit: int) -> bytes | None:
    """The content of the regular file ``path`` if it holds at most ``limit`` bytes, else None (absent,
    unreadable, a symlink at the last step, a FIFO or device, too big): O_NOFOLLOW | O_NONBLOCK, so a
    planted FIFO is never waited on, and never more than ``limit + 1`` bytes read."""
    try:
        fd = os.open(path, os.O_RDONLY | _OPEN_FLAGS)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = handle.read(limit + 1)
    return data if len(data) <= limit else None


__all__ = ["OUTPUT_MODE", "PRIVATE_DIR_MODE", "SECRET_MODE", "Dir", "check_dir", "create", "dir_problem",
           "make_dirs", "make_parent", "open_append", "open_dir", "open_trusted", "private_dir", "private_handle",
           "read_limited", "temp_path", "write_file"]

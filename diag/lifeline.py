"""Processes diag starts die with the process that started them, however it ends (SIGKILL included).

Linux's parent-death signal (prctl PR_SET_PDEATHSIG) is delivered to a process when the thread that forked
it exits. It survives exec (except of set-uid binaries), so it is set in the child just before the program
starts, and the parent is checked once afterwards: had it died before the prctl, no signal would ever come.

    python -m diag.lifeline PARENT_PID -m MODULE ARGS...   run a Python module in this process (torchrun)
    python -m diag.lifeline PARENT_PID -- PROGRAM ARGS...  exec a program (tcpdump)
    python -m diag.lifeline PARENT_PID --user NAME -- PROGRAM ARGS...
                                                           exec it as user NAME (iperf3's servers: nobody)

A server diag starts that needs no privilege (iperf3's, which serves the first client that comes) runs as
an unprivileged user (:data:`UNPRIVILEGED_USER`): the credentials change before the parent-death signal is
set, since the kernel clears that signal on any change of credentials.

torch's launcher starts every worker in a new session of its own, so killing the launcher's process group
does not reach them: every rank (``python -m diag.inplace``) binds itself to its launcher with :func:`bind_to_parent` as well.

diag runs as root, often in a directory others can write (a shared scratch dir, /tmp). ``python -m X``
puts the current directory first on sys.path, so a ``diag/`` or ``torch/`` planted there would run as
root in every child. Every Python child therefore starts through :func:`python_command` (``-P``) with
:func:`child_env` (``PYTHONSAFEPATH=1``, inherited by the workers torch's launcher starts in turn) and
:data:`CHILD_CWD` as its working directory. Python 3.10 knows neither ``-P`` nor PYTHONSAFEPATH: there the
working directory, "/", which only root can write, is what keeps sys.path[0] safe.

No child gets the raw transport's run token: :func:`child_env` leaves out :data:`SECRET_ENV`, so tcpdump,
iperf3, ss and the launchers never hold it in their environment (readable in /proc by their user).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
from collections.abc import Mapping
from typing import Any

PR_SET_PDEATHSIG = 1
CHILD_CWD = "/"    # the working directory of every child diag starts: root's own, so nothing is planted there
SAFE_PATH_FLAG = ("-P",) if sys.version_info >= (3, 11) else ()
# Secrets a rank may hold in its own environment (diag.transports.raw.backend.ENV_TOKEN), never passed on.
SECRET_ENV = ("DIAG_TCP_TOKEN",)
UNPRIVILEGED_USER = "nobody"
NOBODY_ID = 65534   # where the system has no user of that name


def python_command(*args: str) -> list[str]:
    """``[python, -P, *args]``: this interpreter, never importing from its working directory (3.11+)."""
    return [sys.executable, *SAFE_PATH_FLAG, *args]


def child_env(base: Mapping[str, str] | None = None, package_path: bool = True) -> dict[str, str]:
    """The environment of a child (Python or a tool): ``base`` (default os.environ) without SECRET_ENV, with
    PYTHONSAFEPATH=1, and
    PYTHONPATH holding diag's own package root first (the child imports the same diag); empty entries,
    which name the working directory, are dropped and relative ones made absolute (the child runs in
    CHILD_CWD, not here)."""
    env = {k: v for k, v in (os.environ if base is None else base).items() if k not in SECRET_ENV}
    env["PYTHONSAFEPATH"] = "1"
    entries = [os.path.abspath(entry) for entry in env.get("PYTHONPATH", "").split(os.pathsep) if entry]
    if package_path:
        entries.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if entries:
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(entries))
    else:
        env.pop("PYTHONPATH", None)
    return env


def tool_command(argv: list[str], *, user: str | None = None) -> list[str]:
    """``argv`` through this module: it dies with this process, and runs as ``user`` where given (and diag is
    root)."""
    return python_command("-m", "diag.lifeline", str(os.getpid()), *(("--user", user) if user else ()), "--", *argv)


def runnable_by_others(program: str) -> str | None:
    """The real path of ``program`` (looked up on PATH as :func:`shutil.which` does) if a user without
    privilege can run it there: every directory on the way searchable by others and the file executable by
    them; None otherwise (absent, or only root can reach it, e.g. a PATH entry in a directory of root's)."""
    import shutil

    found = shutil.which(program)
    if found is None:
        return None
    real = os.path.realpath(found)
    try:
        if not os.stat(real).st_mode & 0o001:
            return None
        parent = os.path.dirname(real)
        while True:
            if not os.stat(parent).st_mode & 0o001:
                return None
            if parent == os.path.dirname(parent):
                return real
            parent = os.path.dirname(parent)
    except OSError:
        return None


def drop_privileges(user: str) -> None:
    """Become ``user`` (its uid and primary group, no supplementary groups) if root; a no-op otherwise."""
    if os.geteuid() != 0:
        return
    import pwd

    try:
        entry = pwd.getpwnam(user)
        uid, gid = entry.pw_uid, entry.pw_gid
    except KeyError:
        uid = gid = NOBODY_ID
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP arrived: unwind like Ctrl-C, so every ``finally`` (stop ranks, captures) runs."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"terminated by {signal.Signals(signum).name}")
        self.signum = signum


def raise_terminated(signum: int, _frame: object) -> None:
    raise Terminated(signum)


def terminate_as_exception(signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGHUP)) -> dict[int, Any]:
    """Turn SIGTERM/SIGHUP into :class:`Terminated` in this process (main thread only; elsewhere a no-op).

    Returns the previous handlers, for :func:`restore_handlers`."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {sig: signal.signal(sig, raise_terminated) for sig in signals}


def restore_handlers(previous: dict[int, Any]) -> None:
    for sig, handler in previous.items():
        signal.signal(sig, handler)


def set_parent_death_signal(sig: int) -> bool:
    """Ask the kernel to send ``sig`` to this process when its parent dies. False where unsupported."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def bind_to_parent(sig: int, expected_parent: int | None = None) -> None:
    """Die by ``sig`` when the parent dies; exit at once if it is already gone.

    ``expected_parent`` defaults to the parent seen before the prctl: comparing afterwards closes the race
    in which the parent died in between (the process then has a new parent, the reaper).
    """
    parent = os.getppid() if expected_parent is None else expected_parent
    if set_parent_death_signal(sig) and os.getppid() != parent:
        os._exit(128 + int(sig))


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    user = None
    if len(args) > 3 and args[1] == "--user":
        user = args[2]
        del args[1:3]
    if len(args) < 3 or not args[0].isdigit() or args[1] not in ("-m", "--") or (user and args[1] != "--"):
        print("usage: python -m diag.lifeline PARENT_PID [--user NAME] (-m MODULE | -- PROGRAM) ARGS...",
              file=sys.stderr)
        return 2
    parent, mode, target, rest = int(args[0]), args[1], args[2], args[3:]
    if user:
        # Found on root's PATH first (an entry there may be a directory of root's that the user cannot reach),
        # then run by its real path as the user; before the prctl: a change of credentials clears the
        # parent-death signal.
        target = runnable_by_others(target) or target
        drop_privileges(user)
    # SIGTERM: torch's launcher and tcpdump both handle it by stopping what they started / flushing.
    bind_to_parent(signal.SIGTERM, parent)
    if mode == "--":
        try:
            os.execvp(target, [target, *rest])
        except OSError as exc:
            print(f"diag: cannot run {target}: {exc.strerror}", file=sys.stderr)
            return 127
    import runpy

    sys.argv = [target, *rest]
    runpy.run_module(target, run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

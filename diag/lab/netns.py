"""Thin, checked wrappers around ip/tc/ethtool, and sockets opened inside a network namespace.

Commands are batched per namespace (``ip -n NS -batch -``) so bringing a lab up costs a handful of
processes, not dozens.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

from diag.errors import DiagError, MissingToolError, PrivilegeError

CAP_NET_ADMIN = 12
CAP_SYS_ADMIN = 21              # mounting the per-namespace /sys that "ip netns exec" needs
CLONE_NEWNET = 0x40000000
COMMAND_TIMEOUT_S = 30.0
NETNS_DIR = "/run/netns"

T = TypeVar("T")


class CommandError(DiagError):
    """An ip/tc/ethtool command failed; the message carries its stderr."""


def require_tools(*tools: str) -> None:
    for tool in tools:
        if shutil.which(tool) is None:
            raise MissingToolError(tool, "install iproute2 (ip, tc) and ethtool, e.g. apt-get install iproute2 ethtool")


def has_capability(bit: int) -> bool:
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> bit & 1)
    except OSError:
        pass
    return os.geteuid() == 0


def require_privilege(what: str) -> None:
    if not (has_capability(CAP_NET_ADMIN) and has_capability(CAP_SYS_ADMIN)):
        raise PrivilegeError(
            what,
            "run it as root (sudo), or use loopback runs that need no lab: diag sweep --nproc N "
            "(unshaped, so the CPU rather than a NIC limits them)",
        )


def run(argv: Sequence[str], *, input_text: str | None = None, check: bool = True,
        timeout_s: float = COMMAND_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    try:
        proc = subprocess.run(list(argv), input=input_text, capture_output=True, text=True,
                              timeout=timeout_s, check=False)
    except FileNotFoundError as exc:
        raise MissingToolError(argv[0], "install iproute2 (ip, tc) and ethtool") from exc
    except subprocess.TimeoutExpired as exc:
        raise CommandError(f"{' '.join(argv)} did not finish in {timeout_s:.0f} s") from exc
    if check and proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).strip().splitlines()
        first = detail[0] if detail else f"exit status {proc.returncode}"
        raise CommandError(f"{' '.join(argv[:6])}: {first}")
    return proc


def ip_batch(netns: str | None, lines: Sequence[str]) -> None:
    """Run 'ip' commands (without the leading 'ip') in one process, inside netns when given."""
    argv = ["ip"] + (["-n", netns] if netns else []) + ["-batch", "-"]
    run(argv, input_text="\n".join(lines) + "\n")


def tc_batch(netns: str, lines: Sequence[str]) -> None:
    run(["tc", "-n", netns, "-batch", "-"], input_text="\n".join(lines) + "\n")


def link_mtu(netns: str, iface: str) -> int | None:
    """The MTU of iface inside netns (None where it cannot be read)."""
    proc = run(["ip", "-n", netns, "-j", "link", "show", "dev", iface], check=False)
    try:
        return int(json.loads(proc.stdout)[0]["mtu"])
    except (ValueError, LookupError, TypeError):
        return None


def write_sysctls(netns: str, values: dict[str, str]) -> None:
    """Write net.* sysctls inside netns: /proc/sys/net shows the namespace of the thread that opens it, so a
    thread that joined netns writes them (no process to fork)."""
    def write() -> None:
        for name, value in values.items():
            try:
                with open(_sysctl_path(name), "w", encoding="ascii") as handle:
                    handle.write(value)
            except OSError as exc:
                raise DiagError(f"cannot set {name} = {value!r} in {netns} ({exc.strerror}); check the value, "
                                "or drop that fault") from None

    call_in_netns(netns, write)


def read_sysctls(netns: str, names: list[str]) -> dict[str, str]:
    """net.* sysctls inside netns, whitespace normalized ("4096 16384 65536"); "?" where unreadable."""
    def read() -> dict[str, str]:
        values = {}
        for name in names:
            try:
                with open(_sysctl_path(name), encoding="ascii") as handle:
                    values[name] = " ".join(handle.read().split())
            except OSError:
                values[name] = "?"
        return values

    return call_in_netns(netns, read)


def _sysctl_path(name: str) -> str:
    return "/proc/sys/" + name.replace(".", "/")


def list_netns() -> list[str]:
    """Names of all named network namespaces (reads /run/netns: works without root)."""
    try:
        return sorted(os.listdir(NETNS_DIR))
    except FileNotFoundError:
        return []


def netns_exists(netns: str) -> bool:
    return os.path.exists(os.path.join(NETNS_DIR, netns))


def netns_pids(netns: str) -> list[int]:
    proc = run(["ip", "netns", "pids", netns], check=False)
    return [int(word) for word in proc.stdout.split() if word.isdigit()]


def kill_netns_processes(netns: str, grace_s: float = 2.0) -> None:
    """SIGTERM, then SIGKILL, whatever still runs in netns (a namespace lives on while a process holds it)."""
    pids = [pid for pid in netns_pids(netns) if pid != os.getpid()]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + grace_s
        while pids and time.monotonic() < deadline:
            pids = [pid for pid in pids if _alive(pid)]
            if pids:
                time.sleep(0.05)
        if not pids:
            return


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child of ours counts as gone.
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def delete_netns(netns: str) -> None:
    if netns_exists(netns):
        kill_netns_processes(netns)
        proc = run(["ip", "netns", "delete", netns], check=False)
        if proc.returncode != 0 and netns_exists(netns):
            raise CommandError(f"could not delete namespace {netns}: {proc.stderr.strip()}")


def enter_netns(netns: str) -> None:
    """Move the calling thread into netns (setns is per thread: the process and its other threads stay where
    they are). Use it only on a thread of its own that ends there: nothing else must run on it afterwards."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(os.path.join(NETNS_DIR, netns), os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns({netns}): {os.strerror(err)}")
    finally:
        os.close(fd)


def call_in_netns(netns: str, func: Callable[[], T], timeout_s: float = 10.0) -> T:
    """Run func in a fresh thread that joined netns (setns is per thread); the process stays where it was.

    Sockets keep the namespace they were created in, so a socket made here can be used from any thread.
    """
    result: list[T] = []
    errors: list[BaseException] = []

    def body() -> None:
        try:
            enter_netns(netns)
            result.append(func())
        except BaseException as exc:  # handed to the caller's thread below
            errors.append(exc)

    # The thread ends after func: it never returns to the original namespace, so nothing else runs in it.
    thread = threading.Thread(target=body, name=f"netns-{netns}", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise CommandError(f"work inside namespace {netns} did not finish in {timeout_s:.0f} s")
    if errors:
        raise errors[0]
    return result[0]

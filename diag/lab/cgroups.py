"""CPU starvation of one lab host: a cpu cgroup with a CFS quota that whatever the lab starts there joins.

A host fault ``cpu=0.3`` gives lab host hI a cgroup ``diag-NAME-hI`` (named as its namespace, so the lab
naming rule finds it after a crash) directly under the cpu controller's mount: cgroup v1's ``cpu`` hierarchy
(``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``) or cgroup v2 (``cpu.max``). Every command started on that
host goes through ``Lab.exec_prefix``, which for such a host is ``/bin/sh -c 'echo $$ > PROCS && shift &&
exec "$@"'`` in front of ``ip netns exec``: the shell moves itself into the cgroup, then becomes the
command, whose children inherit the cgroup. The join must come first: ``ip netns exec`` remounts /sys for
the new namespace, and /sys/fs/cgroup is gone beneath it.

The quota is for the whole host (all its processes together), as on a real node. Only commands started
through the prefix are limited: diag's own in-process socket measurement (measure_link's default tool)
runs in threads of the calling process and is not.
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import re
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from diag.errors import DiagError

MOUNTINFO = "/proc/self/mountinfo"
# A short CFS period spreads the host's share finely: at cpu=0.3 the host runs 3 ms of every 10, like a
# slow or busy CPU, rather than 30 ms then a 70 ms stall (the kernel's default 100 ms period), which would
# read as a hang of the host. The kernel takes a quota of at least 1 ms, so low shares get longer periods.
CPU_PERIOD_US = 10_000
MIN_QUOTA_US = 1_000
MAX_PERIOD_US = 1_000_000
REMOVE_GRACE_S = 3.0
SHELL = "/bin/sh"
# $1 is the cgroup's cgroup.procs, the rest the command. The path is an argument, never part of the script.
JOIN_SCRIPT = 'echo $$ > "$1" && shift && exec "$@"'
JOIN_ARGV0 = "diag-cgroup-join"


@dataclass(frozen=True)
class CpuController:
    """Where cpu cgroups can be made: the mount of cgroup v1's cpu hierarchy, or of cgroup v2 with cpu."""

    version: int        # 1 or 2
    root: str           # its mount point, e.g. /sys/fs/cgroup/cpu (v1) or /sys/fs/cgroup (v2)


def quota_for(cpus: float) -> tuple[int, int]:
    """(quota_us, period_us) giving `cpus` CPUs of time: 0.3 -> (3000, 10000); 0.05 -> (1000, 20000)."""
    period = min(MAX_PERIOD_US, max(CPU_PERIOD_US, math.ceil(MIN_QUOTA_US / cpus)))
    return max(MIN_QUOTA_US, round(cpus * period)), period


def quota_files(cpus: float, version: int) -> dict[str, str]:
    """The control files (in write order) and contents that set the quota, per cgroup version."""
    quota, period = quota_for(cpus)
    if version == 1:
        # period first: a quota above the old period would be refused while the old period is in force
        return {"cpu.cfs_period_us": str(period), "cpu.cfs_quota_us": str(quota)}
    return {"cpu.max": f"{quota} {period}"}


def parse_mountinfo(text: str, controllers_of: dict[str, str] | None = None) -> CpuController | None:
    """The cpu controller's mount from /proc/self/mountinfo text; v1 first (where it is, v2 cannot have it).

    controllers_of: mount point -> its cgroup.controllers text (v2); read from the file system when None."""
    v2_mounts = []
    for line in text.splitlines():
        fields = line.split()
        if " - " not in line or len(fields) < 5:
            continue
        mount_point = fields[4]
        fs_type, _source, super_options = line.split(" - ", 1)[1].split()[:3]
        if fs_type == "cgroup" and "cpu" in super_options.split(","):
            return CpuController(version=1, root=_unescape(mount_point))
        if fs_type == "cgroup2":
            v2_mounts.append(_unescape(mount_point))
    for mount_point in v2_mounts:
        if controllers_of is not None:
            controllers = controllers_of.get(mount_point, "")
        else:
            try:
                controllers = Path(mount_point, "cgroup.controllers").read_text()
            except OSError:
                continue
        if "cpu" in controllers.split():
            return CpuController(version=2, root=mount_point)
    return None


def _unescape(path: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes (\\040)."""
    return re.sub(r"\\([0-7]{3})", lambda match: chr(int(match.group(1), 8)), path)


def find_cpu_controller() -> CpuController | None:
    try:
        with open(MOUNTINFO, encoding="utf-8") as handle:
            return parse_mountinfo(handle.read())
    except OSError:
        return None


def require_cpu_controller(hosts: list[str]) -> CpuController:
    """The controller, or a one-line DiagError saying why cpu= cannot work here."""
    controller = find_cpu_controller()
    if controller is None:
        raise DiagError(f"cpu= (on {', '.join(hosts)}) needs the cgroup cpu controller, and none is mounted here "
                        "(no cgroup v1 cpu hierarchy, no cgroup v2 with cpu in cgroup.controllers); "
                        "drop cpu= or mount one")
    if controller.version == 2:
        enabled = _read(Path(controller.root, "cgroup.subtree_control")).split()
        if "cpu" not in enabled:
            raise DiagError(f"cpu= needs the cpu controller enabled for children of {controller.root}: "
                            f"echo +cpu > {controller.root}/cgroup.subtree_control (as root), or drop cpu=")
    return controller


def cgroup_path(controller: CpuController, netns: str) -> str:
    """The host's cgroup directory: named as its namespace, directly under the controller's mount."""
    return os.path.join(controller.root, netns)


def procs_file(cgroup: str) -> str:
    return os.path.join(cgroup, "cgroup.procs")


# `ip netns exec` gives the command a fresh /sys, where no cgroup filesystem is mounted: a rank there could not
# read its own quota, as a real node's can (the node fingerprint and the observers read it). In the command's
# own mount namespace (ip netns exec's, private to it), mount the cpu hierarchy back where a real node has it;
# a failure only leaves the quota unread.
VIEW_ARGV0 = "diag-cgroup-view"
VIEW_SCRIPTS = {
    1: ('{ mount -t tmpfs -o mode=755 cgroup_root /sys/fs/cgroup && mkdir -p "/sys/fs/cgroup/$1" && '
        'mount -t cgroup -o "$1" cgroup "/sys/fs/cgroup/$1"; } 2>/dev/null; shift; exec "$@"'),
    2: '{ mount -t cgroup2 cgroup2 /sys/fs/cgroup; } 2>/dev/null; shift; exec "$@"',
}


def view_prefix(cgroup: str) -> list[str]:
    """argv run inside the namespace that shows the cpu cgroup hierarchy at /sys/fs/cgroup, then execs the rest."""
    version = version_of(cgroup)
    hierarchy = os.path.basename(os.path.dirname(cgroup))   # v1: the mount's name, e.g. "cpu" or "cpu,cpuacct"
    return [SHELL, "-c", VIEW_SCRIPTS[version], VIEW_ARGV0, hierarchy if version == 1 else "-"]


def join_prefix(cgroup: str) -> list[str]:
    """argv that moves itself into cgroup, then execs the rest of the command line."""
    return [SHELL, "-c", JOIN_SCRIPT, JOIN_ARGV0, procs_file(cgroup)]


def create(cgroup: str, cpus: float) -> None:
    """Make the cgroup (a leftover of the same name is reused) and set its quota."""
    try:
        os.mkdir(cgroup, 0o755)
    except FileExistsError:
        pass
    except OSError as exc:
        raise DiagError(f"cannot create cgroup {cgroup} for cpu= ({exc.strerror}); run as root, or drop cpu=") from None
    for name, value in quota_files(cpus, version_of(cgroup)).items():
        try:
            Path(cgroup, name).write_text(value)
        except OSError as exc:
            raise DiagError(f"cannot set {name} = {value} in {cgroup} ({exc.strerror}); drop cpu=") from None


def version_of(cgroup: str) -> int:
    return 2 if os.path.exists(os.path.join(cgroup, "cpu.max")) else 1


def read_cpus(cgroup: str) -> float | None:
    """The CPUs of time the cgroup's quota allows (None: unlimited or unreadable)."""
    try:
        if version_of(cgroup) == 2:
            quota_text, period_text = _read(Path(cgroup, "cpu.max")).split()
            if quota_text == "max":
                return None
            quota, period = int(quota_text), int(period_text)
        else:
            quota = int(_read(Path(cgroup, "cpu.cfs_quota_us")))
            period = int(_read(Path(cgroup, "cpu.cfs_period_us")))
    except (OSError, ValueError):
        return None
    return quota / period if quota > 0 and period > 0 else None


def member_pids(cgroup: str) -> list[int]:
    try:
        return [int(word) for word in _read(Path(procs_file(cgroup))).split()]
    except (OSError, ValueError):
        return []


def throttled_s(cgroup: str) -> float | None:
    """Seconds the cgroup spent throttled so far (cpu.stat), None where unreadable."""
    try:
        stats = dict(line.split() for line in _read(Path(cgroup, "cpu.stat")).splitlines() if line.strip())
    except (OSError, ValueError):
        return None
    if "throttled_usec" in stats:
        return int(stats["throttled_usec"]) / 1e6
    if "throttled_time" in stats:
        return int(stats["throttled_time"]) / 1e9
    return None


def remove(cgroup: str) -> None:
    """Kill whatever is still in the cgroup, then delete it; a no-op when it is gone."""
    deadline = time.monotonic() + REMOVE_GRACE_S
    while os.path.isdir(cgroup):
        for pid in member_pids(cgroup):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        try:
            os.rmdir(cgroup)
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            # EBUSY: a killed member has not exited yet
            if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                raise DiagError(f"could not remove cgroup {cgroup} ({exc.strerror}); remove it by hand: "
                                f"rmdir {cgroup}") from None
            time.sleep(0.05)


def lab_cgroups(controller: CpuController | None, owns: Callable[[str], bool]) -> list[str]:
    """Cgroups directly under the controller's mount whose name `owns` accepts (the lab naming rule)."""
    if controller is None:
        return []
    try:
        names = os.listdir(controller.root)
    except OSError:
        return []
    return sorted(os.path.join(controller.root, name) for name in names
                  if owns(name) and os.path.isdir(os.path.join(controller.root, name)))


def _read(path: Path) -> str:
    return path.read_text().strip()

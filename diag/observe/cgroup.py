"""The CPU a process may use under its cgroup's quota, and how often the quota held it back.

A rank capped by a CFS quota (a container's CPU limit, a Jetson-class node's small share, the lab's cpu
fault) shows per-thread CPU well below 100% while it is in fact starved: its threads wait for the next
period, not for the network. The quota and the kernel's throttling counters tell that apart. cgroup v1
(``cpu`` controller: cpu.cfs_quota_us, cpu.cfs_period_us, cpu.stat) and v2 (cpu.max, cpu.stat) alike;
never fails: None where nothing can be read.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
# Where this mount namespace shows no cgroup filesystem (``ip netns exec`` mounts a fresh /sys for the network
# namespace, and a container may hide it), root reads it through the first process's view of the machine.
FALLBACK_ROOTS = (Path("/proc/1/root/sys/fs/cgroup"),)


@dataclass(frozen=True)
class CgroupCpu:
    path: str                      # the cgroup, as /proc/PID/cgroup names it
    quota_cores: float | None      # quota / period; None: no quota
    periods: int | None            # enforcement periods that ran
    throttled_periods: int | None  # periods in which the quota ran out
    throttled_s: float | None      # time the cgroup's threads waited for the next period


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _stat(text: str | None) -> dict[str, int]:
    out = {}
    for line in (text or "").splitlines():
        key, _, value = line.partition(" ")
        if value.strip().isdigit():
            out[key] = int(value)
    return out


def cgroup_of(pid: int) -> tuple[str, str] | None:
    """(version, path) of the cgroup that holds ``pid``'s CPU accounting: v1's cpu controller, else v2's."""
    text = _read(Path(f"/proc/{pid}/cgroup"))
    if text is None:
        return None
    unified = None
    for line in text.splitlines():
        _, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(","):
            return "v1", path
        if controllers == "":
            unified = path
    return ("v2", unified) if unified is not None else None


def _root() -> Path | None:
    for root in (CGROUP_ROOT, *FALLBACK_ROOTS):
        try:
            if any(root.iterdir()):
                return root
        except OSError:
            continue
    return None


def cpu_allowance(pid: int) -> CgroupCpu | None:
    found = cgroup_of(pid)
    root = _root()
    if found is None or root is None:
        return None
    version, path = found
    relative = path.lstrip("/")
    if version == "v1":
        base = next((root / name / relative for name in ("cpu", "cpu,cpuacct", "cpuacct,cpu")
                     if (root / name).is_dir()), None)
        if base is None:
            return None
        quota, period = _read(base / "cpu.cfs_quota_us"), _read(base / "cpu.cfs_period_us")
        cores = int(quota) / int(period) if quota and period and int(quota) > 0 and int(period) > 0 else None
        stat = _stat(_read(base / "cpu.stat"))
        throttled_ns = stat.get("throttled_time")
        return CgroupCpu(path, cores, stat.get("nr_periods"), stat.get("nr_throttled"),
                         throttled_ns / 1e9 if throttled_ns is not None else None)
    base = root / relative if (root / "cgroup.controllers").exists() else root / "unified" / relative
    limit = (_read(base / "cpu.max") or "max").split()
    cores = int(limit[0]) / int(limit[1]) if len(limit) == 2 and limit[0].isdigit() and limit[1].isdigit() else None
    stat = _stat(_read(base / "cpu.stat"))
    throttled_us = stat.get("throttled_usec")
    return CgroupCpu(path, cores, stat.get("nr_periods"), stat.get("nr_throttled"),
                     throttled_us / 1e6 if throttled_us is not None else None)


__all__ = ["CgroupCpu", "cgroup_of", "cpu_allowance"]

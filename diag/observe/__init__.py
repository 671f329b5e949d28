"""Observers that sample what the kernel and the CPUs saw during a sweep, beside the records.

    obs = start_observers(pids, out_path, interval_s=0.2, netns=None, iface=None)
    ...
    obs.stop()

A background thread samples, every interval, the given processes and all their descendants (the ranks are
children of launchers): per-thread CPU (psutil), TCP_INFO of their TCP sockets (``ss -tinp``, run inside the
namespace when given), and NIC byte counters (from /proc/PID/net/dev, which shows the process' namespace).
Each sample is one JSON line with a "kind" (see docs/analyzer.md for the fields).
"""

from __future__ import annotations

from diag.observe.sampler import Observers, parse_ss, start_observers

__all__ = ["Observers", "parse_ss", "start_observers"]

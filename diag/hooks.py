"""World hooks: packet capture and observers that run beside one world size of a sweep.

They only wrap diag.capture / diag.observe; the sweep and reproduce attach them to launch.run_world.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from diag import safefs
from diag.launch import WorldContext


@dataclass
class CaptureHook:
    """tcpdump on one host's link (rank 0's by default) for the whole world size."""

    iface: str | None = None          # None: the first host's link (lab) or loopback (local)
    host_index: int = 0
    snaplen: int = 128
    bpf_filter: str = "tcp"
    captures: list[Path] = field(default_factory=list)
    _handle: Any = None

    def start(self, context: WorldContext) -> None:
        from diag.capture import start_capture

        host = context.hosts[self.host_index]
        iface = self.iface or host.iface or "lo"
        directory = context.run_dir / "captures"
        safefs.private_dir(directory)
        path = directory / f"{context.tag}.pcap"
        self._handle = start_capture(path, iface, bpf_filter=self.bpf_filter, snaplen=self.snaplen,
                                     netns=host.netns)
        self.captures.append(path)

    def stop(self, context: WorldContext) -> None:
        if self._handle is not None:
            info = self._handle.stop()
            self._handle = None
            dropped = getattr(info, "kernel_dropped", None)
            if dropped:
                print(f"diag sweep: warning: the capture dropped {dropped} packets; results derived from it "
                      "are flagged", file=sys.stderr)


@dataclass
class ObserveHook:
    """ss/TCP_INFO, per-thread CPU and NIC counters of the ranks, sampled at a fixed interval."""

    interval_s: float = 0.2
    host_index: int = 0
    _handle: Any = None

    def start(self, context: WorldContext) -> None:
        return None

    def launched(self, context: WorldContext) -> None:
        from diag.observe import start_observers

        host = context.hosts[self.host_index]
        directory = context.run_dir / "observe"
        safefs.private_dir(directory)
        # Local runs: one launcher holds every rank. Lab runs: observe all hosts' launchers; ss runs in the
        # first host's namespace (that host's sockets), CPU samples cover every rank on this machine.
        self._handle = start_observers(list(context.launcher_pids) or [], directory / f"{context.tag}.jsonl",
                                       interval_s=self.interval_s, netns=host.netns, iface=host.iface)

    def stop(self, context: WorldContext) -> None:
        if self._handle is not None:
            self._handle.stop()
            self._handle = None

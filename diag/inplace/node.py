"""A node's own work in an in-place job, done by the node's leader rank: its fingerprint, a capture of its
own NIC for the steps it takes part in (tcpdump where it may; else TCP_INFO from ``ss``, which needs no
privilege), observers of its own ranks (per-thread CPU, the machine's CPUs, NIC counters), and the analysis
of its captures, where the captures are. Nothing here fails the run: what a node cannot do is one note.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from diag import safefs
from diag.errors import DiagError
from diag.inplace.topology import Node

if TYPE_CHECKING:
    from diag.capture.live import CaptureHandle, CaptureInfo
    from diag.inplace.transfer import Left, Outgoing

CAPTURE_SNAPLEN = 128        # headers and the TCP options; payload is never needed
CAPTURE_FILTER = "tcp"
# The node's captures are batched (no --immediate-mode: less CPU at high packet rates), so libpcap reads the
# kernel's ring in blocks handed over when full or when tcpdump's read timeout (1000 ms, fixed in tcpdump)
# retires them; tcpdump stopped by SIGINT before that never writes the packets of the block still open. A
# step's capture therefore runs this long past the step before it is stopped (a short step captured nothing):
# in the background, while the next step runs under a capture of its own, and its file is then cut back to the
# step's own window (settle).
BLOCK_RETIRE_S = 1.1
OBSERVE_INTERVAL_S = 0.2


def capture_ability(fingerprint: dict[str, Any]) -> tuple[bool, str]:
    """(may capture, why not), from the node's fingerprint: tcpdump on PATH, run as root with CAP_NET_RAW
    (diag starts tcpdump as root, and tcpdump drops root itself once the interface is open)."""
    ability = fingerprint.get("capture") or {}
    if not ability.get("tcpdump"):
        return False, "tcpdump is not on PATH (install it: apt-get install tcpdump)"
    if not (ability.get("root") and ability.get("cap_net_raw")):
        return False, "no root with CAP_NET_RAW to capture (run as root)"
    return True, ""


@dataclass
class NodeWork:
    """``directory``: RUN/nodes/<name>, in the shared run directory or this node's own copy of it;
    ``capture_iface``: where tcpdump listens (the job's interface unless the command names another);
    ``wants_capture``: the plan captures at all (a node that cannot says so only then)."""

    node: Node
    directory: Path
    iface: str | None
    capture_iface: str | None = None
    snaplen: int = CAPTURE_SNAPLEN
    wants_capture: bool = True
    notes: list[str] = field(default_factory=list)
    can_capture: bool = False
    fingerprint: dict[str, Any] = field(default_factory=dict)
    analysis_seconds: float = 0.0
    _capture: Any = None
    _observers: Any = None
    _tag: str = ""
    _retiring: list[Retiring] = field(default_factory=list)

    def __post_init__(self) -> None:
        from diag.envinfo import node_fingerprint
        from diag.observe.cgroup import cpu_allowance

        safefs.private_dir(self.directory)
        for sub in ("captures", "analysis", "observe", "tcpinfo"):
            safefs.private_dir(self.directory / sub)
        self.fingerprint = node_fingerprint(self.iface)
        # A CFS quota caps what the node's ranks may use below its CPU count (a container, a small node's
        # share, the lab's cpu fault): the report holds their CPU against it.
        allowance = cpu_allowance(os.getpid())
        self.fingerprint["cpu"]["cpu_quota_cores"] = allowance.quota_cores if allowance else None
        self.capture_iface = self.capture_iface or self.iface
        self.can_capture, why = capture_ability(self.fingerprint)
        if self.can_capture and not self.capture_iface:
            self.can_capture, why = False, "no interface known for the job's traffic (pass --iface)"
        if not self.can_capture and self.wants_capture:
            self.note(f"{why}: sampled TCP_INFO with ss instead of capturing packets")

    def note(self, text: str) -> None:
        self.notes.append(f"{self.node.name}: {text}")

    def write_fingerprint(self, topology_json: dict[str, Any]) -> dict[str, Any]:
        document = {"node": self.node.to_json(), "iface": self.iface, **self.fingerprint,
                    "world_size": topology_json.get("world_size")}
        safefs.write_file(self.directory / "fingerprint.json", json.dumps(document, indent=1, default=str))
        return document

    def start_step(self, tag: str, capture: bool, observe: bool = True) -> None:
        """Capture (where asked and allowed) and observe this node's ranks (where asked) until stop_step. A
        node that may not capture observes anyway: ss's TCP_INFO stands in for its capture."""
        from diag.observe import start_observers

        self._tag = tag
        if capture and self.can_capture:
            from diag.capture import start_capture

            try:
                self._capture = start_capture(self.directory / "captures" / f"{tag}.pcap",
                                              self.capture_iface or "lo", bpf_filter=CAPTURE_FILTER,
                                              snaplen=self.snaplen, tool="tcpdump", immediate=False)
            except DiagError as exc:
                self.can_capture = False
                self.note(f"could not capture ({exc}); sampled TCP_INFO with ss instead")
        if not observe and not (capture and not self.can_capture):
            return
        try:
            self._observers = start_observers(list(self.node.pids), self.directory / "observe" / f"{tag}.jsonl",
                                              interval_s=OBSERVE_INTERVAL_S, iface=self.iface)
        except DiagError as exc:
            self.note(f"no observers ({exc})")

    def stop_step(self) -> None:
        """The step's window closes now: every rank has finished the step (its last barrier), and the next step
        sends nothing before every node has called this. Its capture goes on BLOCK_RETIRE_S in the background."""
        if self._capture is not None:
            self._retiring.append(Retiring(self._capture, self._tag, time.time_ns()))
            self._capture = None
        if self._observers is not None:
            self._observers.stop()
            self._observers = None

    def settle(self) -> None:
        """Every step's capture ended and cut to its window (``<tag>.pcap.capture.json`` written): before the
        captures are read, and when the job ends another way."""
        retiring, self._retiring = self._retiring, []
        for capture in retiring:
            try:
                info = capture.finish()
            except (DiagError, OSError) as exc:
                self.note(f"the capture of {capture.tag} could not be finished ({exc}); its pcap may hold more than "
                          "its step")
                continue
            if info.kernel_dropped:
                self.note(f"the capture of {capture.tag} dropped {info.kernel_dropped} packets; what is derived "
                          "from it is flagged")

    def analyze(self, records: list[str], keep_pcaps: bool = True) -> None:
        """Analyse every capture of this node against the run's records (analysis/<tag>.json); without
        ``keep_pcaps`` a pcap whose analysis was written is deleted (a quick run's pcaps are ~1.1 GB; the analysis
        and <tag>.pcap.capture.json stay, and a pcap whose analysis failed stays to be looked at)."""
        from dataclasses import replace

        from diag.capture.analysis import analyze

        self.settle()
        for pcap in sorted((self.directory / "captures").glob("*.pcap")):
            started = time.monotonic()
            try:
                result, _packets = analyze([str(pcap)], records=records, keep_sequence=False)
            except DiagError as exc:
                self.note(f"analysis of {pcap.name} failed: {exc}")
                continue
            document = replace(result, node=self.node.name).to_json()
            safefs.write_file(self.directory / "analysis" / f"{pcap.stem}.json", json.dumps(document, default=str))
            self.analysis_seconds += time.monotonic() - started
            if not keep_pcaps:
                pcap.unlink()

    def files(self, keep_pcaps: bool) -> tuple[list[Outgoing], list[Left]]:
        """What this node offers rank 0 where the run directory is not shared (diag.inplace.transfer): every
        result file below its directory, each opened without following a symlink and only if it is a regular
        file, measured on that descriptor (pcaps only with --keep-pcaps: else they stay on their node), and
        what it leaves out, with why. The records are the run's own: rank 0 has them."""
        from diag.inplace.transfer import list_node_files

        with safefs.private_handle(self.directory, create=False) as here:
            return list_node_files(here, keep_pcaps)


class Retiring:
    """A step's capture running on past its window (``cut_ns``) until tcpdump's last block retires: a thread
    stops it BLOCK_RETIRE_S after the window closed; ``finish`` waits for that and cuts the file to the window."""

    def __init__(self, handle: CaptureHandle, tag: str, cut_ns: int) -> None:
        self.handle, self.tag, self.cut_ns = handle, tag, cut_ns
        self._thread = threading.Thread(target=self._end, name=f"capture-{tag}", daemon=True)
        self._thread.start()

    def _end(self) -> None:
        time.sleep(max(0.0, self.cut_ns / 1e9 + BLOCK_RETIRE_S - time.time()))
        with contextlib.suppress(Exception):   # finish() ends it again and says what went wrong
            self.handle.end()

    def finish(self) -> CaptureInfo:
        self._thread.join()
        return self.handle.stop(cut_ns=self.cut_ns)


__all__ = ["NodeWork", "Retiring", "capture_ability"]

"""Live capture: tcpdump (libpcap, kernel BPF, exact drop counts), scapy's sniffer when tcpdump is missing.

``start_capture`` returns a handle whose ``stop()`` ends the capture, writes ``<path>.capture.json`` beside
the pcap (interface, snaplen, filter, start/stop wall clock, the kernel's dropped-packet count, packets,
tool, host) and returns the same as a CaptureInfo.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from diag import safefs
from diag.errors import DiagError, MissingToolError, PrivilegeError
from diag.lifeline import CHILD_CWD, child_env, python_command

READY_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 15.0
SCAPY_DROP_WARNING = ("tcpdump was not found: capturing with scapy's sniffer, which drops packets at high "
                      "rates and cannot count the drops; install tcpdump for trustworthy captures")


@dataclass(frozen=True)
class CaptureInfo:
    path: str
    iface: str
    snaplen: int
    filter: str
    start_ns: int
    stop_ns: int
    kernel_dropped: int | None   # None: the tool cannot tell (scapy)
    packets: int | None
    tool: str                    # "tcpdump" | "scapy"
    host: str
    netns: str | None = None
    warnings: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in dataclasses.asdict(self).items()}

    @property
    def flagged(self) -> bool:
        return bool(self.kernel_dropped)


class CaptureHandle(Protocol):
    path: Path

    def end(self) -> None: ...

    def stop(self, cut_ns: int | None = None) -> CaptureInfo: ...


def meta_path(path: str | os.PathLike[str]) -> Path:
    return Path(str(path) + ".capture.json")


def start_capture(path: str | os.PathLike[str], iface: str, bpf_filter: str = "tcp", snaplen: int = 128,
                  netns: str | None = None, tool: str | None = None, buffer_kib: int | None = None,
                  immediate: bool = True) -> CaptureHandle:
    """Start capturing on iface (inside netns if given). tool: None = tcpdump if installed, else scapy.

    buffer_kib: tcpdump's kernel capture buffer (-B); a larger one absorbs bursts at high packet rates.
    immediate: deliver each packet to tcpdump at once (--immediate-mode); False lets libpcap batch, which
    costs far less CPU per packet and so drops less at hundreds of thousands of packets a second.
    """
    out = safefs.make_parent(path)
    if snaplen < 0:
        raise DiagError(f"snaplen must be >= 0 (0 = whole packets), got {snaplen}")
    chosen = tool or ("tcpdump" if shutil.which("tcpdump") else "scapy")
    if chosen == "tcpdump":
        if not shutil.which("tcpdump"):
            raise MissingToolError("tcpdump", "install it (apt-get install tcpdump) or use --tool scapy")
        return TcpdumpCapture(out, iface, bpf_filter, snaplen, netns, buffer_kib, immediate)
    if chosen == "scapy":
        if netns:
            raise DiagError("the scapy fallback cannot capture inside a network namespace; install tcpdump")
        warnings.warn(SCAPY_DROP_WARNING, stacklevel=2)
        return ScapyCapture(out, iface, bpf_filter, snaplen)
    raise DiagError(f"unknown capture tool {chosen!r}: use tcpdump or scapy")


class TcpdumpCapture:
    """tcpdump in the background; ready once it says 'listening on', stopped with SIGINT for its summary."""

    def __init__(self, path: Path, iface: str, bpf_filter: str, snaplen: int, netns: str | None,
                 buffer_kib: int | None = None, immediate: bool = True) -> None:
        self.path = path
        self.iface, self.bpf_filter, self.snaplen, self.netns = iface, bpf_filter, snaplen, netns
        # tcpdump never opens the pcap itself: it writes to its stdout (-w -), a file diag created (O_EXCL,
        # O_NOFOLLOW, diag.safefs), so a symlink planted at the path is never followed. Holding no path to
        # write, it can drop root right after opening the interface (-Z), as tcpdump means to.
        command = ["tcpdump", "-i", iface, "-s", str(snaplen), "-w", "-", "-n", "-Z", _unprivileged_user()]
        if immediate:
            command.append("--immediate-mode")
        if buffer_kib:
            command += ["-B", str(int(buffer_kib))]
        if bpf_filter:
            command.append(bpf_filter)
        # diag.lifeline: tcpdump gets SIGTERM (and finishes its file) if this process dies, even by SIGKILL.
        command = [*python_command("-m", "diag.lifeline", str(os.getpid()), "--"), *command]
        if netns:
            command = ["ip", "netns", "exec", netns, *command]
        if os.geteuid() != 0:
            raise PrivilegeError("capturing packets", "run as root or give tcpdump CAP_NET_RAW")
        self._stderr_lines: list[str] = []
        self._ready = threading.Event()
        self.start_ns = time.time_ns()
        # diag keeps its own descriptor of the file to cut it to its window afterwards (stop's cut_ns)
        self._fd = safefs.create(path, replace=True, read=True)
        try:
            self._proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=self._fd,
                                          stderr=subprocess.PIPE, text=True, env=child_env(), cwd=CHILD_CWD)
        except OSError:
            os.close(self._fd)
            raise
        self._stop_ns: int | None = None
        self._reader = threading.Thread(target=self._read_stderr, name="tcpdump-stderr", daemon=True)
        self._reader.start()
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not self._ready.wait(0.05):
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self._proc.kill() if self._proc.poll() is None else None
                self._reader.join(2)
                os.close(self._fd)
                message = " ".join(line.strip() for line in self._stderr_lines[-3:]) or "no output"
                raise DiagError(f"tcpdump did not start on {iface!r}"
                                f"{' in netns ' + netns if netns else ''}: {message}")
        self.start_ns = time.time_ns()

    def _read_stderr(self) -> None:
        assert self._proc.stderr is not None
        for line in self._proc.stderr:
            self._stderr_lines.append(line)
            if "listening on" in line:
                self._ready.set()

    def end(self) -> None:
        """Stop tcpdump (SIGINT: it writes what it holds and its summary); once only."""
        if self._stop_ns is not None:
            return
        # Give in-flight packets a moment to pass the BPF before we stop.
        time.sleep(0.05)
        self._stop_ns = time.time_ns()
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGINT)
            try:
                self._proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._reader.join(5)

    def stop(self, cut_ns: int | None = None) -> CaptureInfo:
        """End the capture and describe it (``<path>.capture.json``). ``cut_ns``: the moment the window the
        capture is for closed (epoch ns); tcpdump ran on past it (its last block of packets reaches the file
        only when the block retires), and the records stamped after it are cut from the file."""
        self.end()
        assert self._stop_ns is not None
        kept, self._fd = _cut_and_close(self._fd, cut_ns), -1
        stop_ns = self._stop_ns if cut_ns is None else min(self._stop_ns, cut_ns)
        text = "".join(self._stderr_lines)
        packets = _summary_number(text, r"(\d+) packets? captured")
        dropped = _summary_number(text, r"(\d+) packets? dropped by kernel")
        notes = []
        if dropped:
            notes.append(f"the kernel dropped {dropped} packets: the capture is incomplete")
        info = CaptureInfo(str(self.path), self.iface, self.snaplen, self.bpf_filter, self.start_ns, stop_ns,
                           dropped, packets if kept is None else kept, "tcpdump", socket.gethostname(), self.netns,
                           tuple(notes))
        safefs.write_file(meta_path(self.path), json.dumps(info.to_json(), indent=1) + "\n")
        return info

    def __enter__(self) -> TcpdumpCapture:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd >= 0:
            self.stop()


def _cut_and_close(fd: int, cut_ns: int | None) -> int | None:
    """Close the capture's own descriptor of its file (-1: closed already), first cutting the records stamped
    after ``cut_ns`` (pcapfile.cut_after); the records kept, or None where nothing was cut or counted."""
    if fd < 0:
        return None
    try:
        if cut_ns is None:
            return None
        from diag.capture.pcapfile import cut_after

        return cut_after(fd, cut_ns)
    finally:
        os.close(fd)


def _unprivileged_user() -> str:
    """Who tcpdump becomes after opening the interface: its own user where the system has one (Debian, Fedora),
    else nobody."""
    import pwd

    for name in ("tcpdump", "nobody"):
        with contextlib.suppress(KeyError):
            pwd.getpwnam(name)
            return name
    return "root"   # a system with neither: tcpdump would fail to switch; it keeps root, as before


def _summary_number(text: str, pattern: str) -> int | None:
    match = re.search(pattern, text)
    return int(match.group(1)) if match else None


class ScapyCapture:
    """scapy's AsyncSniffer writing truncated packets as they come (no drop count is available)."""

    def __init__(self, path: Path, iface: str, bpf_filter: str, snaplen: int) -> None:
        from scapy.all import AsyncSniffer, PcapWriter

        self.path = path
        self.iface, self.bpf_filter, self.snaplen = iface, bpf_filter, snaplen
        fd = safefs.create(path, replace=True, read=True)
        self._fd = os.dup(fd)   # kept to cut the file to its window afterwards (stop's cut_ns)
        self._writer = PcapWriter(os.fdopen(fd, "wb"), sync=False, snaplen=snaplen or 65535)
        self._count = 0
        self._stop_ns: int | None = None
        self._lock = threading.Lock()
        self.start_ns = time.time_ns()
        self._sniffer = AsyncSniffer(iface=iface, filter=bpf_filter or None, store=False, prn=self._write)
        self._sniffer.start()
        time.sleep(0.3)  # AsyncSniffer has no ready signal; give its socket time to open
        if not getattr(self._sniffer, "running", True):
            os.close(self._fd)
            raise DiagError(f"scapy could not capture on {iface!r}; check the interface name")

    def _write(self, packet: Any) -> None:
        raw = bytes(packet)
        with self._lock:
            if not self._writer.header_present:
                self._writer.write_header(packet)
            caplen = min(len(raw), self.snaplen) if self.snaplen else len(raw)
            self._writer.write_packet(raw[:caplen], sec=float(packet.time), caplen=caplen, wirelen=len(raw))
            self._count += 1

    def end(self) -> None:
        if self._stop_ns is not None:
            return
        time.sleep(0.05)
        self._stop_ns = time.time_ns()
        # A sniffer that already died has nothing more to give.
        with contextlib.suppress(Exception):
            self._sniffer.stop()
        with self._lock:
            self._writer.close()

    def stop(self, cut_ns: int | None = None) -> CaptureInfo:
        """As TcpdumpCapture.stop."""
        self.end()
        assert self._stop_ns is not None
        kept, self._fd = _cut_and_close(self._fd, cut_ns), -1
        stop_ns = self._stop_ns if cut_ns is None else min(self._stop_ns, cut_ns)
        info = CaptureInfo(str(self.path), self.iface, self.snaplen, self.bpf_filter, self.start_ns, stop_ns,
                           None, self._count if kept is None else kept, "scapy", socket.gethostname(), None, (SCAPY_DROP_WARNING,))
        safefs.write_file(meta_path(self.path), json.dumps(info.to_json(), indent=1) + "\n")
        return info

"""The sampling thread behind diag.observe.start_observers."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import IO, Any

from diag import safefs
from diag.lifeline import CHILD_CWD, child_env

SS_TIMEOUT_S = 2.0
_PID_RE = re.compile(r"pid=(\d+)")
_RATE_RE = re.compile(r"^([\d.]+)([KMG]?)bps$")
_RATE_SCALE = {"": 1.0, "K": 1e3, "M": 1e6, "G": 1e9}


def _rate_Bps(text: str) -> float | None:
    match = _RATE_RE.match(text)
    if not match:
        return None
    return float(match.group(1)) * _RATE_SCALE[match.group(2)] / 8


def _ms_to_s(text: str) -> float | None:
    match = re.match(r"^([\d.]+)ms", text)
    return float(match.group(1)) / 1000 if match else None


def parse_ss(text: str) -> list[dict[str, Any]]:
    """`ss -tinpH` output -> one dict per socket (pids, local, remote, send_q, recv_q and TCP_INFO fields)."""
    sockets: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None
    for line in text.splitlines():
        if not line.strip():
            continue
        if not line[0].isspace():
            parts = line.split()
            if len(parts) < 5:
                current = None
                continue
            current = {"state": parts[0], "recv_q": int(parts[1]), "send_q": int(parts[2]),
                       "local": parts[3], "remote": parts[4],
                       "pids": sorted({int(p) for p in _PID_RE.findall(line)})}
            sockets.append(current)
            continue
        if current is None:
            continue
        tokens = line.split()
        for i, token in enumerate(tokens):
            key, _, value = token.partition(":")
            if key == "cwnd" and value.isdigit():
                current["cwnd"] = int(value)
            elif key == "rtt" and value:
                current["rtt_us"] = float(value.split("/")[0]) * 1000
            elif key == "retrans" and "/" in value:
                current["retrans"] = int(value.split("/")[1])
            elif key == "busy":
                current["busy_s"] = _ms_to_s(value)
            elif key == "rwnd_limited":
                current["rwnd_limited_s"] = _ms_to_s(value)
            elif key == "sndbuf_limited":
                current["sndbuf_limited_s"] = _ms_to_s(value)
            elif key in ("bytes_acked", "bytes_received", "bytes_sent", "bytes_retrans") and value.isdigit():
                current[key] = int(value)
            elif token == "delivery_rate" and i + 1 < len(tokens):
                current["delivery_rate_Bps"] = _rate_Bps(tokens[i + 1])
    return sockets


class Observers:
    """A daemon thread writing samples to out_path until stop()."""

    def __init__(self, pids: list[int], out_path: str | os.PathLike[str], interval_s: float = 0.2,
                 netns: str | None = None, iface: str | None = None) -> None:
        import psutil  # noqa: F401 - fail here, in the caller, if psutil is missing

        self.pids = list(pids)
        self.path = Path(out_path)
        safefs.make_parent(self.path)
        self.interval_s = interval_s
        self.netns = netns
        self.iface = iface
        self.samples = 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._cpu_prev: dict[int, tuple[float, float]] = {}  # tid -> (cpu seconds, wall)
        self._host_prev: list[tuple[float, float]] | None = None  # per CPU: (busy seconds, total seconds)
        self._has_ss = shutil.which("ss") is not None
        self._handle: IO[str] = os.fdopen(safefs.open_append(self.path), "a", encoding="utf-8")
        self._thread = threading.Thread(target=self._loop, name="diag-observers", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        next_at = time.monotonic()
        rounds = 0
        while not self._stop.is_set():
            self._sample()
            rounds += 1
            next_at += self.interval_s
            self._stop.wait(max(0.0, next_at - time.monotonic()))
        # One more at stop where the window's last stretch is half an interval or more, or the window is shorter
        # than one interval (each CPU sample is a difference from the one before: a window sampled once has
        # none). A stretch of a few ms would read a quota's whole burst as a busy core.
        if rounds == 1 or time.monotonic() - (next_at - self.interval_s) >= self.interval_s / 2:
            self._sample()

    def _sample(self) -> None:
        try:
            self.sample_once()
        except Exception as exc:  # a sampler must never take the sweep down; keep the reason
            if len(self.errors) < 20:
                self.errors.append(f"{type(exc).__name__}: {exc}")

    def _processes(self) -> list[Any]:
        import psutil

        found: dict[int, Any] = {}
        for pid in self.pids:
            try:
                proc = psutil.Process(pid)
                found[pid] = proc
                for child in proc.children(recursive=True):
                    found[child.pid] = child
            except psutil.Error:
                continue
        return list(found.values())

    def _write(self, sample: dict[str, Any]) -> None:
        self._handle.write(json.dumps(sample, separators=(",", ":")) + "\n")
        self.samples += 1

    def sample_once(self) -> None:
        import psutil

        t_ns = time.time_ns()
        procs = self._processes()
        alive_pids = {p.pid for p in procs}
        for proc in procs:
            try:
                threads = proc.threads()
            except psutil.Error:
                continue
            wall = time.monotonic()
            for thread in threads:
                cpu = thread.user_time + thread.system_time
                prev = self._cpu_prev.get(thread.id)
                self._cpu_prev[thread.id] = (cpu, wall)
                if prev is None or wall <= prev[1]:
                    continue
                self._write({"kind": "cpu_thread", "t_ns": t_ns, "pid": proc.pid, "tid": thread.id,
                             "name": _thread_name(proc.pid, thread.id),
                             "cpu_pct": round(100.0 * (cpu - prev[0]) / (wall - prev[1]), 2)})
        if self._has_ss and alive_pids:
            for sock in self._ss():
                owners = [pid for pid in sock["pids"] if pid in alive_pids]
                if not owners or sock["state"] != "ESTAB":
                    continue
                self._write({"kind": "tcp_info", "t_ns": t_ns, "pid": owners[0], "local": sock["local"],
                             "remote": sock["remote"], "cwnd": sock.get("cwnd"), "rtt_us": sock.get("rtt_us"),
                             "send_q": sock["send_q"], "recv_q": sock["recv_q"],
                             "delivery_rate_Bps": sock.get("delivery_rate_Bps"), "busy_s": sock.get("busy_s"),
                             "rwnd_limited_s": sock.get("rwnd_limited_s"),
                             "sndbuf_limited_s": sock.get("sndbuf_limited_s"), "retrans": sock.get("retrans"),
                             "bytes_acked": sock.get("bytes_acked"), "bytes_received": sock.get("bytes_received")})
        for allowance in self._quotas(procs):
            self._write({"kind": "cpu_quota", "t_ns": t_ns, "cgroup": allowance.path,
                         "quota_cores": round(allowance.quota_cores, 3), "periods": allowance.periods,
                         "throttled_periods": allowance.throttled_periods, "throttled_s": allowance.throttled_s})
        host = self._host_cpu()
        if host is not None:
            self._write({"kind": "cpu_host", "t_ns": t_ns, "cpus": len(host),
                         "busy_pct": round(sum(host) / len(host), 2), "per_cpu_pct": host})
        for iface, (rx, tx) in self._nic(procs).items():
            self._write({"kind": "nic", "t_ns": t_ns, "iface": iface, "tx_bytes": tx, "rx_bytes": rx})
        self._handle.flush()

    def _quotas(self, procs: list[Any]) -> list[Any]:
        """The CPU quota of every cgroup that holds an observed process, where one holds (its counters are
        cumulative: the report takes differences)."""
        from diag.observe.cgroup import cpu_allowance

        seen = {}
        for proc in procs:
            allowance = cpu_allowance(proc.pid)
            if allowance is not None and allowance.quota_cores is not None:
                seen.setdefault(allowance.path, allowance)
        return list(seen.values())

    def _host_cpu(self) -> list[float] | None:
        """Busy % of each CPU of this machine since the last sample (None on the first). Every rank of a
        one-machine run shares these CPUs: all of them busy means the CPU, not the link, may set the pace,
        even when no single thread is pinned (8 ranks on 2 cores)."""
        import psutil

        now = []
        for times in psutil.cpu_times(percpu=True):
            total = sum(times)
            idle = times.idle + getattr(times, "iowait", 0.0)
            now.append((total - idle, total))
        previous, self._host_prev = self._host_prev, now
        if previous is None or len(previous) != len(now):
            return None
        return [round(100.0 * (b1 - b0) / (t1 - t0), 1) if t1 > t0 else 0.0
                for (b0, t0), (b1, t1) in zip(previous, now, strict=True)]

    def _ss(self) -> list[dict[str, Any]]:
        command = ["ss", "-tinpH"]
        if self.netns:
            command = ["ip", "netns", "exec", self.netns, *command]
        try:
            out = subprocess.run(command, capture_output=True, text=True, timeout=SS_TIMEOUT_S, env=child_env(),
                                 cwd=CHILD_CWD).stdout
        except (subprocess.TimeoutExpired, OSError):
            return []
        return parse_ss(out)

    def _nic(self, procs: list[Any]) -> dict[str, tuple[int, int]]:
        # /proc/PID/net/dev shows the namespace of that process; fall back to our own namespace.
        sources = [f"/proc/{p.pid}/net/dev" for p in procs[:1]] + ["/proc/self/net/dev"]
        for source in sources:
            try:
                text = Path(source).read_text()
            except OSError:
                continue
            counters = {}
            for line in text.splitlines()[2:]:
                name, _, rest = line.partition(":")
                fields = rest.split()
                name = name.strip()
                if len(fields) >= 9 and (self.iface is None or name == self.iface):
                    counters[name] = (int(fields[0]), int(fields[8]))
            return counters
        return {}

    def stop(self) -> Path:
        self._stop.set()
        self._thread.join(max(5.0, 3 * self.interval_s))
        if not self._handle.closed:
            self._handle.close()
        return self.path

    def __enter__(self) -> Observers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _thread_name(pid: int, tid: int) -> str:
    try:
        return Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
    except OSError:
        return ""


def start_observers(pids: list[int], out_path: str | os.PathLike[str], interval_s: float = 0.2,
                    netns: str | None = None, iface: str | None = None) -> Observers:
    """Start sampling pids and their descendants every interval_s into out_path (JSON lines)."""
    from diag.errors import DiagError

    if interval_s <= 0:
        raise DiagError(f"observer interval must be positive, got {interval_s}")
    return Observers(pids, out_path, interval_s, netns, iface)

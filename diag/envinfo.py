"""The environment fingerprint stored in every run's ``start`` event (as flent does).

Everything that changes TCP's behaviour on a host goes in: kernel, sysctls, interface MTU/offloads/qdisc,
and the GLOO_*/NCCL_* variables. Reading never fails: a value that cannot be read is recorded as null.
"""

from __future__ import annotations

import os
import platform
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

SYSCTLS = (
    "net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem", "net.ipv4.tcp_congestion_control",
    "net.ipv4.tcp_slow_start_after_idle", "net.core.rmem_max", "net.core.wmem_max",
    "net.ipv4.tcp_mtu_probing", "net.ipv4.tcp_autocorking", "net.core.default_qdisc",
    "net.ipv4.tcp_timestamps", "net.ipv4.tcp_sack", "net.ipv4.tcp_window_scaling",
)
ENV_PREFIXES = ("GLOO_", "NCCL_", "TORCH_", "MASTER_", "OMP_", "TP_SOCKET")


def read_sysctl(name: str) -> str | None:
    path = Path("/proc/sys") / name.replace(".", "/")
    try:
        return " ".join(path.read_text().split())
    except OSError:
        return None


def _run(argv: list[str], timeout: float = 3.0) -> str | None:
    if shutil.which(argv[0]) is None:
        return None
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def interface_for(address: str | None) -> str | None:
    """The interface the kernel routes ``address`` through (``ip route get``)."""
    if not address:
        return None
    out = _run(["ip", "-o", "route", "get", address])
    if out and " dev " in out:
        return out.split(" dev ", 1)[1].split()[0]
    return None


def interface_info(name: str) -> dict[str, Any]:
    base = Path("/sys/class/net") / name
    info: dict[str, Any] = {"name": name}
    for key in ("mtu", "speed", "tx_queue_len"):
        try:
            info[key] = int((base / key).read_text().strip())
        except (OSError, ValueError):
            info[key] = None
    offloads = _run(["ethtool", "-k", name])
    if offloads:
        wanted = ("tcp-segmentation-offload", "generic-segmentation-offload", "generic-receive-offload",
                  "large-receive-offload")
        info["offloads"] = {
            key.strip(): value.split()[0]
            for key, _, value in (line.partition(":") for line in offloads.splitlines())
            if key.strip() in wanted and value.strip()
        }
    qdisc = _run(["tc", "qdisc", "show", "dev", name])
    info["qdisc"] = qdisc.strip() if qdisc else None
    return info


def fingerprint(interface: str | None = None) -> dict[str, Any]:
    """A JSON-ready description of this host as it matters for TCP collectives."""
    env: dict[str, Any] = {
        "host": socket.gethostname(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "kernel": platform.release(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "sysctl": {name: read_sysctl(name) for name in SYSCTLS},
        "variables": {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)},
    }
    try:
        import torch

        env["torch"] = torch.__version__
        env["cuda"] = torch.version.cuda if torch.cuda.is_available() else None
        env["gloo"] = bool(torch.distributed.is_gloo_available())
        env["nccl"] = torch.cuda.nccl.version() if torch.cuda.is_available() else None
    except ImportError:
        env["torch"] = None
    iface = interface or os.environ.get("GLOO_SOCKET_IFNAME") or interface_for(os.environ.get("MASTER_ADDR"))
    env["interface"] = interface_info(iface.split(",")[0]) if iface else None
    try:
        env["netns"] = os.readlink("/proc/self/ns/net")
    except OSError:
        env["netns"] = None
    return env

"""The environment fingerprint stored in every run's ``start`` event (as flent does), and each node's own
fingerprint in an in-place run (``RUN/nodes/<node>/fingerprint.json``, docs/inplace.md).

Everything that changes TCP's behaviour on a host goes in: kernel, sysctls, interface MTU/offloads/qdisc,
and the GLOO_*/NCCL_* variables. Reading never fails: a value that cannot be read is recorded as null
(and :func:`node_fingerprint` lists what it could not read).
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

from diag.lifeline import CHILD_CWD, child_env

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
        out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False, env=child_env(),
                             cwd=CHILD_CWD)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def interface_for(address: str | None) -> str | None:
    """The interface the kernel routes ``address`` through (``ip route get``; a name is resolved first). An
    address of this host's own (rank 0's node and MASTER_ADDR) is routed through lo: the interface that holds
    it is the one meant."""
    if not address:
        return None
    numeric = _numeric_address(address)
    if numeric is None:
        return None
    out = _run(["ip", "-o", "route", "get", numeric])
    if not out or " dev " not in out:
        return None
    if out.startswith("local "):
        holder = _run(["ip", "-o", "addr", "show", "to", numeric])
        fields = holder.split() if holder else []
        if len(fields) > 1:
            return fields[1].split("@")[0]   # "2: eth0    inet 10.77.0.1/24 ..."
    return out.split(" dev ", 1)[1].split()[0]


def _numeric_address(address: str) -> str | None:
    """``address`` as a numeric address: itself, or what a name resolves to (a non-loopback one first)."""
    try:
        socket.inet_pton(socket.AF_INET6 if ":" in address else socket.AF_INET, address)
        return address
    except OSError:
        pass
    try:
        infos = socket.getaddrinfo(address, None, type=socket.SOCK_STREAM)
    except OSError:
        return None
    found = [str(info[4][0]) for info in infos]
    return min(found, key=lambda a: (a.startswith("127.") or a == "::1", ":" in a)) if found else None


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


# ---- one node of an in-place job --------------------------------------------------------------------------

NODE_FINGERPRINT_SCHEMA = 1     # 1: the first layout (docs/inplace.md, "Node fingerprint")
CAP_NET_RAW = 13                # linux/capability.h: what a packet capture needs besides root
PROC_CPUINFO = "/proc/cpuinfo"
BOOT_ID = "/proc/sys/kernel/random/boot_id"
NETNS_LINK = "/proc/self/ns/net"
CPU_MODEL_KEYS = ("model name", "Model", "Hardware", "cpu model", "Processor")   # x86, ARM boards, others


class _Readings:
    """Runs readers; a reader that raises or gives None leaves null and its key in ``unread``."""

    def __init__(self) -> None:
        self.unread: list[str] = []

    def take(self, key: str, reader: Any) -> Any:
        try:
            value = reader()
        except Exception:   # a fingerprint never fails: whatever went wrong, the value is unknown
            value = None
        if value is None:
            self.unread.append(key)
        return value

    def check(self, key: str, value: Any) -> Any:
        """A value read elsewhere: null means unread."""
        return self.take(key, lambda: value)


def node_fingerprint(iface: str | None = None) -> dict[str, Any]:
    """This node as it matters for TCP collectives, for comparing nodes of one job: kernel, sysctls,
    congestion control, the job's interface (MTU, offloads, qdisc) and its NIC (driver, speed, duplex),
    CPU, torch/gloo/diag versions, the network namespace and boot id (what tells two nodes apart), and
    whether this process may capture. Never raises; ``unread`` lists every value left null.

    ``iface`` defaults as :func:`fingerprint` picks it ($GLOO_SOCKET_IFNAME, else the route to
    $MASTER_ADDR). torch is not imported here: its version comes from the package metadata, and gloo's
    availability is read only where torch is already loaded (in a rank it always is).
    """
    readings = _Readings()
    take = readings.take
    name = iface or os.environ.get("GLOO_SOCKET_IFNAME") or interface_for(os.environ.get("MASTER_ADDR"))
    name = name.split(",")[0] if name else None
    sysctls = {key: take(f"sysctl.{key}", lambda key=key: read_sysctl(key)) for key in SYSCTLS}
    available = take("congestion_control.available",
                     lambda: read_sysctl("net.ipv4.tcp_available_congestion_control"))
    interface = _node_interface(name, readings) if name else readings.check("interface", None)
    return {
        "schema": NODE_FINGERPRINT_SCHEMA,
        "hostname": take("hostname", socket.gethostname),
        "kernel": {"release": platform.release(), "version": take("kernel.version", platform.version)},
        "machine": platform.machine(),
        "sysctl": sysctls,
        "congestion_control": {"current": sysctls["net.ipv4.tcp_congestion_control"],
                               "available": available.split() if available else None},
        "interface": interface,
        "cpu": {"model": take("cpu.model", _cpu_model), "count": os.cpu_count(),
                "usable": take("cpu.usable", lambda: len(os.sched_getaffinity(0)))},
        "versions": {"python": sys.version.split()[0], "torch": take("versions.torch", _torch_version),
                     "gloo_available": take("versions.gloo_available", _gloo_available),
                     "diag": _diag_version()},
        "netns": take("netns", lambda: os.readlink(NETNS_LINK)),
        "boot_id": take("boot_id", lambda: Path(BOOT_ID).read_text().strip()),
        "capture": _capture_ability(),
        "unread": readings.unread,
    }


def _node_interface(name: str, readings: _Readings) -> dict[str, Any]:
    """interface_info's MTU, queue, offloads and qdisc, plus the NIC: ethtool first, sysfs where it fails."""
    info = interface_info(name)
    info.pop("speed", None)         # reported under "nic", with its unit
    for key in ("mtu", "tx_queue_len", "offloads", "qdisc"):
        info[key] = readings.check(f"interface.{key}", info.get(key))
    link = _ethtool_fields(["ethtool", name])
    duplex = (link.get("Duplex") or _sysfs_text(name, "duplex") or "").lower()
    info["nic"] = {
        "driver": readings.check("nic.driver", _ethtool_fields(["ethtool", "-i", name]).get("driver")
                                 or _sysfs_driver(name)),
        "speed_mbps": readings.check("nic.speed_mbps", _parse_speed_mbps(link.get("Speed"))
                                     or _sysfs_int(name, "speed")),
        # ethtool says "Unknown! (255)" and sysfs "unknown" where the link is down or the driver does not know
        "duplex": readings.check("nic.duplex", duplex if duplex in ("full", "half") else None),
    }
    return info


def _ethtool_fields(argv: list[str]) -> dict[str, str]:
    out = _run(argv) or ""
    return {key.strip(): value.strip() for key, _, value in (line.partition(":") for line in out.splitlines())
            if value.strip()}


def _parse_speed_mbps(text: str | None) -> int | None:
    """ethtool's "10000Mb/s" -> 10000; "Unknown!" -> None."""
    if not text or not text.endswith("Mb/s") or not text[:-4].isdigit():
        return None
    return int(text[:-4])


def _sysfs_text(name: str, key: str) -> str | None:
    try:
        return (Path("/sys/class/net") / name / key).read_text().strip() or None
    except OSError:     # EINVAL for a link that is down or has no speed (veth, Wi-Fi)
        return None


def _sysfs_int(name: str, key: str) -> int | None:
    text = _sysfs_text(name, key)
    # The kernel reports -1 (SPEED_UNKNOWN) where the driver does not know the speed.
    return int(text) if text and text.lstrip("-").isdigit() and int(text) > 0 else None


def _sysfs_driver(name: str) -> str | None:
    try:
        return os.path.basename(os.readlink(Path("/sys/class/net") / name / "device" / "driver"))
    except OSError:     # virtual interfaces have no device
        return None


def _cpu_model() -> str | None:
    with open(PROC_CPUINFO, encoding="utf-8", errors="replace") as cpuinfo:
        fields = [line.partition(":") for line in cpuinfo]
    for wanted in CPU_MODEL_KEYS:
        for key, _, value in fields:
            if key.strip() == wanted and value.strip():
                return value.strip()
    return platform.processor() or None


def _torch_version() -> str | None:
    from importlib import metadata

    return metadata.version("torch")


def _gloo_available() -> bool | None:
    torch = sys.modules.get("torch")
    return bool(torch.distributed.is_gloo_available()) if torch is not None else None


def _diag_version() -> str:
    import diag

    return diag.__version__


def _capture_ability() -> dict[str, Any]:
    """Whether this process may capture packets: tcpdump on PATH, and CAP_NET_RAW, in this process's
    effective set (root has it, unless a container or setpriv took it away) or given to tcpdump itself
    as a file capability (setcap cap_net_raw+ep)."""
    cap_net_raw = _has_effective_capability(CAP_NET_RAW)
    tcpdump = shutil.which("tcpdump")
    file_cap = _file_grants_capability(tcpdump, CAP_NET_RAW) if tcpdump else False
    return {"may_capture": bool(tcpdump) and (bool(cap_net_raw) or file_cap), "root": os.geteuid() == 0,
            "cap_net_raw": cap_net_raw, "tcpdump": tcpdump, "tcpdump_cap_net_raw": file_cap}


def _file_grants_capability(path: str, bit: int) -> bool:
    """The file's permitted capabilities (security.capability: struct vfs_cap_data, a u32 magic, then
    the permitted set's low 32 bits) include ``bit``."""
    try:
        raw = os.getxattr(path, "security.capability")
    except (OSError, AttributeError):
        return False
    return len(raw) >= 8 and bit < 32 and bool(int.from_bytes(raw[4:8], "little") >> bit & 1)


def _has_effective_capability(bit: int) -> bool | None:
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> bit & 1)
    except (OSError, ValueError):
        pass
    return None

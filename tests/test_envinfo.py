"""The node fingerprint (diag.envinfo.node_fingerprint): what it reads, read again here by other means; a
namespace with its own tcp_rmem shows it; capture rights follow CAP_NET_RAW; nothing readable is no error."""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
from lab_helpers import lab_names, requires_root, unique_lab_name

import diag
from diag import envinfo
from diag.envinfo import SYSCTLS, node_fingerprint
from diag.lab import LabConfig, bring_up
from diag.lifeline import CHILD_CWD, child_env, python_command

__all__ = ["lab_names"]  # the fixture, re-exported so pytest finds it

CHANGED_RMEM = "4096 65536 1048576"
_PRINT_FINGERPRINT = "import json, sys; from diag.envinfo import node_fingerprint; " \
                     "print(json.dumps(node_fingerprint(sys.argv[1] if len(sys.argv) > 1 else None)))"


def fingerprint_in(prefix: list[str], *args: str) -> dict[str, Any]:
    """node_fingerprint() of a fresh process started behind ``prefix`` (ip netns exec, setpriv)."""
    proc = subprocess.run([*prefix, *python_command("-c", _PRINT_FINGERPRINT, *args)], capture_output=True,
                          text=True, timeout=60, cwd=CHILD_CWD, env=child_env(), check=False)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_node_fingerprint_reads_this_machine_as_other_tools_do() -> None:
    found = node_fingerprint("lo")
    assert json.loads(json.dumps(found)) == found
    assert found["kernel"]["release"] == os.uname().release
    for key in SYSCTLS:
        path = Path("/proc/sys") / key.replace(".", "/")
        expected = " ".join(path.read_text().split()) if path.exists() else None
        assert found["sysctl"][key] == expected, key
    cc = Path("/proc/sys/net/ipv4/tcp_available_congestion_control").read_text().split()
    assert found["congestion_control"] == {"current": found["sysctl"]["net.ipv4.tcp_congestion_control"],
                                           "available": cc}
    assert found["interface"]["name"] == "lo"
    assert found["interface"]["mtu"] == int(Path("/sys/class/net/lo/mtu").read_text())
    assert found["netns"] == os.readlink("/proc/self/ns/net")
    assert found["boot_id"] == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert found["cpu"]["count"] == os.cpu_count() and found["cpu"]["usable"] == len(os.sched_getaffinity(0))
    assert found["cpu"]["model"]
    assert found["versions"]["diag"] == diag.__version__
    try:
        assert found["versions"]["torch"] == metadata.version("torch")
    except metadata.PackageNotFoundError:
        assert found["versions"]["torch"] is None and "versions.torch" in found["unread"]
    assert found["capture"]["root"] == (os.geteuid() == 0)
    assert found["capture"]["tcpdump"] == shutil.which("tcpdump")
    # loopback has no NIC: what it lacks is null and said, not guessed
    assert found["interface"]["nic"]["driver"] is None and "nic.driver" in found["unread"]


def test_nothing_readable_is_nulls_and_a_list_not_an_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No tools on PATH, an interface that does not exist, no /proc/cpuinfo or boot id: every value it
    could not read is null and named in ``unread``; capture is impossible without tcpdump."""
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(envinfo, "PROC_CPUINFO", str(tmp_path / "no-cpuinfo"))
    monkeypatch.setattr(envinfo, "BOOT_ID", str(tmp_path / "no-boot-id"))
    monkeypatch.setattr(envinfo.platform, "processor", lambda: "")
    found = node_fingerprint("nosuch0")
    assert found["cpu"]["model"] is None and found["boot_id"] is None
    assert found["interface"]["mtu"] is None and found["interface"]["offloads"] is None
    assert found["interface"]["nic"] == {"driver": None, "speed_mbps": None, "duplex": None}
    assert found["capture"]["may_capture"] is False and found["capture"]["tcpdump"] is None
    assert {"cpu.model", "boot_id", "interface.mtu", "interface.offloads", "interface.qdisc", "nic.driver",
            "nic.speed_mbps", "nic.duplex"} <= set(found["unread"])
    assert found["kernel"]["release"] == platform.release()   # what can be read still is


def test_no_interface_at_all_is_said() -> None:
    env = {key: value for key, value in os.environ.items() if key not in ("GLOO_SOCKET_IFNAME", "MASTER_ADDR")}
    proc = subprocess.run(python_command("-c", _PRINT_FINGERPRINT), capture_output=True, text=True, timeout=60,
                          cwd=CHILD_CWD, env=child_env(env), check=False)
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout)
    assert found["interface"] is None and "interface" in found["unread"]


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None or shutil.which("tcpdump") is None,
                    reason="needs root, setpriv and tcpdump: drops CAP_NET_RAW from a root process")
def test_root_without_cap_net_raw_may_not_capture() -> None:
    found = fingerprint_in(["setpriv", "--bounding-set", "-net_raw"])
    assert found["capture"]["root"] is True
    assert found["capture"]["cap_net_raw"] is False
    assert found["capture"]["may_capture"] is found["capture"]["tcpdump_cap_net_raw"]
    assert fingerprint_in([])["capture"]["may_capture"] is True


@requires_root
def test_a_namespace_with_its_own_tcp_rmem_shows_it(lab_names: list[str]) -> None:
    """Two lab hosts; h1's net.ipv4.tcp_rmem is changed inside its namespace. Each host's fingerprint,
    taken inside it, shows its own value, its own namespace and the machine's one boot id, and the lab's
    NIC (a veth with offloads off, MTU 1500)."""
    name = unique_lab_name("e")
    lab_names.append(name)
    lab = bring_up(LabConfig(name=name, hosts=2, rate="100mbit"))
    subprocess.run([*lab.exec_prefix(lab.hosts[1]), "sysctl", "-qw", f"net.ipv4.tcp_rmem={CHANGED_RMEM}"],
                   check=True, timeout=20)
    h0, h1 = (fingerprint_in(lab.exec_prefix(host), host.iface) for host in lab.hosts)
    assert h1["sysctl"]["net.ipv4.tcp_rmem"] == CHANGED_RMEM
    assert h0["sysctl"]["net.ipv4.tcp_rmem"] != CHANGED_RMEM
    assert h0["netns"] != h1["netns"] and h0["boot_id"] == h1["boot_id"] and h0["hostname"] == h1["hostname"]
    for found in (h0, h1):
        assert found["interface"]["name"] == "eth0" and found["interface"]["mtu"] == 1500
        assert found["interface"]["offloads"]["tcp-segmentation-offload"] == "off"
        assert found["interface"]["qdisc"].startswith("qdisc tbf 1: root")
        # a veth is what ethtool reports for it: 10000Mb/s full duplex (the lab's rate is the tbf's, above)
        assert found["interface"]["nic"] == {"driver": "veth", "speed_mbps": 10000, "duplex": "full"}

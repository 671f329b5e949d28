"""The lab for real: namespaces, veths, tbf, teardown after SIGKILL, measured rates. Runs as root."""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time

import pytest
from lab_helpers import REPO, lab_names, lab_netns, requires_root, root_links, unique_lab_name

from diag.errors import DiagError
from diag.lab import (
    LabConfig,
    bring_up,
    cgroups,
    lab_session,
    load_lab,
    measure_flows,
    measure_link,
    tear_down,
    topology,
)
from diag.lab import state as lab_state
from diag.lab.netns import call_in_netns, link_mtu
from diag.lab.shaping import read_qdiscs
from tests.common import run_diag

__all__ = ["lab_names"]  # the fixture, re-exported so pytest finds it

pytestmark = requires_root

# A rate the 2-core machine carries with room to spare while other test suites load it, so the link and
# not the CPU is the bottleneck (at 200mbit, both directions at once dipped to 80% under a load of 6).
MEASURE_RATE = "100mbit"


def _tcp_echo_ok(lab, a: int, b: int) -> bool:
    """A real TCP round trip from host a to host b through the bridge."""
    server = call_in_netns(lab.hosts[b].netns, lambda: socket.create_server((lab.hosts[b].address, 0)))
    client = call_in_netns(lab.hosts[a].netns, lambda: socket.socket())
    try:
        server.settimeout(5)
        client.settimeout(5)
        client.connect(server.getsockname())
        conn, peer = server.accept()
        with conn:
            client.sendall(b"ping")
            got = conn.recv(4)
            conn.sendall(got)
            return client.recv(4) == b"ping" and peer[0] == lab.hosts[a].address
    finally:
        client.close()
        server.close()


def _assert_gone(name: str, links_before: set[str]) -> None:
    assert lab_netns(name) == []
    assert root_links() == links_before, "the lab changed links of the caller's namespace"
    assert lab_state.state_path(name) is None


def test_up_shapes_both_directions_and_down_leaves_nothing(lab_names: list[str]) -> None:
    name = unique_lab_name()
    lab_names.append(name)
    links_before = root_links()
    lab = bring_up(LabConfig(name=name, hosts=3, rate="300mbit", queue_limit_bytes=50_000))
    assert sorted(lab_netns(name)) == sorted([lab.switch_netns, *(h.netns for h in lab.hosts)])
    assert root_links() == links_before, "nothing of the lab may live in the caller's namespace"
    for host in lab.hosts:
        tx = read_qdiscs(host.netns, host.iface)
        rx = read_qdiscs(lab.switch_netns, host.switch_port)
        for side in (tx, rx):
            assert side[0].kind == "tbf" and side[0].rate_bps == pytest.approx(300e6)
            assert side[0].overhead_bytes == 24
        assert len(tx) == 1 and len(rx) == 1
    offloads = subprocess.run([*lab.exec_prefix(lab.hosts[1]), "ethtool", "-k", "eth0"], capture_output=True,
                              text=True, check=True).stdout
    assert "tcp-segmentation-offload: off" in offloads and "generic-segmentation-offload: off" in offloads
    assert _tcp_echo_ok(lab, 0, 2) and _tcp_echo_ok(lab, 2, 1)
    assert load_lab(name) == lab

    tear_down(name)
    _assert_gone(name, links_before)
    with pytest.raises(DiagError, match=f"no lab named {name} is up"):
        load_lab(name)


def test_up_and_down_are_idempotent(lab_names: list[str]) -> None:
    name = unique_lab_name()
    lab_names.append(name)
    first = bring_up(LabConfig(name=name, hosts=2, rate="1gbit"))
    again = bring_up(LabConfig(name=name, hosts=2, rate=1e9))
    assert again == first
    with pytest.raises(DiagError, match="already up with other settings"):
        bring_up(LabConfig(name=name, hosts=3, rate="1gbit"))
    tear_down(name)
    tear_down(name)
    assert lab_netns(name) == []


def test_sigkilled_up_is_cleaned_by_down_cli(lab_names: list[str]) -> None:
    name = unique_lab_name()
    lab_names.append(name)
    links_before = root_links()
    script = (
        "import os, sys, time, subprocess\n"
        "from diag.lab import LabConfig, bring_up\n"
        f"lab = bring_up(LabConfig(name={name!r}, hosts=2, rate='100mbit'))\n"
        # A process left running inside a host namespace keeps that namespace alive unless down kills it.
        "subprocess.Popen(lab.exec_prefix(lab.hosts[1]) + ['sleep', '120'])\n"
        "print('up', flush=True)\n"
        "time.sleep(120)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "up"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    assert len(lab_netns(name)) == 3
    result = run_diag("lab", "down", "--name", name)
    assert result.returncode == 0, result.stderr
    assert "removed 3 namespaces" in result.stdout
    _assert_gone(name, links_before)


def test_down_finds_namespaces_without_a_state_file(lab_names: list[str]) -> None:
    name = unique_lab_name()
    lab_names.append(name)
    bring_up(LabConfig(name=name, hosts=2, rate="100mbit"))
    lab_state.remove_state(name)           # as if the state directory had been wiped
    assert len(lab_netns(name)) == 3
    result = run_diag("lab", "down", "--name", name)
    assert result.returncode == 0, result.stderr
    assert lab_netns(name) == []


def test_interrupted_up_rolls_back(lab_names: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    name = unique_lab_name()
    lab_names.append(name)
    links_before = root_links()

    def interrupt(_lab: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(topology, "_verify_shaping", interrupt)   # Ctrl-C after every namespace exists
    with pytest.raises(KeyboardInterrupt):
        bring_up(LabConfig(name=name, hosts=2, rate="100mbit"))
    _assert_gone(name, links_before)


def test_lab_session_tears_down_on_error(lab_names: list[str]) -> None:
    name = unique_lab_name()
    lab_names.append(name)
    with pytest.raises(RuntimeError, match="boom"), lab_session(LabConfig(name=name, hosts=2, rate="100mbit")) as lab:
        assert len(lab_netns(name)) == 3 and lab.rate_bps == 100e6
        raise RuntimeError("boom")
    assert lab_netns(name) == []


def test_lab_session_tears_down_on_sigterm(lab_names: list[str]) -> None:
    name = unique_lab_name()
    lab_names.append(name)
    script = (
        "import time\n"
        "from diag.lab import LabConfig, lab_session\n"
        f"with lab_session(LabConfig(name={name!r}, hosts=2, rate='100mbit')):\n"
        "    print('up', flush=True)\n"
        "    time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=REPO)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "up"
        assert len(lab_netns(name)) == 3
        proc.send_signal(signal.SIGTERM)
        proc.wait(20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode != 0
    assert lab_netns(name) == [] and lab_state.state_path(name) is None


def test_two_labs_coexist_with_the_same_addresses(lab_names: list[str]) -> None:
    first, second = unique_lab_name("a"), unique_lab_name("b")
    lab_names += [first, second]
    lab_a = bring_up(LabConfig(name=first, hosts=2, rate="100mbit"))
    lab_b = bring_up(LabConfig(name=second, hosts=3, rate="300mbit"))
    assert lab_a.hosts[0].address == lab_b.hosts[0].address
    assert _tcp_echo_ok(lab_a, 0, 1) and _tcp_echo_ok(lab_b, 0, 1)
    assert read_qdiscs(lab_a.hosts[0].netns, "eth0")[0].rate_bps == pytest.approx(100e6)
    assert read_qdiscs(lab_b.hosts[0].netns, "eth0")[0].rate_bps == pytest.approx(300e6)
    tear_down(first)
    assert lab_netns(first) == [] and len(lab_netns(second)) == 4
    assert _tcp_echo_ok(lab_b, 2, 0)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--rate", "fast"], "bad rate 'fast'"),
        (["--hosts", "0"], "--hosts must be between 2"),
        (["--hosts", "300"], "--hosts must be between 2"),
        (["--fault", "h1:colour=red"], "unknown key 'colour'"),
        (["--fault", "h5:mtu=9000"], "the lab has hosts h0..h1"),
        (["--fault", "h1:tcp_rmem=4096,16384,65536"], "not commas"),
        (["--fault", "h1:cc=nosuchcc"], "is not available in this kernel"),
        (["--scenario", "no-such-scenario"], "built-in scenario: jumbo-host"),
    ],
)
def test_bad_arguments_give_one_clear_line(args: list[str], needle: str) -> None:
    name = unique_lab_name()
    result = run_diag("lab", "up", "--name", name, *args)
    assert result.returncode != 0
    assert result.stderr.count("\n") == 1 and needle in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert lab_netns(name) == []


def test_delay_without_netem_says_so_and_builds_nothing(lab_names: list[str]) -> None:
    name = unique_lab_name()
    lab_names.append(name)
    result = run_diag("lab", "up", "--name", name, "--rate", "100mbit", "--delay", "100us", "--loss", "0.1%")
    if result.returncode == 0:   # a kernel with netem: the delay must then really be there
        lab = load_lab(name)
        kinds = [q.kind for q in read_qdiscs(lab.hosts[0].netns, "eth0")]
        assert kinds == ["tbf", "netem"], kinds
        return
    assert result.stderr.count("\n") == 1, result.stderr
    assert "netem" in result.stderr and "--queue-limit" in result.stderr
    assert lab_netns(name) == [] and lab_state.state_path(name) is None


def test_without_net_admin_one_line_says_what_works_instead(tmp_path) -> None:
    capsh = "/usr/sbin/capsh" if os.path.exists("/usr/sbin/capsh") else None
    setpriv = "/usr/bin/setpriv" if os.path.exists("/usr/bin/setpriv") else None
    if setpriv is None and capsh is None:
        pytest.skip("neither setpriv nor capsh is installed to drop CAP_NET_ADMIN")
    command = [sys.executable, "-m", "diag", "lab", "up", "--name", unique_lab_name()]
    if setpriv:
        command = [setpriv, "--bounding-set=-net_admin,-sys_admin", *command]
    else:
        command = [capsh, "--drop=cap_net_admin,cap_sys_admin", "--", "-c", " ".join(command)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=REPO)
    assert result.returncode == 4
    assert result.stderr.count("\n") == 1
    assert "needs root (CAP_NET_ADMIN)" in result.stderr and "diag sweep --nproc" in result.stderr


def test_cli_up_status_exec_down(lab_names: list[str]) -> None:
    name = unique_lab_name()
    lab_names.append(name)
    up = run_diag("lab", "up", "--name", name, "--hosts", "2", "--rate", "150mbit", "--queue-limit", "40K", "--json")
    assert up.returncode == 0, up.stderr
    assert json.loads(up.stdout)["queue_limit_bytes"] == 40 * 1024

    status = run_diag("lab", "status", "--name", name, "--json")
    assert status.returncode == 0, status.stderr
    links = json.loads(status.stdout)["links"]
    assert [link["host"] for link in links] == ["h0", "h1"]
    assert all(link[side][0]["rate_bps"] == pytest.approx(150e6) for link in links for side in ("tx", "rx"))

    text = run_diag("lab", "status", "--name", name)
    assert "tbf 150mbit (18.8 MB/s)" in text.stdout and "10.77.0.2/24" in text.stdout

    inside = run_diag("lab", "exec", "--name", name, "h1", "--", "ip", "-o", "-4", "addr", "show", "dev", "eth0")
    assert inside.returncode == 0, inside.stderr
    assert "10.77.0.2/24" in inside.stdout

    bad_host = run_diag("lab", "exec", "--name", name, "h7", "--", "true")
    assert bad_host.returncode != 0 and "has no host 'h7'" in bad_host.stderr

    down = run_diag("lab", "down", "--name", name)
    assert down.returncode == 0 and lab_netns(name) == []
    missing = run_diag("lab", "status", "--name", name)
    assert missing.returncode != 0 and f"no lab named {name} is up" in missing.stderr


@pytest.mark.slow
def test_single_stream_and_both_directions_reach_the_rate(lab_names: list[str]) -> None:
    """The requirement: 85-100% of the requested rate one way, and each way at once (full duplex).

    Other suites load the 2 shared cores meanwhile, and stalls of the shaper's timers or of the receiver's
    softirqs blur a 2 s window (seen: 65%..111% at a load average of 7), so the link passes if one of three
    runs has all three rates inside the band; the band's top (100%) also proves the shaper is in the path.
    """
    name = unique_lab_name()
    lab_names.append(name)
    lab = bring_up(LabConfig(name=name, hosts=2, rate=MEASURE_RATE))
    requested_Bps = lab.rate_bps / 8
    attempts = []
    for _ in range(3):
        started = time.monotonic()
        measured = measure_link(lab, 0, 1, seconds=2.0)
        assert time.monotonic() - started < 15
        assert measured.tool == "diag-socket"
        shares = [measured.single_stream_Bps / requested_Bps, *(rate / requested_Bps for rate in measured.bidir_Bps)]
        attempts.append(shares)
        if all(0.85 <= share <= 1.0 for share in shares):
            return
    pytest.fail(f"[single, a->b, b->a] shares of {MEASURE_RATE} per attempt: {attempts}")


@pytest.mark.slow
def test_status_measure_with_iperf3(lab_names: list[str]) -> None:
    if subprocess.run(["which", "iperf3"], capture_output=True).returncode != 0:
        pytest.skip("iperf3 is not installed")
    name = unique_lab_name()
    lab_names.append(name)
    bring_up(LabConfig(name=name, hosts=2, rate=MEASURE_RATE))
    result = run_diag("lab", "status", "--name", name, "--measure", "--tool", "iperf3", "--seconds", "1", "--json")
    assert result.returncode == 0, result.stderr
    (measured,) = json.loads(result.stdout)["measurements"]
    assert measured["tool"] == "iperf3"
    # iperf3 is one busy process here; it must see a shaped link (well below loopback speed, above half rate)
    assert 0.5 * 100e6 / 8 < measured["single_stream_Bps"] <= 100e6 / 8


@pytest.mark.slow
def test_status_ring_pattern_one_iperf3_flow_per_edge(lab_names: list[str]) -> None:
    if subprocess.run(["which", "iperf3"], capture_output=True).returncode != 0:
        pytest.skip("iperf3 is not installed")
    name = unique_lab_name()
    lab_names.append(name)
    bring_up(LabConfig(name=name, hosts=3, rate=MEASURE_RATE))
    started = time.monotonic()
    result = run_diag("lab", "status", "--name", name, "--ring", "3,2", "--seconds", "1", "--json")
    assert result.returncode == 0, result.stderr
    assert time.monotonic() - started < 30
    ring3, ring2 = json.loads(result.stdout)["ring_pattern"]
    assert [(f["sender"], f["receiver"]) for f in ring3["flows"]] == [("h0", "h1"), ("h1", "h2"), ("h2", "h0")]
    assert [(f["sender"], f["receiver"]) for f in ring2["flows"]] == [("h0", "h1"), ("h1", "h0")]
    shaped_Bps = 100e6 / 8
    for pattern in (ring3, ring2):
        assert pattern["tool"] == "iperf3" and pattern["seconds"] == 1
        rates = [f["goodput_Bps"] for f in pattern["flows"]]
        # every edge went through its shaped link at once: above nothing, never above what tbf lets through
        assert all(0 < rate <= shaped_Bps for rate in rates), rates
        assert pattern["min_edge_Bps"] == min(rates)
        assert pattern["mean_edge_Bps"] == pytest.approx(sum(rates) / len(rates))
    # a host count beyond the lab is a one-line error, not a traceback
    bad = run_diag("lab", "status", "--name", name, "--ring", "4")
    assert bad.returncode != 0
    assert "2..3" in bad.stderr and "Traceback" not in bad.stderr
    # the probe's flows run whole seconds (iperf3 -t takes no fractions): a fraction is one line too
    bad = run_diag("lab", "status", "--name", name, "--ring", "2", "--seconds", "1.5")
    assert bad.returncode != 0 and "whole seconds" in bad.stderr and "Traceback" not in bad.stderr


# --- per-host faults ------------------------------------------------------------------------------------------

def _cgroup_of(pid: int) -> str:
    """The pid's cgroup in the cpu hierarchy (cgroup v1 "N:cpu:/path" or v2 "0::/path")."""
    with open(f"/proc/{pid}/cgroup", encoding="ascii") as listing:
        fields = [line.rstrip("\n").split(":", 2) for line in listing]
    v1 = [path for _, controllers, path in fields if "cpu" in controllers.split(",")]
    return v1[0] if v1 else next(path for hierarchy, _, path in fields if hierarchy == "0")


def _sysctl(lab, host: str, name: str) -> str:
    """A sysctl as a program on that host reads it (ip netns exec ... sysctl -n)."""
    out = subprocess.run([*lab.exec_prefix(host), "sysctl", "-n", name], capture_output=True, text=True, check=True)
    return " ".join(out.stdout.split())


def _default_cc(lab, host: str) -> str:
    """The congestion control a new TCP socket on the host gets."""
    sock = call_in_netns(lab.host(host).netns, lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM))
    with sock:
        return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16).rstrip(b"\0").decode()


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")     # utime + stime


def test_each_fault_takes_where_it_lives(lab_names: list[str]) -> None:
    name = unique_lab_name()
    lab_names.append(name)
    links_before = root_links()
    config = LabConfig(name=name, hosts=3, rate="100mbit").with_faults([
        "h1:rate=40mbit,rx-queue=8K,tx-queue=32K,mtu=1280",
        "h1:tcp_rmem=4096 16384 65536,tcp_wmem=4K/32K/128K,cc=reno,slow_start_after_idle=0,cpu=0.3",
        "h2:mtu=9000"])
    lab = bring_up(config)
    h0, h1, h2 = lab.hosts
    # rate and queues: both tbfs of h1's link, and h0's untouched
    tx, rx = read_qdiscs(h1.netns, h1.iface)[0], read_qdiscs(lab.switch_netns, h1.switch_port)[0]
    assert tx.rate_bps == pytest.approx(40e6) and rx.rate_bps == pytest.approx(40e6)
    assert tx.limit_bytes == pytest.approx(32 * 1024, rel=0.02) and rx.limit_bytes == pytest.approx(8192, rel=0.02)
    jumbo = read_qdiscs(h2.netns, h2.iface)[0]
    assert jumbo.burst_bytes is not None and jumbo.burst_bytes >= 8 * 9038      # eight of its own frames
    plain = read_qdiscs(lab.switch_netns, h0.switch_port)[0]
    assert plain.rate_bps == pytest.approx(100e6) and plain.limit_bytes == pytest.approx(65536, rel=0.02)
    # MTU on both ends of each host's link
    assert [link_mtu(h.netns, h.iface) for h in lab.hosts] == [1500, 1280, 9000]
    assert [link_mtu(lab.switch_netns, h.switch_port) for h in lab.hosts] == [1500, 1280, 9000]
    # sysctls in h1's namespace only, as a program there reads them; a new socket there gets reno
    assert _sysctl(lab, "h1", "net.ipv4.tcp_rmem") == "4096 16384 65536"
    assert _sysctl(lab, "h1", "net.ipv4.tcp_wmem") == "4096 32768 131072"
    assert _sysctl(lab, "h1", "net.ipv4.tcp_slow_start_after_idle") == "0"
    assert _default_cc(lab, "h1") == "reno"
    assert _sysctl(lab, "h0", "net.ipv4.tcp_rmem") != "4096 16384 65536"
    assert _sysctl(lab, "h0", "net.ipv4.tcp_slow_start_after_idle") == "1"
    assert _default_cc(lab, "h0") == _sysctl(lab, "h0", "net.ipv4.tcp_congestion_control")
    # CPU: h1's cgroup has the quota; what starts through exec_prefix is in it, in h1's namespace, and capped
    assert h1.cpu_cgroup is not None and h0.cpu_cgroup is None and h2.cpu_cgroup is None
    assert cgroups.read_cpus(h1.cpu_cgroup) == pytest.approx(0.3)
    busy = subprocess.Popen([*lab.exec_prefix(h1), "/bin/sh", "-c", "while :; do :; done"])
    try:
        started = time.monotonic()
        time.sleep(1.0)
        assert _cgroup_of(busy.pid) == "/" + os.path.basename(h1.cpu_cgroup)
        assert busy.pid in cgroups.member_pids(h1.cpu_cgroup)
        assert os.stat(f"/proc/{busy.pid}/ns/net").st_ino == os.stat(f"/run/netns/{h1.netns}").st_ino
        used, elapsed = _cpu_seconds(busy.pid), time.monotonic() - started
    finally:
        busy.kill()
        busy.wait(5)
    assert used <= 0.3 * elapsed * 1.3 + 0.05, f"a busy loop on h1 used {used:.2f} CPU s in {elapsed:.2f} s"
    assert (cgroups.throttled_s(h1.cpu_cgroup) or 0) > 0
    # the command line: diag lab exec joins the cgroup; status shows the fault and what the host has now
    inside = run_diag("lab", "exec", "--name", name, "h1", "--", "cat", "/proc/self/cgroup")
    assert inside.returncode == 0 and f"/{os.path.basename(h1.cpu_cgroup)}" in inside.stdout, inside.stderr
    outside = run_diag("lab", "exec", "--name", name, "h0", "--", "cat", "/proc/self/cgroup")
    assert outside.returncode == 0 and name not in outside.stdout
    status = run_diag("lab", "status", "--name", name, "--json")
    assert status.returncode == 0, status.stderr
    report = json.loads(status.stdout)
    assert report["lab"]["hosts"][1]["fault"]["cc"] == "reno" and report["lab"]["hosts"][0]["fault"] is None
    assert report["hosts"]["h1"]["sysctls"]["net.ipv4.tcp_congestion_control"] == "reno"
    assert report["hosts"]["h1"]["cpus"] == pytest.approx(0.3) and report["hosts"]["h2"]["mtu"] == 9000
    text = run_diag("lab", "status", "--name", name).stdout
    assert "fault: rate=40mbit,rx-queue=8192,tx-queue=32768,mtu=1280" in text and "tbf 40mbit (5 MB/s)" in text
    # up again with the same faults is the same lab; with other faults it is another
    assert bring_up(config) == lab
    with pytest.raises(DiagError, match="already up with other settings"):
        bring_up(LabConfig(name=name, hosts=3, rate="100mbit").with_faults(["h2:mtu=1400"]))

    tear_down(name)
    _assert_gone(name, links_before)
    assert not os.path.exists(h1.cpu_cgroup), "the cpu cgroup survived teardown"


def test_mismatched_mtu_tcp_negotiates_and_big_datagrams_vanish(lab_names: list[str]) -> None:
    """h1 and h2 at 9000, h0 at 1500: TCP works between all of them at the smaller MSS (each SYN announces
    its own), as on a switch; a 8000-byte datagram reaches a jumbo host and is dropped on the way to h0."""
    name = unique_lab_name()
    lab_names.append(name)
    lab = bring_up(LabConfig(name=name, hosts=3, rate="100mbit").with_faults(["h1:mtu=9000", "h2:mtu=9000"]))

    def send_mss(a: int, b: int) -> tuple[int, int]:
        server = call_in_netns(lab.hosts[b].netns, lambda: socket.create_server((lab.hosts[b].address, 0)))
        client = call_in_netns(lab.hosts[a].netns, lambda: socket.socket())
        try:
            client.settimeout(5)
            client.connect(server.getsockname())
            conn, _ = server.accept()
            with conn:
                conn.settimeout(5)
                client.sendall(bytes(100_000))
                got = 0
                while got < 100_000:
                    got += len(conn.recv(65536))
                # struct tcp_info: tcpi_snd_mss at byte 16, for each end
                return tuple(struct.unpack_from("<I", s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104), 16)[0]
                             for s in (client, conn))  # type: ignore[return-value]
        finally:
            client.close()
            server.close()

    def datagram_arrives(a: int, b: int, size: int) -> bool:
        receiver = call_in_netns(lab.hosts[b].netns, lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
        sender = call_in_netns(lab.hosts[a].netns, lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
        with receiver, sender:
            receiver.bind((lab.hosts[b].address, 0))
            receiver.settimeout(0.5)
            sender.setsockopt(socket.IPPROTO_IP, 10, 2)     # IP_MTU_DISCOVER = IP_PMTUDISC_DO: never fragment
            sender.sendto(bytes(size), receiver.getsockname())
            try:
                return len(receiver.recv(65536)) == size
            except TimeoutError:
                return False

    assert send_mss(1, 0) == (1448, 1448) and send_mss(0, 1) == (1448, 1448)
    assert send_mss(1, 2) == (8948, 8948)
    assert datagram_arrives(1, 2, 8000) and datagram_arrives(1, 0, 1400)
    assert not datagram_arrives(1, 0, 8000), "the bridge forwarded a frame larger than h0's MTU"


def test_verification_failure_of_a_fault_rolls_back_everything(lab_names: list[str],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    name = unique_lab_name()
    lab_names.append(name)
    links_before = root_links()
    monkeypatch.setattr(cgroups, "read_cpus", lambda _cgroup: None)     # as if the quota had not taken
    with pytest.raises(DiagError, match=r"the CPU quota of .* reads None, not 0\.5"):
        bring_up(LabConfig(name=name, hosts=2, rate="100mbit").with_faults(["h1:cpu=0.5"]))
    _assert_gone(name, links_before)
    assert topology._present_cgroups(name) == []


def test_sigkilled_up_with_faults_is_cleaned_by_down_cli(lab_names: list[str]) -> None:
    """Namespaces, qdiscs, the cpu cgroup (with a process still in it) and the state all go."""
    name = unique_lab_name()
    lab_names.append(name)
    links_before = root_links()
    script = (
        "import subprocess, time\n"
        "from diag.lab import LabConfig, bring_up\n"
        f"lab = bring_up(LabConfig(name={name!r}, hosts=2, rate='100mbit').with_faults("
        "['h1:cpu=0.5,rate=50mbit,cc=reno']))\n"
        "subprocess.Popen(lab.exec_prefix(lab.hosts[1]) + ['sleep', '120'])\n"
        "print(lab.hosts[1].cpu_cgroup, flush=True)\n"
        "time.sleep(120)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        assert proc.stdout is not None
        cgroup = proc.stdout.readline().strip()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    deadline = time.monotonic() + 5
    while not cgroups.member_pids(cgroup) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert cgroups.member_pids(cgroup), "the sleep started through exec_prefix is not in the cgroup"
    result = run_diag("lab", "down", "--name", name)
    assert result.returncode == 0, result.stderr
    _assert_gone(name, links_before)
    assert not os.path.exists(cgroup)


def test_down_removes_a_leftover_cgroup_alone(lab_names: list[str]) -> None:
    """A cgroup of the lab's name with nothing else left (killed between its creation and the state file)."""
    name = unique_lab_name()
    lab_names.append(name)
    controller = cgroups.require_cpu_controller(["h1"])
    leftover = cgroups.cgroup_path(controller, f"diag-{name}-h1")
    cgroups.create(leftover, 0.5)
    try:
        result = run_diag("lab", "down", "--name", name)
        assert result.returncode == 0, result.stderr
        assert not os.path.exists(leftover)
    finally:
        cgroups.remove(leftover)


@pytest.mark.slow
def test_a_slowed_host_link_carries_its_own_rate(lab_names: list[str]) -> None:
    """h2 at 40mbit in a 100mbit lab: each direction of h2's link carries ~40 Mbit/s, h1's ~100 (one stream
    per direction; two disjoint links at a time, so they share no shaper)."""
    name = unique_lab_name()
    lab_names.append(name)
    lab = bring_up(LabConfig(name=name, hosts=3, rate=MEASURE_RATE).with_faults(["h2:rate=40mbit"]))
    own_rate_Bps = {"h1": 100e6 / 8, "h2": 40e6 / 8}
    attempts = []
    for _ in range(3):   # best of three, as the link test above: other suites load the 2 cores meanwhile
        shares = {}
        for pairs in ([("h0", "h2"), ("h1", "h0")], [("h2", "h0"), ("h0", "h1")]):
            for (sender, receiver), rate in zip(pairs, measure_flows(lab, pairs, seconds=2), strict=True):
                faulty = receiver if receiver != "h0" else sender
                shares[f"{sender}->{receiver}"] = rate / own_rate_Bps[faulty]
        attempts.append(shares)
        # the top of the band proves the host's own shaper is in the path; the bottom that the link, not the
        # CPU, set the rate (the goodput bound is 94% of the rate)
        if all(0.8 <= share <= 1.0 for share in shares.values()):
            return
    pytest.fail(f"share of each link's own rate per attempt: {attempts}")


def _retransmitted_segments(lab, host: str) -> int:
    """The host namespace's TcpRetransSegs (nstat's counter), read from /proc/thread-self/net/snmp."""
    def read() -> int:
        with open("/proc/thread-self/net/snmp", encoding="ascii") as snmp:
            header, values = [line.split() for line in snmp if line.startswith("Tcp:")][:2]
        return int(values[header.index("RetransSegs")])

    return call_in_netns(lab.host(host).netns, read)


@pytest.mark.slow
def test_a_shallow_rx_queue_makes_incast_retransmit(lab_names: list[str]) -> None:
    """Two senders into h1 (a 16 KiB switch port queue) retransmit far more than the same two senders into h3
    (the lab's 64 KiB). Every host runs reno: this kernel's default in namespaces is the machine's (bbr here),
    whose pacing does not fill queues the way loss-based TCP on most clusters does (docs/lab.md)."""
    name = unique_lab_name()
    lab_names.append(name)
    lab = bring_up(LabConfig(name=name, hosts=4, rate=MEASURE_RATE).with_faults(
        ["h1:rx-queue=16K", *(f"h{i}:cc=reno" for i in range(4))]))
    attempts = []
    for _ in range(2):
        counts = {}
        for target in ("h1", "h3"):
            drops_before = read_qdiscs(lab.switch_netns, target)[0].drops or 0
            before = sum(_retransmitted_segments(lab, sender) for sender in ("h0", "h2"))
            measure_flows(lab, [("h0", target), ("h2", target)], seconds=1.0)
            counts[target] = (sum(_retransmitted_segments(lab, sender) for sender in ("h0", "h2")) - before,
                              (read_qdiscs(lab.switch_netns, target)[0].drops or 0) - drops_before)
        attempts.append(counts)
        (shallow, shallow_drops), (deep, _) = counts["h1"], counts["h3"]
        if shallow >= 50 and shallow >= 2 * deep and shallow_drops > 0:
            return
    pytest.fail(f"(retransmitted segments, tbf drops) into h1 (16K) and h3 (64K) per attempt: {attempts}")

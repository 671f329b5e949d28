"""TCP inside overlay tunnels and TSO/GSO/BIG TCP super-segments: diag counts the packets and payload tshark
does, and says which tunnel a connection came through.

Kubernetes and cloud clusters are captured on the underlay NIC, where TCP is inside VXLAN, Geneve or GRE;
a capture on a sending host sees super-segments the NIC cuts later (IPv4 total length 0 beyond 64 KiB, an
IPv6 jumbogram). Built frames of every case (encapsulation_helpers) and real tunnels between two network
namespaces (ip link add type vxlan / geneve / gre / gretap / ipip, tcpdump on the underlay veth).
"""

from __future__ import annotations

import contextlib
import subprocess
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from capture_helpers import need_tools
from encapsulation_helpers import cases, write_cases

from bench.tshark_agreement import compare
from diag.capture.analysis import analyze_files
from diag.lab import netns as ns_tools
from diag.lifeline import CHILD_CWD, python_command
from tests.lab_helpers import requires_root, unique_lab_name


def _by_client(result: dict) -> dict[str, dict]:
    return {conn["a"]: conn for conn in result["connections"]}


def test_built_tunnels_and_super_segments_agree_with_tshark(tmp_path: Path) -> None:
    need_tools("tshark")
    selected = cases()
    pcap = write_cases(tmp_path / "cases.pcap", selected)
    outcome = compare(pcap)
    assert outcome.verdict == "agrees", outcome.differences or outcome.error
    tcp_cases = [case for case in selected if case.tcp]
    assert outcome.diag is not None and len(outcome.diag) == len(tcp_cases)
    result = analyze_files([pcap], with_series=False)
    connections = result["connections"]
    assert [conn["tunnel"] for conn in connections] == [case.tunnel for case in tcp_cases]
    assert [conn["directions"]["a->b"]["payload_bytes"] for conn in connections] == [c.payload for c in tcp_cases]
    assert result["files"][0]["skipped"] == {"non_tcp": len(selected) - len(tcp_cases)}


def test_super_segments_cut_by_snaplen_keep_their_payload(tmp_path: Path) -> None:
    """snaplen 128 leaves only the headers of a 30 kB super-segment and of a 70 kB jumbogram: the frame's
    original length (IPv4) and the Jumbo Payload option (IPv6) still say their payload, as tshark reads it."""
    need_tools("tshark")
    selected = [case for case in cases() if case.payload > 10_000]
    pcap = write_cases(tmp_path / "cut.pcap", selected, snaplen=128)
    outcome = compare(pcap)
    assert outcome.verdict == "agrees", outcome.differences or outcome.error
    payloads = sorted(bytes_ for _, bytes_ in (outcome.diag or {}).values())
    assert payloads == sorted(case.payload for case in selected)


# --- real tunnels between two namespaces ------------------------------------------------------------------

UNDERLAY = ("10.232.0.1", "10.232.0.2")
INNER = ("172.31.0.1", "172.31.0.2")
# ip link arguments per tunnel kind (local/remote filled in), and the name the JSON gives it
TUNNEL_KINDS = {
    "vxlan": (["type", "vxlan", "id", "42", "dstport", "4789", "dev", "eth0"], ["vxlan"]),
    "geneve": (["type", "geneve", "id", "42"], ["geneve"]),
    "gre": (["type", "gre"], ["gre"]),
    "gretap": (["type", "gretap"], ["gre"]),
    "ipip": (["type", "ipip"], ["ip-in-ip"]),
}
SENDER = textwrap.dedent("""
    import socket, sys
    s = socket.create_connection((sys.argv[1], 5001), timeout=20)
    s.sendall(b"v" * int(sys.argv[2]))
    s.shutdown(socket.SHUT_WR)
    while s.recv(65536):
        pass
""")
RECEIVER = textwrap.dedent("""
    import socket, sys
    srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((sys.argv[1], 5001)); srv.listen(1); srv.settimeout(20); print("ready", flush=True)
    c, _ = srv.accept(); c.settimeout(20)
    got = 0
    while True:
        d = c.recv(1 << 20)
        if not d: break
        got += len(d)
    c.close(); print(got, flush=True)
""")


@contextlib.contextmanager
def tunnel_pair(kind: str) -> Iterator[tuple[str, str, str]]:
    """Two namespaces joined by a veth underlay (eth0, 10.232.0.1/.2) and a tunnel of `kind` over it
    (tun0, 172.31.0.1/.2): (namespace a, namespace b, the tunnel's name in the JSON). Always removed."""
    name = unique_lab_name("t")
    a, b = f"{name}a", f"{name}b"
    args, _ = TUNNEL_KINDS[kind]
    try:
        ns_tools.ip_batch(None, [f"netns add {a}", f"netns add {b}"])
        ns_tools.ip_batch(a, [f"link add eth0 type veth peer name eth0 netns {b}"])
        for ns, (local, remote), inner in ((a, UNDERLAY, INNER[0]), (b, UNDERLAY[::-1], INNER[1])):
            link = ["link", "add", "tun0", *args, "remote", remote]
            if kind != "geneve":
                link += ["local", local]
            ns_tools.ip_batch(ns, ["link set lo up", f"addr add {local}/24 dev eth0", "link set eth0 up"])
            try:
                ns_tools.ip_batch(ns, [" ".join(link)])
            except ns_tools.CommandError as exc:
                if "Unknown device type" in str(exc):
                    pytest.skip(f"this kernel cannot create a {kind} device ({exc}); the built frames and "
                                "tcpdump's own test captures (bench.tshark_agreement) cover it")
                raise
            ns_tools.ip_batch(ns, [f"addr add {inner}/24 dev tun0", "link set tun0 up"])
        yield a, b, kind
    finally:
        for ns in (a, b):
            ns_tools.delete_netns(ns)


@requires_root
@pytest.mark.parametrize("kind", list(TUNNEL_KINDS))
def test_real_tunnel_captured_on_the_underlay(tmp_path: Path, kind: str) -> None:
    """200 kB over one TCP connection through the tunnel, captured on the underlay veth (everything on it:
    tcpdump's default filter 'tcp' would drop UDP- and GRE-encapsulated TCP): the inner connection, its
    tunnel, and tshark's packets and payload per direction."""
    need_tools("tcpdump", "tshark")
    from diag.capture import start_capture

    nbytes = 200_000
    with tunnel_pair(kind) as (a, b, _):
        pcap = tmp_path / f"{kind}.pcap"
        handle = start_capture(pcap, "eth0", "", 256, netns=a)
        try:
            receiver = subprocess.Popen(["ip", "netns", "exec", b, *python_command("-c", RECEIVER, INNER[1])],
                                        stdout=subprocess.PIPE, text=True, cwd=CHILD_CWD)
            try:
                assert receiver.stdout is not None and receiver.stdout.readline().strip() == "ready"
                subprocess.run(["ip", "netns", "exec", a, *python_command("-c", SENDER, INNER[1], str(nbytes))],
                               check=True, timeout=30, cwd=CHILD_CWD)
                out, _ = receiver.communicate(timeout=30)
                assert int(out.split()[-1]) == nbytes
            finally:
                if receiver.poll() is None:
                    receiver.kill()
                    receiver.wait()
        finally:
            handle.stop()
    outcome = compare(pcap)
    assert outcome.verdict == "agrees", outcome.differences or outcome.error
    result = analyze_files([pcap], with_series=False)
    conn = _by_client(result)[next(key for key in _by_client(result) if key.startswith(INNER[0]))]
    assert conn["b"] == f"{INNER[1]}:5001"
    assert conn["tunnel"] == TUNNEL_KINDS[kind][1]
    assert conn["directions"]["a->b"]["unique_payload_bytes"] == nbytes

"""A router with a tbf bottleneck between two hosts, built with diag.lab.netns primitives, and real traffic
through it: for tests that hold a reading to the same value upstream and downstream of the bottleneck.

    sender ns: eth0 10.231.0.1/30 --veth-- r0 | router ns: forwards, tbf on r0 and r1 | r1 --veth-- eth0 10.231.0.6/30: receiver ns

The hosts' links are veth pairs, far faster than the bottleneck, so a sender's segments leave in line-rate
bursts and queue at the router -- a host whose 10 GbE NIC feeds a 1 GbE uplink. Both router egresses are
shaped, so each direction has its own bottleneck: a capture on the sender's eth0 is upstream of it for the
sender's data and downstream for the receiver's, a capture on the receiver's eth0 the other way round.
Everything lives in three namespaces named from tests.lab_helpers.unique_lab_name; deleting them (always,
also on failure) removes every link, qdisc and process.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from diag.lab import netns as ns_tools
from diag.lab.shaping import offload_argv
from diag.lifeline import CHILD_CWD, child_env, python_command
from tests.lab_helpers import is_root_with_netns, unique_lab_name

TRAFFIC_TIMEOUT_S = 60.0
NET = "10.231.0"
IFACE = "eth0"


@dataclass(frozen=True)
class BottleneckPath:
    """The three namespaces and the two hosts' addresses (each host's link is its eth0)."""

    sender: str
    router: str
    receiver: str
    sender_addr: str = f"{NET}.1"
    receiver_addr: str = f"{NET}.6"

    def exec_prefix(self, netns: str) -> list[str]:
        return ["ip", "netns", "exec", netns]


@contextlib.contextmanager
def bottleneck_path(rate: str = "50mbit", queue_bytes: int = 200_000, burst_bytes: int = 16_000,
                    offloads: bool = False) -> Iterator[BottleneckPath]:
    """sender -- router -- receiver with a tbf of `rate` on both of the router's egresses (queue_bytes of
    queue: 32 ms at 50 Mbit/s). offloads=False turns TSO/GSO/GRO off on every link (wire-sized segments in the
    captures, as the lab does); True keeps the kernel's default (super-segments at the sender's capture)."""
    if not is_root_with_netns():
        pytest.skip("needs root (CAP_NET_ADMIN + CAP_SYS_ADMIN) and ip/tc/ethtool: namespaces and tc qdiscs")
    name = unique_lab_name("b")
    path = BottleneckPath(sender=f"{name}s", router=f"{name}r", receiver=f"{name}d")
    namespaces = (path.sender, path.router, path.receiver)
    try:
        ns_tools.ip_batch(None, [f"netns add {ns}" for ns in namespaces])
        ns_tools.ip_batch(path.router, [
            f"link add r0 type veth peer name {IFACE} netns {path.sender}",
            f"link add r1 type veth peer name {IFACE} netns {path.receiver}",
            f"addr add {NET}.2/30 dev r0", f"addr add {NET}.5/30 dev r1",
            "link set lo up", "link set r0 up", "link set r1 up",
        ])
        for ns, address, gateway in ((path.sender, f"{NET}.1/30", f"{NET}.2"),
                                     (path.receiver, f"{NET}.6/30", f"{NET}.5")):
            ns_tools.ip_batch(ns, ["link set lo up", f"addr add {address} dev {IFACE}", f"link set {IFACE} up",
                                   f"route add default via {gateway}"])
        ns_tools.run([*path.exec_prefix(path.router), "sysctl", "-qw", "net.ipv4.ip_forward=1"])
        if not offloads:
            for ns, dev in ((path.sender, IFACE), (path.router, "r0"), (path.router, "r1"), (path.receiver, IFACE)):
                ns_tools.run([*path.exec_prefix(ns), *offload_argv(dev)])
        ns_tools.tc_batch(path.router, [f"qdisc add dev {dev} root tbf rate {rate} burst {burst_bytes} "
                                        f"limit {queue_bytes}" for dev in ("r0", "r1")])
        yield path
    finally:
        for ns in namespaces:
            ns_tools.delete_netns(ns)


@contextlib.contextmanager
def captures(path: BottleneckPath, out_dir: Path, tag: str) -> Iterator[dict[str, Path]]:
    """tcpdump on the sender's and the receiver's eth0 at once (snaplen 128): {"sender": pcap, "receiver":
    pcap}. Stopped on exit, whatever happened."""
    from diag.capture import start_capture

    pcaps = {"sender": out_dir / f"{tag}-sender.pcap", "receiver": out_dir / f"{tag}-receiver.pcap"}
    handles = []
    try:
        for point, ns in (("sender", path.sender), ("receiver", path.receiver)):
            handles.append(start_capture(pcaps[point], IFACE, "tcp", 128, netns=ns))
        yield pcaps
    finally:
        for handle in handles:
            handle.stop()


# One TCP connection between the two hosts: "bulk" sends nbytes both ways at once, "pingpong" sends blocks
# of `block` bytes in turns (the client first), each side waiting for the peer's block before its next.
PEER = textwrap.dedent("""
    import socket, sys, threading
    mode, role, host, port, nbytes, block = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
    if role == "server":
        listener = socket.socket(); listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((host, port)); listener.listen(1); listener.settimeout(30)
        print("ready", flush=True)
        conn, _ = listener.accept()
    else:
        conn = socket.create_connection((host, port), timeout=30)
    conn.settimeout(30)
    def receive(total):
        got = 0
        while got < total:
            data = conn.recv(min(1 << 20, total - got))
            if not data: raise SystemExit("the peer closed early")
            got += len(data)
    if mode == "bulk":
        reader = threading.Thread(target=receive, args=(nbytes,)); reader.start()
        conn.sendall(b"d" * nbytes)
        reader.join()
    else:
        for k in range(nbytes // block):
            if (k % 2 == 0) == (role == "client"):
                conn.sendall(b"p" * block)
            else:
                receive(block)
    conn.close()
""")


def exchange(path: BottleneckPath, mode: str, nbytes: int, block: int = 65536, port: int = 5201) -> None:
    """One connection sender -> receiver (the sender connects): "bulk" both ways at once, or "pingpong"."""
    server = subprocess.Popen([*path.exec_prefix(path.receiver), *python_command("-c", PEER, mode, "server",
                               path.receiver_addr, str(port), str(nbytes), str(block))], stdout=subprocess.PIPE,
                              text=True, cwd=CHILD_CWD)
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "ready", "the server did not start"
        subprocess.run([*path.exec_prefix(path.sender), *python_command("-c", PEER, mode, "client",
                        path.receiver_addr, str(port), str(nbytes), str(block))], check=True,
                       timeout=TRAFFIC_TIMEOUT_S, cwd=CHILD_CWD)
        assert server.wait(TRAFFIC_TIMEOUT_S) == 0
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()


def gloo_sweep(path: BottleneckPath, records: Path, op: str = "all_gather", size: str = "4M", iters: int = 3,
               warmup: int = 1, port: int = 29531) -> None:
    """`diag sweep --backend gloo` in place on both hosts, as torchrun would start it on two machines (env://:
    RANK, WORLD_SIZE, MASTER_ADDR = the receiver, which is rank 0 and writes the records)."""
    argv = python_command("-m", "diag", "sweep", "--backend", "gloo", "--op", op, "--sizes", size, "--warmup",
                          str(warmup), "--iters", str(iters), "--iface", IFACE, "--out", str(records), "--quiet",
                          "--timeout", str(int(TRAFFIC_TIMEOUT_S)))
    procs = []
    try:
        for rank, ns in ((0, path.receiver), (1, path.sender)):
            env = child_env({**_base_env(), "RANK": str(rank), "LOCAL_RANK": "0", "GROUP_RANK": str(rank),
                             "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": path.receiver_addr,
                             "MASTER_PORT": str(port)})
            procs.append(subprocess.Popen([*path.exec_prefix(ns), *argv], env=env, cwd=CHILD_CWD,
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        outputs = [proc.communicate(timeout=TRAFFIC_TIMEOUT_S * 3)[0] for proc in procs]
        for proc, output in zip(procs, outputs, strict=True):
            assert proc.returncode == 0, f"diag sweep failed (exit {proc.returncode}):\n{output[-2000:]}"
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _base_env() -> dict[str, str]:
    # the test's own launcher variables (if any) must not leak into the ranks
    return {key: value for key, value in os.environ.items()
            if key not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK")}


def busiest(connections: list[dict]) -> dict:
    """The connection that moved the most payload (gloo's pair, not its rendezvous store)."""
    return max(connections, key=lambda c: sum(d["payload_bytes"] for d in c["directions"].values()))

"""Shared fixtures for the capture/analyze/observe tests: real traffic, namespaces, tshark as the referee."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from diag.capture import analysis
from diag.capture.document import Packets
from diag.capture.live import CaptureInfo
from tests.common import need_root

# tshark's expert-info fields we compare, keyed by the diag per-direction counter they correspond to.
TSHARK_FLAGS = {
    "retransmissions": "tcp.analysis.retransmission",
    "fast_retransmissions": "tcp.analysis.fast_retransmission",
    "dup_acks": "tcp.analysis.duplicate_ack",
    "zero_windows": "tcp.analysis.zero_window",
    "window_full": "tcp.analysis.window_full",
    "spurious_retransmissions": "tcp.analysis.spurious_retransmission",
    "out_of_order": "tcp.analysis.out_of_order",
    "lost_segments": "tcp.analysis.lost_segment",
}
TRAFFIC_TIMEOUT_S = 30.0


def need_tools(*tools: str) -> None:
    missing = [tool for tool in tools if not shutil.which(tool)]
    if missing:
        pytest.skip(f"needs {', '.join(missing)} (installed by .ci/run through apt)")


def tshark_directions(pcap: Path) -> dict[tuple[str, str], dict[str, object]]:
    """Per direction ("ip:port" -> "ip:port"): packets, payload bytes and each analysis flag's frames."""
    fields = ["frame.number", "ip.src", "ipv6.src", "tcp.srcport", "ip.dst", "ipv6.dst", "tcp.dstport", "tcp.len",
              *TSHARK_FLAGS.values()]
    command = ["tshark", "-n", "-r", str(pcap), "-Y", "tcp", "-T", "fields", "-E", "separator=|",
               "-E", "occurrence=f"]
    for name in fields:
        command += ["-e", name]
    out = subprocess.run(command, capture_output=True, text=True, check=True, timeout=300).stdout
    directions: dict[tuple[str, str], dict[str, object]] = {}
    for line in out.splitlines():
        parts = line.split("|")
        frame, src4, src6, sport, dst4, dst6, dport, length = parts[:8]
        src = f"{src4}:{sport}" if src4 else f"[{src6}]:{sport}"
        dst = f"{dst4}:{dport}" if dst4 else f"[{dst6}]:{dport}"
        entry = directions.setdefault((src, dst), {"packets": 0, "payload_bytes": 0,
                                                   **{k: [] for k in TSHARK_FLAGS}})
        entry["packets"] += 1  # type: ignore[operator]
        entry["payload_bytes"] += int(length or 0)  # type: ignore[operator]
        for key, flag in zip(TSHARK_FLAGS, parts[8:], strict=True):
            if flag:
                entry[key].append(int(frame))  # type: ignore[union-attr]
    return directions


def diag_directions(result: dict) -> dict[tuple[str, str], dict]:
    out = {}
    for conn in result["connections"]:
        out[(conn["a"], conn["b"])] = conn["directions"]["a->b"]
        out[(conn["b"], conn["a"])] = conn["directions"]["b->a"]
    return out


def packet_table(paths: Sequence[str | os.PathLike[str]]) -> Packets:
    """The captures' packets (one chunk in memory) with their TCP state, relative sequence numbers included."""
    packets = analysis.analyze(paths, keep_sequence=True)[1]
    assert packets is not None
    return packets


def flagged_frames(pcap: Path, flag: str) -> list[int]:
    """diag's frames for one per-packet flag (for exact frame-by-frame comparison with tshark)."""
    packets = packet_table([pcap])
    column = getattr(packets.state, flag)
    return sorted(packets.cols["frame"][column].tolist())


# --- traffic ---------------------------------------------------------------------------------------


def loopback_capture(pcap: Path, snaplen: int, *transfers: tuple[str, int, int]) -> CaptureInfo:
    """tcpdump on lo while bulk transfers run, one after another, to one free port: each (address, bytes,
    bytes back). Needs root and tcpdump (skips otherwise)."""
    from diag.capture import start_capture
    from tests.common import free_port

    need_root()
    need_tools("tcpdump")
    port = free_port()
    handle = start_capture(pcap, "lo", f"tcp port {port}", snaplen)
    try:
        for address, nbytes, reverse_bytes in transfers:
            bulk_transfer((address, 0), (address, port), nbytes, reverse_bytes=reverse_bytes)
    finally:
        info = handle.stop()
    return info


def bulk_transfer(client_addr: tuple[str, int], server_addr: tuple[str, int], nbytes: int,
                  server_ns: str | None = None, client_ns: str | None = None, reverse_bytes: int = 0,
                  server_rcvbuf: int | None = None, read_delay_s: float = 0.0) -> None:
    """Send nbytes client -> server (and reverse_bytes back) with plain sockets, optionally inside namespaces.

    The peers run as `python -c` child processes so each one can live in its own network namespace.
    """
    server_code = f"""
import socket, time
s = socket.socket(socket.AF_INET6 if ':' in {server_addr[0]!r} else socket.AF_INET)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
if {server_rcvbuf!r}:
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, {server_rcvbuf!r})
s.bind(({server_addr[0]!r}, {server_addr[1]})); s.listen(1); s.settimeout({TRAFFIC_TIMEOUT_S})
print('ready', flush=True)
c, _ = s.accept(); c.settimeout({TRAFFIC_TIMEOUT_S})
if {read_delay_s!r}: time.sleep(0.3)  # let the sender fill the receive buffer: zero windows
got = 0
deadline = time.monotonic() + {TRAFFIC_TIMEOUT_S}
while got < {nbytes} and time.monotonic() < deadline:
    d = c.recv(1024 if {read_delay_s!r} else 1 << 20)
    if not d: break
    got += len(d)
    if {read_delay_s!r}: time.sleep({read_delay_s!r})
if {reverse_bytes}: c.sendall(b'r' * {reverse_bytes})
c.shutdown(socket.SHUT_WR)
while c.recv(65536): pass
c.close()
"""
    client_code = f"""
import socket
c = socket.create_connection(({client_addr[0]!r}, {server_addr[1]}), timeout={TRAFFIC_TIMEOUT_S})
c.sendall(b'x' * {nbytes})
c.shutdown(socket.SHUT_WR)
got = 0
while True:
    d = c.recv(1 << 20)
    if not d: break
    got += len(d)
c.close()
"""
    del client_addr  # the client only needs the server's address; kept in the signature for readability
    server = subprocess.Popen(_in_ns(server_ns, ["python3", "-c", server_code]), stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        assert line.strip() == "ready", "test server did not start"
        subprocess.run(_in_ns(client_ns, ["python3", "-c", client_code]), check=True,
                       timeout=TRAFFIC_TIMEOUT_S * 2)
        server.wait(TRAFFIC_TIMEOUT_S)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()


def _in_ns(netns: str | None, command: list[str]) -> list[str]:
    return ["ip", "netns", "exec", netns, *command] if netns else command


@dataclass
class NetnsPair:
    """Two namespaces joined by a veth pair: a (10.x.y.1) and b (10.x.y.2)."""

    a: str
    b: str
    dev_a: str
    dev_b: str
    addr_a: str
    addr_b: str


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=20)


@contextlib.contextmanager
def netns_pair(tag: str) -> Iterator[NetnsPair]:
    need_root()
    need_tools("ip", "tc")
    pid = os.getpid()
    suffix = f"{tag}{pid % 100000}"
    pair = NetnsPair(a=f"cap5a{suffix}", b=f"cap5b{suffix}", dev_a=f"c5a{pid % 100000}{tag[:2]}",
                     dev_b=f"c5b{pid % 100000}{tag[:2]}",
                     addr_a=f"10.{50 + pid % 50}.{(pid // 50) % 250}.1",
                     addr_b=f"10.{50 + pid % 50}.{(pid // 50) % 250}.2")
    try:
        _ip("netns", "add", pair.a)
        _ip("netns", "add", pair.b)
        _ip("link", "add", pair.dev_a, "netns", pair.a, "type", "veth", "peer", "name", pair.dev_b, "netns", pair.b)
        for ns, dev, addr in ((pair.a, pair.dev_a, pair.addr_a), (pair.b, pair.dev_b, pair.addr_b)):
            _ip("-n", ns, "addr", "add", f"{addr}/30", "dev", dev)
            _ip("-n", ns, "link", "set", dev, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        yield pair
    finally:
        for ns in (pair.a, pair.b):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=20)


def tc(ns: str, *args: str) -> None:
    subprocess.run(["ip", "netns", "exec", ns, "tc", *args], check=True, capture_output=True, timeout=20)


def wait_for(predicate, timeout_s: float = 5.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def run_in_thread(target) -> threading.Thread:  # type: ignore[no-untyped-def]
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread


# --- synthetic captures built with scapy -----------------------------------------------------------


def synthetic_flow(ipv6: bool = False) -> list[tuple[float, bytes]]:
    """A handshake, data with one lost segment, four duplicate ACKs, a fast retransmission, a zero window,
    a FIN exchange: (time, IP packet bytes). Known answers are in SYNTHETIC_EXPECTED."""
    from scapy.layers.inet import IP, TCP
    from scapy.layers.inet6 import IPv6
    from scapy.packet import Raw

    a, b = ("fd00::1", "fd00::2") if ipv6 else ("10.9.0.1", "10.9.0.2")
    net = (lambda s, d: IPv6(src=s, dst=d)) if ipv6 else (lambda s, d: IP(src=s, dst=d))
    isn_a, isn_b = 4_294_960_000, 1000   # a's sequence numbers wrap during the flow
    mss = 1000
    opts_syn = [("MSS", mss), ("NOP", None), ("WScale", 7), ("SAckOK", b""), ("Timestamp", (100, 0))]
    out: list[tuple[float, bytes]] = []
    t = 1_700_000_000.0

    def add(dt: float, src: str, dst: str, sport: int, dport: int, flags: str, seq: int, ack: int, win: int,
            payload: int = 0, ts: tuple[int, int] | None = None, options: list | None = None) -> None:
        nonlocal t
        t += dt
        opts = options if options is not None else ([("NOP", None), ("NOP", None), ("Timestamp", ts)] if ts else [])
        tcp = TCP(sport=sport, dport=dport, flags=flags, seq=seq % (1 << 32), ack=ack % (1 << 32), window=win,
                  options=opts)
        pkt = net(src, dst) / tcp / (Raw(b"z" * payload) if payload else b"")
        out.append((t, bytes(pkt)))

    A = (a, b, 40000, 5000)
    B = (b, a, 5000, 40000)
    add(0, *A, "S", isn_a, 0, 64240, options=opts_syn)
    add(0.001, *B, "SA", isn_b, isn_a + 1, 65160, options=[*opts_syn[:-1], ("Timestamp", (500, 100))])
    add(0.001, *A, "A", isn_a + 1, isn_b + 1, 502, ts=(101, 500))
    seq = isn_a + 1
    for i in range(6):
        if i != 2:  # segment 2 is "lost" before the capture point
            add(0.0005, *A, "PA", seq + i * mss, isn_b + 1, 502, payload=mss, ts=(102 + i, 500))
        if i >= 2:  # receiver keeps ACKing the hole (segment 1 was already ACKed up to it): four duplicates
            add(0.0002, *B, "A", isn_b + 1, seq + 2 * mss, 509, ts=(501 + i, 102 + i))
        else:
            add(0.0002, *B, "A", isn_b + 1, seq + (i + 1) * mss, 509, ts=(501 + i, 102 + i))
    add(0.001, *A, "PA", seq + 2 * mss, isn_b + 1, 502, payload=mss, ts=(110, 505))   # fast retransmission
    add(0.0002, *B, "A", isn_b + 1, seq + 6 * mss, 0, ts=(510, 110))                  # zero window
    add(0.2, *B, "A", isn_b + 1, seq + 6 * mss, 509, ts=(520, 110))                   # window opens
    add(0.0005, *B, "PA", isn_b + 1, seq + 6 * mss, 509, payload=300, ts=(521, 110))  # reverse data
    add(0.0002, *A, "A", seq + 6 * mss, isn_b + 301, 502, ts=(111, 521))
    add(0.001, *A, "FA", seq + 6 * mss, isn_b + 301, 502, ts=(112, 521))
    add(0.0002, *B, "FA", isn_b + 301, seq + 6 * mss + 1, 509, ts=(522, 112))
    add(0.0002, *A, "A", seq + 6 * mss + 1, isn_b + 302, 502, ts=(113, 522))
    return out


SYNTHETIC_EXPECTED = {
    "a->b": {"packets": 11, "payload_bytes": 6000, "unique_payload_bytes": 6000, "retransmissions": 1,
             "fast_retransmissions": 1, "dup_acks": 0, "zero_windows": 0},
    "b->a": {"packets": 11, "payload_bytes": 300, "unique_payload_bytes": 300, "retransmissions": 0,
             "fast_retransmissions": 0, "dup_acks": 4, "zero_windows": 1},
}

LINK_HEADERS = {
    # linktype -> function(ip packet bytes, is_ipv6) -> frame bytes
    1: lambda ip, v6: b"\x02" * 6 + b"\x04" * 6 + (b"\x86\xdd" if v6 else b"\x08\x00") + ip,
    "vlan": lambda ip, v6: b"\x02" * 6 + b"\x04" * 6 + b"\x81\x00\x00\x05" + (b"\x86\xdd" if v6 else b"\x08\x00") + ip,
    113: lambda ip, v6: b"\x00\x00\x00\x01\x00\x06" + b"\x02" * 6 + b"\x00\x00" + (b"\x86\xdd" if v6 else b"\x08\x00") + ip,
    276: lambda ip, v6: (b"\x86\xdd" if v6 else b"\x08\x00") + b"\x00\x00" + b"\x00\x00\x00\x02" + b"\x00\x01"
    + b"\x00\x06" + b"\x02" * 6 + b"\x00\x00" + ip,
    101: lambda ip, v6: ip,
    0: lambda ip, v6: (30 if v6 else 2).to_bytes(4, "little") + ip,
}


def write_pcap(path: Path, frames: list[tuple[float, bytes]], linktype: int, snaplen: int = 65535,
               nanosecond: bool = False, big_endian: bool = False) -> Path:
    """A pcap written by hand (so every header field, including snaplen truncation, is under test control)."""
    import struct

    endian = ">" if big_endian else "<"
    magic = 0xA1B23C4D if nanosecond else 0xA1B2C3D4
    with path.open("wb") as f:
        f.write(struct.pack(endian + "IHHiIII", magic, 2, 4, 0, 0, snaplen, linktype))
        for ts, data in frames:
            sec = int(ts)
            frac = round((ts - sec) * (1e9 if nanosecond else 1e6))
            caplen = min(len(data), snaplen)
            f.write(struct.pack(endian + "IIII", sec, frac, caplen, len(data)))
            f.write(data[:caplen])
    return path


# --- a routed path with a shaped bottleneck in the middle ---------------------------------------------


@dataclass
class RoutedPath:
    """Three namespaces a - r - b: r forwards between two veth links and holds the bottleneck queues.

    A capture on a's link (dev_a) sees a's packets before r's queue toward b (their losses are visible:
    the original and its retransmission are both captured) and b's packets after r's queue toward a
    (their losses are holes the capture never saw).
    """

    a: str
    r: str
    b: str
    dev_a: str
    dev_ra: str
    dev_rb: str
    dev_b: str
    addr_a: str
    addr_b: str


@contextlib.contextmanager
def routed_path(tag: str, rate: str = "50mbit", limit_bytes: int = 30_000, burst: str = "8kb",
                offloads_off: bool = True) -> Iterator[RoutedPath]:
    """a - r - b with a tbf of `rate` on both of r's egress links (a small queue: it drops), torn down after.

    TSO/GSO/GRO are turned off on every link (ethtool) so the capture sees wire-sized segments.
    """
    need_root()
    need_tools("ip", "tc")
    pid = os.getpid() % 100000
    net = f"10.{100 + pid % 100}.{(pid // 100) % 250}"
    path = RoutedPath(a=f"rpa{tag}{pid}", r=f"rpr{tag}{pid}", b=f"rpb{tag}{pid}",
                      dev_a=f"ra{pid}{tag[:2]}", dev_ra=f"rra{pid}{tag[:2]}", dev_rb=f"rrb{pid}{tag[:2]}",
                      dev_b=f"rb{pid}{tag[:2]}", addr_a=f"{net}.1", addr_b=f"{net}.6")
    try:
        for ns in (path.a, path.r, path.b):
            _ip("netns", "add", ns)
            _ip("-n", ns, "link", "set", "lo", "up")
        _ip("link", "add", path.dev_a, "netns", path.a, "type", "veth", "peer", "name", path.dev_ra, "netns", path.r)
        _ip("link", "add", path.dev_b, "netns", path.b, "type", "veth", "peer", "name", path.dev_rb, "netns", path.r)
        for ns, dev, addr in ((path.a, path.dev_a, f"{net}.1/30"), (path.r, path.dev_ra, f"{net}.2/30"),
                              (path.r, path.dev_rb, f"{net}.5/30"), (path.b, path.dev_b, f"{net}.6/30")):
            _ip("-n", ns, "addr", "add", addr, "dev", dev)
            _ip("-n", ns, "link", "set", dev, "up")
        _ip("-n", path.a, "route", "add", "default", "via", f"{net}.2")
        _ip("-n", path.b, "route", "add", "default", "via", f"{net}.5")
        subprocess.run(["ip", "netns", "exec", path.r, "sysctl", "-qw", "net.ipv4.ip_forward=1"], check=True,
                       capture_output=True, timeout=20)
        if offloads_off and shutil.which("ethtool"):
            for ns, dev in ((path.a, path.dev_a), (path.r, path.dev_ra), (path.r, path.dev_rb), (path.b, path.dev_b)):
                subprocess.run(["ip", "netns", "exec", ns, "ethtool", "-K", dev, "tso", "off", "gso", "off",
                                "gro", "off"], capture_output=True, timeout=20)
        for dev in (path.dev_ra, path.dev_rb):
            tc(path.r, "qdisc", "add", "dev", dev, "root", "tbf", "rate", rate, "burst", burst,
               "limit", str(limit_bytes))
        yield path
    finally:
        for ns in (path.a, path.r, path.b):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=20)


DUPLEX_PEER = """
import socket, sys, threading, time
role, host, port, nbytes, limit_s = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
if role == 'server':
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((host, port)); s.listen(1); s.settimeout(limit_s)
    print('ready', flush=True)
    c, _ = s.accept()
else:
    c = socket.create_connection((host, port), timeout=limit_s)
    print('connected', flush=True)
c.settimeout(limit_s)
deadline = time.monotonic() + limit_s
def send():
    chunk = b'd' * 65536
    left = nbytes
    while left > 0 and time.monotonic() < deadline:
        left -= c.send(chunk[:min(left, len(chunk))])
    c.shutdown(socket.SHUT_WR)
sender = threading.Thread(target=send); sender.start()
got = 0
while time.monotonic() < deadline:
    d = c.recv(1 << 20)
    if not d: break
    got += len(d)
sender.join(limit_s)
c.close()
print('received', got, flush=True)
"""


def duplex_transfer(path: RoutedPath, port: int, nbytes: int, reverse_bytes: int | None = None,
                    after_connect: Callable[[], None] | None = None) -> tuple[int, int]:
    """Bulk both ways at once on ONE connection a <-> b (each side sends while it receives).

    after_connect(): called once the connection is up and data is flowing (e.g. to start a capture
    mid-stream). Returns (bytes b received, bytes a received).
    """
    limit = str(TRAFFIC_TIMEOUT_S)
    reverse = nbytes if reverse_bytes is None else reverse_bytes
    server = subprocess.Popen(["ip", "netns", "exec", path.b, "python3", "-c", DUPLEX_PEER, "server", path.addr_b,
                               str(port), str(reverse), limit], stdout=subprocess.PIPE, text=True)
    client = None
    try:
        assert server.stdout is not None
        assert server.stdout.readline().strip() == "ready", "duplex server did not start"
        client = subprocess.Popen(["ip", "netns", "exec", path.a, "python3", "-c", DUPLEX_PEER, "client",
                                   path.addr_b, str(port), str(nbytes), limit], stdout=subprocess.PIPE, text=True)
        assert client.stdout is not None
        assert client.stdout.readline().strip() == "connected", "duplex client did not connect"
        if after_connect is not None:
            after_connect()
        client_out, _ = client.communicate(timeout=TRAFFIC_TIMEOUT_S * 2)
        server_out, _ = server.communicate(timeout=TRAFFIC_TIMEOUT_S)
        return int(server_out.split()[-1]), int(client_out.split()[-1])
    finally:
        for proc in (client, server):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()

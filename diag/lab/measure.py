"""Measure what a lab link carries: one TCP stream, then both directions at once (one socket each way);
and what the machine carries in a collective's own flow pattern (a ring: host i -> host (i+1) % N, every
edge at once), driven by iperf3.

diag's own socket code is the default for the link (no external tool; sockets are opened inside the host
namespaces from this process, see netns.call_in_netns). iperf3 is used when asked and installed. The ring
pattern is iperf3 only: it is the reference for "what this machine can push through N flows at once", and
one Python process driving N flows would measure Python, not the machine. Every step is bounded in time.
"""

from __future__ import annotations

import json
import shutil
import socket
import struct
import subprocess
import threading
import time
from dataclasses import dataclass

from diag.errors import DiagError
from diag.lab import netns as ns_tools
from diag.lab.topology import Lab, LabHost

CHUNK_BYTES = 256 * 1024
WARMUP_FRACTION = 0.2           # of the run: slow start and queue build-up, excluded from the rate
MAX_WARMUP_S = 0.5
GRACE_S = 5.0                   # beyond `seconds`, before a stuck stream is abandoned
IPERF3_PORT = 5201              # inside the lab's private namespaces, so it clashes with nothing
# Ring pattern: receiver-side report interval and the start excluded from the rate (slow start, and the
# N clients' staggered start: each is its own `ip netns exec`, tens of ms apart on a busy machine).
RING_INTERVAL_S = 0.25
RING_WARMUP_S = 0.5
# The clients send with sendfile (-Z): the least CPU per byte iperf3 offers, so the pattern is as close to
# what the kernel and the links allow as the tool gets (A/B against plain writes at N=8 under load 15-19 was
# within the noise, 11.7-13.5 vs 12.8-12.9 MB/s per edge; the reason is the cost, not a measured gain).
RING_CLIENT_OPTIONS: tuple[str, ...] = ("-Z",)
# struct tcp_info (linux/tcp.h): __u64 tcpi_bytes_received sits at byte 128 (since Linux 4.1).
TCPI_BYTES_RECEIVED_OFFSET = 128
TCP_INFO_LEN = 232
SAMPLE_WINDOW_S = 0.5e-3
SAMPLE_INTERVAL_S = 0.02
# Socket buffers of a few hundred ms of data: the measurement then survives the measuring threads being
# descheduled on a busy machine (autotuned buffers held ~20 ms here, and bidirectional runs dipped to 78%).
# The *FORCE options pass the per-namespace net.core.[rw]mem_max cap (we run as root anyway).
MEASURE_BUFFER_BYTES = 4 * 1024 * 1024
SO_SNDBUFFORCE = getattr(socket, "SO_SNDBUFFORCE", 32)
SO_RCVBUFFORCE = getattr(socket, "SO_RCVBUFFORCE", 33)


@dataclass(frozen=True)
class LinkMeasurement:
    """Goodput (TCP payload bytes/s) between two lab hosts."""

    single_stream_Bps: float            # a -> b alone
    bidir_Bps: tuple[float, float]      # (a -> b, b -> a) at the same time
    tool: str                           # "diag-socket" or "iperf3"
    seconds: float = 0.0

    def to_json(self) -> dict[str, object]:
        return {"single_stream_Bps": self.single_stream_Bps, "bidir_Bps": list(self.bidir_Bps),
                "tool": self.tool, "seconds": self.seconds}


def measure_link(lab: Lab, a: int = 0, b: int = 1, seconds: float = 2.0, tool: str = "socket") -> LinkMeasurement:
    """Single-stream a->b, then a->b and b->a together, `seconds` each."""
    host_a, host_b = lab.host(a), lab.host(b)
    if host_a == host_b:
        raise DiagError("measure between two different hosts, e.g. h0 and h1")
    if not 0.2 <= seconds <= 60:
        raise DiagError(f"measurement time {seconds} s is outside 0.2..60 s")
    if tool == "iperf3":
        return _measure_iperf3(lab, host_a, host_b, seconds)
    if tool != "socket":
        raise DiagError(f"unknown measurement tool {tool!r}: use socket or iperf3")
    (single,) = _run_streams([(host_a, host_b)], seconds)
    forward, backward = _run_streams([(host_a, host_b), (host_b, host_a)], seconds)
    return LinkMeasurement(single_stream_Bps=single, bidir_Bps=(forward, backward), tool="diag-socket",
                           seconds=seconds)


def measure_flows(lab: Lab, pairs: list[tuple[LabHost | int | str, LabHost | int | str]],
                  seconds: float = 2.0) -> list[float]:
    """Goodput of one TCP connection per (sender, receiver) pair, all at once (e.g. incast: two senders into
    one host), with diag's own sockets; in the order of pairs."""
    if not 0.2 <= seconds <= 60:
        raise DiagError(f"measurement time {seconds} s is outside 0.2..60 s")
    resolved = [(lab.host(sender), lab.host(receiver)) for sender, receiver in pairs]
    if not resolved or any(sender == receiver for sender, receiver in resolved):
        raise DiagError("measure between pairs of two different hosts, e.g. (h0, h1)")
    return _run_streams(resolved, seconds)


@dataclass(frozen=True)
class EdgeFlow:
    """One ring edge's goodput, measured at the receiver."""

    sender: str
    receiver: str
    goodput_Bps: float

    def to_json(self) -> dict[str, object]:
        return {"sender": self.sender, "receiver": self.receiver, "goodput_Bps": self.goodput_Bps}


@dataclass(frozen=True)
class RingPatternMeasurement:
    """N iperf3 flows at once, h(i) -> h((i+1) % N): the machine's own limit for a ring collective's traffic.

    A ring all_gather's busbw is what each edge carries, so the per-edge mean is the figure to hold raw
    ring busbw against; the slowest edge is kept too, since a ring's steps wait for it.
    """

    world_size: int
    flows: tuple[EdgeFlow, ...]
    tool: str
    seconds: float

    @property
    def mean_edge_Bps(self) -> float:
        return sum(flow.goodput_Bps for flow in self.flows) / len(self.flows)

    @property
    def min_edge_Bps(self) -> float:
        return min(flow.goodput_Bps for flow in self.flows)

    def to_json(self) -> dict[str, object]:
        return {"world_size": self.world_size, "flows": [flow.to_json() for flow in self.flows],
                "mean_edge_Bps": self.mean_edge_Bps, "min_edge_Bps": self.min_edge_Bps,
                "tool": self.tool, "seconds": self.seconds}


def measure_ring_pattern(lab: Lab, world_size: int, seconds: float = 3.0) -> RingPatternMeasurement:
    """One iperf3 flow per ring edge of hosts h0..h(N-1), all edges at once, `seconds` each.

    Each receiving host runs its own one-off iperf3 server (-1) that reports receiver-side intervals as JSON;
    the goodput of an edge is taken from those intervals after the warm-up, so slow start and the clients'
    staggered start (each is a separate `ip netns exec`) stay out of the figure.
    """
    if not 2 <= world_size <= len(lab.hosts):
        raise DiagError(f"a ring of {world_size} hosts needs 2..{len(lab.hosts)} (the lab has {len(lab.hosts)} hosts)")
    if not 1.0 <= seconds <= 60:
        raise DiagError(f"ring pattern time {seconds} s is outside 1..60 s")
    if not iperf3_available():
        raise DiagError("iperf3 is not installed; the ring pattern needs it (apt-get install iperf3)")
    hosts = [lab.host(index) for index in range(world_size)]
    edges = [(hosts[index], hosts[(index + 1) % world_size]) for index in range(world_size)]
    warmup_s = min(RING_WARMUP_S, seconds / 3)
    servers: list[subprocess.Popen[str]] = []
    clients: list[subprocess.Popen[str]] = []
    try:
        for _sender, receiver in edges:
            servers.append(subprocess.Popen(
                [*lab.exec_prefix(receiver), "iperf3", "-s", "-1", "-J", "-i", f"{RING_INTERVAL_S:g}",
                 "-p", str(IPERF3_PORT), "-B", receiver.address],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        for _sender, receiver in edges:
            _wait_listening(lab, receiver, IPERF3_PORT)
        for sender, receiver in edges:
            clients.append(subprocess.Popen(
                [*lab.exec_prefix(sender), "iperf3", "-c", receiver.address, "-p", str(IPERF3_PORT),
                 "-t", f"{seconds:g}", "-J", *RING_CLIENT_OPTIONS], stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, text=True))
        deadline = time.monotonic() + seconds + 2 * GRACE_S
        outputs = [_finish(proc, deadline) for proc in clients + servers]
    finally:
        for proc in clients + servers:
            if proc.poll() is None:
                proc.kill()
                proc.wait(5)
    client_outputs, server_outputs = outputs[:world_size], outputs[world_size:]
    flows = []
    for (sender, receiver), client_out, server_out in zip(edges, client_outputs, server_outputs, strict=True):
        rate = _receiver_rate(server_out[0], warmup_s)
        if rate is None:
            raise DiagError(f"iperf3 {sender.name} -> {receiver.name} failed: "
                            f"{(client_out[1] or client_out[0] or server_out[1]).strip()[:200]}")
        flows.append(EdgeFlow(sender.name, receiver.name, rate))
    return RingPatternMeasurement(world_size=world_size, flows=tuple(flows), tool="iperf3", seconds=seconds)


def _finish(proc: subprocess.Popen[str], deadline: float) -> tuple[str, str]:
    try:
        return proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired as exc:
        raise DiagError(f"iperf3 ring pattern did not finish in time ({' '.join(map(str, proc.args))})") from exc


def _receiver_rate(server_stdout: str, warmup_s: float) -> float | None:
    """Bytes/s the server received over its report intervals that start after the warm-up (the last,
    possibly partial, interval included: its bytes and its length count alike)."""
    try:
        intervals = [interval["sum"] for interval in json.loads(server_stdout)["intervals"]]
    except (ValueError, KeyError, TypeError):
        return None
    steady = [interval for interval in intervals if interval["start"] >= warmup_s - 1e-6]
    span = sum(interval["end"] - interval["start"] for interval in steady)
    if not steady or span <= 0:
        return None
    return sum(interval["bytes"] for interval in steady) / span


def iperf3_available() -> bool:
    return shutil.which("iperf3") is not None


@dataclass
class _Receiver:
    """Counts bytes; the rate is taken between the first read after warm-up and the last read."""

    warmup_s: float
    total: int = 0
    t_first: float | None = None
    t_warm: float | None = None
    bytes_warm: int = 0
    t_last: float = 0.0
    bytes_last: int = 0
    error: BaseException | None = None

    def rate_Bps(self) -> float:
        if self.t_warm is None or self.t_last <= self.t_warm:
            return 0.0
        return (self.bytes_last - self.bytes_warm) / (self.t_last - self.t_warm)


def _run_streams(pairs: list[tuple[LabHost, LabHost]], seconds: float) -> list[float]:
    """One TCP connection per (sender, receiver) pair, all at once; goodput of each."""
    listeners: list[socket.socket] = []
    senders: list[socket.socket] = []
    accepted: list[socket.socket] = []
    try:
        for sender, receiver in pairs:
            listener = ns_tools.call_in_netns(receiver.netns, lambda r=receiver: socket.create_server((r.address, 0)))
            _big_buffers(listener)   # inherited by the accepted socket, set before the handshake sizes the window
            listener.settimeout(GRACE_S)
            listeners.append(listener)
            client = ns_tools.call_in_netns(sender.netns, lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            client.settimeout(GRACE_S)
            _big_buffers(client)
            senders.append(client)
            client.connect(listener.getsockname())
            conn, _ = listener.accept()
            conn.settimeout(GRACE_S)
            accepted.append(conn)

        warmup_s = min(MAX_WARMUP_S, seconds * WARMUP_FRACTION)
        receivers = [_Receiver(warmup_s) for _ in pairs]
        # The sampler (this thread) joins the start barrier too, so its clock starts with the senders'.
        start = threading.Barrier(len(pairs) * 2 + 1)
        threads = []
        for index in range(len(pairs)):
            threads.append(threading.Thread(target=_send, args=(senders[index], seconds, start),
                                            daemon=True, name=f"lab-send-{index}"))
            threads.append(threading.Thread(target=_receive, args=(accepted[index], receivers[index], start,
                                                                   seconds + GRACE_S),
                                            daemon=True, name=f"lab-recv-{index}"))
        for thread in threads:
            thread.start()
        start.wait(GRACE_S)
        began = time.monotonic()
        kernel_rates = _kernel_rates(accepted, began + warmup_s, began + seconds * (1 - WARMUP_FRACTION / 4))
        hard_deadline = time.monotonic() + seconds + 2 * GRACE_S
        for thread in threads:
            thread.join(max(0.0, hard_deadline - time.monotonic()))
        if any(thread.is_alive() for thread in threads):
            raise DiagError(f"link measurement did not finish in {seconds + 2 * GRACE_S:.0f} s; is the lab up?")
        for receiver in receivers:
            if receiver.error is not None:
                raise DiagError(f"link measurement failed: {receiver.error}")
        if kernel_rates is not None:
            return kernel_rates
        return [receiver.rate_Bps() for receiver in receivers]
    finally:
        for sock in listeners + senders + accepted:
            sock.close()


def _big_buffers(sock: socket.socket) -> None:
    for option, fallback in ((SO_SNDBUFFORCE, socket.SO_SNDBUF), (SO_RCVBUFFORCE, socket.SO_RCVBUF)):
        try:
            sock.setsockopt(socket.SOL_SOCKET, option, MEASURE_BUFFER_BYTES)
        except OSError:
            sock.setsockopt(socket.SOL_SOCKET, fallback, MEASURE_BUFFER_BYTES)


def _kernel_rates(sockets: list[socket.socket], t_from: float, t_to: float) -> list[float] | None:
    """Goodput from the kernel's per-socket byte counters (tcpi_bytes_received) between two instants.

    Counted as segments arrive, not when a (possibly descheduled) reader gets them, so CPU contention on
    the measuring process does not blur the link rate. None where TCP_INFO lacks the counter.
    """
    def sample() -> tuple[float, list[int]] | None:
        # A sample counts only if taken within SAMPLE_WINDOW_S: a preemption between reading the clock and
        # the counters would skew the rate (seen here: 101.6% of the link's bound).
        for _ in range(50):
            before = time.monotonic()
            counts = []
            for sock in sockets:
                info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, TCP_INFO_LEN)
                if len(info) < TCPI_BYTES_RECEIVED_OFFSET + 8:
                    return None
                counts.append(struct.unpack_from("<Q", info, TCPI_BYTES_RECEIVED_OFFSET)[0])
            after = time.monotonic()
            if after - before <= SAMPLE_WINDOW_S:
                return (before + after) / 2, counts
        return None

    # Many samples and a least-squares slope, not two end points: one stall of the receiver's softirq
    # (~100 ms on a loaded VM) at an end point would move a two-point rate by several percent.
    time.sleep(max(0.0, t_from - time.monotonic()))
    samples = []
    while time.monotonic() < t_to:
        taken = sample()
        if taken is None:
            return None
        samples.append(taken)
        time.sleep(SAMPLE_INTERVAL_S)
    if len(samples) < 3:
        return None
    times = [t for t, _ in samples]
    return [_slope(times, [counts[index] for _, counts in samples]) for index in range(len(sockets))]


def _slope(xs: list[float], ys: list[int]) -> float:
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    spread = sum((x - mean_x) ** 2 for x in xs)
    return sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / spread


def _send(sock: socket.socket, seconds: float, start: threading.Barrier) -> None:
    payload = memoryview(bytearray(CHUNK_BYTES))
    try:
        start.wait(GRACE_S)
        stop = time.monotonic() + seconds
        while time.monotonic() < stop:
            sock.sendall(payload)
        sock.shutdown(socket.SHUT_WR)
    except (OSError, threading.BrokenBarrierError):
        pass   # the receiver reports what arrived; a reset shows up as a short count there


def _receive(sock: socket.socket, receiver: _Receiver, start: threading.Barrier, limit_s: float) -> None:
    buffer = bytearray(CHUNK_BYTES)
    try:
        start.wait(GRACE_S)
        stop = time.monotonic() + limit_s
        while time.monotonic() < stop:
            count = sock.recv_into(buffer)
            now = time.monotonic()
            if count == 0:
                return
            receiver.total += count
            if receiver.t_first is None:
                receiver.t_first = now
            if receiver.t_warm is None and now - receiver.t_first >= receiver.warmup_s:
                receiver.t_warm, receiver.bytes_warm = now, receiver.total
            receiver.t_last, receiver.bytes_last = now, receiver.total
    except (OSError, threading.BrokenBarrierError) as exc:
        receiver.error = exc


def _measure_iperf3(lab: Lab, host_a: LabHost, host_b: LabHost, seconds: float) -> LinkMeasurement:
    if not iperf3_available():
        raise DiagError("iperf3 is not installed; use the built-in measurement (--tool socket) or apt-get install iperf3")
    server = subprocess.Popen([*lab.exec_prefix(host_b), "iperf3", "-s", "-p", str(IPERF3_PORT), "-B", host_b.address],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_listening(lab, host_b, IPERF3_PORT)
        single = _iperf3_client(lab, host_a, host_b, seconds, bidir=False)
        both = _iperf3_client(lab, host_a, host_b, seconds, bidir=True)
    finally:
        server.terminate()
        try:
            server.wait(5)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(5)
    return LinkMeasurement(single_stream_Bps=single["sum_received"]["bits_per_second"] / 8,
                           bidir_Bps=(both["sum_received"]["bits_per_second"] / 8,
                                      both["sum_received_bidir_reverse"]["bits_per_second"] / 8),
                           tool="iperf3", seconds=seconds)


def _wait_listening(lab: Lab, server: LabHost, port: int) -> None:
    """Poll the server namespace's listening sockets (a probe connection would count as a test to iperf3)."""
    def listening() -> bool:
        with open("/proc/thread-self/net/tcp", encoding="ascii") as table:
            rows = [line.split() for line in table.readlines()[1:]]
        return any(row[1].endswith(f":{port:04X}") and row[3] == "0A" for row in rows)

    deadline = time.monotonic() + GRACE_S
    while time.monotonic() < deadline:
        if ns_tools.call_in_netns(server.netns, listening):
            return
        time.sleep(0.05)
    raise DiagError(f"iperf3 server on {server.address}:{port} did not start in {GRACE_S:.0f} s")


def _iperf3_client(lab: Lab, host_a: LabHost, host_b: LabHost, seconds: float, bidir: bool) -> dict:
    argv = [*lab.exec_prefix(host_a), "iperf3", "-c", host_b.address, "-p", str(IPERF3_PORT),
            "-t", f"{seconds:g}", "-J"] + (["--bidir"] if bidir else [])
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 2 * GRACE_S, check=False)
    except subprocess.TimeoutExpired as exc:
        raise DiagError(f"iperf3 did not finish in {seconds + 2 * GRACE_S:.0f} s") from exc
    try:
        end = json.loads(proc.stdout)["end"]
    except (ValueError, KeyError) as exc:
        raise DiagError(f"iperf3 failed: {(proc.stderr or proc.stdout).strip()[:200]}") from exc
    if bidir and "sum_received_bidir_reverse" not in end:
        raise DiagError("this iperf3 has no --bidir (needs 3.7+); use the built-in measurement (--tool socket)")
    return end

"""TCP goodput of a set of flows, measured at the receiver after a warm-up: the one measurement code that the
lab's link measurement (diag/lab/measure.py, driven from outside the namespaces) and the in-place network
probe (diag/probe/, run by the job's own ranks) share.

Two tools, one rule: the rate of a flow is what its receiver got after slow start and the flows' staggered
start are over.

- iperf3: a one-off server per flow (``-s -1 -J -i 0.25``) on the receiving host and a client on the
  sender; the goodput is the sum of the server's receiver-side intervals that start after the warm-up.
- diag's own streams: one TCP connection per flow, a thread writing on each sending socket and one
  draining each receiving socket; the goodput is the slope of the kernel's per-socket byte counter
  (tcpi_bytes_received), sampled every 20 ms after the warm-up (the median of pairwise slopes).

Nothing here knows namespaces, ranks or the lab; every wait is bounded.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from diag.errors import DiagError

CHUNK_BYTES = 256 * 1024
WARMUP_FRACTION = 0.2           # of the run: slow start and queue build-up, excluded from the rate
MAX_WARMUP_S = 0.5
GRACE_S = 5.0                   # beyond `seconds`, before a stuck stream or tool is abandoned
# iperf3: receiver-side report interval and the start excluded from the rate (slow start, and the clients'
# staggered start: each is its own process, tens of ms apart on a busy machine).
IPERF3_INTERVAL_S = 0.25
IPERF3_WARMUP_S = 0.5
# The clients send with sendfile (-Z): the least CPU per byte iperf3 offers, so the pattern is as close to
# what the kernel and the links allow as the tool gets (A/B against plain writes at N=8 under load 15-19 was
# within the noise, 11.7-13.5 vs 12.8-12.9 MB/s per edge; the reason is the cost, not a measured gain).
IPERF3_CLIENT_OPTIONS: tuple[str, ...] = ("-Z",)
# struct tcp_info (linux/tcp.h): __u64 tcpi_bytes_received sits at byte 128 (since Linux 4.1).
TCPI_BYTES_RECEIVED_OFFSET = 128
TCPI_TOTAL_RETRANS_OFFSET = 100   # struct tcp_info's tcpi_total_retrans (u32): segments the socket resent
TCP_INFO_LEN = 232
SAMPLE_WINDOW_S = 0.5e-3
SAMPLE_INTERVAL_S = 0.02
FIRST_BYTES_INTERVAL_S = 0.002   # until every flow's first bytes arrived: when each flow began
MEDIAN_SLOPE_SAMPLES = 500
# Socket buffers of a few hundred ms of data: the measurement then survives the measuring threads being
# descheduled on a busy machine (autotuned buffers held ~20 ms here, and bidirectional runs dipped to 78%).
# The *FORCE options pass the per-namespace net.core.[rw]mem_max cap where we may (root); elsewhere the
# plain options ask for what the cap allows.
MEASURE_BUFFER_BYTES = 4 * 1024 * 1024
SO_SNDBUFFORCE = getattr(socket, "SO_SNDBUFFORCE", 32)
SO_RCVBUFFORCE = getattr(socket, "SO_RCVBUFFORCE", 33)
TCP_LISTEN_STATE = "0A"         # /proc/net/tcp's st column for LISTEN


class StreamError(DiagError):
    """A stream of :func:`run_streams` failed or did not finish in time."""


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
    """N flows at once, h(i) -> h((i+1) % N): the machine's own limit for a ring collective's traffic
    (run.json ``link.ring_pattern[N]``; measured by the lab from outside, or by the probe in place).

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


# ---- iperf3 ---------------------------------------------------------------------------------------------

def iperf3_available() -> bool:
    """iperf3 is installed where its servers can run as an unprivileged user (diag.lifeline, as root), or
    on PATH (otherwise)."""
    if os.geteuid() == 0:
        from diag.lifeline import runnable_by_others

        return runnable_by_others("iperf3") is not None
    return shutil.which("iperf3") is not None


def iperf3_warmup_s(seconds: float) -> float:
    return min(IPERF3_WARMUP_S, seconds / 3)


def iperf3_server_argv(address: str, port: int) -> list[str]:
    """A one-off server (exits after one test) that reports receiver-side intervals as JSON."""
    return ["iperf3", "-s", "-1", "-J", "-i", f"{IPERF3_INTERVAL_S:g}", "-p", str(port), "-B", address]


def iperf3_client_argv(address: str, port: int, seconds: int) -> list[str]:
    """A client sending for ``seconds``: iperf3's -t takes whole seconds (it reads "1.5" as 1). It reports
    intervals as the server does, so its retransmissions can be counted after the warm-up too."""
    return ["iperf3", "-c", address, "-p", str(port), "-t", str(int(seconds)), "-J", "-i", f"{IPERF3_INTERVAL_S:g}",
            *IPERF3_CLIENT_OPTIONS]


def iperf3_receiver_rate(server_stdout: str, warmup_s: float) -> float | None:
    """Bytes/s the server received over its report intervals that start after the warm-up (the last,
    possibly partial, interval included: its bytes and its length count alike). None when the output holds
    no such interval (iperf3 failed; its error is in the same JSON or on stderr)."""
    try:
        intervals = [interval["sum"] for interval in json.loads(server_stdout)["intervals"]]
        steady = [interval for interval in intervals if interval["start"] >= warmup_s - 1e-6]
        span = sum(interval["end"] - interval["start"] for interval in steady)
        received = sum(interval["bytes"] for interval in steady)
    except (ValueError, KeyError, TypeError):
        return None
    if not steady or span <= 0:
        return None
    return received / span


def iperf3_sender_retransmits(client_stdout: str) -> int | None:
    """Segments the client resent over its whole test (end.sum_sent.retransmits: the sender's
    tcpi_total_retrans); None where iperf3 could not read it (no TCP_INFO on the sender)."""
    try:
        value = json.loads(client_stdout)["end"]["sum_sent"].get("retransmits")
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    return int(value) if isinstance(value, (int, float)) else None


def iperf3_sender_steady_retransmits(client_stdout: str, warmup_s: float) -> int | None:
    """Segments the client resent in its report intervals that start after the warm-up (the window whose
    goodput iperf3_receiver_rate reports): slow start's overshoot left out. None where the intervals do not
    carry the count."""
    try:
        intervals = [interval["sum"] for interval in json.loads(client_stdout)["intervals"]]
        counts = [interval.get("retransmits") for interval in intervals if interval["start"] >= warmup_s - 1e-6]
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    if not counts or not all(isinstance(count, (int, float)) for count in counts):
        return None
    return int(sum(counts))


def retransmitted(sock: socket.socket) -> int | None:
    """Segments this socket has resent (tcpi_total_retrans); None where TCP_INFO lacks the counter."""
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, TCP_INFO_LEN)
    except OSError:
        return None
    if len(info) < TCPI_TOTAL_RETRANS_OFFSET + 4:
        return None
    return int(struct.unpack_from("<I", info, TCPI_TOTAL_RETRANS_OFFSET)[0])


def iperf3_error(*outputs: str) -> str:
    """The first thing iperf3 said about a failure: the JSON's "error", else the first non-empty text."""
    for text in outputs:
        try:
            error = json.loads(text).get("error")
        except (ValueError, AttributeError):
            error = None
        if error:
            return str(error)
    for text in outputs:
        if text.strip():
            return text.strip().splitlines()[0][:200]
    return "no output"


def finish(proc: subprocess.Popen[str], deadline: float) -> tuple[str, str] | None:
    """(stdout, stderr) of a process that ends by the monotonic ``deadline``; None (and killed, reaped)
    when it does not."""
    try:
        return proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        reap([proc])
        return None


def reap(procs: Sequence[subprocess.Popen[str]]) -> None:
    """Kill and wait for every process still running (never leaves a zombie or a listening server)."""
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        # An unkillable process (D state) is left after GRACE_S: nothing more a user-space parent can do.
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(GRACE_S)


def listening_on(port: int) -> bool:
    """Whether a socket of this thread's network namespace listens on TCP ``port`` (IPv4 or IPv6). Read from
    the kernel's tables rather than by connecting: a probe connection would count as a test to iperf3."""
    rows = []
    for table_path in ("/proc/thread-self/net/tcp", "/proc/thread-self/net/tcp6"):
        with contextlib.suppress(FileNotFoundError), open(table_path, encoding="ascii") as table:
            rows += [line.split() for line in table.readlines()[1:]]
    return any(row[1].endswith(f":{port:04X}") and row[3] == TCP_LISTEN_STATE for row in rows)


# ---- diag's own streams ---------------------------------------------------------------------------------

def big_buffers(sock: socket.socket) -> None:
    """Socket buffers of MEASURE_BUFFER_BYTES (see there); on a listener before accept, so the accepted
    socket inherits them before the handshake sizes the window."""
    for option, fallback in ((SO_SNDBUFFORCE, socket.SO_SNDBUF), (SO_RCVBUFFORCE, socket.SO_RCVBUF)):
        try:
            sock.setsockopt(socket.SOL_SOCKET, option, MEASURE_BUFFER_BYTES)
        except OSError:
            sock.setsockopt(socket.SOL_SOCKET, fallback, MEASURE_BUFFER_BYTES)


def stream_warmup_s(seconds: float) -> float:
    return min(MAX_WARMUP_S, seconds * WARMUP_FRACTION)


@dataclass
class _Receiver:
    """Counts bytes; the rate is taken between the first read after warm-up and the last read (the
    fallback where TCP_INFO lacks the byte counter)."""

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


def run_streams(outgoing: Sequence[socket.socket], incoming: Sequence[socket.socket], seconds: float,
                at_warmup: Callable[[], None] | None = None) -> list[float]:
    """Send on every ``outgoing`` socket for ``seconds`` and drain every ``incoming`` one, all at once;
    the goodput (bytes/s) of each incoming socket, in order.

    The two ends of a connection may be in this process (the lab) or in two processes that start this at
    the same moment (the probe: after a barrier); the warm-up absorbs the difference. Raises StreamError
    when a stream fails or does not end within ``seconds + 2 * GRACE_S``. ``at_warmup`` is called when the
    warm-up ends (the probe reads its senders' retransmission counters there).
    """
    warmup_s = stream_warmup_s(seconds)
    receivers = [_Receiver(warmup_s) for _ in incoming]
    for sock in (*outgoing, *incoming):
        sock.settimeout(GRACE_S)
    # The sampler (this thread) joins the start barrier too, so its clock starts with the senders'.
    start = threading.Barrier(len(outgoing) + len(incoming) + 1)
    threads = [threading.Thread(target=_send, args=(sock, seconds, start), daemon=True, name=f"goodput-send-{i}")
               for i, sock in enumerate(outgoing)]
    threads += [threading.Thread(target=_receive, args=(sock, receiver, start, seconds + GRACE_S), daemon=True,
                                 name=f"goodput-recv-{i}")
                for i, (sock, receiver) in enumerate(zip(incoming, receivers, strict=True))]
    for thread in threads:
        thread.start()
    try:
        start.wait(GRACE_S)
    except threading.BrokenBarrierError as exc:
        raise StreamError(f"the stream threads did not start in {GRACE_S:.0f} s") from exc
    began = time.monotonic()
    if at_warmup is not None:
        time.sleep(max(0.0, began + warmup_s - time.monotonic()))
        at_warmup()
    rates = kernel_rates(list(incoming), began, warmup_s, seconds * (1 - WARMUP_FRACTION / 4),
                         began + seconds + GRACE_S) if incoming else []
    hard_deadline = time.monotonic() + seconds + 2 * GRACE_S
    for thread in threads:
        thread.join(max(0.0, hard_deadline - time.monotonic()))
    if any(thread.is_alive() for thread in threads):
        raise StreamError(f"a stream did not finish in {seconds + 2 * GRACE_S:.0f} s")
    for receiver in receivers:
        if receiver.error is not None:
            raise StreamError(f"a stream failed: {receiver.error}")
    if rates is not None:
        return rates
    return [receiver.rate_Bps() for receiver in receivers]


def kernel_rates(sockets: list[socket.socket], began: float, warmup_s: float, window_end_s: float,
                 limit: float) -> list[float] | None:
    """Goodput from the kernel's per-socket byte counters (tcpi_bytes_received), each socket's from
    ``warmup_s`` to ``window_end_s`` after its flow's first bytes arrived (or after ``began``, where bytes had
    arrived already): a sender that starts late (its process left the probe's previous exchange later than
    this one) is measured over its own steady window, as the fallback _Receiver and iperf3 measure from the
    flow's start, not over a window holding its late start. Sampling ends at ``limit`` in any case.

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

    # Many samples and the median of their pairwise slopes (Theil-Sen), neither two end points nor a
    # least-squares line: one stall of the receiver's softirq (~100 ms on a loaded VM) at an end point
    # moves a two-point rate by several percent, and a stall mid-window followed by the catch-up (in-order
    # bytes released at once) tilts a least-squares line. Measured here on 18 flows of 1 s into a host
    # slowed to 50mbit (alone and with the other direction busy, load average ~7), as shares of the
    # one-way bound: least squares 0.92-1.03, end points 0.94-1.14, Theil-Sen 0.92-1.00.
    first = sample()
    if first is None:
        return None
    samples = [first]
    started: list[float | None] = [began if count > 0 else None for count in first[1]]
    while True:
        time.sleep(FIRST_BYTES_INTERVAL_S if None in started else SAMPLE_INTERVAL_S)
        taken = sample()
        if taken is None:
            return None
        samples.append(taken)
        at, counts = taken
        started = [s if s is not None else (at if count > 0 else None) for s, count in zip(started, counts, strict=True)]
        if at >= limit or (None not in started and at >= max(s for s in started if s is not None) + window_end_s):
            break
    rates = []
    for index, flow_start in enumerate(started):
        if flow_start is None:   # nothing arrived at all
            rates.append(0.0)
            continue
        window = [(t, counts[index]) for t, counts in samples
                  if flow_start + warmup_s <= t <= flow_start + window_end_s]
        if len(window) < 3:
            return None
        rates.append(median_slope([t for t, _ in window], [count for _, count in window]))
    return rates


def median_slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Theil-Sen's estimator: the median of the slopes between every two samples (at most
    MEDIAN_SLOPE_SAMPLES of them, evenly spaced, so a 60 s run stays a few MB). Written with numpy:
    scipy.stats.theilslopes computes the same plus intervals we do not use, and importing scipy.stats took
    3 s on this loaded 2-core machine, longer than a probe phase."""
    import numpy as np

    x, y = np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)
    if len(x) > MEDIAN_SLOPE_SAMPLES:
        keep = np.linspace(0, len(x) - 1, MEDIAN_SLOPE_SAMPLES).round().astype(int)
        x, y = x[keep], y[keep]
    first, second = np.triu_indices(len(x), 1)
    return float(np.median((y[second] - y[first]) / (x[second] - x[first])))


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

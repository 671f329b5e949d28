"""Typed evidence queries over a run directory, shared by the diagnosis rules and the plots.

Each fact is computed once here: the raw-TCP reference of a row, what raw TCP reaches of the link per N,
the two-way connections of a capture and its busiest connection, the TCP_INFO series per connection, and
per-thread and whole-machine CPU samples. Rules and plots read the answers' attributes.
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from diag.analysisdoc import Connection
from diag.records import Record
from diag.report.rundir import CaptureSet, RunData
from diag.report.series import mean_busbw, series_label
from diag.report.thresholds import BIDIR_MIN_BYTES, LARGE_SIZE_BYTES
from diag.typedjson import from_json

# --- records ---


def raw_reference(records: Iterable[Record]) -> dict[tuple[str, int, int], Record]:
    """(op, N, per-rank size) -> the fastest raw-TCP row there (any knobs): what plain sockets can do."""
    best: dict[tuple[str, int, int], Record] = {}
    for r in records:
        if r.backend == "raw":
            key = (r.op, r.world_size, r.size_bytes)
            if key not in best or mean_busbw(r) > mean_busbw(best[key]):
                best[key] = r
    return best


def large_sizes(sizes: Sequence[int]) -> list[int]:
    """The sizes at or above LARGE_SIZE_BYTES, else the top third: where a row is bandwidth-bound."""
    large = [s for s in sizes if s >= LARGE_SIZE_BYTES.value]
    return large or sorted(sizes)[-max(1, len(sizes) // 3):]


def raw_link_reach(run: RunData) -> dict[int, float]:
    """Per N: the best raw-TCP busbw at a large size (any op, size or knob set) as a share of the link rate:
    what this machine can carry at that N when nothing but TCP is in the way. Empty without a link rate."""
    return run.remember("raw_link_reach", lambda: _raw_link_reach(run))


def _raw_link_reach(run: RunData) -> dict[int, float]:
    link_Bps = run.link_Bps
    if not link_Bps:
        return {}
    best: dict[int, float] = {}
    per_series: dict[tuple[str, str, int], dict[int, Record]] = defaultdict(dict)
    for r in run.records:
        if r.backend == "raw":
            per_series[(series_label(r), r.op, r.world_size)][r.size_bytes] = r
    for (_label, _op, n), rows in per_series.items():
        large = large_sizes(sorted(rows))
        if large:
            reach = max(mean_busbw(rows[s]) for s in large) / link_Bps
            best[n] = max(best.get(n, 0.0), reach)
    return best


def machine_link_reach(run: RunData) -> dict[int, float]:
    """Per N: the share of the link this machine carried, the lower of raw TCP's best busbw and the iperf3
    ring pattern (run.json link.ring_pattern, where measured): either short of the link at a busy N means
    the CPU, not the link, set the pace there."""
    link = run.link_Bps
    reach = dict(raw_link_reach(run))
    if link:
        for n, pattern_Bps in run.ring_pattern_Bps.items():
            reach[n] = min(reach.get(n, pattern_Bps / link), pattern_Bps / link)
    return reach


# --- captures ---


def analysed(run: RunData) -> list[CaptureSet]:
    """The captures that have an analysis (analysis/<tag>.json)."""
    return [c for c in run.captures.values() if c.analysis]


@dataclass(frozen=True)
class TwoWay:
    """A connection that carries both directions in bulk, with its overlap and its smaller direction."""

    connection: Connection
    overlap: float
    smaller_bytes: int


def two_way_connections(capture: CaptureSet, min_bytes: int = int(BIDIR_MIN_BYTES.value)) -> list[TwoWay]:
    """Connections moving at least min_bytes each way with a known duplex overlap, most balanced first."""
    out = []
    for conn in capture.connections:
        moved = conn.payload_bytes
        if min(moved) >= min_bytes and isinstance(conn.duplex_overlap, (int, float)):
            out.append(TwoWay(conn, float(conn.duplex_overlap), min(moved)))
    return sorted(out, key=lambda item: -item.smaller_bytes)


def busiest_connection(capture: CaptureSet) -> Connection | None:
    """The connection that moved the most payload bytes (both directions together), if any moved."""
    moving = [c for c in capture.connections if c.total_payload_bytes > 0]
    return max(moving, key=lambda c: c.total_payload_bytes) if moving else None


def capture_op(capture: CaptureSet) -> str | None:
    """The op of most phases that carried packets in this capture."""
    ops = Counter(p.phase.op for p in capture.phases if p.connections)
    ops.pop(None, None)
    return ops.most_common(1)[0][0] if ops else None


# --- TCP_INFO ---


@dataclass(frozen=True)
class TcpInfoSample:
    """One TCP_INFO sample: from an observer (pid, local, remote) or a raw transport side file (rank, peer,
    conn). Counters are cumulative over the connection's life."""

    kind: str = "tcp_info"
    t_ns: int = 0
    pid: int | None = None
    local: str | None = None
    remote: str | None = None
    rank: int | None = None
    peer: int | None = None
    conn: str | None = None
    cwnd: float | None = None
    send_q: float | None = None
    busy_s: float | None = None
    rwnd_limited_s: float | None = None
    sndbuf_limited_s: float | None = None
    total_retrans: float | None = None
    retrans: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class TcpInfoSeries:
    label: str                          # "pid P local->remote" or "rank R peer P conn C"
    tag: str | None                     # the capture whose observer took it (None: raw side files)
    samples: tuple[TcpInfoSample, ...]  # oldest first

    def values(self, key: str) -> list[float]:
        out = []
        for s in self.samples:
            value = getattr(s, key)
            if isinstance(value, (int, float)):
                out.append(value)
        return out

    def delta(self, key: str) -> float | None:
        """How much a cumulative counter grew over the series (None with fewer than two values)."""
        values = self.values(key)
        return (max(values) - min(values)) if len(values) >= 2 else None

    @property
    def has_cwnd(self) -> bool:
        return bool(self.values("cwnd"))

    def cwnd_collapses(self, restart_segments: float) -> int:
        """How often cwnd fell to restart_segments or less after having been at least 4x that."""
        count, peak = 0, 0.0
        for cwnd in self.values("cwnd"):
            if cwnd <= restart_segments and peak >= 4 * restart_segments:
                count += 1
                peak = cwnd
            peak = max(peak, cwnd)
        return count

    def cwnd_cuts(self, factor: float) -> int:
        """How often cwnd fell to ``factor`` of its peak since the last cut or less: a multiplicative decrease
        after a loss (CUBIC cuts to 0.7, Reno to 0.5), or a collapse after a timeout."""
        count, peak = 0, 0.0
        for cwnd in self.values("cwnd"):
            if peak > 0 and cwnd <= factor * peak:
                count += 1
                peak = cwnd
            peak = max(peak, cwnd)
        return count

    def retransmitted(self) -> float | None:
        """Segments this socket retransmitted over the series: the growth of the kernel's total_retrans (raw
        side files), else the largest total ss reported (observer samples; ss prints the socket's total)."""
        total = self.delta("total_retrans")
        if total is None:
            values = self.values("retrans")
            total = max(values) if values else None
        return total

    @property
    def endpoints(self) -> frozenset[str]:
        """{"ip:port", "ip:port"} of an observer's series (IPv4-mapped addresses unwrapped); empty otherwise."""
        first = self.samples[0] if self.samples else None
        if first is None or not first.local or not first.remote:
            return frozenset()
        return frozenset(_plain_endpoint(e) for e in (first.local, first.remote))


def _plain_endpoint(text: str) -> str:
    """'[::ffff:10.0.0.1]:5000' -> '10.0.0.1:5000' (what the analyzer writes); others unchanged."""
    address, _, port = text.rpartition(":")
    address = address.strip("[]")
    if address.startswith("::ffff:"):
        address = address[len("::ffff:"):]
    return f"{address}:{port}" if "." in address else text


def connection_tcp_info(run: RunData, conn: Connection) -> list[TcpInfoSeries]:
    """The TCP_INFO series an observer took of this connection (either end)."""
    ends = frozenset((conn.a, conn.b))
    return [s for s in tcp_info_series(run) if s.endpoints == ends]


def tcp_info_series(run: RunData) -> list[TcpInfoSeries]:
    """Per connection, the TCP_INFO samples from observers and raw side files, sorted by label."""
    return run.remember("tcp_info_series", lambda: _tcp_info_series(run))


def _tcp_info_series(run: RunData) -> list[TcpInfoSeries]:
    return series_of(run.captures.values(), run.tcpinfo)


def series_of(captures: Iterable[CaptureSet], tcpinfo: Iterable[dict[str, Any]]) -> list[TcpInfoSeries]:
    """Per connection, the TCP_INFO samples of these captures' observers and these raw side files."""
    grouped: dict[str, list[TcpInfoSample]] = defaultdict(list)
    tags: dict[str, str | None] = {}
    for c in captures:
        for raw in c.observe:
            if raw.get("kind") == "tcp_info":
                s = from_json(TcpInfoSample, raw)
                label = f"pid {s.pid} {s.local}->{s.remote}"
                grouped[label].append(s)
                tags.setdefault(label, c.tag)
    for raw in tcpinfo:
        if raw.get("kind", "tcp_info") == "tcp_info":
            s = from_json(TcpInfoSample, raw)
            label = f"rank {s.rank} peer {s.peer} conn {s.conn}"
            grouped[label].append(s)
            tags.setdefault(label, None)
    return [TcpInfoSeries(label, tags[label], tuple(sorted(samples, key=lambda s: s.t_ns)))
            for label, samples in sorted(grouped.items())]


# --- CPU ---


@dataclass(frozen=True)
class ThreadCpu:
    """One thread's CPU samples in one captured run, in % of one core, oldest first."""

    tag: str
    pid: Any
    tid: Any
    name: str
    cpu_pct: tuple[float, ...]
    t_ns: tuple[int, ...]

    @property
    def median_pct(self) -> float:
        return statistics.median(self.cpu_pct)


@dataclass(frozen=True)
class HostCpu:
    """The whole machine's CPU samples in one captured run: % of all CPUs busy, oldest first."""

    tag: str
    cpus: Any
    busy_pct: tuple[float, ...]
    t_ns: tuple[int, ...]

    @property
    def median_pct(self) -> float:
        return statistics.median(self.busy_pct)


def thread_cpu(run: RunData) -> list[ThreadCpu]:
    """Per (capture, pid, tid), sorted by (tag, pid, tid) as text."""
    return threads_of(run.captures.values())


def threads_of(captures: Iterable[CaptureSet]) -> list[ThreadCpu]:
    """thread_cpu of these captures (one node's)."""
    grouped: dict[tuple[str, Any, Any], list[dict[str, Any]]] = defaultdict(list)
    for c in captures:
        for s in c.observe:
            if s.get("kind") == "cpu_thread" and isinstance(s.get("cpu_pct"), (int, float)):
                grouped[(c.tag, s.get("pid"), s.get("tid"))].append(s)
    out = []
    for (tag, pid, tid), samples in sorted(grouped.items(), key=lambda kv: str(kv[0])):
        name = str(samples[0].get("name", "?"))
        samples.sort(key=lambda s: s.get("t_ns", 0))
        out.append(ThreadCpu(tag, pid, tid, name,
                             tuple(float(s["cpu_pct"]) for s in samples), tuple(s.get("t_ns", 0) for s in samples)))
    return out


def host_cpu(run: RunData) -> dict[str, HostCpu]:
    """Per capture tag, the whole-machine samples (observe kind cpu_host), sorted by tag."""
    return machines_of(run.captures.values())


def machines_of(captures: Iterable[CaptureSet]) -> dict[str, HostCpu]:
    """host_cpu of these captures (one node's)."""
    grouped: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for c in captures:
        for s in c.observe:
            if s.get("kind") == "cpu_host" and isinstance(s.get("busy_pct"), (int, float)):
                grouped[c.tag].append(s)
    out = {}
    for tag, samples in sorted(grouped.items()):
        ordered = sorted(samples, key=lambda s: s.get("t_ns", 0))
        out[tag] = HostCpu(tag, samples[0].get("cpus"), tuple(float(s["busy_pct"]) for s in ordered),
                           tuple(s.get("t_ns", 0) for s in ordered))
    return out


def capture_series(run: RunData, capture: CaptureSet) -> str | None:
    """The series label (transport and knobs) of the records this capture's busy phases belong to: tells two
    raw variants apart where the capture alone says only "raw:ring"."""
    return run.remember(f"capture_series:{capture.tag}", lambda: _capture_series(run, capture))


def _capture_series(run: RunData, capture: CaptureSet) -> str | None:
    by_key: dict[tuple[Any, Any, Any, Any], list[Record]] = defaultdict(list)
    for r in run.records:
        by_key[(r.backend, r.op, r.world_size, r.size_bytes)].append(r)
    labels: Counter[str] = Counter()
    for p in capture.phases:
        if not p.connections:
            continue
        key = (p.phase.backend, p.phase.op, p.phase.world_size, p.phase.size_bytes)
        for r in by_key.get(key, []):
            if r.t_start_ns <= p.phase.t_start_ns and p.phase.t_end_ns <= r.t_end_ns:
                labels[series_label(r)] += 1
    return labels.most_common(1)[0][0] if labels else None


def capture_name(run: RunData, capture: CaptureSet) -> str:
    """How a plot names a capture: its series and op at its N, else its transport and tag."""
    series = capture_series(run, capture)
    op = capture_op(capture)
    n = f"N={capture.world_size}" if capture.world_size else "N=?"
    if series:
        return f"{series} {op or ''} {n}".replace("  ", " ")
    if capture.transport:
        return f"{capture.transport} {n} ({capture.tag})"
    step = capture.tag.split("--")[-1]           # '<plan>--<step>': the step names its transport, op and N
    return step if capture.world_size and step.endswith(f"-n{capture.world_size}") else f"{step} {n}"

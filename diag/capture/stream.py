"""The `diag analyze` JSON of one large capture in bounded memory: a few streaming passes over the file.

flows.analyze holds every packet's columns and TCP state at once (~170 bytes a packet), and its statistics
(medians and 95th percentiles over every packet of a direction, the run gap that decides each busy run,
the duplex overlap and turns built on those runs) read whole arrays. Here the file is read chunk by chunk
(reader.stream_capture), five times, and each pass keeps only what the next needs; the JSON is the same,
byte for byte (tests/test_stream.py holds the two paths to that):

  1. reader only: connections and directions (numbered as flows.connections does), the SYNs (window scale,
     MSS, the handshake's SYN time), every count and sum, the idle-gap runs, the largest segment, the
     coarse histogram of each stream's bulk gaps (quantile.OrderStats, pass 1);
  2. reader only, stops as soon as it can: each connection's handshake RTT (the first ACK after its SYN),
     which the TCP state machine needs from its first packet on;
  3. reader + TCP state (the _ctcp kernel, fed chunk by chunk): verdict counts, unique bytes, the coarse
     histograms of RTTs, windows and bytes in flight, the exact bulk gaps (-> each stream's run gap), the
     throughput series, the turn analysis' bulk segments;
  4. reader + TCP state: the exact RTT, window and in-flight order statistics, the busy runs at each
     stream's run gap (-> duplex overlap), the turn candidates and control frames;
  5. reader only: the bytes each stream sends inside the other's busy runs, the handoff triggers, the
     exact time from a control frame to the peer's next data.

What grows: the busy runs and idle gaps of each stream (one entry per silence longer than the gap, so
bounded by the capture's duration, not its packets), the per-value counts inside the buckets that hold a
wanted order statistic, the connections, endpoints and record phases, and on disk the TCP state kernel's
old segment ends. Everything reads the packets in file order, as flows does; timestamps that step back
are followed exactly except where a binary search over them could land in more than one place
(`_Descents`). Streaming needs both C kernels; for several files, pipes and --plot, and where a file
cannot be streamed exactly (`Fallback` says why), flows.analyze runs in memory.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from diag.capture import native
from diag.capture.flows import (
    CADENCE_FACTOR,
    CADENCE_MIN_GAPS,
    CADENCE_QUANTILE,
    DEFAULT_MSS,
    MAX_BINS,
    MAX_RUN_GAP_S,
    NO_PHASE_PACKETS,
    PACING_PACKETS,
    SEGMENT_SIZE_EDGES,
    _coverage,
    _endpoint,
    connection_json,
    document,
    duplex_result,
    host_json,
    median_s,
    phases_from_records,
)
from diag.capture.quantile import OrderStats, median_ranks, np_median, np_percentile, percentile_ranks
from diag.capture.reader import ACK, FIN, RST, SYN, CaptureChunk, ReadResult, estimate_rows, stream_capture
from diag.capture.turns import (
    BURST_MIN_BYTES,
    CONTROL_MAX_BYTES,
    CONTROL_MAX_SHARE,
    DIRECTIONS,
    GLOO_PREAMBLE_BYTES,
    HANDOFF_FLOOR_S,
    HANDOFF_MAX_RTT,
    HANDOFF_SILENCE_SHARE,
    TURN_MIN_SILENCE_FRACTION,
    finish_turns,
    turns_summary,
)

STREAM_ENV = "DIAG_STREAM"  # auto (default) | always | never | check (see mode())
# Above this many TCP rows (estimated from the file's size) the in-memory analysis would pass ~400 MB.
STREAM_MIN_ROWS = 2_250_000
VERDICTS = ("retransmission", "fast_retransmission", "spurious_retransmission", "out_of_order",
            "lost_segment", "dup_ack", "zero_window", "window_full")
# The JSON's names of the verdict counts, in its key order.
VERDICT_KEYS = ("retransmissions", "fast_retransmissions", "spurious_retransmissions", "out_of_order",
                "lost_segments", "dup_acks", "zero_windows", "window_full")
_STATE_DTYPES = {"new_bytes": np.int64, **{name: np.bool_ for name in VERDICTS}, "in_flight": np.int64,
                 "window_bytes": np.int32, "ack_rtt_ns": np.int64, "ts_rtt_ns": np.int64}
_KERNEL_INPUTS = {"ts_ns": np.int64, "seq": np.uint32, "ack": np.uint32, "plen": np.int32, "win": np.uint16,
                  "flags": np.uint8, "tsval": np.uint32, "tsecr": np.uint32, "has_ts": np.bool_}
_EDGES = np.array(SEGMENT_SIZE_EDGES, dtype=np.int64)
# The TCP state kernel keeps every data segment's end (a retransmission or late ACK of any age must find
# it): 17 bytes a segment. Streaming, it keeps this many a direction in memory and the older ones on disk.
SPILL_WINDOW = 1 << 20


class Fallback(Exception):
    """This file cannot be streamed to the in-memory result (the message says why); analyze it in memory."""


def mode() -> str:
    """DIAG_STREAM: auto (stream files too big to analyze in memory), always, never, or check (tests: analyze
    in memory, then stream in small chunks and raise AssertionError where the two JSONs differ)."""
    value = os.environ.get(STREAM_ENV, "auto").strip().lower() or "auto"
    if value not in ("auto", "always", "never", "check"):
        from diag.errors import DiagError

        raise DiagError(f"{STREAM_ENV}={value!r}: use auto, always, never or check")
    return value


def can_stream(paths: Sequence[str | os.PathLike[str]]) -> bool:
    """One regular file and both C kernels (the TCP state kernel is what can be fed in chunks)."""
    return (len(paths) == 1 and Path(paths[0]).is_file() and native.kernel("_cpcap") is not None
            and native.kernel("_ctcp") is not None)


def should_stream(paths: Sequence[str | os.PathLike[str]]) -> bool:
    """Whether analyze() streams these captures: DIAG_STREAM=always, or auto and a file too big for memory."""
    choice = mode()
    if choice in ("never", "check") or not can_stream(paths):
        return False
    if choice == "always":
        return True
    rows = estimate_rows(paths[0])
    return rows is not None and rows > STREAM_MIN_ROWS


def check(expected: dict[str, Any], path: str | os.PathLike[str], records: Sequence[str | os.PathLike[str]] | None,
          bin_s: float, idle_gap_s: float, with_series: bool, chunk_bytes: int = 4096,
          spill_window: int = 16) -> None:
    """DIAG_STREAM=check: the streamed JSON (in chunks of chunk_bytes, so that every pass crosses many chunk
    boundaries) must equal the in-memory one; a Fallback is allowed (it says the file is analyzed in memory)."""
    from diag.capture import reader

    saved = reader.CHUNK_BYTES
    # small chunks and a small window of segment ends: every pass crosses chunk boundaries and reads ends
    # back from the temporary file
    reader.CHUNK_BYTES = chunk_bytes
    try:
        got = analyze_streaming(path, records, bin_s, idle_gap_s, with_series, spill_window)
    except Fallback:
        return
    finally:
        reader.CHUNK_BYTES = saved
    where = first_difference(expected, got)
    if where is not None:
        raise AssertionError(f"streamed analysis of {path} differs from the in-memory one at {where}")


def first_difference(a: Any, b: Any, path: str = "") -> str | None:
    """The JSON path where a and b first differ (values compared as their JSON text), else None."""
    if isinstance(a, dict) and isinstance(b, dict):
        if list(a) != list(b):
            return f"{path or '/'} (keys {list(a)} vs {list(b)})"
        for key in a:
            found = first_difference(a[key], b[key], f"{path}/{key}")
            if found:
                return found
        return None
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return f"{path} (length {len(a)} vs {len(b)})"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            found = first_difference(x, y, f"{path}[{i}]")
            if found:
                return found
        return None
    import json

    return None if json.dumps(a) == json.dumps(b) else f"{path} ({json.dumps(a)[:80]} vs {json.dumps(b)[:80]})"


# --- the passes ------------------------------------------------------------------------------------------


@dataclass
class Chunk:
    """One reader chunk as the aggregations see it: the columns they read plus per-row ids."""

    ts_ns: np.ndarray
    plen: np.ndarray
    flags: np.ndarray
    win: np.ndarray
    conn: np.ndarray       # int32 connection index (numbered by first appearance)
    direction: np.ndarray  # int8: 0 when sent by the connection's first sender
    src_addr: np.ndarray   # int32 address index (Streamer.addresses, in order of first appearance)
    dst_addr: np.ndarray
    state: dict[str, np.ndarray] | None  # the TCP state outputs (passes 3 and 4)


class _Stop(Exception):
    """Raised inside a consume callback to end a pass early."""


class _Connections:
    """Endpoint pairs -> connection index in order of first appearance, as flows.connections numbers them."""

    def __init__(self) -> None:
        self.cap = 0
        self.lookup = np.zeros(0, dtype=np.int32)  # low * cap + high -> connection, -1 unknown
        self.pairs: dict[tuple[int, int], int] = {}
        self.conn_a: list[int] = []
        self.conn_b: list[int] = []
        self._conn_a_arr = np.zeros(0, dtype=np.int32)  # conn_a as an array, rebuilt when connections came

    def _grow(self, nendpoints: int) -> None:
        cap = max(16, self.cap)
        while cap < nendpoints:
            cap *= 2
        if cap > 2048:  # a dense table would be too large: the dict path alone
            self.cap = -1
            return
        if cap != self.cap:
            self.lookup = np.full(cap * cap, -1, dtype=np.int32)
            for (low, high), c in self.pairs.items():
                self.lookup[low * cap + high] = c
            self.cap = cap

    def ids(self, src: np.ndarray, dst: np.ndarray, nendpoints: int, assign: bool) -> np.ndarray:
        if self.cap != -1 and nendpoints > self.cap:
            self._grow(nendpoints)
        low, high = np.minimum(src, dst), np.maximum(src, dst)
        if self.cap == -1:
            key = low.astype(np.int64) << 32 | high
            uniq, first, inverse = np.unique(key, return_index=True, return_inverse=True)
            known = np.array([self.pairs.get((int(k >> 32), int(k & 0xFFFFFFFF)), -1) for k in uniq.tolist()],
                             dtype=np.int32)
            missing = np.flatnonzero(known < 0)
            if missing.size:
                if not assign:
                    raise AssertionError("a connection appeared in a later pass")
                for m in missing[np.argsort(first[missing], kind="stable")].tolist():
                    k = int(uniq[m])
                    known[m] = self._add(k >> 32, k & 0xFFFFFFFF, src[first[m]], dst[first[m]])
            return known[inverse.ravel()]
        key = low * np.int32(self.cap) + high
        conn = self.lookup[key]
        if conn.size and int(conn.min()) < 0:
            if not assign:
                raise AssertionError("a connection appeared in a later pass")
            rows = np.flatnonzero(conn < 0)
            keys, first = np.unique(key[rows], return_index=True)
            for k, row in sorted(zip(keys.tolist(), rows[first].tolist(), strict=True), key=lambda kr: kr[1]):
                self.lookup[k] = self._add(k // self.cap, k % self.cap, src[row], dst[row])
            conn = self.lookup[key]
        return conn

    def _add(self, low: int, high: int, first_src: Any, first_dst: Any) -> int:
        c = len(self.conn_a)
        self.pairs[(int(low), int(high))] = c
        self.conn_a.append(int(first_src))
        self.conn_b.append(int(first_dst))
        return c

    def direction(self, conn: np.ndarray, src: np.ndarray) -> np.ndarray:
        if len(self.conn_a) == 1:
            return (src != self.conn_a[0]).astype(np.int8)
        if self._conn_a_arr.size != len(self.conn_a):  # once per chunk at most, not once per new connection
            self._conn_a_arr = np.array(self.conn_a, dtype=np.int32)
        return (src != self._conn_a_arr[conn]).astype(np.int8)


class Streamer:
    """Runs the passes over one file and hands every chunk to the aggregations."""

    def __init__(self, path: str | os.PathLike[str], spill_window: int = SPILL_WINDOW) -> None:
        self.path = path
        self.spill_window = spill_window
        self.connections = _Connections()
        self.endpoints: list[tuple[str, int]] = []
        self.address_of_endpoint = np.zeros(0, dtype=np.int32)
        self.addresses: list[str] = []  # address index -> text, in order of first appearance
        self._address_index: dict[str, int] = {}
        self.result: ReadResult | None = None
        self.rows = 0
        # handshake (pass 1)
        self.syn_seen: list[list[bool]] = []
        self.offered: dict[tuple[int, int], int | None] = {}
        self.mss: dict[tuple[int, int], int] = {}
        self.syn_time: dict[int, int] = {}
        self.wscale = np.zeros((0, 2), dtype=np.int64)
        self.first_rtt = np.zeros(0, dtype=np.int64)

    @property
    def nconn(self) -> int:
        return len(self.connections.conn_a)

    def _endpoints(self, chunk: CaptureChunk) -> None:
        if len(chunk.endpoints) == len(self.endpoints):
            return
        new = chunk.endpoints[len(self.endpoints):]
        ids = []
        for address, _port in new:
            index = self._address_index.get(address)
            if index is None:
                index = self._address_index[address] = len(self.addresses)
                self.addresses.append(address)
            ids.append(index)
        self.endpoints = list(chunk.endpoints)
        self.address_of_endpoint = np.concatenate([self.address_of_endpoint, np.array(ids, dtype=np.int32)])

    def run(self, number: int, consume: Callable[[Chunk], None], with_state: bool = False) -> None:
        """One pass: every chunk of the file, with the TCP state when asked, to consume."""
        analyzer = None
        outputs: dict[str, np.ndarray] = {}
        if with_state:
            kernel = native.kernel("_ctcp")
            assert kernel is not None
            analyzer = kernel.Analyzer(2 * self.nconn, np.ascontiguousarray(self.wscale, dtype=np.int64).reshape(-1),
                                       np.ascontiguousarray(self.first_rtt, dtype=np.int64),
                                       spill_window=self.spill_window)

        def on_chunk(raw: CaptureChunk) -> None:
            cols = raw.columns
            n = cols["ts_ns"].size
            if number == 1:
                self._endpoints(raw)
            src, dst = cols["src"], cols["dst"]
            conn = self.connections.ids(src, dst, len(self.endpoints), assign=number == 1)
            direction = self.connections.direction(conn, src)
            ts = cols["ts_ns"]
            if number == 1:
                self._syns(raw, conn, direction)
                self.rows += n
            state = None
            if analyzer is not None:
                for name, dtype in _STATE_DTYPES.items():
                    if name not in outputs or outputs[name].size < n:
                        outputs[name] = np.empty(max(n, 1 << 16), dtype=dtype)
                state = {name: array[:n] for name, array in outputs.items()}
                inputs = [np.ascontiguousarray(conn, dtype=np.int32), np.ascontiguousarray(direction, dtype=np.int8)]
                inputs += [np.ascontiguousarray(cols[name], dtype=dtype) for name, dtype in _KERNEL_INPUTS.items()]
                try:
                    late_ack, late_ts = analyzer.feed(*inputs, None, None, *state.values())
                except OSError as exc:  # its temporary file of segment ends could not be written or read
                    from diag.errors import DiagError

                    raise DiagError(f"{self.path}: {exc}") from None
                for late, name in ((late_ack, "ack_rtt_ns"), (late_ts, "ts_rtt_ns")):
                    for row, value in late:
                        if row < raw.first_row:
                            raise Fallback("an RTT sample falls on a packet of an earlier chunk (packets out of "
                                           "order in the file)")
                        state[name][row - raw.first_row] = value
            consume(Chunk(ts, cols["plen"], cols["flags"], cols["win"], conn, direction,
                          self.address_of_endpoint[src], self.address_of_endpoint[dst], state))

        try:
            result = stream_capture(self.path, on_chunk)
        except _Stop:
            return
        if number == 1:
            self.result = result
            self._settle_handshakes()

    def _syns(self, raw: CaptureChunk, conn: np.ndarray, direction: np.ndarray) -> None:
        while len(self.syn_seen) < self.nconn:
            self.syn_seen.append([False, False])
        if not raw.syns:
            return
        frames = raw.columns["frame"]
        wanted = np.array([s.frame for s in raw.syns], dtype=np.int64)
        rows = np.flatnonzero(np.isin(frames, wanted))
        row_of = dict(zip(frames[rows].tolist(), rows.tolist(), strict=True))
        for syn in raw.syns:
            row = row_of.get(syn.frame)
            if row is None:
                continue
            c, d = int(conn[row]), int(direction[row])
            self.syn_seen[c][d] = True
            self.offered[(c, d)] = syn.wscale
            if syn.mss:
                self.mss[(c, d)] = syn.mss
            if not syn.flags & ACK:
                self.syn_time[c] = syn.ts_ns

    def _settle_handshakes(self) -> None:
        """flows._handshakes' window scales; the handshake RTTs come from pass 2."""
        nconn = self.nconn
        while len(self.syn_seen) < nconn:
            self.syn_seen.append([False, False])
        self.wscale = np.full((nconn, 2), -1, dtype=np.int64)
        for c in range(nconn):
            if self.syn_seen[c][0] and self.syn_seen[c][1]:
                ws0, ws1 = self.offered.get((c, 0)), self.offered.get((c, 1))
                if ws0 is not None and ws1 is not None:
                    self.wscale[c, 0], self.wscale[c, 1] = ws0, ws1
                else:
                    self.wscale[c, 0] = self.wscale[c, 1] = 0
        self.first_rtt = np.zeros(nconn, dtype=np.int64)

    def handshake_rtts(self) -> None:
        """Pass 2: each connection's first non-SYN ACK at or after its SYN time (file order), as _first_where."""
        pending = {c: self.syn_time.get(c, 0) for c in range(self.nconn)
                   if self.syn_seen[c][0] and self.syn_seen[c][1]}
        if not pending:
            return

        def consume(chunk: Chunk) -> None:
            hit = ((chunk.flags & ACK) != 0) & ((chunk.flags & SYN) == 0)
            for c in list(pending):
                rows = np.flatnonzero(hit & (chunk.ts_ns >= pending[c]) & (chunk.conn == c))
                if rows.size:
                    self.first_rtt[c] = int(chunk.ts_ns[rows[0]] - pending[c])
                    del pending[c]
            if not pending:
                raise _Stop

        self.run(2, consume)

    def mss_of(self, c: int, d: int) -> int:
        return self.mss.get((c, d), 0)


# --- one stream of data packets ---------------------------------------------------------------------------


class _Runs:
    """Busy runs of times (file order) at a fixed gap, built chunk by chunk (flows.busy_intervals' starts/ends);
    with keep_gaps also the silences that end them."""

    def __init__(self, gap: float, keep_gaps: bool = False) -> None:
        self.gap = gap
        self.starts: list[np.ndarray] = []
        self.ends: list[np.ndarray] = []
        self.idle: list[np.ndarray] = []
        self.keep_gaps = keep_gaps
        self.last: float | None = None

    def add(self, ts: np.ndarray) -> None:
        if ts.size == 0:
            return
        if self.last is None:
            self.starts.append(ts[:1])
            gaps = np.diff(ts)
            base = ts
        else:
            base = np.concatenate([np.array([self.last]), ts])
            gaps = np.diff(base)
        breaks = np.flatnonzero(gaps > self.gap)
        if breaks.size:
            self.ends.append(base[breaks])
            self.starts.append(base[breaks + 1])
            if self.keep_gaps:
                self.idle.append(gaps[breaks])
        self.last = float(ts[-1])

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        if self.last is None:
            return np.zeros(0), np.zeros(0)
        starts = np.concatenate(self.starts)
        ends = np.concatenate([*self.ends, np.array([self.last])])
        return starts, ends

    def idle_gaps(self) -> np.ndarray:
        return np.concatenate(self.idle) if self.idle else np.zeros(0)


class DataStream:
    """The data packets of one direction, or one host's transmit or receive: what flows.duplex reads."""

    def __init__(self, idle_gap_s: float) -> None:
        self.idle_gap_s = idle_gap_s
        self.n = 0
        self.bytes = 0
        self.pairs = 0
        self.gaps = OrderStats(np.float64)
        self._last_ts: float | None = None
        self._last_bulk = False
        self.run_gap = idle_gap_s
        self.runs: _Runs | None = None
        self.intervals: tuple[np.ndarray, np.ndarray] = (np.zeros(0), np.zeros(0))
        self.bytes_inside_other = 0

    def _bulk_gaps(self, ts: np.ndarray, nbytes: np.ndarray) -> np.ndarray:
        bulk = nbytes > CONTROL_MAX_BYTES
        if self._last_ts is None:
            gaps, pairs = np.diff(ts), bulk[:-1] & bulk[1:]
        else:
            gaps = np.diff(np.concatenate([np.array([self._last_ts]), ts]))
            pairs = np.concatenate([np.array([self._last_bulk]), bulk[:-1]]) & bulk
        self._last_ts, self._last_bulk = float(ts[-1]), bool(bulk[-1])
        return gaps[pairs]

    def pass1(self, ts: np.ndarray, nbytes: np.ndarray) -> None:
        if ts.size == 0:
            return
        self.n += int(ts.size)
        self.bytes += int(nbytes.sum())
        gaps = self._bulk_gaps(ts, nbytes)
        self.pairs += int(gaps.size)
        self.gaps.add(gaps)

    def plan(self) -> None:
        """After pass 1: the ranks flows.run_gap_s partitions for."""
        self._last_ts = None
        if self.n >= CADENCE_MIN_GAPS + 1 and self.pairs >= CADENCE_MIN_GAPS:
            m = self.pairs
            self.gaps.want([(m - 1) // 2, int((m - 1) * CADENCE_QUANTILE / 100)])

    def pass3(self, ts: np.ndarray, nbytes: np.ndarray) -> None:
        if ts.size and self.n >= CADENCE_MIN_GAPS + 1 and self.pairs >= CADENCE_MIN_GAPS:
            self.gaps.collect(self._bulk_gaps(ts, nbytes))

    def settle_gap(self) -> None:
        """After pass 3: flows.run_gap_s."""
        if self.n < CADENCE_MIN_GAPS + 1 or self.pairs < CADENCE_MIN_GAPS:
            self.run_gap = self.idle_gap_s
        else:
            m = self.pairs
            median = self.gaps.value((m - 1) // 2)
            cadence = self.gaps.value(int((m - 1) * CADENCE_QUANTILE / 100))
            gap = max(self.idle_gap_s, CADENCE_FACTOR * float(cadence), PACING_PACKETS * float(median))
            self.run_gap = min(gap, MAX_RUN_GAP_S)
        self.gaps = OrderStats(np.float64)  # its counts are no longer needed
        self.runs = _Runs(self.run_gap)

    def pass4(self, ts: np.ndarray) -> None:
        assert self.runs is not None
        self.runs.add(ts)

    def settle_runs(self) -> None:
        assert self.runs is not None
        self.intervals = self.runs.arrays()
        self.runs = None
        starts = self.intervals[0]
        if starts.size > 1 and not bool((starts[1:] > starts[:-1]).all()):
            # flows._bytes_inside binary-searches the starts: only sorted ones give it a meaning to match
            raise Fallback("a stream's busy runs start out of time order")

    def pass5(self, ts: np.ndarray, nbytes: np.ndarray, other: DataStream) -> None:
        starts, ends = other.intervals
        if ts.size == 0 or starts.size == 0:
            return
        j = np.searchsorted(starts, ts, side="right") - 1
        inside = (j >= 0) & (ts <= ends[np.maximum(j, 0)])
        self.bytes_inside_other += int(nbytes[inside].sum())


def duplex(x: DataStream, y: DataStream) -> dict[str, Any]:
    """flows.duplex from two streams whose passes are done."""
    ix, iy = x.intervals, y.intervals
    both, either = _coverage([ix, iy])
    active_x, _ = _coverage([ix])
    active_y = _coverage([iy])[0]
    return duplex_result(both, either, (active_x, active_y),
                         (float(x.bytes_inside_other), float(y.bytes_inside_other)), (float(x.bytes), float(y.bytes)),
                         (x.run_gap, y.run_gap))


# --- directions, connections, hosts ------------------------------------------------------------------------


def _stats_ms(stats: OrderStats) -> dict[str, Any]:
    if stats.n == 0:
        return {"median": None, "p95": None, "n": 0}

    def to_ms(v: Any) -> Any:
        return v / 1e6

    return {"median": np_median(stats, to_ms), "p95": np_percentile(stats, 95, to_ms), "n": int(stats.n)}


def _want_median_p95(stats: OrderStats) -> None:
    if stats.n:
        stats.want(sorted(set(median_ranks(stats.n)) | set(percentile_ranks(stats.n, 95))))


class _Direction:
    def __init__(self, idle_gap_s: float) -> None:
        self.packets = 0
        self.data_packets = 0
        self.payload_bytes = 0
        self.unique = 0
        self.first_ns: int | None = None
        self.last_ns: int | None = None
        self.verdicts = [0] * len(VERDICTS)
        self.idle = _Runs(idle_gap_s, keep_gaps=True)
        self.segment_counts = np.zeros(len(SEGMENT_SIZE_EDGES) - 1, dtype=np.int64)
        self.max_size = 0                    # the largest data segment (turns' control-frame share reads it)
        self.super_segments = 0
        self.pure_acks = 0
        self.piggybacked = 0
        self.raw_max: int | None = None      # raw window, non-SYN rows
        self.raw_positive_max = 0            # raw window over every row (the peer's scale bound reads it)
        self.window = OrderStats(np.int64)
        self.window_min: int | None = None
        self.window_max: int | None = None
        self.in_flight = OrderStats(np.int64)
        self.in_flight_max: int | None = None
        self.rtt = OrderStats(np.int64)
        self.ts_rtt = OrderStats(np.int64)
        self.stream = DataStream(idle_gap_s)
        self.data_descents = _Descents()     # the data packets' times, for the turn analysis' lookups
        self.series: np.ndarray | None = None
        self.first_data_s: float | None = None   # the first and last data packet's time (turns' span)
        self.last_data_s: float | None = None


class _Connection:
    """One connection within one aggregation (the whole capture, or one record phase)."""

    def __init__(self, c: int, idle_gap_s: float) -> None:
        self.c = c
        self.dirs = (_Direction(idle_gap_s), _Direction(idle_gap_s))
        self.t0_ns: int | None = None
        self.t1_ns: int | None = None
        self.turns: _Turns | None = None


class _Host:
    def __init__(self, idle_gap_s: float) -> None:
        self.tx = DataStream(idle_gap_s)
        self.rx = DataStream(idle_gap_s)


class Aggregation:
    """flows.aggregate over the rows of the whole capture, or of one phase's time window, fed by passes."""

    def __init__(self, top: Analysis, window_s: tuple[float, float] | None, whole: bool = False) -> None:
        self.top = top
        self.window_s = window_s
        self.rows = 0
        self.connections: dict[int, _Connection] = {}
        self.hosts: dict[int, _Host] = {}
        self.whole = False
        # capture point (the whole capture only)
        self._point: dict[int, bool] | None = {} if whole else None
        self._point_started = False

    # -- routing -----------------------------------------------------------------------------------------

    def feed(self, number: int, chunk: Chunk, rows: np.ndarray | None) -> None:
        """rows: this aggregation's rows of the chunk (file order), None for all of them."""
        if rows is None:
            conn, direction, count = chunk.conn, chunk.direction, chunk.ts_ns.size
        else:
            conn, direction, count = chunk.conn[rows], chunk.direction[rows], rows.size
        if count == 0:
            return
        if number == 1:
            self.rows += count
            if self._point is not None:
                self._capture_point(chunk, rows)
        empty = np.zeros(0, np.int64)
        if self.top.streamer.nconn == 1:
            both = [np.flatnonzero(direction == 0), np.flatnonzero(direction == 1)]
            groups = {0: both if rows is None else [rows[b] for b in both]}
        else:
            key = conn.astype(np.int64) * 2 + direction
            order = np.argsort(key, kind="stable")
            sorted_key = key[order]
            bounds = np.flatnonzero(np.diff(sorted_key)) + 1
            groups = {}
            for s, e in zip(np.r_[0, bounds], np.r_[bounds, key.size], strict=True):
                k = int(sorted_key[s])
                at = order[s:e] if rows is None else rows[order[s:e]]
                groups.setdefault(k // 2, [empty, empty])[k % 2] = at
        for c, (ab, ba) in groups.items():
            if not ab.size and not ba.size:
                continue
            connection = self.connections.get(c)
            if connection is None:
                if number != 1:
                    raise AssertionError("a connection appeared after pass 1")
                connection = self.connections[c] = _Connection(c, self.top.idle_gap_s)
            self._connection(number, connection, chunk, [ab, ba])
        self._hosts(number, chunk, rows)

    def _capture_point(self, chunk: Chunk, rows: np.ndarray | None) -> None:
        """flows.capture_point: the first packet's two addresses, kept while every packet has them."""
        point = self._point
        assert point is not None
        src = chunk.src_addr if rows is None else chunk.src_addr[rows]
        dst = chunk.dst_addr if rows is None else chunk.dst_addr[rows]
        if not self._point_started:
            self._point_started = True
            for index in {int(src[0]), int(dst[0])}:
                point[index] = True
        for index, alive in point.items():
            if alive and not bool(np.all((src == index) | (dst == index))):
                point[index] = False

    def observed_addresses(self) -> set[str]:
        names = self.top.streamer.addresses
        return {names[index] for index, alive in (self._point or {}).items() if alive}

    # -- connections -------------------------------------------------------------------------------------

    def _connection(self, number: int, conn: _Connection, chunk: Chunk, rows: list[np.ndarray]) -> None:
        ts_all = chunk.ts_ns
        data_rows = []
        for d in (0, 1):
            idx = rows[d]
            data_rows.append(idx[chunk.plen[idx] > 0] if idx.size else idx)
        data_ts = [ts_all[r] / 1e9 for r in data_rows]
        data_size = [chunk.plen[r].astype(np.int64) for r in data_rows]
        if number == 1:
            for d in (0, 1):
                idx = rows[d]
                if idx.size:
                    times = ts_all[idx]
                    lo_ns, hi_ns = int(times.min()), int(times.max())
                    conn.t0_ns = lo_ns if conn.t0_ns is None else min(conn.t0_ns, lo_ns)
                    conn.t1_ns = hi_ns if conn.t1_ns is None else max(conn.t1_ns, hi_ns)
                self._direction1(conn.dirs[d], chunk, idx, data_ts[d], data_size[d])
            return
        if number == 3:
            for d in (0, 1):
                self._direction3(conn, d, chunk, rows[d], data_rows[d], data_ts[d], data_size[d])
        elif number == 4:
            for d in (0, 1):
                self._direction4(conn, d, chunk, rows[d], data_rows[d], data_ts[d])
        elif number == 5:
            for d in (0, 1):
                conn.dirs[d].stream.pass5(data_ts[d], data_size[d], conn.dirs[1 - d].stream)
        assert conn.turns is not None
        conn.turns.feed(number, data_ts, data_size)

    def _direction1(self, out: _Direction, chunk: Chunk, idx: np.ndarray, data_ts: np.ndarray,
                    sizes: np.ndarray) -> None:
        if not idx.size:
            return
        out.packets += int(idx.size)
        if out.first_ns is None:
            out.first_ns = int(chunk.ts_ns[idx[0]])
        out.last_ns = int(chunk.ts_ns[idx[-1]])
        plen, flags = chunk.plen[idx], chunk.flags[idx]
        data = plen > 0
        out.data_packets += int(np.count_nonzero(data))
        out.payload_bytes += int(plen.sum())
        if sizes.size:
            in_range = sizes[sizes <= _EDGES[-1]]
            bins = np.minimum(np.searchsorted(_EDGES, in_range, side="right") - 1, _EDGES.size - 2)
            out.segment_counts += np.bincount(bins, minlength=_EDGES.size - 1)
            out.max_size = max(out.max_size, int(sizes.max()))
            if out.first_data_s is None:
                out.first_data_s = float(data_ts[0])
            out.last_data_s = float(data_ts[-1])
        has_ack = (flags & ACK) != 0
        out.pure_acks += int(np.count_nonzero(has_ack & ~data & ((flags & (SYN | FIN | RST)) == 0)))
        out.piggybacked += int(np.count_nonzero(has_ack & data))
        win = chunk.win[idx]
        not_syn = (flags & SYN) == 0
        if not_syn.any():
            raw = int(win[not_syn].max())
            out.raw_max = raw if out.raw_max is None else max(out.raw_max, raw)
        out.raw_positive_max = max(out.raw_positive_max, int(win.max()))
        out.idle.add(data_ts)
        out.data_descents.add(data_ts)
        out.stream.pass1(data_ts, sizes)

    def _direction3(self, conn: _Connection, d: int, chunk: Chunk, idx: np.ndarray, data_rows: np.ndarray,
                    data_ts: np.ndarray, sizes: np.ndarray) -> None:
        out = conn.dirs[d]
        st = chunk.state
        assert st is not None
        if idx.size:
            out.unique += int(st["new_bytes"][idx].sum())
            for k, name in enumerate(VERDICTS):
                out.verdicts[k] += int(np.count_nonzero(st[name][idx]))
        self._order_stats(conn, d, chunk, idx, data_rows, add=True)
        if data_rows.size:
            mss = self.top.streamer.mss_of(conn.c, d) or DEFAULT_MSS
            out.super_segments += int(np.count_nonzero(sizes > mss))
            if self.top.with_series:
                assert out.series is not None
                t0, _t1, bin_s, bins = self._bins(conn)
                scaled = np.subtract(data_ts, t0)
                np.divide(scaled, bin_s, out=scaled)
                index = scaled.astype(np.int64)
                np.minimum(index, bins - 1, out=index)
                out.series += np.bincount(index, weights=sizes.astype(np.float64), minlength=bins)
        out.stream.pass3(data_ts, sizes)

    def _rtts(self, conn: _Connection, d: int, st: dict[str, np.ndarray], idx: np.ndarray, add: bool) -> None:
        """ACK and timestamp RTTs on d's packets measure the other direction's data."""
        target = conn.dirs[1 - d]
        # flows._direction: over the whole capture a direction that never sent data has no ACK RTTs
        if not (self.whole and target.data_packets == 0):
            rtt = st["ack_rtt_ns"][idx]
            rtt = rtt[rtt >= 0]
            if rtt.size:
                (target.rtt.add if add else target.rtt.collect)(rtt)
        ts_rtt = st["ts_rtt_ns"][idx]
        ts_rtt = ts_rtt[ts_rtt >= 0]
        if ts_rtt.size:
            (target.ts_rtt.add if add else target.ts_rtt.collect)(ts_rtt)

    def _direction4(self, conn: _Connection, d: int, chunk: Chunk, idx: np.ndarray, data_rows: np.ndarray,
                    data_ts: np.ndarray) -> None:
        self._order_stats(conn, d, chunk, idx, data_rows, add=False)
        conn.dirs[d].stream.pass4(data_ts)

    def _order_stats(self, conn: _Connection, d: int, chunk: Chunk, idx: np.ndarray, data_rows: np.ndarray,
                     add: bool) -> None:
        """The values of the window, in-flight and RTT order statistics: counted (pass 3, with their minimum
        and maximum) or collected (pass 4)."""
        out = conn.dirs[d]
        st = chunk.state
        assert st is not None
        if idx.size:
            not_syn = (chunk.flags[idx] & SYN) == 0
            win = st["window_bytes"][idx][not_syn]
            if win.size and add:
                out.window.add(win.astype(np.int64))
                low, high = int(win.min()), int(win.max())
                out.window_min = low if out.window_min is None else min(out.window_min, low)
                out.window_max = high if out.window_max is None else max(out.window_max, high)
            elif win.size:
                out.window.collect(win.astype(np.int64))
            self._rtts(conn, d, st, idx, add)
        if data_rows.size:
            flight = st["in_flight"][data_rows]
            flight = flight[flight >= 0]
            if flight.size and add:
                out.in_flight.add(flight)
                high = int(flight.max())
                out.in_flight_max = high if out.in_flight_max is None else max(out.in_flight_max, high)
            elif flight.size:
                out.in_flight.collect(flight)

    def _bins(self, conn: _Connection) -> tuple[float, float, float, int]:
        t0, t1 = self._span_s(conn)
        bin_s = self.top.bin_s
        bins = max(1, int(np.ceil((t1 - t0) / bin_s + 1e-9)))
        if bins > MAX_BINS:
            bin_s = (t1 - t0) / MAX_BINS
            bins = MAX_BINS
        return t0, t1, bin_s, bins

    @staticmethod
    def _span_s(conn: _Connection) -> tuple[float, float]:
        assert conn.t0_ns is not None and conn.t1_ns is not None
        return float(conn.t0_ns) / 1e9, float(conn.t1_ns) / 1e9

    # -- hosts -------------------------------------------------------------------------------------------

    def _hosts(self, number: int, chunk: Chunk, rows: np.ndarray | None) -> None:
        if number == 2:
            return
        data = np.flatnonzero(chunk.plen > 0) if rows is None else rows[chunk.plen[rows] > 0]
        if not data.size:
            return
        ts = chunk.ts_ns[data] / 1e9
        nbytes = chunk.plen[data].astype(np.int64)
        src, dst = chunk.src_addr[data], chunk.dst_addr[data]
        naddresses = len(self.top.streamer.addresses)
        present = np.flatnonzero(np.bincount(src, minlength=naddresses) + np.bincount(dst, minlength=naddresses))
        for index in present.tolist():
            host = self.hosts.get(index)
            if host is None:
                if number != 1:
                    raise AssertionError("a host appeared after pass 1")
                host = self.hosts[index] = _Host(self.top.idle_gap_s)
            pairs = [(host.tx, src == index)]
            if host.rx is not host.tx:  # one address (loopback): one stream both ways, as flows.duplex has it
                pairs.append((host.rx, dst == index))
            for stream, mask in pairs:
                t, b = (ts, nbytes) if mask.all() else (ts[mask], nbytes[mask])
                if number == 1:
                    stream.pass1(t, b)
                elif number == 3:
                    stream.pass3(t, b)
                elif number == 4:
                    stream.pass4(t)
                elif number == 5:
                    stream.pass5(t, b, host.rx if stream is host.tx else host.tx)

    # -- between passes ----------------------------------------------------------------------------------

    def settle(self, number: int) -> None:
        """What one pass's end decides for the next."""
        if number == 1 and len(self.top.streamer.addresses) == 1:
            for host in self.hosts.values():
                host.rx = host.tx  # every data packet is the one host's, sent and received: computed once
        streams = [s for conn in self.connections.values() for s in (conn.dirs[0].stream, conn.dirs[1].stream)]
        streams += [s for host in self.hosts.values() for s in ((host.tx,) if host.rx is host.tx else (host.tx, host.rx))]
        if number == 1:
            self.whole = self.rows == self.top.streamer.rows
            for stream in streams:
                stream.plan()
            for conn in self.connections.values():
                if self.top.with_series:
                    bins = self._bins(conn)[3]
                    for direction in conn.dirs:
                        direction.series = np.zeros(bins)
                conn.turns = _Turns(self, conn)
        elif number == 3:
            for stream in streams:
                stream.settle_gap()
            for conn in self.connections.values():
                for direction in conn.dirs:
                    for stats in (direction.rtt, direction.ts_rtt, direction.in_flight):
                        _want_median_p95(stats)
                    if direction.window.n:
                        direction.window.want(median_ranks(direction.window.n))
                assert conn.turns is not None
                conn.turns.settle3()
        elif number == 4:
            for stream in streams:
                stream.settle_runs()
            for conn in self.connections.values():
                assert conn.turns is not None
                conn.turns.settle4()
        elif number == 5:
            for conn in self.connections.values():
                assert conn.turns is not None
                conn.turns.settle5()

    # -- the JSON ----------------------------------------------------------------------------------------

    def result(self, observed: set[str] | None = None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """The connections and hosts; observed: the addresses whose NIC the capture sees (None: this
        aggregation's own capture point, for the whole capture)."""
        if self.rows == 0:
            return [], []
        connections = [self._connection_json(self.connections[c]) for c in sorted(self.connections)]
        return connections, self._hosts_json(self.observed_addresses() if observed is None else observed)

    def _direction_json(self, conn: _Connection, d: int, t0: float) -> dict[str, Any]:
        top = self.top
        out = conn.dirs[d]
        c = conn.c
        first_ts = float(np.int64(out.first_ns) / 1e9) if out.first_ns is not None else None
        last_ts = float(np.int64(out.last_ns) / 1e9) if out.last_ns is not None else None
        span = (last_ts - first_ts) if first_ts is not None and last_ts is not None else 0.0
        starts, ends = out.idle.arrays()
        active_s = float((ends - starts).sum())
        idle = out.idle.idle_gaps()
        mss_known = top.streamer.mss_of(c, d)
        scale = int(top.streamer.wscale[c, d])
        peer = conn.dirs[1 - d]
        scale_lower_bound = None
        if scale < 0 and out.in_flight.n and peer.raw_positive_max > 0:
            assert out.in_flight_max is not None
            ratio = float(out.in_flight_max) / float(peer.raw_positive_max)
            scale_lower_bound = max(0, int(np.ceil(np.log2(ratio)))) if ratio > 1 else 0
        unique = out.unique
        window_median = np_median(out.window) if out.window.n else None
        flight = out.in_flight
        result: dict[str, Any] = {
            "packets": out.packets,
            "data_packets": out.data_packets,
            "payload_bytes": out.payload_bytes,
            "unique_payload_bytes": unique,
            **{key: out.verdicts[k] for k, key in enumerate(VERDICT_KEYS)},
            "first_ts": first_ts,
            "last_ts": last_ts,
            "goodput_Bps": unique / span if span > 0 else 0.0,
            "active_s": active_s,
            "active_goodput_Bps": unique / active_s if active_s > 0 else 0.0,
            "rtt_ms": _stats_ms(out.rtt),
            "ts_rtt_ms": _stats_ms(out.ts_rtt),
            "idle_gaps": {"threshold_s": top.idle_gap_s, "count": int(idle.size), "total_s": float(idle.sum()),
                          "max_s": float(idle.max()) if idle.size else 0.0},
            "segment_sizes": {
                "edges": SEGMENT_SIZE_EDGES,
                "counts": out.segment_counts.tolist(),
                "max_bytes": out.max_size,
                "mss": mss_known or None,
                "super_segments": out.super_segments,
            },
            "window": {
                "scale": scale if scale >= 0 else None,
                "scale_lower_bound": scale_lower_bound,
                "min_bytes": out.window_min,
                "median_bytes": window_median,
                "max_bytes": out.window_max,
                "raw_max": out.raw_max,
            },
            "bytes_in_flight": {
                "median": np_median(flight) if flight.n else None,
                "p95": np_percentile(flight, 95) if flight.n else None,
                "max": out.in_flight_max,
            },
            "acks": {"pure": out.pure_acks, "piggybacked": out.piggybacked},
            "syn_seen": bool(top.streamer.syn_seen[c][d]),
        }
        if top.with_series:
            assert out.series is not None
            bin_s = self._bins(conn)[2]
            result["throughput"] = {"bin_s": bin_s, "t0": t0,
                                    "Bps": [round(float(v) / bin_s, 1) for v in out.series]}
        return result

    def _connection_json(self, conn: _Connection) -> dict[str, Any]:
        streamer = self.top.streamer
        t0 = self._span_s(conn)[0]
        dirs = {"a->b": self._direction_json(conn, 0, t0), "b->a": self._direction_json(conn, 1, t0)}
        dup = duplex(conn.dirs[0].stream, conn.dirs[1].stream)
        rtts = tuple(median_s(dirs[name]["rtt_ms"]) for name in DIRECTIONS)
        assert conn.turns is not None
        turns = conn.turns.json((dup["x_active_s"], dup["y_active_s"]), dup["overlap_s"], dup["active_s"], rtts)
        return connection_json(conn.c, _endpoint(streamer.endpoints, streamer.connections.conn_a[conn.c]),
                               _endpoint(streamer.endpoints, streamer.connections.conn_b[conn.c]), dirs, dup, turns)

    def _hosts_json(self, observed: set[str]) -> list[dict[str, Any]]:
        names = self.top.streamer.addresses
        hosts = []
        for index in sorted(self.hosts, key=lambda i: names[i]):
            host = self.hosts[index]
            hosts.append(host_json(names[index], host.tx.bytes, host.rx.bytes, duplex(host.tx, host.rx),
                                   names[index] in observed))
        return hosts


# --- turns ------------------------------------------------------------------------------------------------


class _Descents:
    """Where a sequence (file order) steps down: each a[i] < a[i-1] as the closed range [a[i], a[i-1]].

    numpy's binary search over a sequence that is not sorted lands on one of several places only for a
    value inside such a range; elsewhere the values below it form a prefix of the sequence and the search
    has one answer (_Searcher finds it). Captures step back now and then (tcpdump on several CPUs), by
    microseconds."""

    LIMIT = 4096

    def __init__(self) -> None:
        self.last: float | None = None
        self.low: list[float] = []
        self.high: list[float] = []
        self._ranges: tuple[np.ndarray, np.ndarray] | None = None

    def add(self, values: np.ndarray) -> None:
        if not values.size:
            return
        base = values if self.last is None else np.concatenate([np.array([self.last]), values])
        down = np.flatnonzero(base[1:] < base[:-1])
        if down.size:
            self.low.extend(base[down + 1].tolist())
            self.high.extend(base[down].tolist())
            if len(self.low) > self.LIMIT:
                raise Fallback("the capture's timestamps step back too often")
        self.last = float(values[-1])

    def check(self, queries: np.ndarray) -> None:
        """Fallback when a query lies where the binary search could land in more than one place."""
        if not self.low or not queries.size:
            return
        if self._ranges is None:
            order = np.argsort(self.low, kind="stable")
            low, high = np.array(self.low)[order], np.maximum.accumulate(np.array(self.high)[order])
            self._ranges = (low, high)
        low, high = self._ranges
        j = np.searchsorted(low, queries, side="right") - 1
        if bool(np.any((j >= 0) & (queries <= high[np.maximum(j, 0)]))):
            raise Fallback("a time the turn analysis looks up lies where the capture steps back")


@dataclass
class _Answers:
    """Queries answered by _Searcher: for each, r (numpy's searchsorted index) and the elements around it."""

    tags: np.ndarray
    q: np.ndarray
    r: np.ndarray
    has_prev: np.ndarray
    prev: np.ndarray
    prev_payload: np.ndarray   # (k, width) int64
    has_next: np.ndarray
    next: np.ndarray


class _Searcher:
    """np.searchsorted(a, q, side) where the array a and the queries q both arrive in file order, in chunks.

    When a's values below q (side "left") or up to q ("right") form a prefix of a -- always for sorted a,
    and otherwise outside _Descents' ranges -- the binary search lands on r, the first index whose value
    passes q: the first index where a's running maximum does. A query is answered once r is in sight
    (the running maximum passes it), with a[r-1] (and its payload) and a[r]; the rest wait for later chunks,
    and finish() answers them with r = len(a). The last TAIL elements stay at hand for a[r-1]."""

    TAIL = 256

    def __init__(self, side: str, width: int = 0) -> None:
        self.side = side
        self.width = width
        self.before = 0                      # elements dropped from the tail
        self.max_before = -math.inf
        self.last_before: tuple[float, np.ndarray] | None = None
        self.tail = np.zeros(0)
        self.tail_payload = np.zeros((0, width), dtype=np.int64)
        self.pending = np.zeros(0)
        self.pending_tags = np.zeros(0, dtype=np.int64)

    def _passes(self, top: np.ndarray | float, q: np.ndarray) -> np.ndarray:
        return np.asarray(top > q) if self.side == "right" else np.asarray(top >= q)

    def step(self, values: np.ndarray, queries: np.ndarray, tags: np.ndarray,
             payload: np.ndarray | None = None) -> _Answers:
        q = np.concatenate([self.pending, queries]) if self.pending.size else queries
        t = np.concatenate([self.pending_tags, tags]) if self.pending_tags.size else tags
        known = np.concatenate([self.tail, values]) if self.tail.size else values
        known_payload = (np.concatenate([self.tail_payload, payload]) if payload is not None
                         else np.zeros((known.size, self.width), dtype=np.int64))
        if q.size and bool(self._passes(self.max_before, q).any()):
            raise Fallback("a looked-up time lies before the part of the capture still in view")
        running = np.maximum.accumulate(known) if known.size else known
        r_local = np.searchsorted(running, q, side=self.side)
        found = r_local < known.size
        answers = self._answers(t[found], q[found], r_local[found], known, known_payload,
                                np.ones(int(found.sum()), bool))
        self.pending, self.pending_tags = q[~found], t[~found]
        if known.size > self.TAIL:
            cut = known.size - self.TAIL
            self.max_before = max(self.max_before, float(known[:cut].max()))
            self.last_before = (float(known[cut - 1]), known_payload[cut - 1].copy())
            self.before += cut
            known, known_payload = known[cut:], known_payload[cut:]
        self.tail, self.tail_payload = known.copy(), known_payload.copy()
        return answers

    def _answers(self, tags: np.ndarray, q: np.ndarray, r_local: np.ndarray, known: np.ndarray,
                 known_payload: np.ndarray, has_next: np.ndarray) -> _Answers:
        has_prev = (r_local >= 1) | ((r_local == 0) & (self.last_before is not None))
        prev = np.zeros(r_local.size)
        prev_payload = np.zeros((r_local.size, self.width), dtype=np.int64)
        inside = r_local >= 1
        prev[inside] = known[r_local[inside] - 1]
        prev_payload[inside] = known_payload[r_local[inside] - 1]
        if self.last_before is not None:
            at_start = r_local == 0
            prev[at_start] = self.last_before[0]
            prev_payload[at_start] = self.last_before[1]
        nxt = np.zeros(r_local.size)
        nxt[has_next] = known[r_local[has_next]]
        return _Answers(tags, q, self.before + r_local, has_prev, prev, prev_payload, has_next, nxt)

    def finish(self) -> _Answers:
        """The queries never passed: r = len(a)."""
        r_local = np.full(self.pending.size, self.tail.size, dtype=np.int64)
        answers = self._answers(self.pending_tags, self.pending, r_local, self.tail, self.tail_payload,
                                np.zeros(self.pending.size, bool))
        self.pending = np.zeros(0)
        self.pending_tags = np.zeros(0, dtype=np.int64)
        return answers


@dataclass
class _Candidate:
    """A start of y's bulk data after a silence long enough to be a turn (turns._handoffs)."""

    start: float
    previous: float
    silence: float
    trigger: int = -1          # searchsorted(tx, start, "right") - 1
    trigger_t: float = 0.0
    trigger_bytes: int = 0
    trigger_cum: int = 0
    next_t: float | None = None
    before: int = -1           # searchsorted(tx, previous, "right") - 1
    before_cum: int = 0


class _Turns:
    """turns.connection_turns, streamed: one connection within one aggregation."""

    def __init__(self, aggregation: Aggregation, conn: _Connection) -> None:
        self.aggregation = aggregation
        self.conn = conn
        dirs = conn.dirs
        self.largest = float(max(d.max_size for d in dirs))  # 0 where neither direction sent data
        self.t_first = min((d.first_data_s for d in dirs if d.first_data_s is not None), default=0.0)
        self.t_last = max((d.last_data_s for d in dirs if d.last_data_s is not None), default=0.0)
        window = aggregation.window_s
        self.start = window[0] if window else self.t_first
        self.span = max(self.t_last - self.t_first, 0.0)
        self.bulk_bytes = [0, 0]
        self.first_bulk: list[float | None] = [None, None]
        self.bulk_seen = [0, 0]
        self.control = [0, 0]
        self.preamble = [0, 0]
        self.bulk_descents = [_Descents(), _Descents()]
        self.gap = (0.0, 0.0)
        self.threshold = [0.0, 0.0]
        # pass 4 and 5
        self.candidates: list[list[_Candidate]] = [[], []]   # [y]: y's bulk starts after a silence
        self._prev_bulk: list[float | None] = [None, None]
        self.after_own = [0, 0]
        self.peer_next = [OrderStats(np.float64), OrderStats(np.float64)]
        self._own: list[_Searcher] = []
        self._peer: list[_Searcher] = []
        self._tx: list[_Searcher] = []
        self._queued = [False, False]
        self._cum = [0, 0]

    def _bulk(self, sizes: np.ndarray) -> np.ndarray:
        return (sizes > CONTROL_MAX_BYTES) | (sizes > CONTROL_MAX_SHARE * self.largest)

    def feed(self, number: int, ts: list[np.ndarray], sizes: list[np.ndarray]) -> None:
        if number == 3:
            for d in (0, 1):
                if not ts[d].size:
                    continue
                bulk = self._bulk(sizes[d])
                self.bulk_bytes[d] += int(sizes[d][bulk].sum())
                nbulk = int(np.count_nonzero(bulk))
                if nbulk and self.first_bulk[d] is None:
                    self.first_bulk[d] = float(ts[d][int(np.argmax(bulk))])
                self.bulk_seen[d] += nbulk
                self.bulk_descents[d].add(ts[d][bulk])
                self.control[d] += int(ts[d].size - nbulk)
                self.preamble[d] += int(np.count_nonzero(sizes[d][~bulk] % GLOO_PREAMBLE_BYTES == 0))
            return
        bulk_mask = [self._bulk(sizes[d]) for d in (0, 1)]
        bulk_ts = [ts[d][bulk_mask[d]] for d in (0, 1)]
        small_ts = [ts[d][~bulk_mask[d]] for d in (0, 1)]
        if number == 4:
            for y in (0, 1):
                self._candidates(y, bulk_ts[y])
        for d in (0, 1):
            self._control(number, d, small_ts[d], bulk_ts[d], bulk_ts[1 - d])
        if number == 5:
            for x in (0, 1):
                self._locate(x, ts[x], sizes[x])

    def settle3(self) -> None:
        self.gap = (self.conn.dirs[0].stream.run_gap, self.conn.dirs[1].stream.run_gap)
        self.threshold = [max(self.gap[y], TURN_MIN_SILENCE_FRACTION * self.span) for y in (0, 1)]
        self._searchers()

    def _searchers(self) -> None:
        self._own = [_Searcher("left"), _Searcher("left")]
        self._peer = [_Searcher("right"), _Searcher("right")]

    def _candidates(self, y: int, bulk: np.ndarray) -> None:
        if not bulk.size:
            return
        first = self._prev_bulk[y] if self._prev_bulk[y] is not None else self.start
        previous = np.concatenate([np.array([first]), bulk[:-1]])
        silence = bulk - previous
        for i in np.flatnonzero(silence >= self.threshold[y]).tolist():
            self.candidates[y].append(_Candidate(float(bulk[i]), float(previous[i]), float(silence[i])))
        self._prev_bulk[y] = float(bulk[-1])

    def _control(self, number: int, d: int, small: np.ndarray, own_bulk: np.ndarray, peer_bulk: np.ndarray) -> None:
        """turns._control_frames: the after-own-burst count (pass 4) and the time from each control frame to
        the peer's next bulk data (counted in pass 4, resolved in pass 5)."""
        if self.control[d] == 0:
            return
        tags = np.zeros(small.size, dtype=np.int64)
        if number == 4:
            self.bulk_descents[d].check(small)
            self._after_own(d, self._own[d].step(own_bulk, small, tags))
        self.bulk_descents[1 - d].check(small)
        self._peer_values(number, d, self._peer[d].step(peer_bulk, small, tags))

    def _after_own(self, d: int, answers: _Answers) -> None:
        """k = r - 1 >= 0 and the frame within the own run gap of a[k]."""
        ok = answers.r >= 1
        close = answers.q[ok] - answers.prev[ok] <= self.gap[d]
        self.after_own[d] += int(np.count_nonzero(close))

    def _peer_values(self, number: int, d: int, answers: _Answers) -> None:
        values = answers.next[answers.has_next] - answers.q[answers.has_next]
        if values.size:
            (self.peer_next[d].add if number == 4 else self.peer_next[d].collect)(values)

    def settle4(self) -> None:
        for d in (0, 1):
            if self.control[d]:
                self._after_own(d, self._own[d].finish())
                self._peer[d].finish()
            if self.peer_next[d].n:
                self.peer_next[d].want(median_ranks(self.peer_next[d].n))
        self._searchers()
        self._tx = [_Searcher("right", width=2), _Searcher("right", width=2)]
        self._queued = [False, False]  # y's candidate times go to x's searcher with x's first chunk

    def _locate(self, x: int, tx: np.ndarray, bx: np.ndarray) -> None:
        """Pass 5: where y's candidate times fall among x's data packets (turns._handoffs' searchsorted)."""
        candidates = self.candidates[1 - x]
        if not candidates:
            return
        if not self._queued[x]:
            self._queued[x] = True
            queries = np.array([t for c in candidates for t in (c.start, c.previous)])
            self.conn.dirs[x].data_descents.check(queries)
            tags = np.arange(queries.size, dtype=np.int64)
        else:
            queries, tags = np.zeros(0), np.zeros(0, dtype=np.int64)
        cum = self._cum[x] + np.cumsum(bx)
        if bx.size:
            self._cum[x] = int(cum[-1])
        self._handoff_answers(x, self._tx[x].step(tx, queries, tags, np.stack([cum, bx], axis=1)
                                                   if bx.size else np.zeros((0, 2), dtype=np.int64)))

    def _handoff_answers(self, x: int, answers: _Answers) -> None:
        candidates = self.candidates[1 - x]
        for k, tag in enumerate(answers.tags.tolist()):
            candidate = candidates[tag // 2]
            r = int(answers.r[k])
            if tag % 2 == 0:
                candidate.trigger = r - 1
                if answers.has_prev[k] and r >= 1:
                    candidate.trigger_t = float(answers.prev[k])
                    candidate.trigger_cum, candidate.trigger_bytes = (int(v) for v in answers.prev_payload[k])
                candidate.next_t = float(answers.next[k]) if answers.has_next[k] else None
            else:
                candidate.before = r - 1
                if answers.has_prev[k] and r >= 1:
                    candidate.before_cum = int(answers.prev_payload[k][0])

    def settle5(self) -> None:
        for x in (0, 1):
            if self._tx and self.candidates[1 - x]:
                self._handoff_answers(x, self._tx[x].finish())
            if self.control[x]:
                self._peer[x].finish()

    def _handoffs(self, x: int, rtt_x: float | None) -> list[dict[str, Any]]:
        y = 1 - x
        dirs = self.conn.dirs
        if self.bulk_seen[y] == 0 or dirs[x].first_data_s is None or not self.candidates[y]:
            return []
        total = float(self._cum[x])
        events = []
        limit_floor = max(HANDOFF_MAX_RTT * (rtt_x or 0.0), HANDOFF_FLOOR_S)
        for candidate in self.candidates[y]:
            if candidate.trigger < 0:
                continue
            cum_trigger = float(candidate.trigger_cum)
            sent_during = cum_trigger - (float(candidate.before_cum) if candidate.before >= 0 else 0.0)
            start = np.float64(candidate.start)
            delay = start - np.float64(candidate.trigger_t)
            limit = np.maximum(limit_floor, HANDOFF_SILENCE_SHARE * np.float64(candidate.silence))
            if not (sent_during >= BURST_MIN_BYTES and delay <= limit):
                continue
            continues = candidate.next_t is not None and np.float64(candidate.next_t) - start <= self.gap[x]
            events.append({
                "from": DIRECTIONS[x],
                "t": float(start),
                "delay_s": float(delay),
                "delay_rtt": float(delay / rtt_x) if rtt_x else None,
                "trigger_bytes": int(candidate.trigger_bytes),
                "trigger_offset_bytes": int(cum_trigger),
                "trigger_offset_fraction": float(cum_trigger / total) if total > 0 else None,
                "burst_bytes": int(sent_during),
                "follower_silence_s": float(candidate.silence),
                "sender_continues": bool(continues),
            })
        return events

    def _control_json(self, d: int) -> dict[str, Any]:
        if self.control[d] == 0:
            return {"count": 0, "preamble_multiples": 0, "after_own_burst": 0, "peer_data_next_ms": None}
        stats = self.peer_next[d]
        peer_next_ms = float(np_median(stats) * 1e3) if stats.n else None
        return {"count": self.control[d], "preamble_multiples": self.preamble[d],
                "after_own_burst": self.after_own[d], "peer_data_next_ms": peer_next_ms}

    def json(self, busy_s: tuple[float, float], both: float, either: float,
             rtt_s: tuple[float | None, ...]) -> dict[str, Any]:
        out = turns_summary(self.span, busy_s, both, either, self.first_bulk, self.bulk_bytes)
        events: list[dict[str, Any]] = []
        for x in (0, 1):
            events.extend(self._handoffs(x, rtt_s[x]))
        return finish_turns(out, events, [self._control_json(d) for d in (0, 1)])


# --- the whole analysis ------------------------------------------------------------------------------------


class Analysis:
    """The aggregations of one file (the whole capture and each record phase) and the passes that feed them."""

    def __init__(self, path: str | os.PathLike[str], records: Sequence[str | os.PathLike[str]] | None,
                 bin_s: float, idle_gap_s: float, with_series: bool, spill_window: int = SPILL_WINDOW) -> None:
        self.path = path
        self.bin_s = bin_s
        self.idle_gap_s = idle_gap_s
        self.with_series = with_series
        self.streamer = Streamer(path, spill_window)
        self.whole = Aggregation(self, None, whole=True)
        self.phases = phases_from_records(records) if records else []
        self.phase_aggs = [Aggregation(self, (p["t_start_ns"] / 1e9, p["t_end_ns"] / 1e9)) for p in self.phases]

    def run(self) -> dict[str, Any]:
        streamer = self.streamer
        streamer.run(1, self._feeder(1))
        for agg in (self.whole, *self.phase_aggs):
            agg.settle(1)
        streamer.handshake_rtts()
        for number, with_state in ((3, True), (4, True), (5, False)):
            streamer.run(number, self._feeder(number), with_state=with_state)
            for agg in (self.whole, *self.phase_aggs):
                agg.settle(number)
        return self._document()

    def _phases_feeder(self, number: int) -> Callable[[Chunk], None]:
        starts = np.array([p["t_start_ns"] for p in self.phases], dtype=np.int64)
        ends = np.array([p["t_end_ns"] for p in self.phases], dtype=np.int64)

        def feed(chunk: Chunk) -> None:
            ts = chunk.ts_ns
            if not ts.size:
                return
            ordered = bool((ts[1:] >= ts[:-1]).all())
            first, last = (int(ts[0]), int(ts[-1])) if ordered else (int(ts.min()), int(ts.max()))
            for i in np.flatnonzero((starts <= last) & (ends >= first)).tolist():
                # flows.analyze: the rows whose time lies in the window, in file order
                if ordered:
                    lo = int(np.searchsorted(ts, starts[i], side="left"))
                    hi = int(np.searchsorted(ts, ends[i], side="right"))
                    rows = np.arange(lo, hi)
                else:
                    rows = np.flatnonzero((ts >= starts[i]) & (ts <= ends[i]))
                self.phase_aggs[i].feed(number, chunk, rows)

        return feed

    def _feeder(self, number: int) -> Callable[[Chunk], None]:
        phases = self._phases_feeder(number) if self.phase_aggs else None

        def feed(chunk: Chunk) -> None:
            self.whole.feed(number, chunk, None)
            if phases is not None:
                phases(chunk)

        return feed

    def _document(self) -> dict[str, Any]:
        result = self.streamer.result
        assert result is not None
        connections, hosts = self.whole.result()
        observed = {host["address"] for host in hosts if host["nic_observed"]}
        phases_out = []
        attributed = 0
        for phase, agg in zip(self.phases, self.phase_aggs, strict=True):
            conns, hs = agg.result(observed)
            attributed += agg.rows
            phases_out.append({"phase": phase, "packets": int(agg.rows), "connections": conns, "hosts": hs})
        extra = [NO_PHASE_PACKETS] if self.phases and attributed == 0 and self.streamer.rows else []
        return document([self.path], [result], [self.streamer.rows], connections, hosts, observed, phases_out,
                        extra, self.bin_s, self.idle_gap_s)


def analyze_streaming(path: str | os.PathLike[str], records: Sequence[str | os.PathLike[str]] | None = None,
                      bin_s: float = 0.01, idle_gap_s: float = 0.002, with_series: bool = True,
                      spill_window: int = SPILL_WINDOW) -> dict[str, Any]:
    """The `diag analyze --json` object of one capture file in bounded memory (see the module docstring).

    spill_window: the segment ends a direction's TCP state keeps in memory (the rest go to a temporary
    file). Raises Fallback where the file cannot be streamed to the in-memory result."""
    return Analysis(path, records, bin_s, idle_gap_s, with_series, spill_window).run()



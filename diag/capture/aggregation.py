"""The one aggregation: per-connection, per-direction and per-host numbers of `diag analyze`, fed chunk by
chunk by the passes over a packet source (source.Pass), for the whole capture or one record phase's window.

Counts follow tshark's tcp.analysis definitions (docs/analyzer.md). Order statistics (medians, 95th
percentiles of RTTs, windows, bytes in flight) are exact: counted in one pass, their values collected in the
next (quantile.OrderStats). Sums of bytes are whole numbers, so they are exact in any order.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from diag.capture import schema
from diag.capture.busy import BusyRuns, DataStream, duplex, flight_events, p95_s, round_trip_s, stall_limit_s
from diag.capture.document import (
    DEFAULT_MSS,
    MAX_BINS,
    SEGMENT_SIZE_EDGES,
    connection_document,
    direction_document,
    endpoint_text,
    host_document,
    median_s,
    size_histogram,
)
from diag.capture.pcapfile import ACK, FIN, RST, SYN
from diag.capture.quantile import OrderStats, median_ranks, percentile_ranks
from diag.capture.schema import DIRECTIONS
from diag.capture.source import VERDICTS, Chunk, Pass
from diag.capture.turns import Turns

if TYPE_CHECKING:
    from diag.capture.analysis import Analysis


def _want_median_p95(stats: OrderStats) -> None:
    if stats.n:
        stats.want(sorted(set(median_ranks(stats.n)) | set(percentile_ranks(stats.n, 95))))


class Direction:
    def __init__(self, idle_gap_s: float, mss: int) -> None:
        self.packets = 0
        self.data_packets = 0
        self.payload_bytes = 0
        self.unique = 0
        self.first_ns: int | None = None
        self.last_ns: int | None = None
        self.verdicts = [0] * len(VERDICTS)
        self.idle = BusyRuns(idle_gap_s, keep_gaps=True)
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
        self.stream = DataStream(idle_gap_s, mss)
        self.series: np.ndarray | None = None
        self.first_data_s: float | None = None   # the first and last data packet's time (turns' span)
        self.last_data_s: float | None = None


class Connection:
    """One connection within one aggregation (the whole capture, or one record phase)."""

    def __init__(self, c: int, idle_gap_s: float, mss: tuple[int, int]) -> None:
        self.c = c
        self.dirs = (Direction(idle_gap_s, mss[0]), Direction(idle_gap_s, mss[1]))
        self.t0_ns: int | None = None
        self.t1_ns: int | None = None
        self.turns: Turns | None = None


@dataclass
class Side:
    """One direction of one connection in one feed: its rows, and its data packets' rows, times (s), sizes."""

    rows: np.ndarray
    data: np.ndarray
    ts: np.ndarray
    sizes: np.ndarray
    mask: np.ndarray | None = None  # rows as a mask over the chunk (a capture of one connection)

    @classmethod
    def of(cls, chunk: Chunk, rows: np.ndarray) -> Side:
        data = rows[chunk.plen[rows] > 0] if rows.size else rows
        return cls(rows, data, chunk.ts_ns[data] / 1e9, chunk.plen[data].astype(np.int64))


_EMPTY = np.zeros(0, np.int64)
# Work items (a chunk's hosts, one connection's data packets or order statistics' values) that may wait for
# the helper thread.
MAX_BESIDE = 16
Values = tuple[OrderStats, np.ndarray]


def _order_values(values: list[Values], add: bool) -> None:
    """Values to their order statistics: counted (pass 1) or collected (pass 2); empty ones skipped."""
    for stats, array in values:
        if array.size:
            (stats.add if add else stats.collect)(array)


def _samples(column: np.ndarray, side: Side) -> np.ndarray:
    """A column's values of at least 0 on the side's rows (file order): the RTT samples it holds."""
    if side.mask is not None:  # mostly -1: one compress of the few samples instead of a gather of every row
        return column[side.mask & (column >= 0)]
    values = column[side.rows]
    return values[values >= 0]


class Host:
    def __init__(self, idle_gap_s: float) -> None:
        self.tx = DataStream(idle_gap_s)
        self.rx = DataStream(idle_gap_s)


class Aggregation:
    """The connections and hosts over the rows of the whole capture, or of one phase's time window."""

    def __init__(self, top: Analysis, window_s: tuple[float, float] | None, capture_point: bool = False) -> None:
        self.top = top
        self.window_s = window_s
        self.rows = 0
        self.connections: dict[int, Connection] = {}
        self.hosts: dict[int, Host] = {}
        self.all_rows = False  # this aggregation's rows are every row of the capture
        # the capture point (the whole capture's aggregation only)
        self._point: dict[int, bool] | None = {} if capture_point else None
        self._point_started = False
        self._pending: deque[Future[None]] = deque()  # work on the helper thread (_beside)

    # -- routing -----------------------------------------------------------------------------------------

    def feed(self, step: Pass, chunk: Chunk, rows: np.ndarray | None) -> None:
        """rows: this aggregation's rows of the chunk (file order), None for all of them."""
        count = chunk.ts_ns.size if rows is None else rows.size
        if count == 0:
            return
        if step is Pass.COUNTS:
            self.rows += count
            if self._point is not None:
                self._capture_point(chunk, rows)
        # The data packets, found once for the hosts and the connections.
        data = np.flatnonzero(chunk.plen > 0) if rows is None else rows[chunk.plen[rows] > 0]
        data_ts = chunk.ts_ns[data] / 1e9
        data_bytes = chunk.plen[data].astype(np.int64)
        # Each data packet's connection's MSS, where the cadence may cut a super-segment into segments
        data_mss = None
        if step in (Pass.COUNTS, Pass.CADENCE) and data.size and int(data_bytes.max()) > DEFAULT_MSS:
            data_mss = self.top.streamer.mss[chunk.conn[data], chunk.direction[data]].astype(np.int64)
            data_mss[data_mss <= 0] = DEFAULT_MSS
        self._beside(self._hosts, step, chunk, data, data_ts, data_bytes, data_mss)
        for c, sides in self._sides(step, chunk, rows, data, data_ts, data_bytes):
            connection = self.connections.get(c)
            if connection is None:
                if step is not Pass.COUNTS:
                    raise AssertionError("a connection appeared after Pass.COUNTS")
                streamer = self.top.streamer
                mss = (streamer.mss_of(c, 0) or DEFAULT_MSS, streamer.mss_of(c, 1) or DEFAULT_MSS)
                connection = self.connections[c] = Connection(c, self.top.idle_gap_s, mss)
            self._connection(step, connection, chunk, sides)

    def _sides(self, step: Pass, chunk: Chunk, rows: np.ndarray | None, data: np.ndarray, data_ts: np.ndarray,
               data_bytes: np.ndarray) -> Iterator[tuple[int, list[Side]]]:
        """Each listed connection with packets among these rows, and its two directions' packets."""
        if self.top.streamer.nconn == 1:  # one connection: its data split by direction; every row where read
            of_data = chunk.direction[data]
            sides = []
            for d in (0, 1):
                pick = of_data == d
                every, mask = _EMPTY, None
                if step is not Pass.OVERLAP:  # the last pass reads the data packets only
                    if rows is None:
                        mask = chunk.direction == d
                        every = np.flatnonzero(mask)
                    else:
                        every = rows[chunk.direction[rows] == d]
                sides.append(Side(every, data[pick], data_ts[pick], data_bytes[pick], mask))
            yield 0, sides
            return
        conn = chunk.conn if rows is None else chunk.conn[rows]
        direction = chunk.direction if rows is None else chunk.direction[rows]
        listed = self.top.streamer.listed
        if listed is not None:  # only the listed connections are analyzed in full
            keep = np.flatnonzero(listed[conn])
            rows = keep if rows is None else rows[keep]
            conn, direction = conn[keep], direction[keep]
            if not keep.size:
                return
        key = conn.astype(np.int64) * 2 + direction
        order = np.argsort(key, kind="stable")
        sorted_key = key[order]
        bounds = np.flatnonzero(np.diff(sorted_key)) + 1
        groups: dict[int, list[np.ndarray]] = {}
        for s, e in zip(np.r_[0, bounds], np.r_[bounds, key.size], strict=True):
            k = int(sorted_key[s])
            at = order[s:e] if rows is None else rows[order[s:e]]
            groups.setdefault(k // 2, [_EMPTY, _EMPTY])[k % 2] = at
        for c, every in groups.items():
            if every[0].size or every[1].size:
                yield c, [Side.of(chunk, rows) for rows in every]

    def _capture_point(self, chunk: Chunk, rows: np.ndarray | None) -> None:
        """Addresses whose NIC the capture sees: those that send or receive every TCP packet captured (only the
        first packet's two addresses can; each is kept while every packet has it). A host seen only through
        its traffic with that one (a ring neighbour at N>=3) may send and receive much more elsewhere."""
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

    def _connection(self, step: Pass, conn: Connection, chunk: Chunk, sides: list[Side]) -> None:
        ts_all = chunk.ts_ns
        rows = [side.rows for side in sides]
        data_ts = [side.ts for side in sides]
        data_size = [side.sizes for side in sides]
        if step is Pass.COUNTS:
            # the connection's first and last packet times (with the sides' masks: every row is its)
            every = [ts_all] if sides[0].mask is not None else [ts_all[idx] for idx in rows if idx.size]
            for times in every:
                lo_ns, hi_ns = int(times.min()), int(times.max())
                conn.t0_ns = lo_ns if conn.t0_ns is None else min(conn.t0_ns, lo_ns)
                conn.t1_ns = hi_ns if conn.t1_ns is None else max(conn.t1_ns, hi_ns)
            for d in (0, 1):
                self._count_direction(conn.dirs[d], chunk, sides[d])
        if step is Pass.CADENCE:
            for d in (0, 1):
                self._state_direction(conn, d, chunk, sides[d])
        elif step is Pass.RUNS:
            for d in (0, 1):
                self._order_stats(conn, d, chunk, sides[d], add=False)
                # the events of its flight read the chunk's TCP state: here, before the next chunk
                assert chunk.state is not None
                conn.dirs[d].stream.add_runs(*flight_events(ts_all, chunk.state, sides[d].data, sides[1 - d].rows))
        self._beside(self._data_packets, step, conn, data_ts, data_size)

    def _data_packets(self, step: Pass, conn: Connection, data_ts: list[np.ndarray], sizes: list[np.ndarray]
                      ) -> None:
        """A pass's work on one connection's data packets (their times and sizes only: fresh arrays)."""
        for d in (0, 1):
            out = conn.dirs[d]
            if step is Pass.COUNTS:
                out.idle.add(data_ts[d])
                out.stream.count(data_ts[d], sizes[d])
            elif step is Pass.CADENCE:
                self._cadence_direction(conn, d, data_ts[d], sizes[d])
            elif step is Pass.OVERLAP:
                out.stream.add_overlap(data_ts[d], sizes[d], conn.dirs[1 - d].stream)
        if step is not Pass.COUNTS:
            assert conn.turns is not None
            conn.turns.feed(step, data_ts, sizes)

    def _count_direction(self, out: Direction, chunk: Chunk, side: Side) -> None:
        idx, data_ts, sizes = side.rows, side.ts, side.sizes
        if not idx.size:
            return
        out.packets += int(idx.size)
        if out.first_ns is None:
            out.first_ns = int(chunk.ts_ns[idx[0]])
        out.last_ns = int(chunk.ts_ns[idx[-1]])
        out.data_packets += int(sizes.size)
        out.payload_bytes += int(sizes.sum())  # the other rows carry no payload
        if sizes.size:
            top = int(sizes.max())
            out.segment_counts += size_histogram(sizes, top)
            out.max_size = max(out.max_size, top)
            if out.first_data_s is None:
                out.first_data_s = float(data_ts[0])
            out.last_data_s = float(data_ts[-1])
        if side.mask is not None:  # the chunk's columns under the side's mask: no gather
            flags, win, mine = chunk.flags, chunk.win, side.mask
        else:
            flags, win, mine = chunk.flags[idx], chunk.win[idx], np.ones(idx.size, dtype=bool)
        data = (chunk.plen if side.mask is not None else chunk.plen[idx]) > 0
        has_ack = ((flags & ACK) != 0) & mine
        out.pure_acks += int(np.count_nonzero(has_ack & ~data & ((flags & (SYN | FIN | RST)) == 0)))
        out.piggybacked += int(np.count_nonzero(has_ack & data))
        not_syn = ((flags & SYN) == 0) & mine
        if not_syn.any():
            raw = int(win[not_syn].max())
            out.raw_max = raw if out.raw_max is None else max(out.raw_max, raw)
        out.raw_positive_max = max(out.raw_positive_max, int(win[mine].max() if side.mask is not None else win.max()))

    def _state_direction(self, conn: Connection, d: int, chunk: Chunk, side: Side) -> None:
        out = conn.dirs[d]
        st = chunk.state
        assert st is not None
        idx = side.rows
        if idx.size:
            out.unique += int(st["new_bytes"][idx].sum())
            for k, name in enumerate(VERDICTS):  # a flag AND a mask counts faster than a gather
                out.verdicts[k] += int(np.count_nonzero(st[name] & side.mask if side.mask is not None
                                                        else st[name][idx]))
        self._order_stats(conn, d, chunk, side, add=True)

    def _cadence_direction(self, conn: Connection, d: int, data_ts: np.ndarray, sizes: np.ndarray) -> None:
        out = conn.dirs[d]
        if sizes.size:
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
        out.stream.collect_gaps(data_ts, sizes)

    def _rtts(self, conn: Connection, d: int, st: dict[str, np.ndarray], side: Side) -> list[Values]:
        """ACK and timestamp RTTs on d's packets measure the other direction's data."""
        target = conn.dirs[1 - d]
        values = []
        # over the whole capture a direction that never sent data has no ACK RTTs
        if not (self.all_rows and target.data_packets == 0):
            values.append((target.rtt, _samples(st["ack_rtt_ns"], side)))
        values.append((target.ts_rtt, _samples(st["ts_rtt_ns"], side)))
        return values

    def _order_stats(self, conn: Connection, d: int, chunk: Chunk, side: Side, add: bool) -> None:
        """The values of the window, in-flight and RTT order statistics, picked here and counted (Pass.CADENCE,
        with their minimum and maximum) or collected (Pass.RUNS) on the helper thread."""
        out = conn.dirs[d]
        st = chunk.state
        assert st is not None
        idx, data_rows = side.rows, side.data
        values: list[Values] = []
        if idx.size:
            if side.mask is not None:
                win = st["window_bytes"][side.mask & ((chunk.flags & SYN) == 0)]
            else:
                win = st["window_bytes"][idx][(chunk.flags[idx] & SYN) == 0]
            if win.size and add:
                low, high = int(win.min()), int(win.max())
                out.window_min = low if out.window_min is None else min(out.window_min, low)
                out.window_max = high if out.window_max is None else max(out.window_max, high)
            values.append((out.window, win.astype(np.int64)))
            values += self._rtts(conn, d, st, side)
        if data_rows.size:
            flight = st["in_flight"][data_rows]
            flight = flight[flight >= 0]
            if flight.size and add:
                high = int(flight.max())
                out.in_flight_max = high if out.in_flight_max is None else max(out.in_flight_max, high)
            values.append((out.in_flight, flight))
        self._beside(_order_values, values, add)

    def _bins(self, conn: Connection) -> tuple[float, float, float, int]:
        t0, t1 = self._span_s(conn)
        bin_s = self.top.bin_s
        bins = max(1, int(np.ceil((t1 - t0) / bin_s + 1e-9)))
        if bins > MAX_BINS:
            bin_s = (t1 - t0) / MAX_BINS
            bins = MAX_BINS
        return t0, t1, bin_s, bins

    @staticmethod
    def _span_s(conn: Connection) -> tuple[float, float]:
        assert conn.t0_ns is not None and conn.t1_ns is not None
        return float(conn.t0_ns) / 1e9, float(conn.t1_ns) / 1e9

    # -- hosts -------------------------------------------------------------------------------------------

    def _beside(self, work: Callable[..., None], *args: Any) -> None:
        """work(*args) on the analysis' helper thread, in order, beside this thread's work on the same rows
        (numpy releases the GIL in its loops): the hosts, and each connection's work on its data packets.
        Such work reads only arrays of its own (the chunk's address ids and data packets are fresh arrays,
        never views of the reader's buffers) and streamer state that only grows. At most MAX_BESIDE wait;
        settle waits for all."""
        if getattr(self.top.helping, "on", False):  # this is the helper thread: at once
            work(*args)
            return
        while len(self._pending) >= MAX_BESIDE:
            self._pending.popleft().result()
        self._pending.append(self.top.helper.submit(work, *args))

    def _beside_done(self) -> None:
        while self._pending:
            self._pending.popleft().result()

    def _hosts(self, step: Pass, chunk: Chunk, data: np.ndarray, ts: np.ndarray, nbytes: np.ndarray,
               mss: np.ndarray | None) -> None:
        """Each host's transmit and receive streams: data: these rows' data packets, ts their times (s),
        nbytes their sizes, mss their connections' MSS (None: none is larger than DEFAULT_MSS)."""
        if not data.size:
            return
        streamer = self.top.streamer
        src, dst = chunk.src_addr[data], chunk.dst_addr[data]
        if streamer.nconn == 1:  # one connection: its two ends' addresses, every packet between them
            present = np.unique(streamer.address_of_endpoint[[streamer.connections.conn_a[0],
                                                              streamer.connections.conn_b[0]]])
        else:
            naddresses = len(streamer.addresses)
            present = np.flatnonzero(np.bincount(src, minlength=naddresses) + np.bincount(dst, minlength=naddresses))
        if streamer.listed_hosts is not None:
            present = present[streamer.listed_hosts[present]]
        for index in present.tolist():
            host = self.hosts.get(index)
            if host is None:
                if step is not Pass.COUNTS:
                    raise AssertionError("a host appeared after Pass.COUNTS")
                host = self.hosts[index] = Host(self.top.idle_gap_s)
            pairs = [(host.tx, src == index)]
            if host.rx is not host.tx:  # one address (loopback): one stream both ways
                pairs.append((host.rx, dst == index))
            for stream, mask in pairs:
                every = mask.all()
                t, b = (ts, nbytes) if every else (ts[mask], nbytes[mask])
                m = mss if mss is None or every else mss[mask]
                if step is Pass.COUNTS:
                    stream.count(t, b, m)
                elif step is Pass.CADENCE:
                    stream.collect_gaps(t, b, m)
                elif step is Pass.RUNS:
                    stream.add_runs(t)
                elif step is Pass.OVERLAP:
                    stream.add_overlap(t, b, host.rx if stream is host.tx else host.tx)

    # -- between passes ----------------------------------------------------------------------------------

    def settle(self, step: Pass) -> None:
        """What one pass's end decides for the next."""
        self._beside_done()
        if step is Pass.COUNTS and len(self.top.streamer.addresses) == 1:
            for host in self.hosts.values():
                host.rx = host.tx  # every data packet is the one host's, sent and received: computed once
        streams = [s for conn in self.connections.values() for s in (conn.dirs[0].stream, conn.dirs[1].stream)]
        streams += [s for host in self.hosts.values() for s in ((host.tx,) if host.rx is host.tx else (host.tx, host.rx))]
        if step is Pass.COUNTS:
            self.all_rows = self.rows == self.top.streamer.rows
            for stream in streams:
                stream.plan()
            for conn in self.connections.values():
                if self.top.with_series:
                    bins = self._bins(conn)[3]
                    for direction in conn.dirs:
                        direction.series = np.zeros(bins)
                conn.turns = Turns(self, conn)
        elif step is Pass.CADENCE:
            for stream in streams:
                stream.settle_gap()
            for conn in self.connections.values():
                for direction in conn.dirs:
                    for stats in (direction.rtt, direction.ts_rtt, direction.in_flight):
                        _want_median_p95(stats)
                    if direction.window.n:
                        direction.window.want(median_ranks(direction.window.n))
                assert conn.turns is not None
                conn.turns.settle_run_gaps()
        elif step is Pass.RUNS:
            for conn in self.connections.values():
                for d, direction in enumerate(conn.dirs):
                    peer = conn.dirs[1 - d]  # its RTTs: packets toward d's sender, answered by it
                    back = round_trip_s((peer.rtt, peer.ts_rtt))
                    stall = stall_limit_s(direction.stream.run_gap, p95_s(direction.rtt), back)
                    direction.stream.settle_runs(stall, back)
            for host in self.hosts.values():
                for stream in (host.tx,) if host.rx is host.tx else (host.tx, host.rx):
                    stream.settle_runs()
            self._hosts_in_flight()
            for conn in self.connections.values():
                assert conn.turns is not None
                conn.turns.settle_lookups()
        elif step is Pass.OVERLAP:
            for conn in self.connections.values():
                assert conn.turns is not None
                conn.turns.settle_handoffs()

    def _hosts_in_flight(self) -> None:
        """A host transmits (receives) while a connection direction it sends (receives) is busy, in flight
        included: its busy runs join theirs (after Pass.RUNS)."""
        streamer = self.top.streamer
        joined: dict[tuple[int, bool], list[tuple[np.ndarray, np.ndarray]]] = {}
        for conn in self.connections.values():
            ends = (streamer.connections.conn_a[conn.c], streamer.connections.conn_b[conn.c])
            for d in (0, 1):
                sender, receiver = (int(streamer.address_of_endpoint[ends[k]]) for k in (d, 1 - d))
                runs = conn.dirs[d].stream.intervals
                joined.setdefault((sender, True), []).append(runs)
                joined.setdefault((receiver, False), []).append(runs)
        for index, host in self.hosts.items():
            if host.rx is host.tx:
                host.tx.join(joined.get((index, True), []) + joined.get((index, False), []))
            else:
                host.tx.join(joined.get((index, True), []))
                host.rx.join(joined.get((index, False), []))

    # -- the document ------------------------------------------------------------------------------------

    def result(self, observed: set[str] | None = None) -> tuple[list[schema.Connection], list[schema.Host]]:
        """The connections and hosts; observed: the addresses whose NIC the capture sees (None: this
        aggregation's own capture point, for the whole capture)."""
        if self.rows == 0:
            return [], []
        connections = [self._connection_document(self.connections[c]) for c in sorted(self.connections)]
        return connections, self._hosts_document(self.observed_addresses() if observed is None else observed)

    def _direction_document(self, conn: Connection, d: int, t0: float) -> schema.Direction:
        streamer, c = self.top.streamer, conn.c
        throughput = None
        if self.top.with_series:
            assert conn.dirs[d].series is not None
            bin_s = self._bins(conn)[2]
            throughput = schema.Throughput(bin_s, t0, [round(float(v) / bin_s, 1) for v in conn.dirs[d].series])
        return direction_document(conn.dirs[d], conn.dirs[1 - d], int(streamer.wscale[c, d]),
                                  streamer.mss_of(c, d), bool(streamer.syn_seen[c, d]), self.top.idle_gap_s,
                                  throughput)

    def _connection_document(self, conn: Connection) -> schema.Connection:
        streamer = self.top.streamer
        t0 = self._span_s(conn)[0]
        dirs = {name: self._direction_document(conn, d, t0) for d, name in enumerate(DIRECTIONS)}
        dup = duplex(conn.dirs[0].stream, conn.dirs[1].stream)
        rtts = tuple(median_s(dirs[name].rtt_ms) for name in DIRECTIONS)
        assert conn.turns is not None
        turns = conn.turns.document((dup["x_active_s"], dup["y_active_s"]), dup["overlap_s"], dup["active_s"], rtts)
        return connection_document(conn.c, endpoint_text(streamer.endpoints, streamer.connections.conn_a[conn.c]),
                                   endpoint_text(streamer.endpoints, streamer.connections.conn_b[conn.c]), dirs, dup,
                                   turns, streamer.tunnel_of(conn.c))

    def _hosts_document(self, observed: set[str]) -> list[schema.Host]:
        names = self.top.streamer.addresses
        hosts = []
        for index in sorted(self.hosts, key=lambda i: names[i]):
            host = self.hosts[index]
            hosts.append(host_document(names[index], host.tx.bytes, host.rx.bytes, duplex(host.tx, host.rx),
                                       names[index] in observed))
        return hosts

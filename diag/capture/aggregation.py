"""The one aggregation: per-connection, per-direction and per-host numbers of `diag analyze`, fed chunk by
chunk by the passes over a packet source (source.Pass), for the whole capture or one record phase's window.

Counts follow tshark's tcp.analysis definitions (docs/analyzer.md). Order statistics (medians, 95th
percentiles of RTTs, windows, bytes in flight) are exact: counted in one pass, their values collected in the
next (quantile.OrderStats). Sums of bytes are whole numbers, so they are exact in any order.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from diag.capture.busy import (
    DEFAULT_MSS,
    BusyRuns,
    DataStream,
    Host,
    flight_events,
    host_stream,
    p95_s,
    round_trip_s,
    stall_limit_s,
)
from diag.capture.document import MAX_BINS, SEGMENT_SIZE_EDGES, size_histogram
from diag.capture.pcapfile import ACK, FIN, RST, SYN
from diag.capture.quantile import OrderStats, median_ranks, percentile_ranks
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
    """One direction of one connection in one feed: its rows (or, in a chunk of one connection's rows, a mask
    over the chunk instead), and its data packets' rows, times (s), sizes."""

    rows: np.ndarray | None
    data: np.ndarray
    ts: np.ndarray
    sizes: np.ndarray
    mask: np.ndarray | None = None  # its rows as a mask over the chunk (a chunk of one connection's rows)

    @classmethod
    def of(cls, chunk: Chunk, rows: np.ndarray) -> Side:
        data = rows[chunk.plen[rows] > 0] if rows.size else rows
        return cls(rows, data, chunk.ts_ns[data] / 1e9, chunk.plen[data].astype(np.int64))

    @property
    def count(self) -> int:
        """Its rows."""
        return int(self.rows.size) if self.rows is not None else int(np.count_nonzero(self.mask))

    def first_last(self) -> tuple[int, int]:
        """Its first and last row (it has at least one)."""
        if self.rows is not None:
            return int(self.rows[0]), int(self.rows[-1])
        assert self.mask is not None
        return int(np.argmax(self.mask)), self.mask.size - 1 - int(np.argmax(self.mask[::-1]))


_EMPTY = np.zeros(0, np.int64)
# A side of a chunk of one connection with at most this share of its rows is read by its rows, not a mask
# (a gather of a few rows is cheaper than an AND over all of them: an ACK-only direction).
ONE_SIDE_ROWS = 0.125
Values = tuple[OrderStats, np.ndarray]


def _order_values(values: list[Values], add: bool) -> None:
    """Values to their order statistics: counted (pass 1) or collected (pass 2); empty ones skipped."""
    for stats, array in values:
        if array.size:
            (stats.add if add else stats.collect)(array)


def _on_side(sparse: tuple[np.ndarray, np.ndarray], side: Side) -> tuple[np.ndarray, np.ndarray]:
    """The rows and values of a sparse state column (Chunk.sparse) that are the side's, in file order."""
    rows, values = sparse
    if side.mask is not None:
        keep = side.mask[rows]
    elif side.rows is None or not side.rows.size or not rows.size:
        return rows[:0], values[:0]
    else:
        keep = side.rows[np.minimum(np.searchsorted(side.rows, rows), side.rows.size - 1)] == rows
    return rows[keep], values[keep]


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
        if rows is None and self.top.streamer.nconn == 1:
            self._feed_one(step, chunk)
            return
        # The data packets, found once for the hosts and the connections.
        data = np.flatnonzero(chunk.plen > 0) if rows is None else rows[chunk.plen[rows] > 0]
        data_ts = chunk.ts_ns[data] / 1e9
        data_bytes = chunk.plen[data].astype(np.int64)
        # Each data packet's connection's MSS, where the cadence may cut a super-segment into segments
        data_mss = None
        if step in (Pass.COUNTS, Pass.CADENCE) and data.size and int(data_bytes.max()) > DEFAULT_MSS:
            data_mss = self.top.streamer.mss[chunk.conn[data], chunk.direction[data]].astype(np.int64)
            data_mss[data_mss <= 0] = DEFAULT_MSS
        self._hosts(step, chunk, data, data_ts, data_bytes, data_mss)
        for c, sides in self._sides(step, chunk, rows, data, data_ts, data_bytes):
            connection = self.connections.get(c)
            if connection is None:
                if step is not Pass.COUNTS:
                    raise AssertionError("a connection appeared after Pass.COUNTS")
                streamer = self.top.streamer
                mss = (streamer.mss_of(c, 0) or DEFAULT_MSS, streamer.mss_of(c, 1) or DEFAULT_MSS)
                connection = self.connections[c] = Connection(c, self.top.idle_gap_s, mss)
            self._connection(step, connection, chunk, sides)

    def _feed_one(self, step: Pass, chunk: Chunk) -> None:
        """Every row of a chunk of a capture of one connection: each side's rows as a mask over the chunk (an
        AND is cheaper than a gather; a side of a few rows, ONE_SIDE_ROWS or less of them, by its rows), its
        data packets' rows, times and sizes found once a chunk (Chunk.one_data: a kept chunk keeps them for
        every pass), the hosts' streams those of the sides."""
        if chunk.one_data is None:
            data = chunk.plen > 0
            found = [np.flatnonzero(data & (chunk.direction == d)) for d in (0, 1)]
            chunk.one_data = tuple((rows.astype(np.int32), chunk.ts_ns[rows] / 1e9, chunk.plen[rows].astype(np.int32))
                                   for rows in found)
        sides = [Side(None, rows, ts, sizes) for rows, ts, sizes in chunk.one_data]   # int32 sizes: sums widen
        if step is not Pass.OVERLAP:   # the last pass reads the data packets only
            for d, side in enumerate(sides):
                side.mask = chunk.direction == d
                if np.count_nonzero(side.mask) <= ONE_SIDE_ROWS * side.mask.size:
                    side.rows, side.mask = np.flatnonzero(side.mask), None
        both = None   # one address (loopback), data both ways: its one stream is every data packet, in file order
        if len(self.top.streamer.addresses) == 1 and all(side.sizes.size for side in sides):
            data = np.flatnonzero(chunk.plen > 0)
            both = (chunk.ts_ns[data] / 1e9, chunk.plen[data].astype(np.int64), chunk.direction[data])
        self._one_hosts(step, sides, both)
        connection = self.connections.get(0)
        if connection is None:
            if step is not Pass.COUNTS:
                raise AssertionError("a connection appeared after Pass.COUNTS")
            streamer = self.top.streamer
            connection = self.connections[0] = Connection(0, self.top.idle_gap_s, (
                streamer.mss_of(0, 0) or DEFAULT_MSS, streamer.mss_of(0, 1) or DEFAULT_MSS))
        self._connection(step, connection, chunk, sides, whole=True)

    def _sides(self, step: Pass, chunk: Chunk, rows: np.ndarray | None, data: np.ndarray, data_ts: np.ndarray,
               data_bytes: np.ndarray) -> Iterator[tuple[int, list[Side]]]:
        """Each listed connection with packets among these rows, and its two directions' packets."""
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
        assert chunk.src_addr is not None and chunk.dst_addr is not None   # Pass.COUNTS: every chunk has them
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

    def _connection(self, step: Pass, conn: Connection, chunk: Chunk, sides: list[Side], whole: bool = False
                    ) -> None:
        """whole: every row of the chunk is this connection's (_feed_one)."""
        ts_all = chunk.ts_ns
        data_ts = [side.ts for side in sides]
        data_size = [side.sizes for side in sides]
        if step is Pass.COUNTS:
            # the connection's first and last packet times
            every = [ts_all] if whole else [ts_all[s.rows] for s in sides if s.rows is not None and s.rows.size]
            for times in every:
                lo_ns, hi_ns = int(times.min()), int(times.max())
                conn.t0_ns = lo_ns if conn.t0_ns is None else min(conn.t0_ns, lo_ns)
                conn.t1_ns = hi_ns if conn.t1_ns is None else max(conn.t1_ns, hi_ns)
            for d in (0, 1):
                self._count_direction(conn.dirs[d], chunk, sides[d])
        if step is Pass.CADENCE:
            self._state_counts(conn, chunk, sides, whole)
            for d in (0, 1):
                self._order_stats(conn, d, chunk, sides[d], add=True)
        elif step is Pass.RUNS:
            for d in (0, 1):
                self._order_stats(conn, d, chunk, sides[d], add=False)
                # the events of its flight read the chunk's TCP state: here, before the next chunk
                assert chunk.state is not None
                acks = _on_side(chunk.sparse("peer_in_flight"), sides[1 - d])
                conn.dirs[d].stream.add_runs(*flight_events(ts_all, chunk.state["in_flight"], sides[d].data, *acks))
        self._data_packets(step, conn, data_ts, data_size)

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
        idx, data_ts, sizes, count = side.rows, side.ts, side.sizes, side.count
        if not count:
            return
        out.packets += count
        first, last = side.first_last()
        if out.first_ns is None:
            out.first_ns = int(chunk.ts_ns[first])
        out.last_ns = int(chunk.ts_ns[last])
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
            assert idx is not None
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

    def _state_counts(self, conn: Connection, chunk: Chunk, sides: list[Side], whole: bool) -> None:
        """Each direction's unique bytes and verdict counts; whole (every row is one side's or the other's):
        the side of more rows counts the chunk's less the other side's."""
        st = chunk.state
        assert st is not None
        derived = (0 if sides[0].count > sides[1].count else 1) if whole else None
        counts: list[list[int] | None] = [None, None]
        for d, side in enumerate(sides):
            if d != derived and side.count:
                mine = side.rows if side.rows is not None else side.mask
                counts[d] = [int(st["new_bytes"][mine].sum())] + [  # a flag AND a mask counts faster than a gather
                    int(np.count_nonzero(st[name] & side.mask if side.mask is not None else st[name][mine]))
                    for name in VERDICTS]
        if derived is not None and sides[derived].count:
            other = counts[1 - derived] or [0] * (len(VERDICTS) + 1)
            counts[derived] = [int(st["new_bytes"].sum()) - other[0]] + [
                int(np.count_nonzero(st[name])) - other[k + 1] for k, name in enumerate(VERDICTS)]
        for d, got in enumerate(counts):
            if got is not None:
                conn.dirs[d].unique += got[0]
                conn.dirs[d].verdicts = [a + b for a, b in zip(conn.dirs[d].verdicts, got[1:], strict=True)]

    def _cadence_direction(self, conn: Connection, d: int, data_ts: np.ndarray, sizes: np.ndarray) -> None:
        out = conn.dirs[d]
        if sizes.size:
            mss = self.top.streamer.mss_of(conn.c, d) or DEFAULT_MSS
            out.super_segments += int(np.count_nonzero(sizes > mss))
            if self.top.with_series:
                assert out.series is not None
                t0, _t1, bin_s, bins = self.bins(conn)
                scaled = np.subtract(data_ts, t0)
                np.divide(scaled, bin_s, out=scaled)
                index = scaled.astype(np.int64)
                np.minimum(index, bins - 1, out=index)
                out.series += np.bincount(index, weights=sizes.astype(np.float64), minlength=bins)
        out.stream.collect_gaps(data_ts, sizes)

    def _rtts(self, conn: Connection, d: int, chunk: Chunk, side: Side) -> list[Values]:
        """ACK and timestamp RTTs on d's packets measure the other direction's data."""
        target = conn.dirs[1 - d]
        values = []
        # over the whole capture a direction that never sent data has no ACK RTTs
        if not (self.all_rows and target.data_packets == 0):
            values.append((target.rtt, _on_side(chunk.sparse("ack_rtt_ns"), side)[1]))
        values.append((target.ts_rtt, _on_side(chunk.sparse("ts_rtt_ns"), side)[1]))
        return values

    def _order_stats(self, conn: Connection, d: int, chunk: Chunk, side: Side, add: bool) -> None:
        """The values of the window, in-flight and RTT order statistics, picked here and counted (Pass.CADENCE,
        with their minimum and maximum) or collected (Pass.RUNS)."""
        out = conn.dirs[d]
        st = chunk.state
        assert st is not None
        idx, data_rows = side.rows, side.data
        values: list[Values] = []
        if side.count:
            if side.mask is not None:
                win = st["window_bytes"][side.mask & ((chunk.flags & SYN) == 0)]
            else:
                win = st["window_bytes"][idx][(chunk.flags[idx] & SYN) == 0]
            if win.size and add:
                low, high = int(win.min()), int(win.max())
                out.window_min = low if out.window_min is None else min(out.window_min, low)
                out.window_max = high if out.window_max is None else max(out.window_max, high)
            values.append((out.window, win.astype(np.int64)))
            values += self._rtts(conn, d, chunk, side)
        if data_rows.size:
            flight = st["in_flight"][data_rows]
            flight = flight[flight >= 0]
            if flight.size and add:
                high = int(flight.max())
                out.in_flight_max = high if out.in_flight_max is None else max(out.in_flight_max, high)
            values.append((out.in_flight, flight))
        _order_values(values, add)

    def bins(self, conn: Connection) -> tuple[float, float, float, int]:
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

    def _hosts(self, step: Pass, chunk: Chunk, data: np.ndarray, ts: np.ndarray, nbytes: np.ndarray,
               mss: np.ndarray | None) -> None:
        """Each host's transmit and receive streams: data: these rows' data packets, ts their times (s),
        nbytes their sizes, mss their connections' MSS (None: none is larger than DEFAULT_MSS)."""
        if not data.size:
            return
        streamer = self.top.streamer
        src, dst = streamer.addresses_of(chunk, data)
        if streamer.nconn == 1:  # one connection: its two ends' addresses, every packet between them
            present = np.unique(streamer.address_of_endpoint[[streamer.connections.conn_a[0],
                                                              streamer.connections.conn_b[0]]])
        else:
            naddresses = len(streamer.addresses)
            present = np.flatnonzero(np.bincount(src, minlength=naddresses) + np.bincount(dst, minlength=naddresses))
        if streamer.listed_hosts is not None:
            present = present[streamer.listed_hosts[present]]
        for index in present.tolist():
            host = self._host(step, index)
            pairs = [(host.tx, src == index)]
            if host.rx is not host.tx:  # one address (loopback): one stream both ways
                pairs.append((host.rx, dst == index))
            for stream, mask in pairs:
                every = mask.all()
                t, b = (ts, nbytes) if every else (ts[mask], nbytes[mask])
                host_stream(step, host, stream, t, b, mss if mss is None or every else mss[mask])

    def _host(self, step: Pass, index: int) -> Host:
        """The host at address ``index``: made (and split by address count) in Pass.COUNTS, found after it."""
        streamer = self.top.streamer
        host = self.hosts.get(index)
        if host is None:
            if step is not Pass.COUNTS:
                raise AssertionError("a host appeared after Pass.COUNTS")
            host = self.hosts[index] = Host(self.top.idle_gap_s, len(streamer.addresses) == 1)
        if step is Pass.COUNTS:
            host.split(len(streamer.addresses))
        return host

    def _one_hosts(self, step: Pass, sides: list[Side],
                   both: tuple[np.ndarray, np.ndarray, np.ndarray] | None) -> None:
        """_hosts of a chunk of one connection's rows: each host's transmit and receive are the sides' data
        (the connection's two ends; at one address, loopback, one stream of every data packet: both, its
        times, sizes and directions, where each side has data)."""
        if not any(side.sizes.size for side in sides):   # as _hosts: a host appears with data packets
            return
        streamer = self.top.streamer
        ends = [int(streamer.address_of_endpoint[end[0]]) for end in (streamer.connections.conn_a,
                                                                      streamer.connections.conn_b)]
        mss = None   # as _hosts: each packet's connection's MSS where one is larger than DEFAULT_MSS
        if step in (Pass.COUNTS, Pass.CADENCE) and max((int(s.sizes.max()) for s in sides if s.sizes.size),
                                                       default=0) > DEFAULT_MSS:
            mss = [np.full(s.sizes.size, streamer.mss_of(0, d) or DEFAULT_MSS, dtype=np.int64)
                   for d, s in enumerate(sides)]
        for index in sorted(set(ends)):
            host = self._host(step, index)
            if ends[0] != ends[1]:   # sends what its side sends, receives what the other sends
                sent = ends.index(index)
                streams = [(host.tx, sent), (host.rx, 1 - sent)]
                for stream, d in streams:
                    host_stream(step, host, stream, sides[d].ts, sides[d].sizes, mss[d] if mss else None)
                continue
            if both is None:   # loopback, data one way (or none): that side's
                d = 0 if sides[0].sizes.size else 1
                t, b, m = sides[d].ts, sides[d].sizes, mss[d] if mss else None
            else:
                t, b, direction = both
                m = np.where(direction == 0, *(int(part[0]) for part in mss)) if mss else None
            for stream in (host.tx,) if host.rx is host.tx else (host.tx, host.rx):
                host_stream(step, host, stream, t, b, m)

    # -- between passes ----------------------------------------------------------------------------------

    def settle(self, step: Pass) -> None:
        """What one pass's end decides for the next."""
        streams = [s for conn in self.connections.values() for s in (conn.dirs[0].stream, conn.dirs[1].stream)]
        streams += [s for host in self.hosts.values() for s in ((host.tx,) if host.rx is host.tx else (host.tx, host.rx))]
        if step is Pass.COUNTS:
            self.all_rows = self.rows == self.top.streamer.rows
            for stream in streams:
                stream.plan()
            for conn in self.connections.values():
                if self.top.with_series:
                    bins = self.bins(conn)[3]
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

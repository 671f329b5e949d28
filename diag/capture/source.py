"""The packet source and the passes over it: every chunk of TCP rows, numbered, with its TCP state.

A source is the capture file read chunk by chunk (FileChunks: reader.stream_capture, memory one chunk
whatever the file's size), or one chunk in memory (OneChunk: pipes, several files merged in time order,
--plot, and a file whose chunks cannot be analyzed exactly -- Fallback says why). The Streamer reads the
source in Pass.CONNECTIONS and hands each chunk, with its connection and direction ids (connections.py,
numbered by first appearance, as tshark's tcp.stream) and, in the passes that need it, its TCP state (the
_ctcp kernel fed chunk by chunk, or tcpstate.analyze_packets over the one chunk), to the aggregations. While
the source fits CACHE_BYTES, that first pass keeps its chunks and every later pass replays them (the TCP
state computed once); otherwise every pass reads the file again. Each pass keeps only what the next needs:

  CONNECTIONS connections and their packets and bytes, SYNs (window scale, MSS): which are listed
  COUNTS      counts and sums, idle runs, bulk gaps counted
  HANDSHAKES  each connection's handshake RTT (the TCP state needs it from the first packet); stops early
  CADENCE     TCP state: verdicts, RTT/window/in-flight counted, exact bulk gaps -> run gaps, series
  RUNS        TCP state: exact order statistics, busy runs at each run gap, turn candidates
  OVERLAP     bytes inside the other stream's busy runs, handoff triggers, control frames' peer times
"""

from __future__ import annotations

import enum
import os
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from diag.capture import native, pcapfile
from diag.capture.connections import ConnectionIds
from diag.capture.pcapfile import ACK, GZIP_MAGIC, SYN, TUNNELS, CaptureChunk, ReadResult
from diag.capture.reader import read_files, stream_capture
from diag.capture.reader_native import MIN_ROW_FILE_BYTES, row_bound
from diag.capture.tcpstate import PacketState, analyze_packets

VERDICTS = ("retransmission", "fast_retransmission", "spurious_retransmission", "out_of_order",
            "lost_segment", "dup_ack", "zero_window", "window_full")
# The JSON's names of the verdict counts, in its key order.
_STATE_DTYPES = {"new_bytes": np.int64, **{name: np.bool_ for name in VERDICTS}, "in_flight": np.int64,
                 "window_bytes": np.int32, "ack_rtt_ns": np.int64, "ts_rtt_ns": np.int64,
                 "peer_in_flight": np.int32}
_KERNEL_INPUTS = {"ts_ns": np.int64, "seq": np.uint32, "ack": np.uint32, "plen": np.int32, "win": np.uint16,
                  "flags": np.uint8, "tsval": np.uint32, "tsecr": np.uint32, "has_ts": np.bool_}
# The TCP state kernel keeps every data segment's end (a retransmission or late ACK of any age must find
# it): 17 bytes a segment. Streaming, it keeps this many a direction in memory and the older ones on disk.
SPILL_WINDOW = 1 << 20
# A capture of more connections (a port scan, a busy server) lists these in full, the busiest first chosen,
# and sums up the rest in the JSON's connections_omitted; likewise the hosts.
MAX_LISTED_CONNECTIONS = 2000
MAX_LISTED_HOSTS = 4096
# The TCP state that the pass after the first state pass reads (Pass.RUNS: the values of the order
# statistics, and the flight of each direction's busy runs). A chunk kept in memory keeps these once its state
# is computed, so the state is computed once: KEPT_STATE a row, SPARSE_STATE (a value, >= 0, on few rows: the
# RTT samples, the ACKs of new data) as its rows and values where that is smaller (Chunk.sparse).
KEPT_STATE = ("window_bytes", "in_flight")
SPARSE_STATE = ("ack_rtt_ns", "ts_rtt_ns", "peer_in_flight")
# A capture of one connection's data packets: their rows, times (s) and sizes (Chunk.one_data); its rows'
# addresses are then their direction's ends (Streamer.addresses_of), not kept (8 bytes a packet less).
ONE_DATA_BYTES = 4 + 8 + 4 - 8
# What a kept file costs a TCP packet: the columns the aggregation reads and the ids (Chunk: ts_ns, plen,
# flags, win, conn, direction, src_addr, dst_addr: 28 bytes), a capture of one connection's data packets,
# KEPT_STATE and SPARSE_STATE (at most a row each), and the TCP state kernel's segment end (all in memory: 17
# bytes a data segment). The kernel's inputs (seq, ack, TSval, TSecr) are kept until the state replaces them.
KEPT_ROW_BYTES = 28 + ONE_DATA_BYTES + sum(np.dtype(_STATE_DTYPES[name]).itemsize
                                           for name in (*KEPT_STATE, *SPARSE_STATE)) + 17
# A capture file that costs at most this kept (~2.6 M packets) is read and decoded once: the first pass keeps
# its chunks and the later passes replay them. A bigger one is read once a pass, in memory bounded by a chunk.
CACHE_BYTES = 192 << 20


class Pass(enum.IntEnum):
    """The reads of the source, in order (see the module docstring)."""

    CONNECTIONS = 0
    COUNTS = 1
    HANDSHAKES = 2
    CADENCE = 3
    RUNS = 4
    OVERLAP = 5


class Fallback(Exception):
    """This file cannot be streamed to the in-memory result (the message says why); analyze it in memory."""


@dataclass
class Chunk:
    """One reader chunk as the aggregations see it: the columns they read plus per-row ids."""

    ts_ns: np.ndarray
    plen: np.ndarray
    flags: np.ndarray
    win: np.ndarray
    conn: np.ndarray       # int32 connection index (numbered by first appearance)
    direction: np.ndarray  # int8: 0 when sent by the connection's first sender
    src_addr: np.ndarray | None   # int32 address index (Streamer.addresses, in order of first appearance)
    dst_addr: np.ndarray | None   # (None: a kept chunk of a capture of one connection, Streamer.addresses_of)
    state: dict[str, np.ndarray] | None  # the TCP state outputs (Pass.CADENCE and Pass.RUNS)
    # A capture of one connection: each direction's data packets' rows (int32), times (s) and sizes (int32),
    # found by the first pass that reads the chunk (a kept chunk keeps them for the later passes)
    one_data: tuple[tuple[np.ndarray, np.ndarray, np.ndarray], ...] | None = None
    # a kept chunk's SPARSE_STATE columns kept as (rows, values)
    samples: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)

    def sparse(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """A SPARSE_STATE column as the rows that hold a value (>= 0), in file order, and their values."""
        kept = self.samples.get(name)
        if kept is not None:
            return kept
        assert self.state is not None
        return _sparse(self.state[name])


def _sparse(column: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    rows = np.flatnonzero(column >= 0)
    return rows, column[rows]


class _Stop(Exception):
    """Raised inside a consume callback to end a pass early."""


class FileChunks:
    """One capture file read chunk by chunk (reader.stream_capture): memory is one chunk whatever its size."""

    single = False

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.paths = [path]
        self.results: list[ReadResult] = []

    def read(self, consume: Callable[[CaptureChunk], None], details: bool = True) -> None:
        """Every chunk to consume; details: with the SYNs and endpoints (the first pass)."""
        result = stream_capture(self.paths[0], consume, details=details)
        if details:
            self.results = [result]

    def decoded_bytes(self) -> int:
        """The file's size as its records are read (a gzip file's from its trailer): what a chunk of
        pcapfile.CHUNK_BYTES is a share of."""
        try:
            with open(self.paths[0], "rb") as raw:
                gz = raw.read(2) == GZIP_MAGIC
                return (row_bound(raw, gz) - 1) * MIN_ROW_FILE_BYTES
        except OSError:  # gone since the reader opened it: judged by its rows alone
            return 0


@dataclass
class _Kept:
    """A chunk kept in memory: its Chunk, and the TCP state kernel's inputs until its state is computed."""

    chunk: Chunk
    inputs: dict[str, np.ndarray] | None
    state: dict[str, np.ndarray] | None = None


class _Keeper:
    """Pass.CONNECTIONS keeps every chunk it numbers while the source fits in memory: OneChunk's one chunk
    always (it is in memory anyway), a file's chunks while they and the file's projected rows (rows per file
    byte so far times the file's size) take at most CACHE_BYTES. Past that nothing is kept: every later pass
    reads the file again."""

    def __init__(self, source: FileChunks | OneChunk) -> None:
        self.source = source
        self.file_bytes: int | None = None
        self.kept: list[_Kept] | None = []
        self.rows = 0

    def add(self, chunk: Chunk, cols: dict[str, np.ndarray]) -> Chunk:
        """The chunk as Pass.CONNECTIONS hands it on: its kept copy, or itself where nothing is kept."""
        if self.kept is None:
            return chunk
        self.rows += chunk.conn.size
        if isinstance(self.source, FileChunks):
            if self.file_bytes is None:  # the reader has opened the file by now
                self.file_bytes = self.source.decoded_bytes()
            read = len(self.kept) + 1  # chunks of pcapfile.CHUNK_BYTES read so far (at least)
            projected = self.rows * self.file_bytes // (read * pcapfile.CHUNK_BYTES)
            if max(self.rows, projected) * KEPT_ROW_BYTES > CACHE_BYTES:
                self.kept = None
                return chunk
            # a file's chunks view the reader's reused buffers: copied (the ids are new arrays already)
            chunk = Chunk(*(a.copy() for a in (chunk.ts_ns, chunk.plen, chunk.flags, chunk.win)), chunk.conn,
                          chunk.direction, chunk.src_addr, chunk.dst_addr, None)
            cols = {name: cols[name].copy() for name in ("seq", "ack", "tsval", "tsecr", "has_ts")}
            cols.update(ts_ns=chunk.ts_ns, plen=chunk.plen, flags=chunk.flags, win=chunk.win)
        self.kept.append(_Kept(chunk, cols))
        return chunk


class OneChunk:
    """Every file read into memory and merged in time order (mergecap semantics): one chunk. For pipes,
    several files, --plot and a machine without the C kernels."""

    single = True

    def __init__(self, paths: Sequence[str | os.PathLike[str]]) -> None:
        self.paths = list(paths)
        cols, endpoints, self.results = read_files(paths)
        self.chunk = CaptureChunk(cols, [syn for result in self.results for syn in result.syns], 0, endpoints)

    def read(self, consume: Callable[[CaptureChunk], None], details: bool = True) -> None:
        del details  # the one chunk holds them anyway
        if self.chunk.rows:  # as stream_capture: never a chunk of zero rows
            consume(self.chunk)


class Streamer:
    """Runs the passes over one packet source and hands every chunk to the aggregations."""

    def __init__(self, source: FileChunks | OneChunk, spill_window: int = SPILL_WINDOW) -> None:
        self.source = source
        self.path = source.paths[0]
        self.spill_window = spill_window
        self.keep_sequence = False
        self.connections = ConnectionIds()
        self.endpoints: list[tuple[str, int]] = []
        self.address_of_endpoint = np.zeros(0, dtype=np.int32)
        self.addresses: list[str] = []  # address index -> text, in order of first appearance
        self._address_index: dict[str, int] = {}
        self.rows = 0
        # per connection (Pass.CONNECTIONS), in arrays that grow: a few dozen bytes a connection
        self.syn_seen = np.zeros((0, 2), dtype=bool)
        self.offered = np.zeros((0, 2), dtype=np.int8)   # the SYN's window scale; -1: none offered
        self.mss = np.zeros((0, 2), dtype=np.int32)      # the SYN's MSS, 0 unknown
        self.syn_time = np.zeros(0, dtype=np.int64)      # the most recent SYN without ACK
        self.packets = np.zeros(0, dtype=np.int64)
        self.payload = np.zeros(0, dtype=np.int64)
        self.tunnel_bits = np.zeros(0, dtype=np.uint8)   # the tunnels its packets came through (TUNNELS bits)
        self.tunnelled = np.zeros(0, dtype=np.int64)     # its packets that came through one
        self.host_bytes = np.zeros(0, dtype=np.int64)    # per address: data bytes sent and received (_select)
        self.listed: np.ndarray | None = None            # connections analyzed in full (None: all)
        self.listed_hosts: np.ndarray | None = None
        self._kernel_ids = np.zeros(0, dtype=np.int32)    # listed connection -> the TCP state kernel's index
        self.wscale = np.zeros((0, 2), dtype=np.int64)
        self.first_rtt = np.zeros(0, dtype=np.int64)
        self._one_state: dict[str, np.ndarray] | None = None  # OneChunk: the TCP state, computed once
        self.one_state: PacketState | None = None
        self.kept: list[_Kept] | None = None  # the source's chunks, when Pass.CONNECTIONS kept them
        self._keeper: _Keeper | None = None

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

    def run(self, step: Pass, consume: Callable[[Chunk], None], with_state: bool = False) -> None:
        """One pass: every chunk of the source, with the TCP state when asked, to consume."""
        if self.kept is not None:
            self._replay(consume, with_state)
            return
        state_of = self._state_feeder(self.spill_window) if with_state and not self.source.single else None
        keeper = self._keeper = _Keeper(self.source) if step is Pass.CONNECTIONS else None

        def on_chunk(raw: CaptureChunk) -> None:
            cols = raw.columns
            if step is Pass.CONNECTIONS:
                self._endpoints(raw)
            src, dst = cols["src"], cols["dst"]
            conn = self.connections.ids(src, dst, len(self.endpoints), assign=step is Pass.CONNECTIONS)
            direction = self.connections.direction(conn, src)
            if step is Pass.CONNECTIONS:
                self._tally(raw, conn, direction)
            state = None
            if with_state and self.source.single:
                state = self._whole_state(cols, conn, direction)
            elif state_of is not None:
                state = state_of(cols, conn, direction)
            chunk = Chunk(cols["ts_ns"], cols["plen"], cols["flags"], cols["win"], conn, direction,
                          self.address_of_endpoint[src], self.address_of_endpoint[dst], state)
            if keeper is not None:
                chunk = keeper.add(chunk, cols)
            consume(chunk)

        try:
            self.source.read(on_chunk, details=step is Pass.CONNECTIONS)
        except _Stop:
            return
        if step is Pass.CONNECTIONS:
            assert keeper is not None
            self.kept, self._keeper = keeper.kept, None
            self._settle_handshakes()
            self._select()

    def _replay(self, consume: Callable[[Chunk], None], with_state: bool) -> None:
        """A pass over the kept chunks. The first pass with the TCP state computes it (the kernel fed chunk by
        chunk, the next chunk on a helper thread while this one is consumed; or analyze_packets over
        OneChunk's one chunk) and keeps what a later pass reads (KEPT_STATE)."""
        assert self.kept is not None
        if with_state and not self.source.single and self.kept and self.kept[0].inputs is not None:
            self._replay_computing_state(consume)
            return
        try:
            for kept in self.kept:
                chunk = kept.chunk
                chunk.state = None
                if with_state and self.source.single:
                    assert kept.inputs is not None
                    chunk.state = self._whole_state(kept.inputs, chunk.conn, chunk.direction)
                elif with_state:
                    chunk.state = kept.state
                consume(chunk)
        except _Stop:
            return

    def _replay_computing_state(self, consume: Callable[[Chunk], None]) -> None:
        """The first pass with the TCP state over the kept chunks: the kernel (every segment end in memory:
        the file fits) writes KEPT_STATE straight into arrays for the whole file, the rest into two sets of
        buffers used in turn, so that it can work on the next chunk on a helper thread while this one is
        consumed."""
        kept_chunks = self.kept
        assert kept_chunks is not None
        feed_state = self._state_feeder(spill_window=0)

        def state_of(*args: Any) -> tuple[dict[str, np.ndarray], dict[str, tuple[np.ndarray, np.ndarray]]]:
            state = feed_state(*args)
            samples = {}
            for name in SPARSE_STATE:   # as rows and values where that is smaller, kept
                rows, values = _sparse(state[name])
                if rows.size * (4 + values.itemsize) < values.itemsize * state[name].size:
                    samples[name] = (rows.astype(np.int32), values)
            return state, samples

        sizes = [kept.chunk.conn.size for kept in kept_chunks]
        starts = np.concatenate([[0], np.cumsum(sizes)]).tolist()
        whole = {name: np.empty(starts[-1], dtype=_STATE_DTYPES[name]) for name in KEPT_STATE}
        buffers = [{name: np.empty(max(sizes), dtype=dtype) for name, dtype in _STATE_DTYPES.items()
                    if name not in KEPT_STATE} for _ in range(2)]

        def into(at: int) -> dict[str, np.ndarray]:
            lo, hi = starts[at], starts[at + 1]
            return {name: whole[name][lo:hi] if name in KEPT_STATE else buffers[at % 2][name][:hi - lo]
                    for name in _STATE_DTYPES}

        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="diag-tcpstate") as pool:
            def submit(at: int) -> Future[tuple[dict[str, np.ndarray], dict[str, tuple[np.ndarray, np.ndarray]]]]:
                kept = kept_chunks[at]
                assert kept.inputs is not None
                return pool.submit(state_of, kept.inputs, kept.chunk.conn, kept.chunk.direction, into(at))

            pending = submit(0)
            for at, kept in enumerate(kept_chunks):
                state, samples = pending.result()
                if at + 1 < len(kept_chunks):
                    pending = submit(at + 1)
                kept.state = {name: state[name] for name in KEPT_STATE}
                kept.state.update((name, state[name].copy()) for name in SPARSE_STATE if name not in samples)
                kept.inputs = None
                kept.chunk.state, kept.chunk.samples = state, samples
                consume(kept.chunk)

    def _state_feeder(self, spill_window: int) -> Callable[..., dict[str, np.ndarray]]:
        """The TCP state kernel fed chunk by chunk with the listed connections' rows (renumbered 0..K-1):
        state_of(cols, conn, direction, into=None) gives a chunk's state (rows of connections not listed are
        0) in `into` where given (arrays of the chunk's length, a field each), else in arrays reused for the
        next chunk. The kernel keeps spill_window segment ends a direction in memory (0: all), the older
        ones in its temporary file."""
        kernel = native.require("_ctcp")
        listed = np.arange(self.nconn) if self.listed is None else np.flatnonzero(self.listed)
        analyzer = kernel.Analyzer(2 * listed.size, np.ascontiguousarray(self.wscale[listed], dtype=np.int64).reshape(-1),
                                   np.ascontiguousarray(self.first_rtt[listed], dtype=np.int64),
                                   spill_window=spill_window)
        outputs: dict[str, np.ndarray] = {}
        fed = [0]  # rows fed to the kernel before this chunk (its row numbers)

        def state_of(cols: dict[str, np.ndarray], conn: np.ndarray, direction: np.ndarray,
                     into: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
            n = conn.size
            rows = None if self.listed is None else np.flatnonzero(self.listed[conn])
            m = n if rows is None else rows.size
            if into is not None and rows is None:
                fed_state = into
            else:
                for name, dtype in _STATE_DTYPES.items():
                    if name not in outputs or outputs[name].size < m:
                        outputs[name] = np.empty(max(m, 1 << 16), dtype=dtype)
                fed_state = {name: array[:m] for name, array in outputs.items()}
            ids = conn if rows is None else self._kernel_ids[conn[rows]]
            inputs = [np.ascontiguousarray(ids, dtype=np.int32),
                      np.ascontiguousarray(direction if rows is None else direction[rows], dtype=np.int8)]
            inputs += [np.ascontiguousarray(cols[name] if rows is None else cols[name][rows], dtype=dtype)
                       for name, dtype in _KERNEL_INPUTS.items()]
            try:
                late_ack, late_ts = analyzer.feed(*inputs, None, None, *fed_state.values())
            except OSError as exc:  # its temporary file of segment ends could not be written or read
                from diag.errors import DiagError

                raise DiagError(f"{self.path}: {exc}") from None
            for late, name in ((late_ack, "ack_rtt_ns"), (late_ts, "ts_rtt_ns")):
                for row, value in late:
                    if row < fed[0]:
                        raise Fallback("an RTT sample falls on a packet of an earlier chunk (packets out of "
                                       "order in the file)")
                    fed_state[name][row - fed[0]] = value
            fed[0] += m
            if rows is None:
                return fed_state
            state = into if into is not None else {name: np.empty(n, dtype=dtype) for name, dtype in _STATE_DTYPES.items()}
            for name, values in fed_state.items():
                state[name].fill(0)
                state[name][rows] = values
            return state

        return state_of

    def _whole_state(self, cols: dict[str, np.ndarray], conn: np.ndarray, direction: np.ndarray
                     ) -> dict[str, np.ndarray]:
        """The one chunk's TCP state (tcpstate.analyze_packets: the C kernel, or its numpy twin), computed once
        and kept for the later passes and the plots."""
        if self._one_state is None:
            self.one_state = analyze_packets(cols, conn, direction, self.wscale, self.first_rtt,
                                             keep_sequence=self.keep_sequence)
            self._one_state = {name: getattr(self.one_state, name) for name in _STATE_DTYPES}
        return self._one_state

    def _tally(self, raw: CaptureChunk, conn: np.ndarray, direction: np.ndarray) -> None:
        """Pass.CONNECTIONS: rows, each connection's packets and payload bytes, SYNs."""
        n, nconn = conn.size, self.nconn
        self.rows += n
        if self.packets.size < nconn:
            grow = max(nconn, 2 * self.packets.size)
            self.packets, self.payload, self.syn_time = (_grown(a, grow) for a in (self.packets, self.payload,
                                                                                 self.syn_time))
            self.tunnel_bits, self.tunnelled = _grown(self.tunnel_bits, grow), _grown(self.tunnelled, grow)
            self.syn_seen, self.mss = _grown(self.syn_seen, grow), _grown(self.mss, grow)
            self.offered = _grown(self.offered, grow, fill=-1)
        plen = raw.columns["plen"]
        if nconn == 1:
            self.packets[0] += n
            self.payload[0] += int(plen.sum())
        else:
            self.packets[:nconn] += np.bincount(conn, minlength=nconn)
            self.payload[:nconn] += np.bincount(conn, weights=plen, minlength=nconn).astype(np.int64)
        tunnel = raw.columns["tunnel"]
        if tunnel.any():
            inside = tunnel != 0
            self.tunnelled[:nconn] += np.bincount(conn[inside], minlength=nconn)
            for bit in TUNNELS:
                hit = (tunnel & bit) != 0
                if hit.any():
                    self.tunnel_bits[:nconn] |= np.where(np.bincount(conn[hit], minlength=nconn) > 0, bit, 0
                                                         ).astype(np.uint8)
        if raw.syns:
            self._syns(raw, conn, direction)

    def _syns(self, raw: CaptureChunk, conn: np.ndarray, direction: np.ndarray) -> None:
        frames = raw.columns["frame"]
        wanted = np.array([s.frame for s in raw.syns], dtype=np.int64)
        rows = np.flatnonzero(np.isin(frames, wanted))
        row_of = dict(zip(frames[rows].tolist(), rows.tolist(), strict=True))
        for syn in raw.syns:
            row = row_of.get(syn.frame)
            if row is None:
                continue
            c, d = int(conn[row]), int(direction[row])
            self.syn_seen[c, d] = True
            self.offered[c, d] = -1 if syn.wscale is None else syn.wscale
            if syn.mss:
                self.mss[c, d] = syn.mss
            if not syn.flags & ACK:
                self.syn_time[c] = syn.ts_ns

    def _select(self) -> None:
        """The connections analyzed in full: all, or the MAX_LISTED_CONNECTIONS that moved the most bytes
        (then packets; ties in order of first appearance); likewise the hosts (MAX_LISTED_HOSTS)."""
        nconn = self.nconn
        self.packets, self.payload = self.packets[:nconn], self.payload[:nconn]
        if nconn > MAX_LISTED_CONNECTIONS:
            order = np.lexsort((np.arange(nconn), -self.packets, -self.payload))[:MAX_LISTED_CONNECTIONS]
            self.listed = np.zeros(nconn, dtype=bool)
            self.listed[order] = True
            self._kernel_ids = np.full(nconn, -1, dtype=np.int32)
            self._kernel_ids[self.listed] = np.arange(MAX_LISTED_CONNECTIONS, dtype=np.int32)
        # Each address's data bytes sent and received: its connections' payload (every packet of a connection
        # is between its two endpoints; one address at both ends counts the bytes twice, as sent and received).
        ends = [self.address_of_endpoint[np.array(side, dtype=np.int64)] for side in (self.connections.conn_a,
                                                                                     self.connections.conn_b)]
        moved = self.host_bytes = np.zeros(len(self.addresses), dtype=np.int64)
        for end in ends:
            np.add.at(moved, end, self.payload)
        if np.count_nonzero(moved) > MAX_LISTED_HOSTS:
            order = np.lexsort((np.arange(moved.size), -moved))[:MAX_LISTED_HOSTS]
            self.listed_hosts = np.zeros(moved.size, dtype=bool)
            self.listed_hosts[order] = True

    def omitted(self) -> dict[str, int] | None:
        """The connections not listed: how many, and their packets and payload bytes (None: all listed)."""
        if self.listed is None:
            return None
        rest = ~self.listed
        return {"count": int(np.count_nonzero(rest)), "packets": int(self.packets[rest].sum()),
                "payload_bytes": int(self.payload[rest].sum())}

    def _settle_handshakes(self) -> None:
        """Window scales (RFC 7323: both SYNs must offer it); the handshake RTTs come from Pass.HANDSHAKES."""
        nconn = self.nconn
        self.syn_seen, self.offered = _grown(self.syn_seen, nconn)[:nconn], _grown(self.offered, nconn, -1)[:nconn]
        self.mss, self.syn_time = _grown(self.mss, nconn)[:nconn], _grown(self.syn_time, nconn)[:nconn]
        self.wscale = np.full((nconn, 2), -1, dtype=np.int64)
        both = self.syn_seen.all(axis=1)
        scaled = both & (self.offered >= 0).all(axis=1)
        self.wscale[scaled] = self.offered[scaled]
        self.wscale[both & ~scaled] = 0  # one side did not offer scaling: neither direction scales
        self.first_rtt = np.zeros(nconn, dtype=np.int64)

    def handshake_rtts(self) -> None:
        """Pass.HANDSHAKES: each connection's first non-SYN ACK at or after its most recent SYN without ACK
        (Wireshark's ts_first_rtt), in file order."""
        wanted = self.syn_seen.all(axis=1) if self.listed is None else self.syn_seen.all(axis=1) & self.listed
        pending = {c: int(self.syn_time[c]) for c in np.flatnonzero(wanted).tolist()}
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

        self.run(Pass.HANDSHAKES, consume)

    def one_connection(self) -> None:
        """After the first pass over a kept capture of one connection: each row's addresses are its
        direction's ends, so the kept chunks let their address columns go (addresses_of answers for them)."""
        if self.kept is not None and self.nconn == 1:
            for kept in self.kept:
                kept.chunk.src_addr = kept.chunk.dst_addr = None

    def addresses_of(self, chunk: Chunk, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The source and destination address index of these rows of the chunk."""
        if chunk.src_addr is not None and chunk.dst_addr is not None:
            return chunk.src_addr[rows], chunk.dst_addr[rows]
        ends = self.address_of_endpoint[[self.connections.conn_a[0], self.connections.conn_b[0]]]
        direction = chunk.direction[rows]
        return ends[direction], ends[1 - direction]

    def mss_of(self, c: int, d: int) -> int:
        return int(self.mss[c, d])

    def tunnel_of(self, c: int) -> list[str] | None:
        """The tunnels connection c's packets came through (pcapfile.TUNNELS names; "plain" where some of its
        packets came through none); None where none did."""
        bits = int(self.tunnel_bits[c]) if c < self.tunnel_bits.size else 0
        if not bits:
            return None
        names = [name for bit, name in TUNNELS.items() if bits & bit]
        return names + (["plain"] if self.tunnelled[c] < self.packets[c] else [])


def _grown(array: np.ndarray, rows: int, fill: int = 0) -> np.ndarray:
    """array with at least `rows` rows (the new ones `fill`)."""
    if array.shape[0] >= rows:
        return array
    out = np.full((rows, *array.shape[1:]), fill, dtype=array.dtype)
    out[:array.shape[0]] = array
    return out

"""`diag analyze`: the passes over one packet source feed one aggregation per scope (the whole capture and
each record phase), and the document is assembled from them.

    source.FileChunks | source.OneChunk --chunks--> source.Streamer (Pass.CONNECTIONS .. Pass.OVERLAP)
        --> aggregation.Aggregation (busy.DataStream, turns.Turns, quantile.OrderStats) --> document.document

One regular capture file is read in chunks, in bounded memory whatever its size or content; several files,
a pipe and --plot are one merged chunk in memory. Where a file's chunks cannot be analyzed exactly (an RTT
sample falls on a packet of an earlier chunk, or a lookup reaches back past the packets still in view:
source.Fallback), it is analyzed as one chunk and `diag analyze` says so in one stderr line.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from diag import analysisdoc as doc
from diag.capture import native
from diag.capture import source as sources
from diag.capture.aggregation import Aggregation
from diag.capture.document import (
    DEFAULT_BIN_S,
    IDLE_GAP_S,
    NO_PHASE_PACKETS,
    Packets,
    aggregation_document,
    document,
    phases_from_records,
)
from diag.capture.source import SPILL_WINDOW, Chunk, Fallback, FileChunks, OneChunk, Pass, Streamer
from diag.capture.tcpstate import analyze_packets


class Analysis:
    """The aggregations of one packet source (the whole capture and each record phase) and the passes that
    feed them."""

    def __init__(self, source: FileChunks | OneChunk, records: Sequence[str | os.PathLike[str]] | None,
                 bin_s: float, idle_gap_s: float, with_series: bool, spill_window: int = SPILL_WINDOW) -> None:
        self.source = source
        self.bin_s = bin_s
        self.idle_gap_s = idle_gap_s
        self.with_series = with_series
        self.streamer = Streamer(source, spill_window)
        self.phases = phases_from_records(records) if records else []
        self._aggregations()

    def _aggregations(self) -> None:
        self.overall = Aggregation(self, None, capture_point=True)
        self.phase_aggs = [Aggregation(self, (p.t_start_ns / 1e9, p.t_end_ns / 1e9)) for p in self.phases]

    def run(self) -> doc.Analysis:
        streamer = self.streamer
        counts = self._feeder(Pass.COUNTS)
        ahead = [True]

        def first_read(chunk: Chunk) -> None:
            # Pass.COUNTS rides along the first read while every connection seen so far will be listed (the
            # usual case: one read less); past MAX_LISTED_CONNECTIONS its aggregations are dropped.
            if ahead[0] and streamer.nconn > sources.MAX_LISTED_CONNECTIONS:
                ahead[0] = False
                self._aggregations()
            if ahead[0]:
                counts(chunk)

        streamer.run(Pass.CONNECTIONS, first_read)
        streamer.one_connection()
        if not ahead[0] or streamer.listed is not None or streamer.listed_hosts is not None:
            self._aggregations()  # count again, the listed connections and hosts only
            streamer.run(Pass.COUNTS, self._feeder(Pass.COUNTS))
        for agg in (self.overall, *self.phase_aggs):
            agg.settle(Pass.COUNTS)
        streamer.handshake_rtts()
        for step, with_state in ((Pass.CADENCE, True), (Pass.RUNS, True), (Pass.OVERLAP, False)):
            streamer.run(step, self._feeder(step), with_state=with_state)
            for agg in (self.overall, *self.phase_aggs):
                agg.settle(step)
        return self._document()

    def _phases_feeder(self, step: Pass) -> Callable[[Chunk], None]:
        starts = np.array([p.t_start_ns for p in self.phases], dtype=np.int64)
        ends = np.array([p.t_end_ns for p in self.phases], dtype=np.int64)

        def feed(chunk: Chunk) -> None:
            ts = chunk.ts_ns
            if not ts.size:
                return
            ordered = bool((ts[1:] >= ts[:-1]).all())
            first, last = (int(ts[0]), int(ts[-1])) if ordered else (int(ts.min()), int(ts.max()))
            for i in np.flatnonzero((starts <= last) & (ends >= first)).tolist():
                # the rows whose time lies in the window, in file order
                if ordered:
                    lo = int(np.searchsorted(ts, starts[i], side="left"))
                    hi = int(np.searchsorted(ts, ends[i], side="right"))
                    rows = np.arange(lo, hi)
                else:
                    rows = np.flatnonzero((ts >= starts[i]) & (ts <= ends[i]))
                self.phase_aggs[i].feed(step, chunk, rows)

        return feed

    def _feeder(self, step: Pass) -> Callable[[Chunk], None]:
        phases = self._phases_feeder(step) if self.phase_aggs else None

        def feed(chunk: Chunk) -> None:
            self.overall.feed(step, chunk, None)
            if phases is not None:
                phases(chunk)

        return feed

    def _document(self) -> doc.Analysis:
        source = self.source
        connections, hosts = aggregation_document(self.overall)
        observed = {host.address for host in hosts if host.nic_observed}
        phases_out = []
        attributed = 0
        for phase, agg in zip(self.phases, self.phase_aggs, strict=True):
            conns, hs = aggregation_document(agg, observed)
            attributed += agg.rows
            phases_out.append(doc.Phase(phase, int(agg.rows), conns, hs))
        extra = [NO_PHASE_PACKETS] if self.phases and attributed == 0 and self.streamer.rows else []
        tcp_packets = [r.packets for r in source.results] if source.single else [self.streamer.rows]
        omitted = self.streamer.omitted()
        hosts_omitted = None
        if self.streamer.listed_hosts is not None:
            hosts_omitted = doc.Omitted(int(np.count_nonzero(self.streamer.host_bytes)) - len(hosts))
        return document(source.paths, source.results, tcp_packets, connections, hosts, observed, phases_out,
                        extra, self.bin_s, self.idle_gap_s,
                        doc.Omitted(**omitted) if omitted is not None else None, hosts_omitted)

    def packets(self) -> Packets:
        """The one chunk's packet table and TCP state (OneChunk sources only)."""
        streamer = self.streamer
        assert isinstance(streamer.source, OneChunk)
        cols = streamer.source.chunk.columns
        if streamer.one_state is None:  # no TCP packet: no pass computed a state
            conn, direction = np.zeros(0, np.int32), np.zeros(0, np.int8)
            streamer.one_state = analyze_packets(cols, conn, direction, streamer.wscale, streamer.first_rtt)
        return Packets(cols, streamer.one_state, np.array(streamer.connections.conn_a, dtype=np.int64),
                       np.array(streamer.connections.conn_b, dtype=np.int64), streamer.endpoints, streamer.wscale,
                       np.zeros((streamer.nconn, 2), np.int64), np.array(streamer.syn_seen, dtype=bool).reshape(-1, 2))


def analyze_files(paths: Sequence[str | os.PathLike[str]], records: Sequence[str | os.PathLike[str]] | None = None,
                  bin_s: float = DEFAULT_BIN_S, idle_gap_s: float = IDLE_GAP_S,
                  with_series: bool = True) -> dict[str, Any]:
    """The `diag analyze --json` object for these capture files (and sweep phases from records)."""
    return analyze(paths, records, bin_s, idle_gap_s, with_series, keep_sequence=False)[0].to_json()


def chunked(paths: Sequence[str | os.PathLike[str]]) -> bool:
    """Whether these captures are read in chunks: one regular file and both C kernels (the TCP state kernel
    is what can be fed chunk by chunk)."""
    return (len(paths) == 1 and Path(paths[0]).is_file() and native.kernel("_cpcap") is not None
            and native.kernel("_ctcp") is not None)


def analyze(paths: Sequence[str | os.PathLike[str]], records: Sequence[str | os.PathLike[str]] | None = None,
            bin_s: float = DEFAULT_BIN_S, idle_gap_s: float = IDLE_GAP_S, with_series: bool = True,
            keep_sequence: bool = True, spill_window: int = SPILL_WINDOW) -> tuple[doc.Analysis, Packets | None]:
    """The analysis document (typed: analyze_files' JSON is its to_json()) plus the packet table with its TCP
    state (for --plot: keep_sequence keeps each packet's relative sequence numbers, and the captures are then
    one chunk in memory); None without keep_sequence."""
    from diag.errors import DiagError

    if not paths:
        raise DiagError("give at least one capture file")
    if bin_s <= 0 or idle_gap_s <= 0:
        raise DiagError("--bin and --idle-gap must be positive seconds")
    if not keep_sequence and chunked(paths):
        try:
            return Analysis(FileChunks(paths[0]), records, bin_s, idle_gap_s, with_series, spill_window).run(), None
        except Fallback as why:
            print(f"diag analyze: {paths[0]}: {why}, so it is analyzed in memory (~170 bytes a packet)",
                  file=sys.stderr)
    analysis = Analysis(OneChunk(paths), records, bin_s, idle_gap_s, with_series)
    analysis.streamer.keep_sequence = keep_sequence
    out = analysis.run()
    return out, (analysis.packets() if keep_sequence else None)

"""Turn-taking on one connection, per repetition: who sends alone, when both send, and what starts a turn.

A backend that drives both directions of one TCP connection can make them take turns: one side's data
waits for a notice the other side sends only after its own burst. gloo's pair (gloo/transport/tcp/pair.h,
pair.cc) frames every operation with a 48-byte preamble (six size_t fields: nbytes, opcode, slot, offset,
length, roffset); a receive posts NOTIFY_RECV_READY, a send whose peer is not ready posts NOTIFY_SEND_READY,
and both go in-band, in FIFO order behind whatever the sender already queued. On the wire a notice is a
segment of its own (48 bytes, or a few of them coalesced) when the sender's queue is empty, and rides at the
end of the sender's data when it is not -- exactly when it delays the peer most.

So the analyzer reads a turn from its effect, which holds for any protocol of that shape: the peer Y
(re)starts its data after a long silence, within a few RTTs of a packet of X, after X sent a burst alone
during Y's silence (a *handoff*; X's packet is the trigger, and where it sits in X's stream -- its offset in
the repetition -- says which of X's messages carried the notice). Standalone control frames (data segments
of at most CONTROL_MAX_BYTES) are counted with their position: right after the sender's own burst or not,
and how long until the peer's next data. Each repetition's active time splits into leader-alone / both /
follower-alone, from the same busy runs as the connection's duplex overlap (busy.duplex). A ring at N>=3
sends one way per connection: the follower carries no bulk data, so there is no handoff and no turn.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from diag.analysisdoc import DIRECTIONS, TWO_WAY_MIN_BYTES, ControlFrames, Handoff, Phase, TurnSummary
from diag.analysisdoc import Turns as TurnsDocument
from diag.capture.quantile import OrderStats, median_ranks, np_median
from diag.capture.source import Fallback, Pass

if TYPE_CHECKING:
    from diag.capture.aggregation import Aggregation, Connection

# A data segment this small or smaller is a control frame: up to four 48-byte gloo preambles coalesced --
# when it is also at most CONTROL_MAX_SHARE of the connection's largest segment (a flow whose MSS is tiny
# has no control frames, only small data).
CONTROL_MAX_BYTES = 192
CONTROL_MAX_SHARE = 0.25
GLOO_PREAMBLE_BYTES = 48
# A handoff needs X to have sent at least this much alone while Y was silent (a burst, not a notice).
BURST_MIN_BYTES = 64 * 1024
# ... and Y's silence to be at least this fraction of the repetition's span (not a scheduling hiccup).
TURN_MIN_SILENCE_FRACTION = 0.05
# Y reacts to X's trigger within this many RTTs of X's direction (X's data -> Y's ACK at the capture point),
# never less than HANDOFF_FLOOR_S (a loaded host takes a millisecond to wake a thread) nor than
# HANDOFF_SILENCE_SHARE of Y's silence (a follower that waited 700 ms and starts 3 ms after X's last packet,
# as gloo's send-first exchange does on a loaded 2-core host, waited on X).
HANDOFF_MAX_RTT = 4.0
HANDOFF_FLOOR_S = 0.002
HANDOFF_SILENCE_SHARE = 0.02
# Handoff events listed per connection (their count is always complete).
MAX_LISTED_HANDOFFS = 16


def _median(values: list[float]) -> float | None:
    return float(np.median(values)) if values else None


def turns_document(span: float, busy_s: tuple[float, float], both: float, either: float,
                   first_bulk: list[float | None], bulk_bytes: list[float] | list[int], events: list[Handoff],
                   control: list[ControlFrames]) -> TurnsDocument:
    """The turn object: the time split and leader, the handoffs (both directions', sorted by time) and the
    control frames. first_bulk: each direction's first bulk segment time (None: none), a->b first."""
    alone = [busy - both for busy in busy_s]
    leader = None
    if first_bulk[0] is not None or first_bulk[1] is not None:
        leader = 0 if first_bulk[1] is None or (first_bulk[0] is not None and first_bulk[0] <= first_bulk[1]) else 1
    lead = leader if leader is not None else 0
    follow = 1 - lead
    events.sort(key=lambda e: e.t)
    return TurnsDocument(
        span, either, max(span - either, 0.0), {DIRECTIONS[d]: alone[d] for d in (0, 1)}, both,
        DIRECTIONS[leader] if leader is not None else None,
        alone[lead] / either if either > 0 else None, both / either if either > 0 else None,
        alone[follow] / either if either > 0 else None, {DIRECTIONS[d]: int(bulk_bytes[d]) for d in (0, 1)},
        len(events), events[:MAX_LISTED_HANDOFFS], {DIRECTIONS[d]: control[d] for d in (0, 1)}, bool(events))


def summarize(phases: list[Phase]) -> list[TurnSummary]:
    """Per run (backend, algo, op, N, size): the turn analysis of its repetitions, for the report's rules.

    Connections that carry less than BURST_MIN_BYTES of bulk data in a repetition (set-up, store traffic)
    are left out."""
    groups: dict[tuple[Any, ...], list[Phase]] = defaultdict(list)
    for entry in phases:
        if not entry.packets:  # a record of another capture
            continue
        phase = entry.phase
        groups[(phase.backend, phase.algo, phase.op, phase.world_size, phase.size_bytes)].append(entry)
    out = []
    for (backend, algo, op, world_size, size_bytes), entries in groups.items():
        fractions: dict[str, list[float]] = defaultdict(list)
        delays_ms: list[float] = []
        delays_rtt: list[float] = []
        offsets: list[float] = []
        handoffs: list[int] = []
        turn_reps = 0
        two_way = 0
        connections = 0
        for entry in entries:
            rep_handoffs = 0
            for conn in entry.connections:
                turns = conn.turns or TurnsDocument()
                moved = turns.bulk_bytes
                if max(moved.values(), default=0) < BURST_MIN_BYTES:
                    continue
                connections += 1
                two_way += int(min(moved.values()) >= TWO_WAY_MIN_BYTES)
                for name in ("leader_only_fraction", "both_fraction", "follower_only_fraction"):
                    if getattr(turns, name) is not None:
                        fractions[name].append(getattr(turns, name))
                rep_handoffs += turns.handoff_count
                for event in turns.handoffs:
                    delays_ms.append(event.delay_s * 1e3)
                    if event.delay_rtt is not None:
                        delays_rtt.append(event.delay_rtt)
                    if event.trigger_offset_fraction is not None:
                        offsets.append(event.trigger_offset_fraction)
            handoffs.append(rep_handoffs)
            turn_reps += int(rep_handoffs > 0)
        out.append(TurnSummary(
            backend, algo, op, world_size, size_bytes, len(entries), connections, two_way, turn_reps,
            _median([float(h) for h in handoffs]), _median(fractions["leader_only_fraction"]),
            _median(fractions["both_fraction"]), _median(fractions["follower_only_fraction"]), _median(delays_ms),
            _median(delays_rtt), _median(offsets)))
    out.sort(key=lambda g: (str(g.backend), str(g.algo), str(g.op), g.world_size or 0, g.size_bytes or 0))
    return out


# --- the turns of one connection, fed by the passes ---------------------------------------------------


@dataclass
class _Answers:
    """Queries answered by Searcher: for each, r (numpy's searchsorted index) and the elements around it."""

    tags: np.ndarray
    q: np.ndarray
    r: np.ndarray
    has_prev: np.ndarray
    prev: np.ndarray
    prev_payload: np.ndarray   # (k, width) int64
    has_next: np.ndarray
    next: np.ndarray


class Searcher:
    """np.searchsorted(running maximum of a, q, side) where the array a and the queries q both arrive in file
    order, in chunks: r, the first index where a's running maximum passes q (side "right": exceeds it, "left":
    reaches it). A capture's clock steps back now and then (tcpdump on several CPUs, by microseconds); the
    running maximum is its time line, so a query's place does not depend on how the file was chunked. A query
    is answered once r is in sight, with a[r-1] (and its payload) and a[r]; the rest wait for later chunks,
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
    """A start of y's bulk data after a silence long enough to be a turn, and where it falls among x's data."""

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


class Turns:
    """The turn analysis of one connection within one aggregation (the whole capture, or one repetition):
    the time split, the handoffs (Y's bulk data restarting after a long silence within a few RTTs of a
    packet of X, after X sent a burst alone) and the control frames."""

    def __init__(self, aggregation: Aggregation, conn: Connection) -> None:
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
        self.gap = (0.0, 0.0)
        self.threshold = [0.0, 0.0]
        # Pass.RUNS and Pass.OVERLAP
        self.candidates: list[list[_Candidate]] = [[], []]   # [y]: y's bulk starts after a silence
        self._prev_bulk: list[float | None] = [None, None]
        self.after_own = [0, 0]
        self.peer_next = [OrderStats(np.float64), OrderStats(np.float64)]
        self._own: list[Searcher] = []
        self._peer: list[Searcher] = []
        self._tx: list[Searcher] = []
        self._queued = [False, False]
        self._cum = [0, 0]

    def _bulk(self, sizes: np.ndarray) -> np.ndarray:
        return (sizes > CONTROL_MAX_BYTES) | (sizes > CONTROL_MAX_SHARE * self.largest)

    def feed(self, step: Pass, ts: list[np.ndarray], sizes: list[np.ndarray]) -> None:
        if step is Pass.CADENCE:
            for d in (0, 1):
                if not ts[d].size:
                    continue
                bulk = self._bulk(sizes[d])
                self.bulk_bytes[d] += int(sizes[d][bulk].sum())
                nbulk = int(np.count_nonzero(bulk))
                if nbulk and self.first_bulk[d] is None:
                    self.first_bulk[d] = float(ts[d][int(np.argmax(bulk))])
                self.bulk_seen[d] += nbulk
                self.control[d] += int(ts[d].size - nbulk)
                self.preamble[d] += int(np.count_nonzero(sizes[d][~bulk] % GLOO_PREAMBLE_BYTES == 0))
            return
        bulk_mask = [self._bulk(sizes[d]) for d in (0, 1)]
        bulk_ts = [ts[d][bulk_mask[d]] for d in (0, 1)]
        small_ts = [ts[d][~bulk_mask[d]] for d in (0, 1)]
        if step is Pass.RUNS:
            for y in (0, 1):
                self._candidates(y, bulk_ts[y])
        for d in (0, 1):
            self._control(step, d, small_ts[d], bulk_ts[d], bulk_ts[1 - d])
        if step is Pass.OVERLAP:
            for x in (0, 1):
                self._locate(x, ts[x], sizes[x])

    def settle_run_gaps(self) -> None:
        self.gap = (self.conn.dirs[0].stream.run_gap, self.conn.dirs[1].stream.run_gap)
        self.threshold = [max(self.gap[y], TURN_MIN_SILENCE_FRACTION * self.span) for y in (0, 1)]
        self._searchers()

    def _searchers(self) -> None:
        self._own = [Searcher("left"), Searcher("left")]
        self._peer = [Searcher("right"), Searcher("right")]

    def _candidates(self, y: int, bulk: np.ndarray) -> None:
        if not bulk.size:
            return
        first = self._prev_bulk[y] if self._prev_bulk[y] is not None else self.start
        previous = np.concatenate([np.array([first]), bulk[:-1]])
        silence = bulk - previous
        for i in np.flatnonzero(silence >= self.threshold[y]).tolist():
            self.candidates[y].append(_Candidate(float(bulk[i]), float(previous[i]), float(silence[i])))
        self._prev_bulk[y] = float(bulk[-1])

    def _control(self, step: Pass, d: int, small: np.ndarray, own_bulk: np.ndarray, peer_bulk: np.ndarray) -> None:
        """Control frames: how many come right after the sender's own burst (Pass.RUNS) and the time from each
        to the peer's next bulk data (counted in Pass.RUNS, collected in Pass.OVERLAP)."""
        if self.control[d] == 0:
            return
        tags = np.zeros(small.size, dtype=np.int64)
        if step is Pass.RUNS:
            self._after_own(d, self._own[d].step(own_bulk, small, tags))
        self._peer_values(step, d, self._peer[d].step(peer_bulk, small, tags))

    def _after_own(self, d: int, answers: _Answers) -> None:
        """k = r - 1 >= 0 and the frame within the own run gap of a[k]."""
        ok = answers.r >= 1
        close = answers.q[ok] - answers.prev[ok] <= self.gap[d]
        self.after_own[d] += int(np.count_nonzero(close))

    def _peer_values(self, step: Pass, d: int, answers: _Answers) -> None:
        values = answers.next[answers.has_next] - answers.q[answers.has_next]
        if values.size:
            (self.peer_next[d].add if step is Pass.RUNS else self.peer_next[d].collect)(values)

    def settle_lookups(self) -> None:
        for d in (0, 1):
            if self.control[d]:
                self._after_own(d, self._own[d].finish())
                self._peer[d].finish()
            if self.peer_next[d].n:
                self.peer_next[d].want(median_ranks(self.peer_next[d].n))
        self._searchers()
        self._tx = [Searcher("right", width=2), Searcher("right", width=2)]
        self._queued = [False, False]  # y's candidate times go to x's searcher with x's first chunk

    def _locate(self, x: int, tx: np.ndarray, bx: np.ndarray) -> None:
        """Pass.OVERLAP: where y's candidate times fall among x's data packets (searchsorted, side right)."""
        candidates = self.candidates[1 - x]
        if not candidates:
            return
        if not self._queued[x]:
            self._queued[x] = True
            queries = np.array([t for c in candidates for t in (c.start, c.previous)])
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

    def settle_handoffs(self) -> None:
        for x in (0, 1):
            if self._tx and self.candidates[1 - x]:
                self._handoff_answers(x, self._tx[x].finish())
            if self.control[x]:
                self._peer[x].finish()

    def _handoffs(self, x: int, rtt_x: float | None) -> list[Handoff]:
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
            events.append(Handoff(DIRECTIONS[x], float(start), float(delay),
                                  float(delay / rtt_x) if rtt_x else None, int(candidate.trigger_bytes),
                                  int(cum_trigger), float(cum_trigger / total) if total > 0 else None,
                                  int(sent_during), float(candidate.silence), bool(continues)))
        return events

    def _control_frames(self, d: int) -> ControlFrames:
        if self.control[d] == 0:
            return ControlFrames(0, 0, 0, None)
        stats = self.peer_next[d]
        peer_next_ms = float(np_median(stats) * 1e3) if stats.n else None
        return ControlFrames(self.control[d], self.preamble[d], self.after_own[d], peer_next_ms)

    def document(self, busy_s: tuple[float, float], both: float, either: float,
                 rtt_s: tuple[float | None, ...]) -> TurnsDocument:
        events = [event for x in (0, 1) for event in self._handoffs(x, rtt_s[x])]
        return turns_document(self.span, busy_s, both, either, self.first_bulk, self.bulk_bytes, events,
                              [self._control_frames(d) for d in (0, 1)])

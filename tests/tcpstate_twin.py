"""The numpy twin of the TCP state kernel (diag.capture._ctcp): tshark's tcp.analysis state machine without a
per-packet loop -- the tests' independent reference for the kernel (tests/test_native_tcp.py).

Wireshark 4.0's tcp_analyze_sequence_number walks packets one by one and keeps, per direction,
``nextseq`` (highest seq + len of any packet seen, pure ACKs included), ``lastack``/``window`` (of the
last packet sent) and a duplicate-ACK counter. Each of those is a prefix quantity (a running maximum, the
previous row, a run length), so over packets sorted by (direction, file order) they are numpy
accumulations with a group offset. The reverse direction's state at a packet is the state after the last
reverse packet before it in file order. Two rules feed back on their own state - a zero-window probe does
not move nextseq, and an ACK beyond the captured data resets the peer's counter depending on where its
contiguous data ends - and are settled by short loops over their rare candidates only.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np

from diag.capture.pcapfile import ACK, FIN, RST, SYN
from diag.capture.tcpstate import PacketState

# tshark: a retransmission within this time of the reverse direction's last (>=2) duplicate ACK is "fast".
FAST_RETRANSMISSION_WINDOW_NS = 20_000_000
# tshark: out-of-order threshold when the handshake RTT is unknown.
DEFAULT_OOO_THRESHOLD_NS = 3_000_000
_WRAP = 1 << 32
_HALF = 1 << 31
_LOW32 = _WRAP - 1  # x & _LOW32 == x % _WRAP for int64, without a division
_GROUP_SPAN = 1 << 44  # > any unwrapped sequence span we track per direction (16 TiB)
_NEVER = 1 << 62  # a row index beyond every row: "no such packet"



def group_order(group: np.ndarray, ngroups: int) -> np.ndarray:
    """Stable permutation that sorts rows by group: a radix sort when group ids fit 16 bits."""
    if ngroups <= 8:  # a few connections: one pass per group beats any sort
        itype = index_dtype(group.size)
        return np.concatenate([np.flatnonzero(group == k).astype(itype, copy=False) for k in range(ngroups)]
                              or [np.zeros(0, dtype=itype)])
    if ngroups <= 1 << 16:
        return np.argsort(group.astype(np.uint16), kind="stable")
    return np.argsort(group, kind="stable")


def index_dtype(n: int) -> type:
    """Row indices in 32 bits when they fit: half the memory traffic of int64 for every index array."""
    return np.int32 if n < (1 << 31) - 1 else np.int64


def group_first(starts: np.ndarray) -> np.ndarray:
    """Index of the first row of each row's group (groups are contiguous)."""
    n = starts.size
    idx = np.arange(n, dtype=index_dtype(n))
    return np.fmax.accumulate(np.where(starts, idx, 0)) if n else idx


def group_starts(group: np.ndarray) -> np.ndarray:
    """Boolean: row starts a new group (groups are contiguous)."""
    start = np.ones(group.size, dtype=bool)
    if group.size > 1:
        start[1:] = group[1:] != group[:-1]
    return start


def previous_in_group(values: np.ndarray, starts: np.ndarray, fill: int) -> np.ndarray:
    out = np.empty_like(values)
    if values.size:
        out[1:] = values[:-1]
        out[starts] = fill
    return out


def running_max_exclusive(values: np.ndarray, group: np.ndarray, starts: np.ndarray, empty: int) -> np.ndarray:
    """Max of values over earlier rows of the same group; ``empty`` where there are none."""
    if values.size == 0:
        return values.copy()
    bounds = np.flatnonzero(starts)
    if bounds.size <= 64:  # few groups: a running max per slice, no per-row group offsets
        out = np.empty_like(values)
        for start, stop in zip(bounds.tolist(), [*bounds[1:].tolist(), values.size], strict=True):
            out[start] = empty
            if stop - start > 1:
                np.fmax.accumulate(values[start:stop - 1], out=out[start + 1:stop])
        return np.maximum(out, empty, out=out)
    # Lift each group above all earlier ones so one running max never crosses a group boundary.
    offset = group.astype(np.int64)
    offset *= _GROUP_SPAN * 4
    keyed = values - empty  # >= 0 for real values, so 0 means "none"
    keyed += offset
    acc = np.fmax.accumulate(keyed)
    del keyed
    out = np.empty_like(values)
    out[1:] = acc[:-1]
    del acc
    out[1:] -= offset[1:]
    out += empty
    out[0] = empty
    out[starts] = empty
    return np.maximum(out, empty, out=out)


def last_index_where(mask: np.ndarray, starts: np.ndarray, first: np.ndarray | None = None) -> np.ndarray:
    """For each row, the index of the latest row at or before it (same group) where mask holds, else -1.

    first: group_first(starts), when the caller already has it.
    """
    n = mask.size
    if first is None:
        first = group_first(starts)
    pos = np.where(mask, np.arange(n, dtype=first.dtype), -1)
    acc = np.fmax.accumulate(pos) if n else pos
    return np.where(acc >= first, acc, -1)


def unwrap(values: np.ndarray, starts: np.ndarray, first: np.ndarray | None = None) -> np.ndarray:
    """32-bit sequence numbers -> int64 relative to each group's first row, following wrap-arounds."""
    v = values.astype(np.uint32)
    delta = np.zeros(v.size, dtype=np.int64)
    if v.size > 1:
        # uint32 subtraction wraps modulo 2**32; reading it as int32 gives the signed step in (-2**31, 2**31).
        delta[1:] = (v[1:] - v[:-1]).view(np.int32)
    delta[starts] = 0
    total = np.cumsum(delta, out=delta)
    if first is None:
        first = group_first(starts)
    if v.size:
        total -= total[first]
    return total


def analyze_packets_numpy(cols: dict[str, np.ndarray], conn: np.ndarray, direction: np.ndarray,
                           wscale: np.ndarray, first_rtt_ns: np.ndarray) -> PacketState:
    """The numpy twin of the C kernel: analyze_packets vectorized, without a per-packet loop.

    Intermediate arrays are deleted as soon as they are used: at millions of packets each is tens of MB.
    """
    n = conn.size
    itype = index_dtype(n)
    flags = cols["flags"]
    plen = cols["plen"].astype(np.int64)
    ts = cols["ts_ns"]
    seq32 = cols["seq"]
    ack32 = cols["ack"]
    win = cols["win"].astype(np.int64)
    synfin = (flags & (SYN | FIN)) != 0
    syn_fin_rst = (flags & (SYN | FIN | RST)) != 0
    has_ack = (flags & ACK) != 0

    # Direction-major order: every per-direction prefix quantity is an accumulation over a contiguous run.
    ngroups = 2 * (int(conn.max()) + 1) if n else 0
    group = conn.astype(np.int64) * 2 + direction
    order = group_order(group, ngroups).astype(itype, copy=False)
    # Parts that need nothing computed below run on a second core (numpy releases the GIL in the
    # bulk work) while this thread walks the per-direction state.
    helper = ThreadPoolExecutor(max_workers=1, thread_name_prefix="diag-tcpstate")
    reverse = helper.submit(_reverse_packets, conn, direction, ngroups // 2, itype)
    ts_rtt_future = helper.submit(_ts_rtt, cols, order, group, ts, has_ack)
    g = group[order]
    starts = group_starts(g)
    first = group_first(starts)
    o_seq32, o_plen, o_synfin = seq32[order], plen[order], synfin[order]
    o_ack32 = ack32[order].astype(np.int64)
    inverse = np.empty(n, dtype=itype)  # direction-major row -> time-order row
    inverse[order] = np.arange(n, dtype=itype)
    # The ACK-number unwrap needs only the ordering: a third part for the second core.
    ack_rel_future = helper.submit(_ack_rel, g, starts, first, o_seq32, o_ack32, has_ack[order], ngroups, inverse)
    o_ts = ts[order]
    seq_rel = unwrap(o_seq32, starts, first)
    end_rel = seq_rel + o_plen + o_synfin
    empty = -(_GROUP_SPAN)

    # tshark's nextseq: the highest seq + len (+1 for SYN/FIN) of *every* earlier packet of the direction,
    # pure ACKs included (a pure ACK beyond the data seen moves it: the capture missed that data), except
    # zero-window probes. A probe is recognised by nextseq itself, so the rare candidates (1 byte while
    # the reverse direction's last window was 0) are settled one by one.
    zwp: np.ndarray | None = None  # time order; None: no probe at all (the usual case)
    moves_next = end_rel  # what each packet offers to nextseq: its end, `empty` for a probe
    one_byte = plen == 1
    has_rev = r = None
    if one_byte.any():
        has_rev, r = reverse.result()
        zwp_candidate = one_byte & has_rev & (win[r] == 0)
        if zwp_candidate.any():
            o_zwp = _zero_window_probes(zwp_candidate[order], g, starts, seq_rel, end_rel, empty)
            if o_zwp.any():
                zwp = np.empty(n, dtype=bool)
                zwp[order] = o_zwp
                moves_next = np.where(o_zwp, empty, end_rel)
            del o_zwp
        del zwp_candidate
    del one_byte
    nextseq_before = running_max_exclusive(moves_next, g, starts, empty)
    has_nextseq = nextseq_before > empty
    # Time at which the current nextseq was set (the first packet, or a strictly new maximum).
    sets_max = moves_next > nextseq_before
    setter = last_index_where(sets_max, starts, first)
    del sets_max
    setter_before = previous_in_group(setter, starts, -1)
    del setter
    nextseq_time = np.where(setter_before >= 0, o_ts[np.maximum(setter_before, 0)], 0)
    del setter_before, o_ts

    # Sequence space first covered by this packet's data: a segment that jumps over a hole the capture
    # missed claims the hole too (it was sent), so the sum over a direction is highest end - first seq.
    data_end = np.where(o_plen > 0, seq_rel + o_plen, empty)
    prev_data_end = running_max_exclusive(data_end, g, starts, empty)
    base = np.where(prev_data_end > empty, prev_data_end, seq_rel)
    new_bytes = np.where(o_plen > 0, np.maximum(0, seq_rel + o_plen - base), 0)
    data_high = np.maximum(prev_data_end, data_end)  # the highest data end so far, this packet's included
    del prev_data_end, base, data_end

    # This direction's previous packet (tshark's fwd->window / fwd->lastack).
    o_win = win[order]
    prev_win = previous_in_group(o_win, starts, -1)
    prev_ack = previous_in_group(o_ack32, starts, -1)
    plain = ~syn_fin_rst[order]
    if zwp is not None:
        plain &= ~zwp[order]  # a zero-window probe skips every check up to the duplicate ACK
    below_next = nextseq_before - seq_rel  # 0: at nextseq; 1: one byte below it
    seq_eq_next = has_nextseq & (below_next == 0)
    keep_alive = plain & (o_plen <= 1) & has_nextseq & (below_next == 1)
    del below_next
    dup_ack = (plain & (o_plen == 0) & (o_win != 0) & (o_win == prev_win) & seq_eq_next
               & (o_ack32 == prev_ack))
    del o_win, prev_win, seq_eq_next, plain
    t_keep_alive = None
    if keep_alive.any():
        # An ACK of a keep-alive repeats the previous ACK like a duplicate but is not one.
        if r is None:
            has_rev, r = reverse.result()
        t_keep_alive = keep_alive[inverse]
        after_keep_alive = (has_rev & t_keep_alive[r])[order]
        dup_ack &= ~after_keep_alive
        del after_keep_alive
    del keep_alive
    # tshark's dupacknum: duplicate ACKs since this direction's ACK number last changed. (A window update
    # in between does not reset it.)
    ack_changes = starts | (o_ack32 != prev_ack)
    del prev_ack
    dupacknum = _run_counts(dup_ack, ack_changes, starts, first)
    del ack_changes

    # Back to time order for the cross-direction lookups.
    def to_time(a: np.ndarray, inverse: np.ndarray = inverse) -> np.ndarray:
        return a[inverse]

    # One array at a time, each direction-major original freed as soon as its copy exists: the two
    # orders of every column alive at once were the analysis's peak of memory.
    t_seq_rel = to_time(seq_rel)
    del seq_rel
    t_moves_next = None if moves_next is end_rel else to_time(moves_next)
    del moves_next
    t_end_rel = to_time(end_rel)
    del end_rel
    if t_moves_next is None:
        t_moves_next = t_end_rel
    t_next = to_time(nextseq_before)
    del nextseq_before, has_nextseq
    t_has_next = t_next > empty
    t_next_time = to_time(nextseq_time)
    del nextseq_time
    t_dupack = to_time(dup_ack)
    del dup_ack
    t_dupacknum = to_time(dupacknum)
    del dupacknum
    new_bytes = to_time(new_bytes)

    if r is None:
        has_rev, r = reverse.result()
    assert has_rev is not None

    ack_rel = ack_rel_future.result()  # in the reverse direction's seq_rel space
    # This direction's highest ACK before each packet (packets with the ACK flag only), for peer_in_flight.
    prev_ack_max = to_time(running_max_exclusive(np.where(has_ack[order], ack_rel[order], empty), g, starts,
                                                 empty))
    t_data_high = to_time(data_high)
    del o_seq32, o_ack32, g, starts, first, inverse, data_high

    peer_in_flight = _peer_in_flight(has_ack, has_rev, ack_rel, prev_ack_max, t_data_high[r], empty)
    del prev_ack_max, t_data_high
    rev_ack_rel = ack_rel[r]                  # reverse's lastack, in *this* direction's seq_rel space
    rev_ack32 = ack32[r].astype(np.int64)     # tshark keeps the ACK field even without the ACK flag
    rev_ack_valid = has_rev & has_ack[r]
    rev_dupacknum = t_dupacknum[r]
    # An ACK beyond everything captured of the other direction resets that direction's counter (rare:
    # the capture missed packets the peer received).
    resets = _ack_beyond_capture(group, order, has_ack, ack_rel, has_rev, r, t_seq_rel, t_next, t_moves_next, empty)
    del t_moves_next
    if resets.size:
        rev_dupacknum = _reset_rev_counts(resets, group, order, ack32, t_dupack, r)
    del t_dupacknum

    data_or_sf = (plen > 0) | synfin
    if t_keep_alive is not None:
        data_or_sf &= ~t_keep_alive  # a keep-alive is never a retransmission
        del t_keep_alive
    # seq below nextseq - except a segment of more than one byte starting one byte below it (after a
    # zero-window probe it carries new data).
    below_next = t_next - t_seq_rel
    not_advanced = data_or_sf & t_has_next & ((below_next > 1) | ((below_next == 1) & (plen <= 1)))
    # Spurious comes first: data the reverse direction already ACKed, wherever nextseq is.
    end32 = (seq32 + plen) & _LOW32
    spurious = (data_or_sf & (plen > 0) & has_rev & (rev_ack32 != 0)
                & ((((end32 - rev_ack32 + _HALF) & _LOW32) - _HALF) <= 0))
    since_rev = ts - ts[r]
    fast = (not_advanced & ~spurious & has_rev & (rev_dupacknum >= 2) & (rev_ack32 == seq32)
            & (since_rev >= 0) & (since_rev < FAST_RETRANSMISSION_WINDOW_NS))
    del rev_dupacknum, since_rev
    # Per connection first, then per packet (a scalar when there is one connection).
    threshold_of_conn = np.where(first_rtt_ns > 0, first_rtt_ns, DEFAULT_OOO_THRESHOLD_NS)
    ooo_threshold = threshold_of_conn[0] if threshold_of_conn.size == 1 else threshold_of_conn[conn]
    del threshold_of_conn
    since_next = ts - t_next_time
    ooo = (not_advanced & ~spurious & ~fast & (since_next >= 0) & (since_next < ooo_threshold)
           & (t_next != t_end_rel))
    del ooo_threshold, t_next_time, since_next
    retrans = (not_advanced & ~ooo) | spurious  # tshark marks fast and spurious ones as retransmissions too
    lost = t_has_next & (below_next < 0) & ((flags & RST) == 0)
    del below_next
    del not_advanced, data_or_sf

    zero_window = (win == 0) & ~syn_fin_rst
    checked = ~syn_fin_rst
    if zwp is not None:  # a probe skips the lost-segment, zero-window and window-full checks
        lost &= ~zwp
        zero_window &= ~zwp
        checked &= ~zwp
    # group = conn * 2 + direction indexes the (connection, direction) rows of wscale flattened.
    flat_wscale = np.ascontiguousarray(wscale).ravel()
    shift_fwd = flat_wscale[group]
    shift_rev = flat_wscale[group ^ 1]
    # The reverse side's window is unscaled while its last packet is its SYN (tshark's is_first_ack).
    # (Gathered only here, from r, so that these two are not alive through the checks above.)
    rev_win = win[r]
    rev_is_syn = (flags[r] & SYN) != 0
    del r
    rev_shift = np.where(rev_is_syn, 0, np.maximum(shift_rev, 0))
    window_full = ((plen > 0) & checked & has_rev & (shift_rev >= 0)
                   & (end32 == ((rev_ack32 + (rev_win << rev_shift)) & _LOW32)))
    del rev_shift, shift_rev, rev_win, rev_ack32, rev_is_syn, end32, checked
    window_bytes = np.where(shift_fwd >= 0, win << np.maximum(shift_fwd, 0), win)
    window_bytes = np.where((flags & SYN) != 0, win, window_bytes)  # the SYN's own window is never scaled
    window_bytes = window_bytes.astype(np.int32)  # <= 65535 << 14 fits; half the memory of int64
    del shift_fwd

    highest = np.maximum(t_next, t_end_rel)
    in_flight = np.where((plen > 0) & rev_ack_valid, np.maximum(highest - rev_ack_rel, 0), -1)
    del highest, rev_ack_rel, t_next

    ack_rtt = _ack_rtt(order, group, ts, plen, t_end_rel, retrans, ack_rel, has_ack)
    ts_rtt = ts_rtt_future.result()
    helper.shutdown()
    return PacketState(conn, direction, t_seq_rel, t_end_rel, new_bytes, retrans, fast, spurious,
                       ooo, lost, t_dupack, zero_window, window_full, in_flight, window_bytes, ack_rtt, ts_rtt,
                       peer_in_flight)


def _peer_in_flight(has_ack: np.ndarray, has_rev: np.ndarray, ack_rel: np.ndarray, prev_ack_max: np.ndarray,
                    rev_data_high: np.ndarray, empty: int) -> np.ndarray:
    """On an ACK above every earlier ACK of its direction, while that earlier maximum lay below the reverse
    direction's highest data end (it acknowledges data not acknowledged before): the reverse direction's data
    still in flight after it, saturated to int32; -1 elsewhere."""
    advance = (has_ack & has_rev & (prev_ack_max > empty) & (ack_rel > prev_ack_max) & (rev_data_high > empty)
               & (prev_ack_max < rev_data_high))
    left = np.clip(rev_data_high - ack_rel, 0, np.iinfo(np.int32).max)
    return np.where(advance, left, -1).astype(np.int32)


def _run_counts(hits: np.ndarray, run_starts: np.ndarray, starts: np.ndarray, first: np.ndarray) -> np.ndarray:
    """Direction-major: hits counted since the latest run start at or before each row (the row included)."""
    total = np.cumsum(hits)
    base_at = np.where(run_starts, total - hits, 0)
    base_index = last_index_where(run_starts, starts, first)
    return total - base_at[np.maximum(base_index, 0)]


def _ack_beyond_capture(group: np.ndarray, order: np.ndarray, has_ack: np.ndarray, ack_rel: np.ndarray,
                        has_rev: np.ndarray, r: np.ndarray, seq_rel: np.ndarray, nextseq_before: np.ndarray,
                        end_rel: np.ndarray, empty: int) -> np.ndarray:
    """Time-order rows at which tshark sets the reverse direction's duplicate-ACK counter to -1.

    tshark's "ACKed unseen segment" check: a packet whose ACK lies beyond the reverse direction's
    maxseqtobeacked (the end of its contiguous data, which jumps to nextseq whenever a packet starts
    exactly at it) either catches maxseqtobeacked up to nextseq, when it lagged behind, or - when it was
    already there, i.e. the ACK covers data beyond everything captured - resets that direction's counter.
    Only the second changes a verdict we report (the fast-retransmission test, see _reset_rev_counts). It
    needs the ACK beyond nextseq, which the first vectorized test finds; only then are the rare lagging
    stretches of maxseqtobeacked walked, one per hole in the captured data.
    end_rel: each packet's seq + len (+1 for SYN/FIN), `empty` for zero-window probes (which move nothing).
    """
    nextseq_after = np.maximum(nextseq_before, end_rel)
    acked_next = nextseq_after[r]
    rows = np.flatnonzero(ack_rel > acked_next)  # few; the other conditions are checked on them only
    rows = rows[has_ack[rows] & has_rev[rows] & (acked_next[rows] > empty)]
    del acked_next
    if not rows.size:
        return np.zeros(0, dtype=np.int64)
    beyond = np.zeros(group.size, dtype=bool)
    beyond[rows] = True
    g = group[order]
    bounds = np.searchsorted(g, np.arange(int(g[-1]) + 2)) if g.size else np.zeros(1, dtype=np.int64)
    resets: list[np.ndarray] = []
    for acking in np.unique(group[beyond]).tolist():
        acked = acking ^ 1  # the direction whose data the ACKs cover: its maxseqtobeacked is walked
        x_rows = order[bounds[acked]:bounds[acked + 1]].astype(np.int64)
        y_rows = order[bounds[acking]:bounds[acking + 1]].astype(np.int64)
        y_beyond = y_rows[beyond[y_rows]]
        moves = end_rel[x_rows] > empty  # zero-window probes never touch maxseqtobeacked
        x_seq = seq_rel[x_rows]
        x_next = nextseq_before[x_rows]
        # A lag starts where a packet raises nextseq without starting at it; maxseqtobeacked stays at the
        # old nextseq until a packet starts exactly there or an ACK passes it.
        lag_start = moves & (x_next > empty) & (nextseq_after[x_rows] > x_next) & (x_seq != x_next)
        starts_at, levels = x_rows[lag_start], x_next[lag_start]
        resync_order = np.lexsort((x_rows[moves], x_seq[moves]))
        resync_seq, resync_row = x_seq[moves][resync_order], x_rows[moves][resync_order]
        y_acks = y_rows[has_ack[y_rows]]
        y_ack_values = ack_rel[y_acks]
        caught_up_by_ack: list[int] = []
        position = -1
        while True:
            k = int(np.searchsorted(starts_at, position, side="right"))
            if k >= starts_at.size:
                break
            row, level = int(starts_at[k]), int(levels[k])
            # the first later packet of this direction starting exactly at the level ...
            j = int(np.searchsorted(resync_seq, level, side="left"))
            j += int(np.searchsorted(resync_row[j:np.searchsorted(resync_seq, level, side="right")], row,
                                     side="right"))
            by_packet = int(resync_row[j]) if j < resync_seq.size and resync_seq[j] == level else _NEVER
            # ... or the first later ACK beyond it, whichever comes first
            by_ack = _first_above(y_acks, y_ack_values, row, by_packet, level)
            if by_ack >= 0:
                caught_up_by_ack.append(by_ack)
                position = by_ack
            else:
                position = by_packet
            if position == _NEVER:
                break
        resets.append(np.setdiff1d(y_beyond, np.array(caught_up_by_ack, dtype=np.int64)))
    return np.sort(np.concatenate(resets))


def _first_above(rows: np.ndarray, values: np.ndarray, after: int, before: int, level: int) -> int:
    """First of rows in (after, before) whose value exceeds level, else -1; scanned in growing windows
    so the work is bounded by the distance to the hit."""
    lo = int(np.searchsorted(rows, after, side="right"))
    hi = int(np.searchsorted(rows, before, side="left"))
    step = 64
    while lo < hi:
        stop = min(hi, lo + step)
        hit = np.flatnonzero(values[lo:stop] > level)
        if hit.size:
            return int(rows[lo + hit[0]])
        lo, step = stop, step * 4
    return -1


def _reset_rev_counts(resets: np.ndarray, group: np.ndarray, order: np.ndarray, ack32: np.ndarray,
                      dup_ack: np.ndarray, r: np.ndarray) -> np.ndarray:
    """The reverse direction's duplicate-ACK counter at each packet, with tshark's resets applied.

    resets: time-order rows of the acking direction; each sets the counter of its reverse direction to
    -1, which tshark keeps in an unsigned 32-bit field: it reads 4294967295 (>= 2, so a retransmission
    may be "fast") until that direction's next duplicate ACK (counted as 1) or ACK change (0).
    """
    n = group.size
    g = group[order]
    starts = group_starts(g)
    first = group_first(starts)
    o_ack32 = ack32[order]
    ack_changes = starts.copy()
    ack_changes[1:] |= o_ack32[1:] != o_ack32[:-1]
    del o_ack32
    reset_mark = np.zeros(n, dtype=bool)
    pending = np.zeros(n, dtype=bool)
    bounds = np.searchsorted(g, np.arange(int(g[-1]) + 2))
    for acking in np.unique(group[resets]).tolist():
        qs = resets[group[resets] == acking]
        counted = acking ^ 1
        lo, hi = int(bounds[counted]), int(bounds[counted + 1])
        k = lo + np.searchsorted(order[lo:hi], qs, side="right")  # the counted direction's next packet
        reset_mark[k[k < hi]] = True
        next_time = np.where(k < hi, order[np.minimum(k, hi - 1)], n)
        # The acking direction's packets from each reset up to that next packet read the reset value.
        span = order[int(bounds[acking]):int(bounds[acking + 1])]
        depth = np.zeros(span.size + 1, dtype=np.int64)
        np.add.at(depth, np.searchsorted(span, qs, side="left"), 1)
        np.add.at(depth, np.searchsorted(span, next_time, side="left"), -1)
        pending[span[np.cumsum(depth[:-1]) > 0]] = True
    run_starts = ack_changes | reset_mark
    counts = _run_counts(dup_ack[order], run_starts, starts, first)
    run_start = last_index_where(run_starts, starts, first)
    unsigned_minus_one = (counts == 0) & reset_mark[run_start] & ~ack_changes[run_start]
    counts[unsigned_minus_one] = _LOW32
    in_time = np.empty(n, dtype=np.int64)
    in_time[order] = counts
    rev_counts = in_time[r]
    rev_counts[pending] = _LOW32
    return rev_counts


def _zero_window_probes(candidate: np.ndarray, g: np.ndarray, starts: np.ndarray, seq_rel: np.ndarray,
                        end_rel: np.ndarray, empty: int) -> np.ndarray:
    """Which candidates (direction-major rows) are zero-window probes: seq == nextseq at that point.

    A probe does not move nextseq, so each candidate's verdict depends on the earlier ones: nextseq is
    taken without any candidate, then the candidates (rare: a 1-byte segment into a zero window) are
    walked in order, each adding its end only when it is not a probe.
    """
    without = running_max_exclusive(np.where(candidate, empty, end_rel), g, starts, empty)
    probe = np.zeros(candidate.size, dtype=bool)
    accepted: dict[int, int] = {}  # group -> highest end of the candidates that were not probes
    rows = np.flatnonzero(candidate)
    for row, grp, before, seq, end in zip(rows.tolist(), g[rows].tolist(), without[rows].tolist(),
                                          seq_rel[rows].tolist(), end_rel[rows].tolist(), strict=True):
        nextseq = max(before, accepted.get(grp, empty))
        if nextseq > empty and seq == nextseq:
            probe[row] = True
        else:
            accepted[grp] = max(accepted.get(grp, empty), end)
    return probe


def _ack_rel(g: np.ndarray, starts: np.ndarray, first: np.ndarray, o_seq32: np.ndarray, o_ack32: np.ndarray,
             o_has_ack: np.ndarray, ngroups: int, inverse: np.ndarray) -> np.ndarray:
    """Each packet's ACK number unwrapped into the *other* direction's seq_rel space, in time order.

    Inputs are in direction-major order (g, starts, first as in analyze_packets). Packets without the ACK
    flag (a bare SYN) carry no ACK number: forward-fill so they do not break the unwrap.
    """
    base_seq32 = np.zeros(ngroups, dtype=np.int64)
    known_base = np.zeros(ngroups, dtype=bool)
    base_seq32[g[starts]] = o_seq32[starts]
    known_base[g[starts]] = True
    fill_idx = last_index_where(o_has_ack, starts, first)
    a_filled = np.where(fill_idx >= 0, o_ack32[np.maximum(fill_idx, 0)], o_ack32)
    del fill_idx
    a_unwrapped = unwrap(a_filled, starts, first)
    # The anchor is one number per direction: its first row's ACK against the reverse direction's base.
    heads = np.flatnonzero(starts)
    first_ack = a_filled[heads]
    del a_filled
    target = g[heads] ^ 1  # g = conn * 2 + direction, so the reverse direction is g ^ 1
    target_base = np.where(known_base[target], base_seq32[target], first_ack)
    anchor = ((first_ack - target_base + _HALF) & _LOW32) - _HALF
    a_unwrapped += np.repeat(anchor, np.diff(np.append(heads, g.size)))
    return a_unwrapped[inverse]


def _reverse_packets(conn: np.ndarray, direction: np.ndarray, nconn: int, itype: type
                     ) -> tuple[np.ndarray, np.ndarray]:
    """(has a reverse packet, index of it): the reverse direction's last packet before each packet."""
    # Connections that never interleave in time (one connection, or one after another) are in
    # connection-major order already: no permutation to apply and to undo (three gathers and a scatter
    # of every row).
    in_order = nconn <= 1 or bool((conn[1:] >= conn[:-1]).all())
    corder = None if in_order else group_order(conn, nconn).astype(itype, copy=False)  # connection-major
    cstarts = group_starts(conn if corder is None else conn[corder])
    cfirst = group_first(cstarts)
    cdir1 = (direction if corder is None else direction[corder]) == 1
    last_dir1 = last_index_where(cdir1, cstarts, cfirst)
    last_dir0 = last_index_where(~cdir1, cstarts, cfirst)
    rev_c = np.where(cdir1, last_dir0, last_dir1)
    del last_dir1, last_dir0, cdir1, cstarts, cfirst
    if corder is None:
        rev = rev_c
    else:
        rev = np.full(conn.size, -1, dtype=itype)
        rev[corder] = np.where(rev_c >= 0, corder[np.maximum(rev_c, 0)], -1)
    del rev_c, corder
    return rev >= 0, np.maximum(rev, 0)


def _ack_rtt(order: np.ndarray, group: np.ndarray, ts: np.ndarray, plen: np.ndarray, end_rel: np.ndarray,
             retrans: np.ndarray, ack_rel: np.ndarray, has_ack: np.ndarray) -> np.ndarray:
    """RTT from a data segment to the first ACK that covers exactly its end (Karn: never retransmitted).

    Rows are taken in direction-major order (order), so the sort keys below are nearly sorted already and
    the stable sorts run in about linear time.
    """
    n = ts.size
    out = np.full(n, -1, dtype=np.int64)
    data = order[((plen > 0) & ~retrans)[order]]
    if data.size == 0:
        return out
    key_data = group[data] * _GROUP_SPAN * 4 + end_rel[data]
    sort = np.argsort(key_data, kind="stable")
    key_sorted, data_sorted = key_data[sort], data[sort]
    del key_data, sort, data
    # Only the first ACK that reaches a given point measures an RTT; later ones are duplicates.
    acks = order[has_ack[order]]
    target = (group[acks] ^ 1) * _GROUP_SPAN * 4 + ack_rel[acks]
    _, first = np.unique(target, return_index=True)
    acks, target = acks[first], target[first]
    pos = np.searchsorted(key_sorted, target)
    found = pos < key_sorted.size
    found[found] &= key_sorted[pos[found]] == target[found]
    rows = acks[found]
    sent = ts[data_sorted[pos[found]]]
    delta = ts[rows] - sent
    good = delta >= 0
    out[rows[good]] = delta[good]
    return out


def _ts_rtt(cols: dict[str, np.ndarray], order: np.ndarray, group: np.ndarray, ts: np.ndarray,
            has_ack: np.ndarray) -> np.ndarray:
    """RTT from the first packet carrying a TSval to the first reverse packet echoing it (RFC 7323)."""
    n = ts.size
    out = np.full(n, -1, dtype=np.int64)
    has_ts = cols["has_ts"]
    senders = order[has_ts[order]]
    echoers = order[(has_ts & has_ack & (cols["tsecr"] != 0))[order]]
    if senders.size == 0 or echoers.size == 0:
        return out
    key_s = group[senders] * _WRAP + cols["tsval"][senders].astype(np.int64)
    uniq_s, first_s = np.unique(key_s, return_index=True)
    del key_s
    key_e = (group[echoers] ^ 1) * _WRAP + cols["tsecr"][echoers].astype(np.int64)
    uniq_e, first_e = np.unique(key_e, return_index=True)
    del key_e
    pos = np.searchsorted(uniq_s, uniq_e)
    found = pos < uniq_s.size
    found[found] &= uniq_s[pos[found]] == uniq_e[found]
    rows = echoers[first_e[found]]
    delta = ts[rows] - ts[senders[first_s[pos[found]]]]
    good = delta >= 0
    out[rows[good]] = delta[good]
    return out

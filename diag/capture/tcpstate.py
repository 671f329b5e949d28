"""Per-packet TCP analysis flags, vectorized: tshark's tcp.analysis state machine without a Python loop.

tshark walks packets one by one and keeps, per direction, ``nextseq`` (highest sequence end seen),
``lastack``/``window`` (of the last packet sent) and a duplicate-ACK counter. Each of those is a prefix
quantity (a running maximum, the previous row, a run length), so over packets sorted by (direction, file
order) they are numpy accumulations with a group offset. The reverse direction's state at a packet is the
state after the last reverse packet before it in file order. The rules themselves are quoted in
docs/analyzer.md next to the places where this implementation deliberately differs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from diag.capture.reader import ACK, FIN, RST, SYN

# tshark: a retransmission within this time of the reverse direction's last (>=2) duplicate ACK is "fast".
FAST_RETRANSMISSION_WINDOW_NS = 20_000_000
# tshark: out-of-order threshold when the handshake RTT is unknown.
DEFAULT_OOO_THRESHOLD_NS = 3_000_000
_WRAP = 1 << 32
_HALF = 1 << 31
_GROUP_SPAN = 1 << 44  # > any unwrapped sequence span we track per direction (16 TiB)


@dataclass
class PacketState:
    """Arrays in the analysis' time order (one entry per TCP packet)."""

    conn: np.ndarray            # connection index
    direction: np.ndarray       # 0: a->b, 1: b->a
    seq_rel: np.ndarray         # unwrapped, relative to the direction's first sequence number
    end_rel: np.ndarray         # seq_rel + payload (+1 for SYN/FIN)
    new_bytes: np.ndarray       # payload bytes never seen before in this direction
    retransmission: np.ndarray  # tshark's tcp.analysis.retransmission (includes fast + spurious)
    fast_retransmission: np.ndarray
    spurious_retransmission: np.ndarray
    out_of_order: np.ndarray
    lost_segment: np.ndarray
    dup_ack: np.ndarray
    zero_window: np.ndarray
    window_full: np.ndarray
    in_flight: np.ndarray       # bytes in flight after a data packet (-1 where not defined)
    window_bytes: np.ndarray    # advertised window scaled by the known shift (raw where unknown)
    ack_rtt_ns: np.ndarray      # data -> ACK RTT, attributed to the ACK packet (-1 where none)
    ts_rtt_ns: np.ndarray       # TSval -> TSecr RTT, attributed to the echoing packet (-1 where none)


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
    shifted = values - empty  # >= 0 for real values, so 0 means "none"
    keyed = shifted + group.astype(np.int64) * _GROUP_SPAN * 4
    acc = np.maximum.accumulate(keyed)
    out = np.empty_like(values)
    out[1:] = acc[:-1] - group[1:].astype(np.int64) * _GROUP_SPAN * 4 + empty
    out[0] = empty
    out[starts] = empty
    return np.maximum(out, empty)


def last_index_where(mask: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """For each row, the index of the latest row at or before it (same group) where mask holds, else -1."""
    n = mask.size
    pos = np.where(mask, np.arange(n), -1)
    start_pos = np.where(starts, np.arange(n), 0)
    group_first = np.maximum.accumulate(start_pos) if n else start_pos
    acc = np.maximum.accumulate(pos) if n else pos
    return np.where(acc >= group_first, acc, -1)


def unwrap(values: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """32-bit sequence numbers -> int64 relative to each group's first row, following wrap-arounds."""
    v = values.astype(np.int64)
    delta = np.zeros_like(v)
    if v.size > 1:
        delta[1:] = ((v[1:] - v[:-1] + _HALF) % _WRAP) - _HALF
    delta[starts] = 0
    total = np.cumsum(delta)
    base = total[np.maximum.accumulate(np.where(starts, np.arange(v.size), 0))] if v.size else total
    return total - base


def analyze_packets(cols: dict[str, np.ndarray], conn: np.ndarray, direction: np.ndarray,
                    wscale: np.ndarray, first_rtt_ns: np.ndarray) -> PacketState:
    """cols: reader columns in time order. wscale[conn, dir]: shift of dir's advertised window, -1 unknown.

    first_rtt_ns[conn]: handshake RTT (tshark's ts_first_rtt) or 0 when the handshake was not captured.
    """
    n = conn.size
    flags = cols["flags"].astype(np.int64)
    plen = cols["plen"].astype(np.int64)
    ts = cols["ts_ns"]
    seq32 = cols["seq"].astype(np.int64)
    ack32 = cols["ack"].astype(np.int64)
    win = cols["win"].astype(np.int64)
    synfin = (flags & (SYN | FIN)) != 0
    syn_fin_rst = (flags & (SYN | FIN | RST)) != 0
    has_ack = (flags & ACK) != 0

    # Direction-major order: every per-direction prefix quantity is an accumulation over a contiguous run.
    group = conn.astype(np.int64) * 2 + direction
    order = np.lexsort((np.arange(n), group))
    g = group[order]
    starts = group_starts(g)
    o_seq32, o_plen, o_synfin = seq32[order], plen[order], synfin[order]
    o_ts = ts[order]
    seq_rel = unwrap(o_seq32, starts)
    end_rel = seq_rel + o_plen + o_synfin
    advances = (o_plen > 0) | o_synfin
    empty = -(_GROUP_SPAN)
    nextseq_before = running_max_exclusive(np.where(advances, end_rel, empty), g, starts, empty)
    has_nextseq = nextseq_before > empty
    # Time at which the current nextseq was set (a strictly new maximum).
    inclusive_max = np.maximum(nextseq_before, np.where(advances, end_rel, empty))
    sets_max = advances & (end_rel > nextseq_before)
    setter = last_index_where(sets_max, starts)
    setter_before = previous_in_group(setter, starts, -1)
    nextseq_time = np.where(setter_before >= 0, o_ts[np.maximum(setter_before, 0)], 0)
    del inclusive_max

    # Sequence space first covered by this packet's data: a segment that jumps over a hole the capture
    # missed claims the hole too (it was sent), so the sum over a direction is highest end - first seq.
    data_end = np.where(o_plen > 0, seq_rel + o_plen, empty)
    prev_data_end = running_max_exclusive(data_end, g, starts, empty)
    base = np.where(prev_data_end > empty, prev_data_end, seq_rel)
    new_bytes = np.where(o_plen > 0, np.maximum(0, seq_rel + o_plen - base), 0)

    # This direction's previous packet (tshark's fwd->window / fwd->lastack).
    o_win, o_ack32 = win[order], ack32[order]
    prev_win = previous_in_group(o_win, starts, -1)
    prev_ack = previous_in_group(o_ack32, starts, -1)
    # nextseq in 32-bit space: tshark compares absolute sequence numbers with '=='.
    seq_eq_next = has_nextseq & (seq_rel == nextseq_before)
    o_sfr = syn_fin_rst[order]
    dup_ack = ((o_plen == 0) & (o_win != 0) & (o_win == prev_win) & seq_eq_next
               & (o_ack32 == prev_ack) & ~o_sfr)
    # tshark's dupacknum: duplicate ACKs since this direction's ACK number last changed. (A window update
    # in between does not reset it - measured against tshark 4.0.)
    ack_changes = starts | (o_ack32 != prev_ack)
    dup_total = np.cumsum(dup_ack)
    run_base_at = np.where(ack_changes, dup_total - dup_ack, 0)
    base_index = last_index_where(ack_changes, starts)
    dupacknum = dup_total - run_base_at[np.maximum(base_index, 0)]

    # Back to time order for the cross-direction lookups.
    inverse = np.empty(n, dtype=np.int64)
    inverse[order] = np.arange(n)

    def to_time(a: np.ndarray) -> np.ndarray:
        return a[inverse]

    t_seq_rel, t_end_rel, t_next, t_has_next = (to_time(seq_rel), to_time(end_rel),
                                               to_time(nextseq_before), to_time(has_nextseq))
    t_next_time, t_dupack, t_dupacknum = to_time(nextseq_time), to_time(dup_ack), to_time(dupacknum)

    # Reverse direction's last packet before each packet, in connection-major time order.
    corder = np.lexsort((np.arange(n), conn))
    cstarts = group_starts(conn[corder])
    cdir = direction[corder]
    last_dir1 = last_index_where(cdir == 1, cstarts)
    last_dir0 = last_index_where(cdir == 0, cstarts)
    rev_c = np.where(cdir == 0, last_dir1, last_dir0)
    rev = np.full(n, -1, dtype=np.int64)
    rev[corder] = np.where(rev_c >= 0, corder[np.maximum(rev_c, 0)], -1)
    has_rev = rev >= 0
    r = np.maximum(rev, 0)

    # The ACK numbers of each direction, unwrapped into the *other* direction's seq_rel space. Packets
    # without the ACK flag (a bare SYN) carry no ACK number: forward-fill so they do not break the unwrap.
    ngroups = 2 * (int(conn.max()) + 1) if n else 0
    base_seq32 = np.zeros(ngroups, dtype=np.int64)
    known_base = np.zeros(ngroups, dtype=bool)
    base_seq32[g[starts]] = o_seq32[starts]
    known_base[g[starts]] = True
    ack_valid_t = has_ack
    a_ack = ack32[order]
    fill_idx = last_index_where(has_ack[order], starts)
    a_filled = np.where(fill_idx >= 0, a_ack[np.maximum(fill_idx, 0)], a_ack)
    a_unwrapped = unwrap(a_filled, starts)
    first_ack_per_row = a_filled[starts][np.cumsum(starts) - 1]
    target_group = g ^ 1  # g = conn * 2 + direction, so the reverse direction is g ^ 1
    target_base = np.where(known_base[target_group], base_seq32[target_group], first_ack_per_row)
    anchor = ((first_ack_per_row - target_base + _HALF) % _WRAP) - _HALF
    ack_rel = to_time(a_unwrapped + anchor)  # in the reverse direction's seq_rel space

    rev_ack_rel = ack_rel[r]                  # reverse's lastack, in *this* direction's seq_rel space
    rev_ack32 = ack32[r]
    rev_ack_valid = has_rev & ack_valid_t[r]
    rev_time = ts[r]
    rev_dupacknum = t_dupacknum[r]
    rev_win = win[r]

    data_or_sf = (plen > 0) | synfin
    candidate = data_or_sf & t_has_next & (t_seq_rel < t_next)
    fast = (candidate & has_rev & (rev_dupacknum >= 2) & (rev_ack32 == seq32)
            & ((ts - rev_time) < FAST_RETRANSMISSION_WINDOW_NS))
    ooo_threshold = np.where(first_rtt_ns[conn] > 0, first_rtt_ns[conn], DEFAULT_OOO_THRESHOLD_NS)
    ooo = (candidate & ~fast & ((ts - t_next_time) < ooo_threshold)
           & (t_next != t_seq_rel + plen))
    spurious = (candidate & ~fast & ~ooo & (plen > 0) & rev_ack_valid & (rev_ack32 != 0)
                & (t_seq_rel + plen <= rev_ack_rel))
    retrans = candidate & ~ooo  # tshark also marks fast and spurious ones as retransmissions
    lost = data_or_sf & t_has_next & (t_seq_rel > t_next)

    zero_window = (win == 0) & ~syn_fin_rst
    shift_fwd = wscale[conn, direction]
    shift_rev = wscale[conn, 1 - direction]
    rev_window_bytes = np.where(shift_rev >= 0, rev_win << np.maximum(shift_rev, 0), rev_win)
    window_full = ((plen > 0) & ~syn_fin_rst & rev_ack_valid & (shift_rev >= 0)
                   & (((seq32 + plen) % _WRAP) == ((rev_ack32 + rev_window_bytes) % _WRAP)))
    window_bytes = np.where(shift_fwd >= 0, win << np.maximum(shift_fwd, 0), win)
    window_bytes = np.where((flags & SYN) != 0, win, window_bytes)  # the SYN's own window is never scaled

    highest = np.maximum(t_next, t_end_rel)
    in_flight = np.where((plen > 0) & rev_ack_valid, np.maximum(highest - rev_ack_rel, 0), -1)

    ack_rtt = _ack_rtt(conn, direction, ts, plen, t_end_rel, retrans, ack_rel, has_ack)
    ts_rtt = _ts_rtt(cols, conn, direction, ts, has_ack)
    return PacketState(conn, direction, t_seq_rel, t_end_rel, to_time(new_bytes), retrans, fast, spurious,
                       ooo, lost, t_dupack, zero_window, window_full, in_flight, window_bytes, ack_rtt, ts_rtt)


def _ack_rtt(conn: np.ndarray, direction: np.ndarray, ts: np.ndarray, plen: np.ndarray, end_rel: np.ndarray,
             retrans: np.ndarray, ack_rel: np.ndarray, has_ack: np.ndarray) -> np.ndarray:
    """RTT from a data segment to the first ACK that covers exactly its end (Karn: never retransmitted)."""
    n = conn.size
    out = np.full(n, -1, dtype=np.int64)
    data = np.flatnonzero((plen > 0) & ~retrans)
    if data.size == 0:
        return out
    group = conn.astype(np.int64) * 2 + direction
    key_data = group[data] * _GROUP_SPAN * 4 + end_rel[data]
    order = np.argsort(key_data, kind="stable")
    key_sorted, data_sorted = key_data[order], data[order]
    # Only the first ACK that reaches a given point measures an RTT; later ones are duplicates.
    acks = np.flatnonzero(has_ack)
    target = (conn[acks].astype(np.int64) * 2 + (1 - direction[acks])) * _GROUP_SPAN * 4 + ack_rel[acks]
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


def _ts_rtt(cols: dict[str, np.ndarray], conn: np.ndarray, direction: np.ndarray, ts: np.ndarray,
            has_ack: np.ndarray) -> np.ndarray:
    """RTT from the first packet carrying a TSval to the first reverse packet echoing it (RFC 7323)."""
    n = conn.size
    out = np.full(n, -1, dtype=np.int64)
    has_ts = cols["has_ts"]
    senders = np.flatnonzero(has_ts)
    echoers = np.flatnonzero(has_ts & has_ack & (cols["tsecr"] != 0))
    if senders.size == 0 or echoers.size == 0:
        return out
    group = conn.astype(np.int64) * 2 + direction
    key_s = group[senders] * _WRAP + cols["tsval"][senders].astype(np.int64)
    uniq_s, first_s = np.unique(key_s, return_index=True)
    key_e = (conn[echoers].astype(np.int64) * 2 + (1 - direction[echoers])) * _WRAP + cols["tsecr"][echoers]
    uniq_e, first_e = np.unique(key_e, return_index=True)
    pos = np.searchsorted(uniq_s, uniq_e)
    found = pos < uniq_s.size
    found[found] &= uniq_s[pos[found]] == uniq_e[found]
    rows = echoers[first_e[found]]
    delta = ts[rows] - ts[senders[first_s[pos[found]]]]
    good = delta >= 0
    out[rows[good]] = delta[good]
    return out

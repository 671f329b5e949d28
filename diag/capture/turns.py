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
follower-alone, from the same busy runs as the connection's duplex overlap (flows.duplex). A ring at N>=3
sends one way per connection: the follower carries no bulk data, so there is no handoff and no turn.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

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

DIRECTIONS = ("a->b", "b->a")


def _median(values: list[float]) -> float | None:
    return float(np.median(values)) if values else None


def connection_turns(ts: tuple[np.ndarray, np.ndarray], nbytes: tuple[np.ndarray, np.ndarray],
                     busy_s: tuple[float, float], both_s: float, either_s: float, gaps_s: tuple[float, float],
                     rtt_s: tuple[float | None, float | None], window: tuple[float, float] | None = None
                     ) -> dict[str, Any]:
    """The turn analysis of one connection over one repetition (or the whole capture without a window).

    ts/nbytes: each direction's data packets (seconds, payload bytes) in time order, a->b first; busy_s,
    both_s, either_s: each direction's busy time, both at once, either (flows.duplex); gaps_s: the
    silence that ends a busy run of each direction; rtt_s: each direction's data -> ACK RTT at the capture
    point (None when unknown); window: the repetition's wall-clock window."""
    largest = max((float(b.max()) for b in nbytes if b.size), default=0.0)
    bulk = [(b > CONTROL_MAX_BYTES) | (b > CONTROL_MAX_SHARE * largest) for b in nbytes]
    # sum(where=) and argmax: no compressed copy of every packet (a capture may hold millions)
    bulk_bytes = [float(b.sum(where=m)) for b, m in zip(nbytes, bulk, strict=True)]
    first_index = [int(np.argmax(m)) if m.size else 0 for m in bulk]
    first = [float(t[i]) if m.size and m[i] else None for t, m, i in zip(ts, bulk, first_index, strict=True)]
    present = [t.size > 0 for t in ts]
    t_first = min(float(t[0]) for t, p in zip(ts, present, strict=True) if p) if any(present) else 0.0
    t_last = max(float(t[-1]) for t, p in zip(ts, present, strict=True) if p) if any(present) else 0.0
    start = window[0] if window else t_first
    span = max(t_last - t_first, 0.0)
    out = turns_summary(span, busy_s, both_s, either_s, first, bulk_bytes)
    bulk_ts = [t if m.all() else t[m] for t, m in zip(ts, bulk, strict=True)]
    events: list[dict[str, Any]] = []
    for x in (0, 1):
        y = 1 - x
        events.extend(_handoffs(ts[x], nbytes[x], bulk_ts[y], gaps_s[x], gaps_s[y], rtt_s[x], span, start,
                                DIRECTIONS[x]))
    control = [_control_frames(ts[d], nbytes[d], bulk[d], bulk_ts[d], bulk_ts[1 - d], gaps_s[d]) for d in (0, 1)]
    return finish_turns(out, events, control)


def turns_summary(span: float, busy_s: tuple[float, float], both: float, either: float,
                  first_bulk: list[float | None], bulk_bytes: list[float] | list[int]) -> dict[str, Any]:
    """The turn object's time split and leader (connection_turns; stream.py's streamed turns too).

    first_bulk: each direction's first bulk segment time (None: none), a->b first."""
    alone = [busy - both for busy in busy_s]
    leader = None
    if first_bulk[0] is not None or first_bulk[1] is not None:
        leader = 0 if first_bulk[1] is None or (first_bulk[0] is not None and first_bulk[0] <= first_bulk[1]) else 1
    lead = leader if leader is not None else 0
    follow = 1 - lead
    return {
        "span_s": span,
        "active_s": either,
        "idle_s": max(span - either, 0.0),
        "one_way_s": {DIRECTIONS[d]: alone[d] for d in (0, 1)},
        "both_s": both,
        "leader": DIRECTIONS[leader] if leader is not None else None,
        "leader_only_fraction": alone[lead] / either if either > 0 else None,
        "both_fraction": both / either if either > 0 else None,
        "follower_only_fraction": alone[follow] / either if either > 0 else None,
        "bulk_bytes": {DIRECTIONS[d]: int(bulk_bytes[d]) for d in (0, 1)},
    }


def finish_turns(out: dict[str, Any], events: list[dict[str, Any]], control: list[dict[str, Any]]
                 ) -> dict[str, Any]:
    """turns_summary's object with the handoffs (both directions', sorted by time) and control frames."""
    events.sort(key=lambda e: e["t"])
    out["handoff_count"] = len(events)
    out["handoffs"] = events[:MAX_LISTED_HANDOFFS]
    out["control_frames"] = {DIRECTIONS[d]: control[d] for d in (0, 1)}
    out["turn_taking"] = bool(events)
    return out


def _handoffs(tx: np.ndarray, bx: np.ndarray, ty_bulk: np.ndarray, gap_x: float, gap_y: float,
              rtt_x: float | None, span: float, start: float, name_x: str) -> list[dict[str, Any]]:
    """Starts of Y's bulk data that waited on a burst of X (see the module docstring), vectorized."""
    if ty_bulk.size == 0 or tx.size == 0:
        return []
    previous = np.concatenate([[start], ty_bulk[:-1]])
    silence = ty_bulk - previous
    candidate = np.flatnonzero(silence >= max(gap_y, TURN_MIN_SILENCE_FRACTION * span))
    if candidate.size == 0:
        return []
    starts = ty_bulk[candidate]
    trigger = np.searchsorted(tx, starts, side="right") - 1
    cum = np.cumsum(bx)
    before = np.searchsorted(tx, previous[candidate], side="right") - 1
    safe = np.maximum(trigger, 0)
    sent_during = cum[safe] - np.where(before >= 0, cum[np.maximum(before, 0)], 0.0)
    delay = starts - tx[safe]
    limit = np.maximum(max(HANDOFF_MAX_RTT * (rtt_x or 0.0), HANDOFF_FLOOR_S),
                       HANDOFF_SILENCE_SHARE * silence[candidate])
    keep = (trigger >= 0) & (sent_during >= BURST_MIN_BYTES) & (delay <= limit)
    after = np.searchsorted(tx, starts, side="right")
    continues = (after < tx.size) & (tx[np.minimum(after, tx.size - 1)] - starts <= gap_x)
    total = float(cum[-1])
    events = []
    for i in np.flatnonzero(keep).tolist():
        j = int(trigger[i])
        events.append({
            "from": name_x,
            "t": float(starts[i]),
            "delay_s": float(delay[i]),
            "delay_rtt": float(delay[i] / rtt_x) if rtt_x else None,
            "trigger_bytes": int(bx[j]),
            "trigger_offset_bytes": int(cum[j]),
            "trigger_offset_fraction": float(cum[j] / total) if total > 0 else None,
            "burst_bytes": int(sent_during[i]),
            "follower_silence_s": float(silence[candidate[i]]),
            "sender_continues": bool(continues[i]),
        })
    return events


def _control_frames(t: np.ndarray, b: np.ndarray, bulk: np.ndarray, own_bulk: np.ndarray, peer_bulk: np.ndarray,
                    own_gap: float) -> dict[str, Any]:
    """Standalone small data segments: how many, how many sit right after the sender's own burst, and how
    long until the peer's next bulk data. (b holds data packets only, so not bulk = a control frame.)"""
    count = int(bulk.size - np.count_nonzero(bulk))
    if count == 0:
        return {"count": 0, "preamble_multiples": 0, "after_own_burst": 0, "peer_data_next_ms": None}
    small = ~bulk
    times = t[small]
    out: dict[str, Any] = {"count": count,
                           "preamble_multiples": int(np.count_nonzero(b[small] % GLOO_PREAMBLE_BYTES == 0))}
    after_own = 0
    if own_bulk.size:
        k = np.searchsorted(own_bulk, times, side="left") - 1
        after_own = int(np.count_nonzero((k >= 0) & (times - own_bulk[np.maximum(k, 0)] <= own_gap)))
    peer_next_ms = None
    if peer_bulk.size:
        m = np.searchsorted(peer_bulk, times, side="right")
        has_next = m < peer_bulk.size
        if has_next.any():
            peer_next_ms = float(np.median(peer_bulk[m[has_next]] - times[has_next]) * 1e3)
    return {**out, "after_own_burst": after_own, "peer_data_next_ms": peer_next_ms}


def summarize(phases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per run (backend, algo, op, N, size): the turn analysis of its repetitions, for the report's rules.

    Connections that carry less than BURST_MIN_BYTES of bulk data in a repetition (set-up, store traffic)
    are left out."""
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for entry in phases:
        if not entry["packets"]:  # a record of another capture
            continue
        phase = entry["phase"]
        key = (phase["backend"], phase["algo"], phase["op"], phase["world_size"], phase["size_bytes"])
        groups[key].append(entry)
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
            for conn in entry["connections"]:
                turns = conn.get("turns") or {}
                moved = turns.get("bulk_bytes") or {}
                if max(moved.values(), default=0) < BURST_MIN_BYTES:
                    continue
                connections += 1
                two_way += int(min(moved.values()) >= BURST_MIN_BYTES)
                for name in ("leader_only_fraction", "both_fraction", "follower_only_fraction"):
                    if turns.get(name) is not None:
                        fractions[name].append(turns[name])
                rep_handoffs += turns.get("handoff_count", 0)
                for event in turns.get("handoffs", []):
                    delays_ms.append(event["delay_s"] * 1e3)
                    if event["delay_rtt"] is not None:
                        delays_rtt.append(event["delay_rtt"])
                    if event["trigger_offset_fraction"] is not None:
                        offsets.append(event["trigger_offset_fraction"])
            handoffs.append(rep_handoffs)
            turn_reps += int(rep_handoffs > 0)
        out.append({
            "backend": backend, "algo": algo, "op": op, "world_size": world_size, "size_bytes": size_bytes,
            "repetitions": len(entries),
            "connections": connections,
            "two_way_connections": two_way,
            "turn_taking_repetitions": turn_reps,
            "handoffs_per_repetition": _median([float(h) for h in handoffs]),
            **{name: _median(fractions[name])
               for name in ("leader_only_fraction", "both_fraction", "follower_only_fraction")},
            "handoff_delay_ms": _median(delays_ms),
            "handoff_delay_rtt": _median(delays_rtt),
            "trigger_offset_fraction": _median(offsets),
        })
    out.sort(key=lambda g: (str(g["backend"]), str(g["algo"]), str(g["op"]), g["world_size"] or 0,
                            g["size_bytes"] or 0))
    return out

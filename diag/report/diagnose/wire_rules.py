"""Rules on the wire (capture analyses) and TCP_INFO: duplex overlap, turn-taking against a raw shared
connection, windows, retransmissions, idle gaps, capture drops."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from diag.analysisdoc import Connection
from diag.report.diagnose.base import drop_note, undecided
from diag.report.diagnose.findings import Evidence, Finding
from diag.report.diagnose.loss import SideBySide, side_by_side
from diag.report.queries import (
    analysed,
    capture_op,
    connection_tcp_info,
    tcp_info_series,
    two_way_connections,
)
from diag.report.rundir import CaptureSet, RunData
from diag.report.series import PAIRWISE_OPS
from diag.report.thresholds import (
    BIDIR_MIN_BYTES,
    CWND_COLLAPSE_SEGMENTS,
    DUPLEX_OVERLAP_LOW,
    IDLE_FRACTION,
    IDLE_RESTART_S,
    LOSS_RATE_CONTRAST,
    RETRANS_MIN_COUNT,
    RETRANS_RATE,
    RWND_LIMITED_FRACTION,
    SNDBUF_LIMITED_FRACTION,
    TURN_GAP_SHARE,
    TURN_TAKING_GAP,
    WINDOW_FULL_MIN_COUNT,
    WINDOW_FULL_RATE,
    used,
)
from diag.units import human_bytes

# What the wire-shape observations (duplex overlap, turn-taking) account for: they show how the loss looks.
DESCRIBES = ("how the loss looks on the wire, not why: only an experiment that toggles a cause accounts for a "
             "share of it")


def low_duplex_overlap(run: RunData) -> list[Finding]:
    """Connections/hosts that carry both directions but rarely move both at once."""
    name = "low_duplex_overlap"
    limits = (DUPLEX_OVERLAP_LOW, BIDIR_MIN_BYTES)
    thresholds = used(*limits)
    captures = analysed(run)
    if not captures:
        return undecided(name, "no capture analysis (analysis/*.json): cannot measure duplex overlap", *limits)
    low: list[Evidence] = []
    ok: list[str] = []
    unreliable = False
    for c in sorted(captures, key=lambda c: (c.world_size or 0, c.tag)):
        source = c.source("analysis")
        op = capture_op(c)
        # (kind, bytes each way, overlap, what it is) for every connection and every host the capture sees
        carriers = [("connection", tuple(conn.payload_bytes), conn.duplex_overlap,
                     f"connection {conn.a} <-> {conn.b} carries {{}} / {{}} but both directions move at once")
                    for conn in c.connections]
        carriers += [("host", (host.tx_bytes, host.rx_bytes), host.duplex_overlap,
                      f"host {host.address} sends {{}} and receives {{}}, both at once")
                     for host in c.hosts]
        for kind, moved, overlap, what in carriers:
            if min(moved) < BIDIR_MIN_BYTES.value or not isinstance(overlap, (int, float)):
                continue
            text = (f"{c.label}: {what.format(human_bytes(moved[0]), human_bytes(moved[1]))} "
                    f"{overlap:.0%} of its active time{drop_note(c)}")
            if overlap < DUPLEX_OVERLAP_LOW.value:
                unreliable |= bool(c.kernel_dropped)
                low.append(Evidence(text, {"world_size": c.world_size, "transport": c.transport,
                                           "duplex_overlap": overlap, "kind": kind, "op": op}, source,
                                    "duplex_overlap.png"))
            else:
                ok.append(text)
    if not low:
        if not ok:
            return [Finding(name, "clear", "no connection or host carried both directions in bulk "
                            f"(>= {human_bytes(BIDIR_MIN_BYTES.value)} each way)", thresholds=thresholds)]
        return [Finding(name, "clear", "every connection/host carrying both directions used both at once: "
                        + "; ".join(ok[:6]), thresholds=thresholds)]
    # The headline quotes the collective's own captures; a pairwise experiment (exchange) is quoted apart.
    collective = [e for e in low if e.values["op"] not in PAIRWISE_OPS]
    pairwise = [e for e in low if e.values["op"] in PAIRWISE_OPS]
    headline = collective or low
    worst = min(e.values["duplex_overlap"] for e in headline)
    ns = sorted({e.values["world_size"] for e in headline if e.values["world_size"]})
    ops = sorted({str(e.values["op"]) for e in headline if e.values["op"]})
    statement = (f"the link's full duplex goes unused at N={','.join(map(str, ns)) or '?'}"
                 + (f" in the {'/'.join(ops)} capture" if ops else "")
                 + f": a connection or host that carries both directions moves them at once only {worst:.0%} "
                 "of the time")
    if collective and pairwise:
        statement += (f"; the {'/'.join(sorted({str(e.values['op']) for e in pairwise}))} experiment's: "
                      f"{min(e.values['duplex_overlap'] for e in pairwise):.0%}")
    fine_ns = sorted({n for n in (c.world_size for c in captures) if n and n not in ns})
    if fine_ns:
        statement += f" (captures at N={','.join(map(str, fine_ns))} show no such loss)"
    if unreliable:
        statement += "; some of these captures dropped packets in the kernel: their overlap is unreliable"
    # How the wire looks, never why: an observation (the mechanism lists it as consistent with what an
    # experiment shows; only an experiment that toggles a cause accounts for a share of the loss).
    return [Finding(name, "observed", statement, evidence=tuple(low), thresholds=thresholds,
                    explains=f"none: {DESCRIBES}")]


def turn_taking(run: RunData) -> list[Finding]:
    """At N=2 a backend's one connection carries both directions in turns while raw TCP on one shared
    connection, on the same hosts, carries both at once: the turn-taking is the backend's, not TCP's."""
    name = "turn_taking"
    limits = (TURN_TAKING_GAP, DUPLEX_OVERLAP_LOW, BIDIR_MIN_BYTES)
    thresholds = used(*limits)
    pairs = [c for c in analysed(run) if c.world_size == 2 and two_way_connections(c)]
    backend = [c for c in pairs if (c.transport or "").startswith("torch:") and capture_op(c) == "all_gather"]
    raw = [c for c in pairs if (c.transport or "").startswith("raw")]
    if not backend:
        return undecided(name, "no capture of a backend all_gather at N=2 with a connection carrying both "
                         "directions: cannot test turn-taking", *limits)
    if not raw:
        return undecided(name, "no capture of raw TCP on one shared connection at N=2 (raw --conn shared or "
                         "--emulate gloo): no reference for what one connection can do", *limits)
    best_raw = max(raw, key=lambda c: two_way_connections(c)[0].overlap)
    reference = two_way_connections(best_raw)[0]
    raw_conn, raw_overlap = reference.connection, reference.overlap
    findings = []
    for c in backend:
        first = two_way_connections(c)[0]
        conn, overlap = first.connection, first.overlap
        evidence = (
            Evidence(f"{c.label}: connection {conn.a} <-> {conn.b} moves both directions at once "
                     f"{overlap:.0%} of its active time", {"world_size": 2, "duplex_overlap": overlap,
                                                           "transport": c.transport},
                     c.source("analysis"), "duplex_overlap.png"),
            Evidence(f"{best_raw.label}: raw TCP, one connection {raw_conn.a} <-> {raw_conn.b} "
                     f"carrying both directions, overlaps them {raw_overlap:.0%} of its active time",
                     {"world_size": 2, "duplex_overlap": raw_overlap, "transport": best_raw.transport},
                     best_raw.source("analysis"), "duplex_overlap.png"),
        )
        if overlap < DUPLEX_OVERLAP_LOW.value and raw_overlap - overlap >= TURN_TAKING_GAP.value:
            dropped = ("; a capture dropped packets in the kernel: the overlap is unreliable"
                       if c.kernel_dropped or best_raw.kernel_dropped else "")
            findings.append(Finding(
                name, "observed",
                f"{c.transport} all_gather at N=2 sends and receives on its one connection in turns "
                f"({overlap:.0%} overlap), while raw TCP on one shared connection between the same hosts overlaps "
                f"them {raw_overlap:.0%}: one TCP connection can carry both directions at once, so the turns "
                f"come from how the backend drives the pair, not from TCP or the link{dropped}", evidence=evidence,
                thresholds=thresholds, explains=f"none: {DESCRIBES}"))
        else:
            # Say what "clear" clears: a low overlap that raw TCP on one connection shows too is the connection's
            # (low_duplex_overlap may still note it), not turns the backend takes.
            low = overlap < DUPLEX_OVERLAP_LOW.value
            findings.append(Finding(name, "clear", f"{c.transport} all_gather at N=2 overlaps the two directions "
                                    f"of its connection {overlap:.0%} (raw shared connection: {raw_overlap:.0%})"
                                    + (f"; low, but raw TCP on one shared connection is within "
                                       f"{TURN_TAKING_GAP.value:.0%} of it, so the backend adds no turns of its own"
                                       if low else ""),
                                    thresholds=thresholds))
    return findings


def window_limited(run: RunData) -> list[Finding]:
    """Receive-window limited (zero windows, full windows, TCP_INFO rwnd_limited) or send-buffer limited."""
    name = "window_limited"
    limits = (RWND_LIMITED_FRACTION, SNDBUF_LIMITED_FRACTION, WINDOW_FULL_RATE, WINDOW_FULL_MIN_COUNT)
    thresholds = used(*limits)
    captures = analysed(run)
    tcp = tcp_info_series(run)
    if not captures and not tcp:
        return undecided(name, "no capture analysis and no TCP_INFO samples: cannot see windows", *limits)
    hits: list[Evidence] = []
    for c in captures:
        for conn in c.connections:
            for label, d in conn.labelled_directions():
                zero, full = d.zero_windows, d.window_full
                data_packets = d.data_packets or d.packets
                often_full = (full >= WINDOW_FULL_MIN_COUNT.value and data_packets > 0
                              and full / data_packets >= WINDOW_FULL_RATE.value)
                if zero or often_full:
                    hits.append(Evidence(f"{c.label} {label}: {zero} zero-window and {full} window-full events "
                                         f"in {data_packets} data packets{drop_note(c)}",
                                         {"zero_windows": zero, "window_full": full, "data_packets": data_packets,
                                          "world_size": c.world_size},
                                         c.source("analysis"), "window.png"))
    for series in tcp:
        busy = series.delta("busy_s")
        if not busy:
            continue
        for key, limit, what in (("rwnd_limited_s", RWND_LIMITED_FRACTION, "receive-window"),
                                 ("sndbuf_limited_s", SNDBUF_LIMITED_FRACTION, "send-buffer")):
            spent = series.delta(key)
            if spent is not None and spent / busy >= limit.value:
                hits.append(Evidence(f"{series.label}: {what} limited {spent / busy:.0%} of its busy time "
                                     f"({spent:.3g} s of {busy:.3g} s, TCP_INFO)",
                                     {key: spent, "busy_s": busy, "fraction": spent / busy}, "TCP_INFO samples",
                                     "window.png"))
    if not hits:
        return [Finding(name, "clear", "no zero windows and no direction often window-full on the wire, and no "
                        "connection window- or buffer-limited beyond the thresholds", thresholds=thresholds)]
    zero = sum(e.values.get("zero_windows", 0) for e in hits)
    data = sum(e.values.get("data_packets", 0) for e in hits)
    thresholds[LOSS_RATE_CONTRAST.name] = LOSS_RATE_CONTRAST.value
    sides = side_by_side(run, _window_rate)
    costly = [s for s in sides if s.loss and s.reference is not None and s.backend >= WINDOW_FULL_RATE.value
              and s.backend >= LOSS_RATE_CONTRAST.value * max(s.reference, WINDOW_FULL_RATE.value / 10)]
    head = (f"the sender waited on the receiver's window or its own buffer ({len(hits)} connection directions; "
            f"{zero} zero windows" + (f" in {data} data packets" if data else "") + ")")
    return [judged(name, head, sides, costly, _per_packet, "waited on a full window", hits, thresholds,
                   "the backend's senders wait on windows the raw reference's do not")]


def _window_rate(captures: list[CaptureSet]) -> float | None:
    """Zero-window and window-full events per data packet over every direction of these captures."""
    events = packets = 0
    for c in captures:
        for conn in c.connections:
            for _label, d in conn.labelled_directions():
                events += d.zero_windows + d.window_full
                packets += d.data_packets or d.packets
    return events / packets if packets else None


def _per_packet(value: float) -> str:
    return f"{value:.2g} window events per data packet"


def retransmissions(run: RunData) -> list[Finding]:
    name = "retransmissions"
    limits = (RETRANS_RATE, RETRANS_MIN_COUNT)
    thresholds = used(*limits)
    captures = analysed(run)
    tcp = tcp_info_series(run)
    if not captures and not tcp:
        return undecided(name, "no capture analysis and no TCP_INFO samples: cannot count retransmissions",
                         *limits)
    hits: list[Evidence] = []
    for c in captures:
        for conn in c.connections:
            for label, d in conn.labelled_directions():
                resent, packets = d.retransmissions, d.packets
                if packets and resent >= RETRANS_MIN_COUNT.value and resent / packets >= RETRANS_RATE.value:
                    hits.append(Evidence(f"{c.label} {label}: {resent} retransmissions in {packets} packets "
                                         f"({resent / packets:.2%}){drop_note(c)}",
                                         {"retransmissions": resent, "packets": packets, "rate": resent / packets,
                                          "world_size": c.world_size},
                                         c.source("analysis")))
    for series in tcp:
        total = series.delta("total_retrans")
        if total is None:
            values = series.values("retrans")
            total = max(values) if values else None
        if total and total >= RETRANS_MIN_COUNT.value:
            hits.append(Evidence(f"{series.label}: {total:.0f} retransmitted segments (TCP_INFO)", {"retrans": total},
                                 "TCP_INFO samples"))
    if not hits:
        return [Finding(name, "clear", "retransmissions below the threshold everywhere", thresholds=thresholds)]
    worst = max(e.values.get("rate", 0) for e in hits)
    thresholds[LOSS_RATE_CONTRAST.name] = LOSS_RATE_CONTRAST.value
    sides = side_by_side(run, _resent_rate)
    costly = [s for s in sides if s.loss and s.reference is not None and s.backend >= RETRANS_RATE.value
              and s.backend >= LOSS_RATE_CONTRAST.value * max(s.reference, RETRANS_RATE.value / 10)]
    head = f"segments were lost and resent on {len(hits)} connection directions (worst {worst:.2%} of packets)"
    return [judged(name, head, sides, costly, _percent, "resent", hits, thresholds,
                   "losses cost time the raw reference on the same link does not lose")]


def _resent_rate(captures: list[CaptureSet]) -> float | None:
    """Retransmitted segments per packet over every direction of these captures."""
    resent = packets = 0
    for c in captures:
        for conn in c.connections:
            for _label, d in conn.labelled_directions():
                resent += d.retransmissions
                packets += d.packets
    return resent / packets if packets else None


def _percent(value: float) -> str:
    return f"{100 * value:.2g}% of packets"


def judged(name: str, head: str, sides: list[SideBySide], costly: list[SideBySide], unit: Callable[[float], str],
           what: str, hits: list[Evidence], thresholds: dict[str, float], cost: str) -> Finding:
    """An observation judged against the raw reference on the same link: a finding (moderate: what it costs is
    not measured) only at an N where the backend has a measured loss and shows LOSS_RATE_CONTRAST times the
    raw reference's; else an observation, with the comparison that makes it one."""
    compared = [Evidence(s.text(unit), {"world_size": s.world_size, "backend": s.backend, "reference": s.reference,
                                        "measured_loss": s.loss}, "analysis of the backend's and the raw "
                         "reference's captures") for s in sides]
    table = "; ".join(s.text(unit) for s in sides)
    if costly:
        where = ", ".join(f"N={s.world_size}" for s in costly)
        return Finding(name, "fired", f"{head}; at {where}, where the backend is slow ({costly[0].loss}), its "
                       f"directions {what} at least {LOSS_RATE_CONTRAST.value:g}x the raw reference's on the same link "
                       f"({table}): {cost}", "moderate", tuple([*compared, *hits][:20]), thresholds,
                       explains=f"not measured: a share of the loss at {where} may be this; what it costs is not "
                                "measured here")
    losses = [s for s in sides if s.loss]
    if not losses:
        why = "no loss of the backend is measured at any N captured, so this accounts for none"
    elif all(s.reference is None for s in losses):
        why = (f"no capture of the raw reference at N={','.join(str(s.world_size) for s in losses)}, where the "
               "backend is slow, to judge it against: it stays an observation")
    else:
        why = ("where the backend is slow its own directions show no more than the raw reference's on the same "
               "link: this is the link's (or raw TCP's own), not the backend's, and accounts for none of its loss")
    table = table or "no capture of the backend"
    return Finding(name, "observed", f"{head}; judged against the raw reference on the same link ({table}): {why}",
                   evidence=tuple([*compared, *hits][:20]),
                   thresholds=thresholds, explains=f"none: {why}")


def find_sysctl(env: Any, fragment: str) -> Any:
    """Search the fingerprint for a sysctl by name fragment, wherever the harness put it."""
    if isinstance(env, dict):
        for k, v in env.items():
            if fragment in str(k) and not isinstance(v, (dict, list)):
                return v
            found = find_sysctl(v, fragment)
            if found is not None:
                return found
    return None


def idle_gaps(run: RunData) -> list[Finding]:
    """Idle gaps in a direction; after an idle longer than the RTO Linux restarts from slow start.

    On a connection that takes turns, a direction's gaps are the other direction's turns: they say nothing
    of their own, and when TCP_INFO of that connection shows no cwnd collapse there was no idle restart
    either, so such gaps are not counted (they are named in the statement)."""
    name = "idle_gaps"
    limits = (IDLE_RESTART_S, IDLE_FRACTION, TURN_GAP_SHARE, CWND_COLLAPSE_SEGMENTS)
    thresholds = used(*limits)
    captures = analysed(run)
    if not captures:
        return undecided(name, "no capture analysis: cannot see idle gaps", *limits)
    ssai = find_sysctl(run.env, "slow_start_after_idle")
    hits: list[Evidence] = []
    turns: list[str] = []
    restart = False
    costly = False       # some direction idles a large share of timed time, and not as the other's turns
    for c in captures:
        for conn in c.connections:
            two_way = (min(conn.payload_bytes) >= BIDIR_MIN_BYTES.value
                       and isinstance(conn.duplex_overlap, (int, float))
                       and conn.duplex_overlap < DUPLEX_OVERLAP_LOW.value)
            series = connection_tcp_info(run, conn) if two_way else []
            collapses = sum(s.cwnd_collapses(CWND_COLLAPSE_SEGMENTS.value) for s in series)
            for label, d in conn.labelled_directions():
                if d.payload_bytes < BIDIR_MIN_BYTES.value:
                    continue  # an ACK-only direction idles by design
                gaps = d.idle_gaps
                span = d.span_s
                total, longest = gaps.total_s, gaps.max_s
                fraction = total / span if span > 0 else 0.0
                if not (longest >= IDLE_RESTART_S.value or fraction >= IDLE_FRACTION.value):
                    continue
                # Time the connection was busy while this direction was not: the other direction's turns.
                other_alone = max(0.0, conn.active_s - d.active_s)
                turn_share = min(1.0, other_alone / total) if total > 0 else 0.0
                is_turns = two_way and turn_share >= TURN_GAP_SHARE.value
                if is_turns and series and not collapses:
                    turns.append(f"{c.label} {label}: {total:.3g} s idle, {turn_share:.0%} of it while the other "
                                 f"direction sent (overlap {conn.duplex_overlap:.0%}); TCP_INFO shows no cwnd "
                                 f"collapse")
                    continue
                inside_s, timed_s = idle_inside_iterations(c, conn, label)
                inside_share = inside_s / timed_s if timed_s > 0 else None
                restart |= longest >= IDLE_RESTART_S.value
                timed_cost = inside_share is not None and inside_share >= IDLE_FRACTION.value
                costly |= timed_cost and not is_turns
                note = (f"; inside timed iterations {inside_s:.3g} s of {timed_s:.3g} s timed ({inside_share:.0%}), "
                        f"the rest between iterations" if inside_share is not None
                        else "; no record windows: whether the gaps fall inside timed iterations is unknown")
                if is_turns:
                    note += (f"; {turn_share:.0%} of it while the other direction sent"
                            + (f", and TCP_INFO shows cwnd collapsing {collapses} time(s)" if collapses
                               else ", no TCP_INFO of this connection to tell whether cwnd collapsed"))
                hits.append(Evidence(
                    f"{c.label} {label}: {gaps.count} idle gaps, {total:.3g} s idle of {span:.3g} s "
                    f"({fraction:.0%}), longest {longest:.3g} s{note}{drop_note(c)}",
                    {"count": gaps.count, "total_s": total, "max_s": longest, "fraction": fraction,
                     "world_size": c.world_size, "turn_share": turn_share, "cwnd_collapses": collapses,
                     "inside_iterations_s": inside_s, "timed_s": timed_s, "timed_share": inside_share},
                    c.source("analysis"), "conn_throughput.png"))
    turn_note = (f"; not counted: {len(turns)} direction(s) whose gaps are the other direction's turns on a "
                 f"connection that takes turns (turn_taking), with no cwnd collapse in TCP_INFO, so no idle "
                 f"restart: " + "; ".join(turns[:4])) if turns else ""
    if not hits:
        return [Finding(name, "clear", "no direction idles long enough to matter" + turn_note, thresholds=thresholds)]
    statement = f"connections sit idle between bursts ({len(hits)} directions)"
    if restart:
        statement += (f"; gaps longer than {IDLE_RESTART_S.value} s let Linux restart from slow start after idle"
                      + (f" (net.ipv4.tcp_slow_start_after_idle = {ssai})" if ssai is not None
                         else " (tcp_slow_start_after_idle not in the fingerprint)"))
        if str(ssai) == "0":
            statement += ", which is off here, so no cwnd reset"
    if not costly:
        statement += ("; the gaps fall between timed iterations or are turns on a connection that takes turns, "
                      "so they cost the timed iterations little")
    # A finding only where gaps cost timed time (inside iterations, not turns) with Linux restarting cwnd after
    # them, at an N where the backend is slow and idles more of its timed time than the raw reference there.
    thresholds[LOSS_RATE_CONTRAST.name] = LOSS_RATE_CONTRAST.value
    sides = side_by_side(run, lambda cs: _idle_share(cs, hits))
    costly = [s for s in sides if costly and restart and str(ssai) != "0" and s.loss and s.reference is not None
              and s.backend >= IDLE_FRACTION.value and s.backend >= s.reference + IDLE_FRACTION.value]
    finding = judged(name, statement + turn_note, sides, costly, _idle_text, "idle inside timed iterations",
                     hits, thresholds, "idle time inside the iterations the raw reference does not have, with "
                     "Linux restarting from slow start after it")
    inside = [e.values["timed_share"] for e in hits if e.values.get("timed_share") is not None]
    if finding.status == "fired" and inside:
        finding = replace(finding, explains=f"at most {max(inside):.0%} of the timed time (idle inside iterations), "
                          "not measured against the loss")
    return [finding]


def _idle_share(captures: list[CaptureSet], hits: list[Evidence]) -> float | None:
    """Idle seconds inside timed iterations over the timed seconds, of the gap directions of these captures
    (the hits; a capture with no such direction idles 0 of its timed time)."""
    sources = {c.source("analysis") for c in captures}
    mine = [e.values for e in hits if e.source in sources and e.values.get("timed_s")]
    if not mine:
        return 0.0 if captures else None
    return sum(v["inside_iterations_s"] for v in mine) / sum(v["timed_s"] for v in mine)


def _idle_text(value: float) -> str:
    return f"{value:.0%} of timed time idle"


def idle_inside_iterations(capture: CaptureSet, conn: Connection, label: str) -> tuple[float, float]:
    """Idle seconds of one direction inside the timed iterations (the capture's record phases), and the
    timed seconds those phases span where the connection was seen."""
    idle = 0.0
    timed = 0.0
    for p in capture.phases:
        for pc in p.connections:
            if {pc.a, pc.b} != {conn.a, conn.b}:
                continue
            timed += (p.phase.t_end_ns - p.phase.t_start_ns) / 1e9
            for key, d in pc.labelled_directions():
                if key == label:
                    idle += d.idle_gaps.total_s
    return idle, timed


def capture_drops(run: RunData) -> list[Finding]:
    name = "capture_drops"
    known = [c for c in run.captures.values() if c.kernel_dropped is not None or c.flagged]
    if not known:
        return undecided(name, "no capture metadata: whether the kernel dropped packets is unknown")
    bad = [c for c in known if (c.kernel_dropped or 0) > 0 or c.flagged]
    if not bad:
        return [Finding(name, "clear", f"no kernel drops in {len(known)} captures")]
    # About the capture, not the run's speed: an observation that says which findings it makes unreliable.
    return [Finding(name, "observed", f"{len(bad)} captures lost packets in the kernel: findings from them "
                    f"(duplex overlap, windows, retransmissions, gaps) are unreliable",
                    evidence=tuple(Evidence(f"{c.label}: kernel dropped {c.kernel_dropped} packets",
                                            {"kernel_dropped": c.kernel_dropped}, c.source("captures"))
                                   for c in bad), explains="none: about the capture, not the loss")]

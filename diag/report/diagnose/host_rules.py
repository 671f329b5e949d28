"""Rules that name the cause and the host: a slow host link (the link matrix, checked against the survey
rows), loss at one host (retransmissions per direction across every node's captures, TCP_INFO cwnd cuts,
and what they cost), and a window or buffer limit at one host (TCP_INFO limited time and window events on
the wire, tied to that host's sysctls from its fingerprint)."""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from diag.report.diagnose.base import strength_of, undecided, weaken
from diag.report.diagnose.cpu_rules import starved_nodes
from diag.report.diagnose.findings import Evidence, Finding
from diag.report.nodes import (
    NodeCapacity,
    NodeFlow,
    NodeSeries,
    best_large_busbw,
    capacities,
    differences_of,
    display_key,
    fingerprint_differences,
    flatten,
    flow_observations,
    node_flows,
    node_tcp_info,
    phase_idle,
    subgroup_nodes,
)
from diag.report.rundir import RunData
from diag.report.thresholds import (
    BIDIR_MIN_BYTES,
    CWND_COLLAPSE_SEGMENTS,
    CWND_CUT_FACTOR,
    IDLE_RESTART_S,
    INCAST_STARVED_SHARE,
    LOCALIZE_MIN_NODES,
    LOSS_HOST_SHARE,
    LOSS_PEER_SHARE,
    LOSS_RATE_CONTRAST,
    PACED_TOLERANCE,
    RETRANS_MIN_COUNT,
    RETRANS_RATE,
    RWND_LIMITED_FRACTION,
    SLOW_LINK_RATIO,
    SNDBUF_LIMITED_FRACTION,
    WINDOW_FULL_MIN_COUNT,
    WINDOW_FULL_RATE,
    used,
)
from diag.report.topology import SEGMENT_BYTES, Incast, IncastFlow, LinkEdge, steady_resent_share
from diag.units import human_rate

MATRIX_PLOT = "link_matrix.png"
_WAYS = {("in", "out"): "both ways", ("out",): "sending", ("in",): "receiving"}

# --- slow host link ---


def slow_host_link(run: RunData) -> list[Finding]:
    """One node's edges well below the others' in the link matrix (out, in or both), or one edge below what
    both its ends carry elsewhere; and whether every N that includes it runs at its pace (survey rows)."""
    name = "slow_host_link"
    limits = (SLOW_LINK_RATIO, LOCALIZE_MIN_NODES, PACED_TOLERANCE)
    thresholds = used(*limits)
    matrix = run.link_matrix
    if matrix is None:
        return undecided(name, "no link matrix (run.json link.matrix): no edge between two nodes was measured, "
                         "so no host or link can be named slow", *limits)
    alone = matrix.alone()
    nodes = [n for n in matrix.names() if any(n in pair for pair in alone)]
    if len(nodes) < LOCALIZE_MIN_NODES.value:
        return undecided(name, f"the link matrix has {len(nodes)} node(s): with fewer than "
                         f"{LOCALIZE_MIN_NODES.value:.0f} every edge touches both ends, so a slow edge cannot be "
                         "pinned on one host", *limits)
    caps = capacities(alone, nodes)
    outs = [c.out_Bps for c in caps.values() if c.out_Bps]
    ins = [c.in_Bps for c in caps.values() if c.in_Bps]
    reference_out, reference_in = statistics.median(outs), statistics.median(ins)
    slow = {node: ways for node, cap in caps.items() if (ways := _slow_ways(cap, reference_out, reference_in))}
    edges = _slow_edges(alone, slow)
    if not slow and not edges:
        return [Finding(name, "clear", f"every node of the link matrix carries within {1 - SLOW_LINK_RATIO.value:.0%} "
                        f"of the median node (best edge out {_span(outs)}, in {_span(ins)}; "
                        f"{len(alone)} edges, {matrix.tool or 'tool unknown'}) and no edge falls below what its "
                        "ends carry elsewhere", thresholds=thresholds)]
    # A node whose CPU was starved runs the probe's tools on that CPU too: its slow edges are no evidence
    # against its link (cpu_bound names it).
    starved = starved_nodes(run)
    blamed = sorted((set(slow) | {n for (pair, _v, _e) in edges for n in pair}) & starved)
    slow = {node: ways for node, ways in slow.items() if node not in starved}
    edges = [edge for edge in edges if not set(edge[0]) & starved]
    if not slow and not edges:
        return undecided(name, f"the link matrix's slow edges touch {', '.join(blamed)}, whose CPU was starved "
                         "during the run (cpu_bound): the probe's own tools ran on that CPU, so they do not show its "
                         "link slow", *limits)
    findings = []
    windows = _window_limits(run)
    for node, ways in list(slow.items()):
        bounds = [windows.get((node, "receive" if way == "in" else "send")) for way in ways]
        if all(bounds):
            findings.append(_window_bound(name, f"{node}'s link is slow {_WAYS[tuple(sorted(ways))]} in the link matrix",
                                          [b for b in bounds if b], thresholds))
            del slow[node]
    for node, ways in slow.items():
        cap = caps[node]
        depth = min(v / r for v, r, way in ((cap.out_Bps, reference_out, "out"), (cap.in_Bps, reference_in, "in"))
                    if way in ways and v)
        rate = min(v for v, way in ((cap.out_Bps, "out"), (cap.in_Bps, "in")) if way in ways and v)
        what = _WAYS[tuple(sorted(ways))]
        head = (f"{node}'s link is slow {what}: its best edge out carries {_rate(cap.out_Bps)} and in "
                f"{_rate(cap.in_Bps)}, against the median node's {human_rate(reference_out)} out and "
                f"{human_rate(reference_in)} in ({depth:.0%})")
        evidence = [Evidence(head, {"node": node, "ways": what, "out_Bps": cap.out_Bps, "in_Bps": cap.in_Bps,
                                    "reference_out_Bps": reference_out, "reference_in_Bps": reference_in,
                                    "ratio": depth}, "run.json link.matrix", MATRIX_PLOT)]
        pace, paced, contradicted = _pacing(run, lambda members, n=node: n in members, rate, node)
        evidence += pace
        strength = strength_of(SLOW_LINK_RATIO.value - depth, 0.2, 0.1)
        findings.append(Finding(name, "fired", f"{head}; {paced}", weaken(strength) if contradicted else strength,
                                tuple(evidence), thresholds))
    for (src, dst), value, expected in edges:
        bounds = [b for b in (windows.get((dst, "receive")), windows.get((src, "send"))) if b]
        if bounds:
            findings.append(_window_bound(name, f"the one edge {src} -> {dst} carries {human_rate(value)}, "
                                          f"{value / expected:.0%} of what its ends carry on their other edges",
                                          bounds, thresholds))
            continue
        head = (f"the one edge {src} -> {dst} is slow: {human_rate(value)}, where {src} sends and {dst} receives "
                f"{human_rate(expected)} on their other edges ({value / expected:.0%})")
        evidence = [Evidence(head, {"src": src, "dst": dst, "alone_Bps": value, "expected_Bps": expected,
                                    "ratio": value / expected}, "run.json link.matrix", MATRIX_PLOT)]
        pace, paced, contradicted = _pacing(run, lambda members, a=src, b=dst: a in members and b in members,
                                            value, f"{src} -> {dst}")
        evidence += pace
        strength = strength_of(SLOW_LINK_RATIO.value - value / expected, 0.2, 0.1)
        findings.append(Finding(name, "fired", f"{head}; {paced}", weaken(strength) if contradicted else strength,
                                tuple(evidence), thresholds))
    return findings


def _window_limits(run: RunData) -> dict[tuple[str, str], str]:
    """(node, "receive" | "send") -> why that node's window caps its flows that way, whatever its link: the
    window_at_host finding on it, else its tcp_rmem / tcp_wmem maximum below every other node's (its fingerprint).
    A window-limited flow carries about one window per round trip, so the link matrix's edges at that end
    measure the window, not the link."""
    out: dict[tuple[str, str], str] = {}
    for f in run.remember("window_at_host", lambda: window_at_host(run)):
        if f.status == "fired" and f.evidence:
            values = f.evidence[0].values
            node, role = values.get("node"), values.get("role")
            if node and role:
                out[(node, role)] = f"{f.statement.split(': ', 1)[0]} (window_at_host, {f.strength})"
    for role, sysctl in (("receive", "tcp_rmem"), ("send", "tcp_wmem")):
        for d in fingerprint_differences(run):
            if sysctl not in d.key:
                continue
            maxima = {node: _buffer_max(value) for value, nodes in d.groups for node in nodes}
            for node, value in maxima.items():
                others = [v for n, v in maxima.items() if n != node and v is not None]
                if value is not None and others and value < min(others) and (node, role) not in out:
                    what = "receive window" if role == "receive" else "send buffer"
                    out[(node, role)] = (f"{node}'s {d.key} caps its {what} at {value} bytes, below every other "
                                         "node's (fingerprint)")
    return out


def _buffer_max(value: str) -> int | None:
    """The maximum of a 'min default max' tcp_rmem / tcp_wmem value."""
    parts = value.split()
    return int(parts[-1]) if len(parts) == 3 and parts[-1].isdigit() else None


def _window_bound(name: str, head: str, bounds: list[str], thresholds: dict[str, float]) -> Finding:
    return Finding(name, "undecided", f"{head}, but {'; and '.join(bounds)}: a window-limited flow carries about a "
                   "window per round trip whatever the link, so the matrix cannot tell whether this link is slow",
                   thresholds=thresholds)


def _slow_ways(cap: NodeCapacity, reference_out: float, reference_in: float) -> list[str]:
    ways = []
    if cap.out_Bps is not None and cap.out_Bps < SLOW_LINK_RATIO.value * reference_out:
        ways.append("out")
    if cap.in_Bps is not None and cap.in_Bps < SLOW_LINK_RATIO.value * reference_in:
        ways.append("in")
    return ways


def _slow_edges(alone: dict[tuple[str, str], float], slow: dict[str, list[str]]
                ) -> list[tuple[tuple[str, str], float, float]]:
    """Edges between nodes that are not slow, below SLOW_LINK_RATIO of the lesser of what their sender sends
    and their receiver receives on their other edges: ((src, dst), goodput, that expectation)."""
    out = []
    for (src, dst), value in sorted(alone.items()):
        if src in slow or dst in slow:
            continue
        sent = [v for (s, d), v in alone.items() if s == src and d != dst]
        got = [v for (s, d), v in alone.items() if d == dst and s != src]
        if sent and got:
            expected = min(max(sent), max(got))
            if value < SLOW_LINK_RATIO.value * expected:
                out.append(((src, dst), value, expected))
    return out


def _pacing(run: RunData, includes: Callable[[list[str]], bool], edge_Bps: float, what: str
            ) -> tuple[list[Evidence], str, bool]:
    """Per N, the best large-size busbw against the slow edge: every N whose subgroup includes it (the
    ``includes(members)`` test) should stay at or below its goodput (PACED_TOLERANCE); the N without it are
    the contrast. Returns the evidence, a clause for the statement, and whether some N contradicts the pace."""
    groups = subgroup_nodes(run)
    best = best_large_busbw(run)
    if not groups:
        return [], "which N include it is unknown (no run.json topology subgroups)", False
    if not best:
        return [], "no survey rows to check whether the N that include it run at its pace", False
    with_it, without, above = [], [], []
    evidence = []
    for n in sorted(best):
        if n not in groups:
            continue
        busbw, series = best[n]
        inside = includes(groups[n])
        share = busbw / edge_Bps
        (with_it if inside else without).append((n, busbw))
        if inside and share > 1 + PACED_TOLERANCE.value:
            above.append(n)
        evidence.append(Evidence(
            f"N={n} ({', '.join(groups[n])}{': includes ' + what if inside else ''}): best busbw {human_rate(busbw)} "
            f"({series}), {share:.0%} of the slow edge's {human_rate(edge_Bps)}",
            {"world_size": n, "busbw_Bps": busbw, "edge_Bps": edge_Bps, "includes": inside, "share": share},
            run.source_of(next(r for r in run.records if r.world_size == n)), "busbw_vs_size.png"))
    if not with_it:
        return evidence, f"no N measured here includes {what}", False
    ns = ",".join(str(n) for n, _ in with_it)
    contrast = (f"; without it N={','.join(str(n) for n, _ in without)} reach up to "
                f"{human_rate(max(v for _, v in without))}" if without else "")
    if above:
        verbs = ("includes", "runs") if len(above) == 1 else ("include", "run")
        return evidence, (f"yet N={','.join(map(str, above))} {verbs[0]} {what} and {verbs[1]} above its edge (more "
                          f"than {PACED_TOLERANCE.value:.0%} over): the matrix and the survey disagree{contrast}"), True
    return evidence, (f"every N that includes it (N={ns}) is paced by it: best busbw "
                      f"{_span([v for _, v in with_it])}, at or below its {human_rate(edge_Bps)}{contrast}"), False


def _rate(value: float | None) -> str:
    return human_rate(value) if value else "?"


def _span(values: Sequence[float]) -> str:
    low, high = human_rate(min(values)), human_rate(max(values))
    return low if low == high else f"{low}..{high}"


# --- loss at one host ---


@dataclass
class PairLoss:
    """Retransmissions on the directions from one node to another: the wire's where it saw them, else TCP_INFO's."""

    resent: float = 0.0
    packets: int = 0
    payload_bytes: int = 0
    fast: int = 0
    flows: list[NodeFlow] = field(default_factory=list)
    series: list[NodeSeries] = field(default_factory=list)


def _pair_losses(run: RunData) -> dict[tuple[str, str], PairLoss]:
    pairs: dict[tuple[str, str], PairLoss] = defaultdict(PairLoss)
    for flow in node_flows(run):
        if flow.src and flow.dst and flow.src != flow.dst:
            loss, d = pairs[(flow.src, flow.dst)], flow.direction
            loss.resent += d.retransmissions
            loss.packets += d.packets
            loss.payload_bytes += d.payload_bytes
            loss.fast += d.fast_retransmissions
            loss.flows.append(flow)
    for s in node_tcp_info(run):
        if s.src and s.dst and s.src != s.dst:
            loss = pairs[(s.src, s.dst)]
            loss.series.append(s)
            if not loss.flows:   # no capture of these directions: TCP_INFO counts them
                loss.resent += s.series.retransmitted() or 0.0
    return dict(pairs)


def loss_at_host(run: RunData) -> list[Finding]:
    """Retransmissions concentrated on the directions into (or out of) one host, with cwnd cuts in TCP_INFO
    and what they cost (slower directions, stalls as long as a retransmission timeout)."""
    name = "loss_at_host"
    limits = (RETRANS_RATE, RETRANS_MIN_COUNT, LOSS_HOST_SHARE, LOSS_PEER_SHARE, CWND_CUT_FACTOR, CWND_COLLAPSE_SEGMENTS,
              IDLE_RESTART_S)
    thresholds = used(*limits)
    pairs = _pair_losses(run)
    # The link matrix's flows reach every host from several peers, where a ring's steps send into each host
    # from one: where the steps cannot place the loss, the matrix may.
    in_matrix = _matrix_loss(run, pairs)
    if not pairs:
        return in_matrix or undecided(name, "no capture analysis or TCP_INFO whose ends the run can name (run.json "
                                      "topology, or a lab's addresses): retransmissions cannot be placed on a host",
                                      *limits)
    total = sum(p.resent for p in pairs.values())
    packets = sum(p.packets for p in pairs.values())
    if total < RETRANS_MIN_COUNT.value or (packets and total / packets < RETRANS_RATE.value):
        return in_matrix or [Finding(name, "clear", f"{total:.0f} retransmitted segments in {packets} packets across "
                                     f"{len(pairs)} node-to-node directions: no loss worth placing on a host",
                                     thresholds=thresholds)]
    # One capture point sees every host's directions through its own: all of its own, only those of the others
    # that touch it. A host is named from what at least two nodes saw (their captures or TCP_INFO).
    viewpoints = {f.capture.node for f in flow_observations(run) if f.src and f.dst} | {
        s.node for p in pairs.values() for s in p.series}
    if len(viewpoints - {None}) < 2:
        return in_matrix or undecided(name, "the captures and TCP_INFO come from one capture point, which sees only the "
                         "directions that touch its own host: a host is named only from what two or more nodes "
                         "saw (the in-place layout, nodes/<node>/)", *limits)
    nodes = sorted({n for pair in pairs for n in pair})
    tallies = sorted(((sum(p.resent for (s, d), p in pairs.items() if (d if way == "into" else s) == node) / total,
                       node, way) for node in nodes for way in ("into", "out of")), reverse=True)
    if tallies[0][0] < LOSS_HOST_SHARE.value:
        spread = ", ".join(f"{w} {n} {s:.0%}" for s, n, w in tallies[:4])
        return in_matrix or [Finding(name, "clear", f"{total:.0f} retransmitted segments, spread over the hosts ({spread}): no "
                        f"one host holds {LOSS_HOST_SHARE.value:.0%} of them (see retransmissions)",
                        thresholds=thresholds)]
    placed = [_place(pairs, node, way, share) for share, node, way in tallies if share >= LOSS_HOST_SHARE.value]
    hosts = [p for p in placed if len(p.peers) >= 2]
    if hosts:
        place = hosts[0]
        where = f"the directions {place.way} {place.node} (from {len(place.peers)} peers)"
        strength = "strong" if place.share >= 0.95 else "moderate"
    else:
        # One edge carries the loss: its sender's side and its receiver's are both candidates.
        (src, dst), _loss = max(((pair, p) for pair, p in pairs.items() if p.resent > 0), key=lambda kv: kv[1].resent)
        side, why = _edge_side(run, src, dst)
        share_of = {(n, w): s for s, n, w in tallies}
        if side is None:
            place = _place(pairs, dst, "into", share_of[(dst, "into")])
            where = (f"the one edge {src} -> {dst}: {src}'s sending side or {dst}'s receiving side (every lossy "
                     f"direction runs {src} -> {dst}, and {why})")
            strength = "weak"
        else:
            node = dst if side == "into" else src
            place = _place(pairs, node, side, share_of[(node, side)])
            where = f"the directions {side} {node} (the edge {src} -> {dst} carries them; {why})"
            strength = "moderate"
    # A host is only named against a contrast: directions into (out of) other hosts that carried data. Where
    # data only ever flowed into one host, its loss cannot be told from what every host would have lost.
    if not place.contrast:
        return in_matrix or undecided(name, f"{place.share:.0%} of {total:.0f} retransmitted segments are on directions "
                         f"{place.way} {place.node}, but no direction {place.way} another host was seen to compare "
                         f"with: {place.node}'s loss cannot be told from every host's", *limits)
    evidence, cost = _loss_evidence(run, pairs, place.lossy, place.node, place.way)
    return [Finding(name, "fired", f"segments are lost on {where}: {place.share:.0%} of {total:.0f} retransmitted "
                    f"segments{'; ' + cost if cost else ''}", strength, tuple(evidence[:20]), thresholds)]


@dataclass(frozen=True)
class Placement:
    """The loss read as one host's: the directions into (or out of) it, their peers, and the contrast."""

    node: str
    way: str                                  # "into" | "out of"
    share: float                              # of all retransmitted segments
    lossy: dict[tuple[str, str], PairLoss]
    peers: tuple[str, ...]                    # peers on lossy directions
    contrast: bool                            # directions of the same way at other hosts carried data


def _matrix_resent(e: LinkEdge) -> int:
    """The segments a matrix edge's sender resent, both phases."""
    return int(e.alone_retransmits or 0) + int(e.bidir_retransmits or 0)


def _matrix_loss(run: RunData, pairs: dict[tuple[str, str], PairLoss]) -> list[Finding] | None:
    """The loss placed by the link matrix's own flows: first its incast phases (every other node into one at
    once), then every ordered pair alone and both ways at once, with the segments each sender resent. Fired
    where one host's flows in (or out), from two or more peers (each with LOSS_PEER_SHARE of the host's loss or
    more), resent at least LOSS_RATE_CONTRAST times the share of segments of any other host's; None otherwise
    (the captures' reading stands)."""
    incast = _incast_loss(run, pairs)
    if incast is not None:
        return [incast]
    matrix = run.link_matrix
    edges = [e for e in (matrix.edges if matrix is not None and matrix.seconds else ())
             if e.src != e.dst and e.alone_retransmits is not None and e.bidir_retransmits is not None
             and (e.alone_Bps or 0) > 0 and (e.bidir_Bps or 0) > 0]
    names = sorted({n for e in edges for n in (e.src, e.dst)})
    if matrix is None or len(names) < LOCALIZE_MIN_NODES.value:
        return None
    seconds = float(matrix.seconds or 0)

    def share(mine: list[LinkEdge]) -> float:
        sent = sum((e.alone_Bps or 0) + (e.bidir_Bps or 0) for e in mine) * seconds / SEGMENT_BYTES
        return sum(_matrix_resent(e) for e in mine) / sent if sent > 0 else 0.0

    for way in ("into", "out of"):
        by_host = {n: [e for e in edges if (e.dst if way == "into" else e.src) == n] for n in names}
        rates = {n: share(mine) for n, mine in by_host.items() if mine}
        node = max(rates, key=rates.__getitem__)
        mine = by_host[node]
        others = max((r for n, r in rates.items() if n != node), default=0.0)
        placed = sum(_matrix_resent(e) for e in mine)
        # a peer counts only where its edge holds a real part of the host's loss, as in the captures' placement:
        # beside one edge that carries nearly all of it (the jumbo-host lab beside a busy machine: 91 segments
        # h2 -> h0, 3 h1 -> h0) the loss is that edge's, not the host's
        lossy = [e for e in mine if _matrix_resent(e) >= max(RETRANS_MIN_COUNT.value, LOSS_PEER_SHARE.value * placed)]
        if (placed < RETRANS_MIN_COUNT.value or rates[node] < RETRANS_RATE.value or len(lossy) < 2
                or rates[node] < LOSS_RATE_CONTRAST.value * max(others, RETRANS_RATE.value / 10)):
            continue
        return [_matrix_finding(pairs, node, way, mine, len(lossy), rates, others)]
    return None


def _incast_loss(run: RunData, pairs: dict[tuple[str, str], PairLoss]) -> Finding | None:
    """The loss into one host where every other node sends into it at once: the only traffic of the run that
    converges on a host's switch port, where a shallow buffer tail-drops. The host whose senders resent the
    most over all rounds is named where, in one round or more, they (two or more of them lossy) resent at least
    LOSS_RATE_CONTRAST times the share of segments into any other host, and in every other round a sender into
    it starved while none into another host did."""
    matrix = run.link_matrix
    rounds = matrix.incast_rounds() if matrix is not None else {}
    read = {number: shares for number, phases in rounds.items()
            if len(shares := {dst: share for dst, phase in phases.items()
                              if (share := phase.resent_share()) is not None}) >= LOCALIZE_MIN_NODES.value}
    if not read:
        return None
    # The host whose senders resent the most of their segments over every round; it must stand out in each
    # round, by its share or by a starved sender (incast collapse: a flow sits out the round in retransmission
    # timeouts, resending little, while no flow into another host starves).
    pooled = {dst: steady_resent_share([(rounds[number][dst], f) for number in read if dst in read[number]
                                 for f in rounds[number][dst].flows]) or 0.0
              for dst in set().union(*read.values())}
    node = max(pooled, key=pooled.__getitem__)
    others = {number: max((share for dst, share in shares.items() if dst != node), default=0.0)
              for number, shares in read.items()}
    starved: dict[int, list[IncastFlow]] = {}
    by_share = 0
    for number, shares in read.items():
        if node not in shares:
            return None
        phase = rounds[number][node]
        resent = sum(int(f.steady_retransmits or 0) for f in phase.flows)
        lossy = [f for f in phase.flows if int(f.steady_retransmits or 0) >= RETRANS_MIN_COUNT.value]
        if not (resent < RETRANS_MIN_COUNT.value or shares[node] < RETRANS_RATE.value or len(lossy) < 2
                or shares[node] < LOSS_RATE_CONTRAST.value * max(others[number], RETRANS_RATE.value / 10)):
            by_share += 1
            continue
        hungry = _starved(phase)
        if not hungry or any(_starved(other) for dst, other in rounds[number].items() if dst != node):
            return None
        starved[number] = hungry
    if not by_share:
        return None
    source = "run.json link.matrix.incast"
    several = len(read) > 1
    evidence = [Evidence(f"incast into each host{f' (round {number})' if several else ''}, segments resent after "
                         "the warm-up: " + ", ".join(f"{dst} {share:.2%}" for dst, share in sorted(shares.items())),
                         {"round": number, "shares": dict(sorted(shares.items())),
                          "other_hosts_max_share": others[number]}, source, MATRIX_PLOT)
                for number, shares in read.items()]
    evidence += [Evidence(f"{f.src} -> {node}, with every other node sending into {node}"
                          + (f" (round {number})" if several else "") + f": {f.steady_retransmits} segments resent "
                          f"after the warm-up ({f.retransmits} in all), {_rate(f.goodput_Bps)}",
                          {"node": node, "way": "into", "src": f.src, "dst": node, "round": number,
                           "steady_retransmits": f.steady_retransmits, "retransmits": f.retransmits,
                           "goodput_Bps": f.goodput_Bps}, source, MATRIX_PLOT)
                 for number in read for f in sorted(rounds[number][node].flows,
                                                     key=lambda f: -int(f.steady_retransmits or 0))]
    mine = [read[number][node] for number in read]
    contrast = max(read[number][node] / max(others[number], 1e-9) for number in read)
    phase = rounds[min(read)][node]
    agree, steps = _steps_agree(pairs, node, "into")
    if steps is not None:
        evidence.append(steps)
    goodputs = [f.goodput_Bps or 0 for number in read for f in rounds[number][node].flows]
    # What it cost this run: the steps' own loss into the node (a ring sends into each host from one peer, so a
    # port that drops converging traffic may cost its collectives little).
    steps_share = steps.values.get("steps_share") if steps is not None else None
    if agree:
        cost = "; the run's own steps lose most there too"
    elif isinstance(steps_share, float) and steps_share < RETRANS_RATE.value:
        cost = (f"; the run's own steps lost only {steps_share:.3%} of their packets into {node} (they do not "
                f"converge on it): little cost to them, more to many-to-one traffic")
    else:
        cost = ""
    rounds_text = f" in {len(read)} rounds" if several else ""
    if starved:
        cost = "; " + "; ".join(f"in round {number} " + ", ".join(
            f"{f.src} -> {node} starved ({_rate(f.goodput_Bps)}, {f.steady_retransmits} segments resent: "
            "retransmission timeouts)" for f in flows) for number, flows in starved.items()) + cost
    statement = (f"segments are lost on the directions into {node}: with every other node sending into it at once "
                 f"its {len(phase.flows)} senders resent {' and '.join(f'{m:.2%}' for m in mine)} of their segments"
                 f"{rounds_text}, up to {contrast:.0f}x the most into any other host "
                 f"({', '.join(f'{o:.2%}' for o in others.values())}); a shallow buffer at {node}'s switch port (or "
                 f"NIC) drops what converges on it, its senders carried {_span(goodputs)}{cost}")
    limits = (RETRANS_RATE, RETRANS_MIN_COUNT, LOSS_RATE_CONTRAST, LOCALIZE_MIN_NODES, INCAST_STARVED_SHARE)
    return Finding("loss_at_host", "fired", statement, "strong" if agree else "moderate", tuple(evidence[:20]),
                   used(*limits))


def _starved(phase: Incast) -> list[IncastFlow]:
    fair = sum(f.goodput_Bps or 0 for f in phase.flows) / max(len(phase.flows), 1)
    return [f for f in phase.flows if (f.goodput_Bps or 0) < INCAST_STARVED_SHARE.value * fair
            and int(f.steady_retransmits or 0) >= RETRANS_MIN_COUNT.value]


def _steps_agree(pairs: dict[tuple[str, str], PairLoss], node: str, way: str) -> tuple[bool, Evidence | None]:
    """Whether the run's own steps (each direction from its sender's capture) lose most {way} ``node`` too: at
    least twice the median of the other hosts; with the evidence that says so."""
    by_host: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for (src, dst), p in pairs.items():
        host = dst if way == "into" else src
        by_host[host][0] += p.resent
        by_host[host][1] += p.packets
    steps = {n: r / k for n, (r, k) in by_host.items() if k}
    agree = bool(steps) and max(steps, key=steps.__getitem__) == node and len(steps) > 1 and \
        steps[node] >= 2 * statistics.median(v for n, v in steps.items() if n != node)
    if steps.get(node) is None:
        return agree, None
    rest = [v for n, v in steps.items() if n != node]
    return agree, Evidence(f"the run's own steps (each direction from its sender's capture): {way} {node} "
                           f"{steps[node]:.3%} of packets resent, {way} the other hosts "
                           f"{min(rest, default=0):.3%}-{max(rest, default=0):.3%}",
                           {"node": node, "steps_share": steps[node], "steps_others": rest}, "analysis of every node")


def _matrix_finding(pairs: dict[tuple[str, str], PairLoss], node: str, way: str, mine: list[LinkEdge], peers: int,
                    rates: dict[str, float], others: float) -> Finding:
    source = "run.json link.matrix"
    evidence = [Evidence(f"{e.src} -> {e.dst}: {_matrix_resent(e)} segments resent ({e.alone_retransmits} alone, "
                         f"{e.bidir_retransmits} both ways at once); both ways at once it carried "
                         f"{_rate(e.bidir_Bps)}, {(e.bidir_Bps or 0) / (e.alone_Bps or 1):.0%} of alone",
                         {"node": node, "way": way, "src": e.src, "dst": e.dst, "retransmissions": _matrix_resent(e),
                          "alone_retransmits": e.alone_retransmits, "bidir_retransmits": e.bidir_retransmits,
                          "bidir_ratio": (e.bidir_Bps or 0) / (e.alone_Bps or 1)}, source, MATRIX_PLOT)
                for e in sorted(mine, key=lambda e: -_matrix_resent(e))]
    evidence.append(Evidence(f"the other hosts' edges {way} them: at most {others:.3%} of their segments resent",
                             {"other_hosts_max_share": others}, source))
    # The run's own steps, each direction from its sender's capture: where they agree, the finding is strong.
    agree, steps = _steps_agree(pairs, node, way)
    if steps is not None:
        evidence.append(steps)
    bidir = [(e.bidir_Bps or 0) / (e.alone_Bps or 1) for e in mine]
    statement = (f"segments are lost on the directions {way} {node} (from {peers} peers, in the link matrix's "
                 f"flows): {rates[node]:.2%} of their segments resent, against at most {others:.3%} {way} any other "
                 f"host; both ways at once its edges carried {min(bidir):.0%}-{max(bidir):.0%} of alone"
                 + ("; the run's own steps lose most there too" if agree else ""))
    limits = (RETRANS_RATE, RETRANS_MIN_COUNT, LOSS_PEER_SHARE, LOSS_RATE_CONTRAST, LOCALIZE_MIN_NODES)
    return Finding("loss_at_host", "fired", statement, "strong" if agree else "moderate", tuple(evidence[:20]),
                   used(*limits))


def _place(pairs: dict[tuple[str, str], PairLoss], node: str, way: str, share: float) -> Placement:
    def host_of(pair: tuple[str, str]) -> str:
        return pair[1] if way == "into" else pair[0]

    # lossy by the retransmissions rule's own bar: a few resent segments on a busy direction are no loss there
    lossy = {pair: p for pair, p in pairs.items() if host_of(pair) == node and _lossy(p)}
    # a peer counts towards the host only where its direction holds a real part of the host's loss: beside one
    # edge that carries nearly all of it (the slow-nic lab: 128,463 segments h0 -> h1, 47 and 51 h0 -> h2, h3),
    # the loss is that edge's, not "out of h0 from 3 peers"
    placed = sum(p.resent for p in lossy.values())
    peers = tuple(sorted({pair[0] if way == "into" else pair[1] for pair, p in lossy.items()
                          if p.resent >= LOSS_PEER_SHARE.value * placed}))
    # data, not ACKs alone: a direction that carries no data has nothing to lose
    contrast = any(host_of(pair) != node and (p.payload_bytes >= BIDIR_MIN_BYTES.value or p.series)
                   for pair, p in pairs.items())
    return Placement(node, way, share, lossy, peers, contrast)


def _lossy(loss: PairLoss) -> bool:
    return loss.resent >= RETRANS_MIN_COUNT.value and (not loss.packets or loss.resent / loss.packets >= RETRANS_RATE.value)


def _edge_side(run: RunData, src: str, dst: str) -> tuple[str | None, str]:
    """Which end of a lossy edge drops: "into" (dst's receiving side, or the path to it), "out of" (src's sending
    side), or None; with the reason. The link matrix shows one end slow where it measured it; else the sender's
    own capture: segments it saw leave and later resent were lost after its NIC, segments it never saw (gaps
    before the resend) were dropped before it, on the sender's side."""
    matrix = run.link_matrix
    if matrix is not None and matrix.alone():
        alone = matrix.alone()
        caps = capacities(alone, matrix.names())
        ins = [c.in_Bps for c in caps.values() if c.in_Bps]
        outs = [c.out_Bps for c in caps.values() if c.out_Bps]
        got, sent = caps[dst].in_Bps if dst in caps else None, caps[src].out_Bps if src in caps else None
        low_in = bool(got and ins and got < SLOW_LINK_RATIO.value * statistics.median(ins))
        low_out = bool(sent and outs and sent < SLOW_LINK_RATIO.value * statistics.median(outs))
        if low_in != low_out:
            return (("into", f"the link matrix shows {dst} receiving at {_rate(got)}, below the median node's "
                     f"{human_rate(statistics.median(ins))}") if low_in else
                    ("out of", f"the link matrix shows {src} sending at {_rate(sent)}, below the median node's "
                     f"{human_rate(statistics.median(outs))}"))
    own = [f for f in flow_observations(run) if f.src == src and f.dst == dst and f.capture.node == src]
    resent = sum(f.direction.retransmissions for f in own)
    gaps = sum(f.direction.lost_segments for f in own)
    if resent >= RETRANS_MIN_COUNT.value:
        if gaps <= 0.1 * resent:
            return "into", (f"{src}'s own capture saw the segments leave before it resent them ({resent} "
                            f"retransmissions, {gaps} gaps): they were lost after its NIC, on the way into {dst}")
        if gaps >= 0.5 * resent:
            return "out of", (f"{src}'s own capture never saw many of the segments it resent ({gaps} gaps for "
                              f"{resent} retransmissions): they were dropped before its NIC, on {src}'s sending side")
    return None, ("neither the link matrix nor the sender's own capture tells the two apart" if own or matrix
                  else "no link matrix and no capture on the sender to tell the two apart")


def _goodput_ratio(lossy: dict[tuple[str, str], PairLoss], others: list[PairLoss]) -> tuple[float | None, int]:
    """The median, over the steps (capture tags) that have both, of the lossy directions' median active goodput
    over the other data directions' of the same step: like against like (same sizes, same N)."""
    def by_tag(losses: Iterable[PairLoss]) -> dict[str, list[float]]:
        out: dict[str, list[float]] = defaultdict(list)
        for p in losses:
            for f in p.flows:
                if f.direction.payload_bytes >= BIDIR_MIN_BYTES.value and f.direction.active_goodput_Bps > 0:
                    out[f.capture.tag].append(f.direction.active_goodput_Bps)
        return out
    slow, fast = by_tag(lossy.values()), by_tag(others)
    ratios = [statistics.median(slow[tag]) / statistics.median(fast[tag]) for tag in slow if tag in fast]
    return (statistics.median(ratios), len(ratios)) if ratios else (None, 0)


def _loss_evidence(run: RunData, pairs: dict[tuple[str, str], PairLoss], lossy: dict[tuple[str, str], PairLoss],
                   node: str, way: str) -> tuple[list[Evidence], str]:
    evidence = []
    for (src, dst), p in sorted(lossy.items(), key=lambda kv: -kv[1].resent):
        rate = f" ({p.resent / p.packets:.2%} of {p.packets} packets, {p.fast} fast retransmits)" if p.packets else ""
        source = p.flows[0].capture.source("analysis") if p.flows else "TCP_INFO samples"
        evidence.append(Evidence(f"into {dst} from {src}: {p.resent:.0f} retransmitted segments{rate}",
                                 {"node": node, "way": way, "src": src, "dst": dst, "retransmissions": p.resent,
                                  "packets": p.packets, "fast_retransmissions": p.fast}, source))
    others = [p for pair, p in pairs.items() if pair not in lossy]
    quiet = sum(p.packets for p in others)
    if quiet:
        evidence.append(Evidence(f"every other node-to-node direction: {sum(p.resent for p in others):.0f} "
                                 f"retransmitted segments in {quiet} packets", {"node": node, "packets": quiet},
                                 "analysis of every node"))
    costs = []
    ratio, steps = _goodput_ratio(lossy, others)
    if ratio is not None:
        costs.append(f"the lossy directions moved data at {ratio:.0%} of the rate of the other directions of the "
                     f"same steps while active (median over {steps} step(s))" if ratio < 0.95 else
                     f"the lossy directions moved data as fast as the others of the same steps while active "
                     f"({ratio:.0%}, {steps} step(s))")
    spans = [phase_idle(f) for p in lossy.values() for f in p.flows
             if f.direction.payload_bytes >= BIDIR_MIN_BYTES.value]   # an ACK-only direction idles by design
    idle, timed = sum(span[0] for span in spans), sum(span[2] for span in spans)
    longest = max((span[1] for span in spans), default=0.0)
    if timed > 0 and idle > 0:
        costs.append(f"inside timed iterations they idled {idle:.3g} s of {timed:.3g} s (longest gap {longest:.3g} s"
                     + (f", past the {IDLE_RESTART_S.value:g} s minimum retransmission timeout"
                        if longest >= IDLE_RESTART_S.value else "") + ")")
    series = [s for p in lossy.values() for s in p.series]
    cuts = sum(s.series.cwnd_cuts(CWND_CUT_FACTOR.value) for s in series)
    collapses = sum(s.series.cwnd_collapses(CWND_COLLAPSE_SEGMENTS.value) for s in series)
    if series:
        text = (f"TCP_INFO of {len(series)} socket(s) sending {way.replace('out of', 'from')} {node}: cwnd cut to <= "
                f"{CWND_CUT_FACTOR.value:.0%} of its peak {cuts} time(s), {collapses} of them to <= "
                f"{CWND_COLLAPSE_SEGMENTS.value:.0f} segments (a timeout's restart)")
        evidence.append(Evidence(text, {"node": node, "cwnd_cuts": cuts, "cwnd_collapses": collapses},
                                 "TCP_INFO samples", "window.png"))
        if cuts:
            costs.append(f"cwnd cut {cuts} time(s) ({collapses} collapses)")
    if costs:
        evidence.append(Evidence("cost: " + "; ".join(costs), {"node": node, "idle_s": idle, "idle_max_s": longest,
                                                                "timed_s": timed, "goodput_ratio": ratio},
                                 "analysis of every node"))
    return evidence, "; ".join(costs)


# --- window or buffer limit at one host ---


@dataclass
class WindowTally:
    limited_s: float = 0.0
    busy_s: float = 0.0
    zero_windows: int = 0
    window_full: int = 0
    data_packets: int = 0

    @property
    def share(self) -> float | None:
        return self.limited_s / self.busy_s if self.busy_s > 0 else None


def window_at_host(run: RunData) -> list[Finding]:
    """Senders waiting on one host's receive window (TCP_INFO rwnd_limited of the sockets sending to it, zero
    windows it advertised, window-full events of data into it) or on one host's send buffer (sndbuf_limited),
    tied to that host's tcp_rmem/tcp_wmem when its fingerprint differs from the others'."""
    name = "window_at_host"
    limits = (RWND_LIMITED_FRACTION, SNDBUF_LIMITED_FRACTION, WINDOW_FULL_RATE, WINDOW_FULL_MIN_COUNT)
    thresholds = used(*limits)
    series = [s for s in node_tcp_info(run) if s.src and s.dst]
    flows = [f for f in node_flows(run) if f.src and f.dst]
    if not series and not flows:
        return undecided(name, "no TCP_INFO or capture analysis whose ends the run can name: windows cannot be "
                         "placed on a host", *limits)
    receive: dict[str, WindowTally] = defaultdict(WindowTally)
    send: dict[str, WindowTally] = defaultdict(WindowTally)
    for s in series:
        busy = s.series.delta("busy_s")
        if busy and s.src and s.dst:
            for tally, key in ((receive[s.dst], "rwnd_limited_s"), (send[s.src], "sndbuf_limited_s")):
                tally.busy_s += busy
                tally.limited_s += s.series.delta(key) or 0.0
    for f in flows:
        if f.src and f.dst:
            d = f.direction
            receive[f.src].zero_windows += d.zero_windows           # f.src advertised them: its window was full
            receive[f.dst].window_full += d.window_full             # data into f.dst filled its window
            receive[f.dst].data_packets += d.data_packets or d.packets
    roles = (("receive", receive, RWND_LIMITED_FRACTION, "rmem", "receive window"),
             ("send", send, SNDBUF_LIMITED_FRACTION, "wmem", "send buffer"))
    findings, alike = [], []
    for role, tallies, limit, sysctl, what in roles:
        limited = [n for n, t in tallies.items() if _limited(t, limit.value)]
        active = [n for n, t in tallies.items() if t.busy_s > 0 or t.data_packets > 0]
        if not limited:
            continue
        if len(active) < 2:
            alike.append(f"only {', '.join(active)}'s {what} was seen: one host's cannot be told from every host's")
            continue
        if len(limited) == len(active):
            alike.append(f"every host's {what} limits alike ({', '.join(sorted(limited))})")
            continue
        for node in sorted(limited):
            findings.append(_window_finding(run, node, role, tallies, limit.value, sysctl, what, thresholds))
    if findings:
        return findings
    return [Finding(name, "clear", ("; ".join(alike) + ": not one host's (see window_limited)") if alike else
                    "no host's receive window or send buffer limits its peers beyond the thresholds",
                    thresholds=thresholds)]


def _limited(t: WindowTally, limit: float) -> bool:
    """TCP_INFO, where the senders' sockets were sampled, says how long they waited on the window: it decides.
    Else the wire: windows filled, or zero windows advertised, at a rate (a few zero windows are a receiver that
    was slow to read once, e.g. rank 0 busy writing its records, not a window too small)."""
    if t.share is not None:
        return t.share >= limit

    def often(count: int) -> bool:
        return (count >= WINDOW_FULL_MIN_COUNT.value and t.data_packets > 0
                and count / t.data_packets >= WINDOW_FULL_RATE.value)

    return often(t.window_full) or often(t.zero_windows)


def _window_finding(run: RunData, node: str, role: str, tallies: dict[str, WindowTally], limit: float,
                    sysctl: str, what: str, thresholds: dict[str, float]) -> Finding:
    t = tallies[node]
    others = {n: o for n, o in tallies.items() if n != node}
    parts = []
    if t.share is not None:
        other = [o.share for o in others.values() if o.share is not None]
        parts.append(f"sockets {'sending to' if role == 'receive' else 'of'} {node} spent {t.share:.0%} of their busy "
                     f"time {what} limited (TCP_INFO, {t.limited_s:.3g} s of {t.busy_s:.3g} s)"
                     + (f", the other hosts' {max(other):.0%} at most" if other else ""))
    if role == "receive" and (t.zero_windows or t.window_full):
        parts.append(f"on the wire {node} advertised {t.zero_windows} zero windows and data into it filled its "
                     f"window {t.window_full} times in {t.data_packets} data packets")
    differs = [d for d in differences_of(run, node) if sysctl in d.key]
    fingerprint = run.fingerprints().get(node)
    if differs:
        tie, strength = "; tied to its sysctls: " + "; ".join(d.text for d in differs), "strong"
    else:
        own = {k: v for k, v in flatten(fingerprint or {}).items() if sysctl in k}
        values = ", ".join(f"{display_key(k)} = {v}" for k, v in own.items())
        tie = (f"; its {values}: as on the other nodes" if own else
               "; no fingerprint of its sysctls to tie it to" if fingerprint is None else
               f"; its fingerprint has no {sysctl} to tie it to")
        strength = "moderate" if t.share is not None and t.share >= 2 * limit else "weak"
    statement = f"{node}'s {what} limits its peers: " + "; ".join(parts) + tie
    evidence = [Evidence(p, {"node": node, "role": role, "share": t.share, "zero_windows": t.zero_windows,
                             "window_full": t.window_full}, "TCP_INFO samples and analysis of every node",
                         "window.png") for p in parts]
    evidence += [Evidence(d.text, {"node": node, "key": d.key, "value": d.value_of(node)},
                          f"nodes/{node}/fingerprint.json") for d in differs]
    return Finding("window_at_host", "fired", statement, strength, tuple(evidence), thresholds)

"""Diagnosis rules: each reads a RunData (files only) and says what it found, how sure, on what evidence,
and which named threshold fired. A rule that lacks its inputs says it cannot decide, and why.

Every rule returns Findings with status "fired", "clear" (checked, nothing wrong) or "undecided" (could
not check). A fired finding always carries evidence: numbers, the file they came from, the plot that
shows them and, where it applies, the phase.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from diag.records import Record
from diag.report.compare import ALPHA, welch_test
from diag.report.rundir import CaptureSet, RunData
from diag.report.series import PAIRWISE_OPS, busbw_samples, by_series, knob, series_label
from diag.units import human_bytes, human_rate, human_time

# --- Named thresholds (each finding reports the ones it used) ---
# busbw at N=2 below this fraction of the median busbw at N>=3 (same size) is a dip.
N2_DIP_RATIO = 0.8
# A dip deeper than this (at the largest size, over >= 2 sizes) is strong.
N2_DIP_STRONG = 0.6
# Sizes at or above this count as "large" (bandwidth-bound rather than latency-bound).
LARGE_SIZE_BYTES = 1 << 20
# Backend busbw below this fraction of the raw-TCP reference's (same op, N, size) is "far below".
BACKEND_RAW_EFFICIENCY = 0.7
# A connection/host carrying at least this many payload bytes each way "carries both directions".
BIDIR_MIN_BYTES = 64 * 1024
# Duplex overlap (fraction of active time both directions move data) below this is low.
DUPLEX_OVERLAP_LOW = 0.5
# The exchange order (send-first vs recv-first) or raw --conn changes time by at least this much.
ORDER_EFFECT = 0.15
CONN_SPLIT_EFFECT = 0.15
# Fraction of busy time a connection spent receive-window limited before we call it rwnd limited.
RWND_LIMITED_FRACTION = 0.2
# Same, send-buffer limited.
SNDBUF_LIMITED_FRACTION = 0.2
# Retransmitted segments per data segment above which retransmissions matter.
RETRANS_RATE = 0.001
# ... and at least this many, so one resent segment on a tiny connection is not a finding.
RETRANS_MIN_COUNT = 3
# Linux resets cwnd after an idle longer than the RTO (tcp_slow_start_after_idle); the RTO is >= 200 ms.
IDLE_RESTART_S = 0.2
# Idle time (gaps) above this fraction of a direction's active span is significant.
IDLE_FRACTION = 0.3
# A thread at or above this % of one core ...
CPU_PINNED_PCT = 90.0
# ... in at least this share of its samples (and at least CPU_MIN_SAMPLES samples) is pinned.
CPU_PINNED_SHARE = 0.5
CPU_MIN_SAMPLES = 3
# The machine's CPUs (all of them, averaged) at least this busy in CPU_PINNED_SHARE of a run's samples: the
# ranks together use every core, so the CPU rather than the link may set the pace.
CPU_SATURATED_PCT = 90.0
# ... but a busy machine limits an N only where the raw-TCP reference at that N also stays below this share
# of the measured link rate: where raw TCP fills the link on the same busy machine, the CPU can carry that
# traffic, and a slower backend is slow for another reason.
CPU_LINK_REACHED = 0.85

# A backend's bidirectional connection overlaps its directions this much less than raw TCP on one shared
# connection between the same hosts: the backend, not TCP or the link, makes the directions take turns.
TURN_TAKING_GAP = 0.3
# A backend's busbw within this fraction of a raw ring that alternates directions (half duplex).
HALF_DUPLEX_MATCH = 0.2

STATUSES = ("fired", "undecided", "clear")
STRENGTHS = ("strong", "moderate", "weak")


@dataclass(frozen=True)
class Evidence:
    text: str                                    # one sentence with the numbers
    values: dict[str, Any] = field(default_factory=dict)
    source: str = ""                             # file the numbers came from
    plot: str | None = None                      # report PNG that shows it
    phase: dict[str, Any] | None = None          # sweep phase (capture window) it belongs to


@dataclass(frozen=True)
class Finding:
    rule: str
    status: str                                  # fired | undecided | clear
    statement: str
    strength: str = ""                           # strong | moderate | weak (fired only)
    evidence: tuple[Evidence, ...] = ()
    thresholds: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"bad status {self.status!r}")
        if self.status == "fired" and (not self.evidence or self.strength not in STRENGTHS):
            raise ValueError(f"rule {self.rule}: a finding needs evidence and a strength")

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["evidence"] = [asdict(e) for e in self.evidence]
        return out


Rule = Callable[[RunData], list[Finding]]


def _strength(margin: float, strong: float, moderate: float) -> str:
    """margin: how far past the threshold (bigger = clearer)."""
    return "strong" if margin >= strong else "moderate" if margin >= moderate else "weak"


def _weaken(strength: str) -> str:
    return STRENGTHS[min(STRENGTHS.index(strength) + 1, len(STRENGTHS) - 1)]


def _undecided(rule: str, why: str, **thresholds: float) -> list[Finding]:
    return [Finding(rule, "undecided", why, thresholds=dict(thresholds))]


# --- Records rules ---

def rule_n2_dip(run: RunData) -> list[Finding]:
    """busbw at N=2 below N>=3 at the same size, and the size from which the dip holds."""
    name = "n2_busbw_dip"
    thresholds = {"N2_DIP_RATIO": N2_DIP_RATIO, "N2_DIP_STRONG": N2_DIP_STRONG, "ALPHA": ALPHA}
    findings: list[Finding] = []
    # N>=3 runs where the CPU, not the link, set the pace would drag the reference down and hide a dip:
    # they are left out of it while link-bound N>=3 runs remain (cpu_bound names them).
    cpu_limited = cpu_limited_world_sizes(run)
    for (label, op), per_n in sorted(by_series(run.records).items()):
        if op in PAIRWISE_OPS or 2 not in per_n or not any(n >= 3 for n in per_n):
            continue
        per_n, axis = _match_axis(per_n)
        reference = [n for n in per_n if n >= 3 and n not in cpu_limited] or [n for n in per_n if n >= 3]
        left_out = sorted(n for n in per_n if n >= 3 and n not in reference)
        note = (f"; N={','.join(map(str, left_out))} left out of the reference: CPU-bound there (cpu_bound)"
                if left_out else "")
        ratios: dict[int, tuple[float, float, float]] = {}
        for size, row2 in sorted(per_n[2].items()):
            others = [per_n[n][size].busbw_Bps for n in reference if size in per_n[n]]
            if others and row2.busbw_Bps > 0:
                ref = statistics.median(others)
                ratios[size] = (row2.busbw_Bps / ref if ref > 0 else math.inf, row2.busbw_Bps, ref)
        if not ratios:
            continue
        sizes = sorted(ratios)
        source = run.source_of(per_n[2][sizes[-1]])
        table = ", ".join(f"{axis}{human_bytes(s)}: {ratios[s][0]:.2f}" for s in sizes)
        if ratios[sizes[-1]][0] >= N2_DIP_RATIO:
            findings.append(Finding(name, "clear", f"{label} {op}: busbw at N=2 is not below N>=3 at the largest "
                                    f"size (N=2 / N>=3 ratio by size: {table}){note}", thresholds=thresholds))
            continue
        onset = sizes[-1]
        for s in reversed(sizes):
            if ratios[s][0] >= N2_DIP_RATIO:
                break
            onset = s
        dipping = [s for s in sizes if s >= onset]
        worst = ratios[sizes[-1]][0]
        strength = ("strong" if worst < N2_DIP_STRONG and len(dipping) >= 2
                    else "moderate" if len(dipping) >= 2 or worst < N2_DIP_STRONG else "weak")
        ns = sorted(reference)
        reference_label = f"N={','.join(map(str, ns))}" if left_out else f"N>={ns[0]}"
        pooled = [v for n in ns if sizes[-1] in per_n[n] for v in busbw_samples(per_n[n][sizes[-1]])]
        test = welch_test(busbw_samples(per_n[2][sizes[-1]]), pooled)
        if test.p_value is None or test.p_value >= ALPHA:
            strength = "weak"  # the samples do not separate N=2 from N>=3 with confidence
        significance = (f"p={test.p_value:.2g}" if test.p_value is not None else test.reason)
        evidence = [Evidence(
            f"at {axis}{human_bytes(s)}{' per rank' if not axis else ''}, N=2 busbw {human_rate(ratios[s][1])} vs median "
            f"N={','.join(map(str, ns))} "
            f"{human_rate(ratios[s][2])} (ratio {ratios[s][0]:.2f})",
            {"size_bytes": s, "ratio": ratios[s][0], "busbw_n2_Bps": ratios[s][1], "busbw_n3plus_Bps": ratios[s][2]},
            source, "busbw_vs_size.png") for s in dipping]
        findings.append(Finding(
            name, "fired",
            f"{label} {op}: busbw at N=2 is {1 - worst:.0%} below {reference_label} at {axis}{human_bytes(sizes[-1])}, "
            f"from {axis}{human_bytes(onset)}{' per rank' if not axis else ''} upward "
            f"({significance}; ratio by size: {table}){note}",
            strength, tuple(evidence), thresholds))
    if not findings:
        return _undecided(name, "no series has both N=2 and N>=3 rows at the same sizes: cannot compare "
                          "(sweep --nproc 2,3,4)", **thresholds)
    return findings


def _match_axis(per_n: dict[int, dict[int, Record]]) -> tuple[dict[int, dict[int, Record]], str]:
    """Compare N=2 with N>=3 at equal per-rank size S, or at equal per-device volume D = (N-1) x S (the
    user's own axis, and what diag reproduce sweeps) when that matches more rows. Returns the maps and a
    label prefix for sizes ("" for S, "D=" for volume)."""
    by_volume = {n: {row.volume_bytes: row for row in rows.values()} for n, rows in per_n.items()}

    def matches(maps: dict[int, dict[int, Record]]) -> int:
        return sum(1 for key in maps.get(2, {}) if any(key in maps[n] for n in maps if n >= 3))

    return (by_volume, "D=") if matches(by_volume) > matches(per_n) else (per_n, "")


def _large_sizes(sizes: Sequence[int]) -> list[int]:
    large = [s for s in sizes if s >= LARGE_SIZE_BYTES]
    return large or sorted(sizes)[-max(1, len(sizes) // 3):]


def rule_backend_vs_raw(run: RunData) -> list[Finding]:
    """A torch backend far below the raw-TCP reference on the same op, N and sizes."""
    name = "backend_below_raw"
    thresholds = {"BACKEND_RAW_EFFICIENCY": BACKEND_RAW_EFFICIENCY, "LARGE_SIZE_BYTES": LARGE_SIZE_BYTES}
    raw = [r for r in run.records if r.backend == "raw"]
    torch_rows = [r for r in run.records if r.backend != "raw"]
    if not raw:
        return _undecided(name, "no raw rows: cannot compare the backend with the raw-TCP reference", **thresholds)
    if not torch_rows:
        return _undecided(name, "no torch backend rows: nothing to compare with the raw reference", **thresholds)
    best_raw: dict[tuple[str, int, int], Record] = {}
    for r in raw:
        k = (r.op, r.world_size, r.size_bytes)
        if k not in best_raw or r.busbw_Bps > best_raw[k].busbw_Bps:
            best_raw[k] = r
    groups: dict[tuple[str, str, int], list[Record]] = defaultdict(list)
    for r in torch_rows:
        if (r.op, r.world_size, r.size_bytes) in best_raw:
            groups[(series_label(r), r.op, r.world_size)].append(r)
    if not groups:
        return _undecided(name, "raw and backend rows share no (op, N, size): cannot compare", **thresholds)
    low: list[Evidence] = []
    fine: dict[tuple[str, str], list[tuple[int, float]]] = defaultdict(list)
    for (label, op, n), rows in sorted(groups.items()):
        by_size = {r.size_bytes: r for r in rows}
        large = _large_sizes(sorted(by_size))
        effs = [by_size[s].busbw_Bps / best_raw[(op, n, s)].busbw_Bps for s in large
                if best_raw[(op, n, s)].busbw_Bps > 0]
        if not effs:
            continue
        eff = statistics.median(effs)
        ref = best_raw[(op, n, large[-1])]
        text = (f"{label} {op} N={n}: busbw {eff:.0%} of raw ({series_label(ref)}) at "
                f"{human_bytes(large[0])}..{human_bytes(large[-1])} "
                f"({human_rate(by_size[large[-1]].busbw_Bps)} vs {human_rate(ref.busbw_Bps)} at {human_bytes(large[-1])})")
        if eff < BACKEND_RAW_EFFICIENCY:
            low.append(Evidence(text, {"world_size": n, "op": op, "efficiency": eff, "raw": series_label(ref)},
                                run.source_of(by_size[large[-1]]), "efficiency.png"))
        else:
            fine[(label, op)].append((n, eff))
    if not low:
        return [Finding(name, "clear", "backend busbw is within reach of raw TCP: " + _efficiency_summary(fine),
                        thresholds=thresholds)]
    worst = min(e.values["efficiency"] for e in low)
    ns = sorted({e.values["world_size"] for e in low})
    statement = (f"the backend is far below raw TCP on the same link at N={','.join(map(str, ns))} "
                 f"(lowest efficiency {worst:.0%})")
    if fine:
        statement += "; elsewhere it keeps up: " + _efficiency_summary(fine)
    return [Finding(name, "fired", statement, _strength(BACKEND_RAW_EFFICIENCY - worst, 0.3, 0.1),
                    tuple(low), thresholds)]


def _efficiency_summary(fine: dict[tuple[str, str], list[tuple[int, float]]]) -> str:
    """'torch:gloo all_gather N=3,4,5: 86-107% of raw; ...' (large-size busbw medians per N)."""
    parts = []
    for (label, op), items in sorted(fine.items()):
        ns = ",".join(str(n) for n, _ in sorted(items))
        low, high = min(e for _, e in items), max(e for _, e in items)
        span = f"{low:.0%}" if round(low * 100) == round(high * 100) else f"{low * 100:.0f}-{high:.0%}"
        parts.append(f"{label} {op} N={ns}: {span} of raw")
    return "; ".join(parts)


def _order_of(record: Record) -> str | None:
    value = knob(record, "order")
    return str(value) if value in ("recv-first", "send-first") else None


def _verdict(large: bool, test: Any) -> str:
    """An experiment's outcome: "effect" (large and significant), "unsure" (large, but the samples cannot
    confirm it) or "flat" (below the effect threshold)."""
    if not large:
        return "flat"
    return "effect" if test.p_value is not None and test.p_value < ALPHA else "unsure"


def rule_exchange_order(run: RunData) -> list[Finding]:
    """Which call a rank posts first (recv-first vs send-first) changes throughput."""
    name = "exchange_order"
    thresholds = {"ORDER_EFFECT": ORDER_EFFECT, "ALPHA": ALPHA}
    pairs: dict[tuple[str, str, int, int], dict[str, Record]] = defaultdict(dict)
    for r in run.records:
        order = _order_of(r)
        if order:
            pairs[(series_label(r, without=("order",)), r.op, r.world_size, r.size_bytes)][order] = r
    both = {k: v for k, v in pairs.items() if len(v) == 2}
    if not both:
        why = ("no rows record an order (exchange --order)" if not pairs
               else "rows ran in one order only: run exchange with --order recv-first and send-first")
        return _undecided(name, why + ": cannot tell whether the order matters", **thresholds)
    effects: list[Evidence] = []
    flat: list[str] = []
    unsure: list[str] = []
    groups: dict[tuple[str, str, int], list[int]] = defaultdict(list)
    for (label, op, n, size) in both:
        groups[(label, op, n)].append(size)
    for (label, op, n), sizes in sorted(groups.items()):
        size = max(sizes)
        recv, send = both[(label, op, n, size)]["recv-first"], both[(label, op, n, size)]["send-first"]
        ratio = send.time_s / recv.time_s if recv.time_s > 0 else math.inf
        test = welch_test(recv.times_s, send.times_s)
        text = (f"{label} {op} N={n} {human_bytes(size)}: send-first {human_time(send.time_s)} vs recv-first "
                f"{human_time(recv.time_s)} (send/recv time ratio {ratio:.2f}"
                + (f", p={test.p_value:.2g})" if test.p_value is not None else f", {test.reason})"))
        verdict = _verdict(abs(ratio - 1) >= ORDER_EFFECT, test)
        if verdict == "effect":
            effects.append(Evidence(text, {"world_size": n, "size_bytes": size, "time_ratio_send_over_recv": ratio,
                                           "p_value": test.p_value}, run.source_of(send), "busbw_vs_size.png"))
        else:
            (unsure if verdict == "unsure" else flat).append(text)
    if not effects and unsure:
        # a large difference the samples cannot confirm is not "no effect": say so and ask for more samples
        return _undecided(name, "the order may change throughput, but the samples cannot confirm it (more "
                          "--iters would): " + "; ".join(unsure), **thresholds)
    if not effects:
        return [Finding(name, "clear", "the exchange order does not change throughput: " + "; ".join(flat),
                        thresholds=thresholds)]
    worst = max(abs(math.log(e.values["time_ratio_send_over_recv"])) for e in effects)
    return [Finding(name, "fired", "the order of send and receive changes throughput: "
                    + "; ".join(e.text for e in effects), _strength(math.exp(worst) - 1 - ORDER_EFFECT, 0.3, 0.1),
                    tuple(effects), thresholds)]


def rule_conn_split(run: RunData) -> list[Finding]:
    """Raw TCP: one connection per direction (split) vs both directions on one (shared, as gloo at N=2)."""
    name = "shared_connection"
    thresholds = {"CONN_SPLIT_EFFECT": CONN_SPLIT_EFFECT, "ALPHA": ALPHA}
    pairs: dict[tuple[str, str, int, int], dict[str, Record]] = defaultdict(dict)
    for r in run.records:
        conn = knob(r, "conn")
        if r.backend == "raw" and conn in ("shared", "split"):
            pairs[(series_label(r, without=("conn", "emulate")), r.op, r.world_size, r.size_bytes)][conn] = r
    both = {k: v for k, v in pairs.items() if len(v) == 2}
    if not both:
        return _undecided(name, "no raw rows with both --conn shared and --conn split: cannot tell what sharing "
                          "one connection for both directions costs", **thresholds)
    hits: list[Evidence] = []
    flat: list[str] = []
    unsure: list[str] = []
    largest: dict[tuple[str, str, int], int] = {}
    for (label, op, n, size) in both:
        largest[(label, op, n)] = max(size, largest.get((label, op, n), 0))
    for (label, op, n), size in sorted(largest.items()):
        shared, split = both[(label, op, n, size)]["shared"], both[(label, op, n, size)]["split"]
        gain = split.busbw_Bps / shared.busbw_Bps if shared.busbw_Bps > 0 else math.inf
        test = welch_test(shared.times_s, split.times_s)
        text = (f"{label} {op} N={n} {human_bytes(size)}: split {human_rate(split.busbw_Bps)} vs shared "
                f"{human_rate(shared.busbw_Bps)} busbw ({gain:.2f}x"
                + (f", p={test.p_value:.2g})" if test.p_value is not None else f", {test.reason})"))
        verdict = _verdict(gain >= 1 + CONN_SPLIT_EFFECT, test)
        if verdict == "effect":
            hits.append(Evidence(text, {"world_size": n, "size_bytes": size, "split_over_shared": gain,
                                        "p_value": test.p_value}, run.source_of(split), "busbw_vs_size.png"))
        else:
            (unsure if verdict == "unsure" else flat).append(text)
    if not hits and unsure:
        return _undecided(name, "a shared connection may cost throughput, but the samples cannot confirm it "
                          "(more --iters would): " + "; ".join(unsure), **thresholds)
    if not hits:
        return [Finding(name, "clear", "sharing one connection for both directions costs nothing measurable: "
                        + "; ".join(flat), thresholds=thresholds)]
    best = max(e.values["split_over_shared"] for e in hits)
    statement = "both directions on one TCP connection are slower than one connection per direction: " + \
        "; ".join(e.text for e in hits)
    if flat:
        statement += "; no effect where: " + "; ".join(flat)
    return [Finding(name, "fired", statement, _strength(best - 1 - CONN_SPLIT_EFFECT, 0.3, 0.1), tuple(hits),
                    thresholds)]


def rule_data_errors(run: RunData) -> list[Finding]:
    name = "data_errors"
    bad = [r for r in run.records if r.nwrong > 0]
    if not bad:
        return [Finding(name, "clear", f"all {len(run.records)} rows verified with 0 wrong elements")]
    return [Finding(name, "fired", f"{len(bad)} rows delivered wrong data: their timings are not trustworthy",
                    "strong", tuple(Evidence(f"{series_label(r)} {r.op} N={r.world_size} {human_bytes(r.size_bytes)}: "
                                             f"{r.nwrong} wrong elements", {"nwrong": r.nwrong}, run.source_of(r))
                                    for r in bad[:20]))]


# --- Wire rules (analysis JSON, capture metadata) ---

def _analysed(run: RunData) -> list[CaptureSet]:
    return [c for c in run.captures.values() if c.analysis]


def _drop_note(capture: CaptureSet) -> str:
    dropped = capture.kernel_dropped
    return f" (capture dropped {dropped} packets: unreliable)" if dropped else ""


def _directions(conn: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    a, b = conn.get("a", "?"), conn.get("b", "?")
    dirs = conn.get("directions") or {}
    return [(f"{a}->{b}", dirs.get("a->b") or {}), (f"{b}->{a}", dirs.get("b->a") or {})]


def rule_duplex_overlap(run: RunData) -> list[Finding]:
    """Connections/hosts that carry both directions but rarely move both at once."""
    name = "low_duplex_overlap"
    thresholds = {"DUPLEX_OVERLAP_LOW": DUPLEX_OVERLAP_LOW, "BIDIR_MIN_BYTES": BIDIR_MIN_BYTES}
    captures = _analysed(run)
    if not captures:
        return _undecided(name, "no capture analysis (analysis/*.json): cannot measure duplex overlap", **thresholds)
    low: list[Evidence] = []
    ok: list[str] = []
    unreliable = False
    for c in sorted(captures, key=lambda c: (c.world_size or 0, c.tag)):
        source = f"analysis/{c.tag}.json"
        for conn in c.connections:
            dirs = _directions(conn)
            moved = [d.get("payload_bytes", 0) or 0 for _, d in dirs]
            overlap = conn.get("duplex_overlap")
            if min(moved) < BIDIR_MIN_BYTES or not isinstance(overlap, (int, float)):
                continue
            text = (f"{c.label}: connection {conn.get('a')} <-> {conn.get('b')} carries "
                    f"{human_bytes(moved[0])} / {human_bytes(moved[1])} but both directions move at once "
                    f"{overlap:.0%} of its active time{_drop_note(c)}")
            if overlap < DUPLEX_OVERLAP_LOW:
                unreliable |= bool(c.kernel_dropped)
                low.append(Evidence(text, {"world_size": c.world_size, "transport": c.transport,
                                           "duplex_overlap": overlap, "kind": "connection"}, source,
                                    "duplex_overlap.png"))
            else:
                ok.append(text)
        for host in c.hosts:
            overlap = host.get("duplex_overlap")
            tx, rx = host.get("tx_bytes", 0) or 0, host.get("rx_bytes", 0) or 0
            if min(tx, rx) < BIDIR_MIN_BYTES or not isinstance(overlap, (int, float)):
                continue
            text = (f"{c.label}: host {host.get('address')} sends {human_bytes(tx)} and receives "
                    f"{human_bytes(rx)}, both at once {overlap:.0%} of its active time{_drop_note(c)}")
            if overlap < DUPLEX_OVERLAP_LOW:
                unreliable |= bool(c.kernel_dropped)
                low.append(Evidence(text, {"world_size": c.world_size, "transport": c.transport,
                                           "duplex_overlap": overlap, "kind": "host"}, source, "duplex_overlap.png"))
            else:
                ok.append(text)
    if not low:
        if not ok:
            return [Finding(name, "clear", "no connection or host carried both directions in bulk "
                            f"(>= {human_bytes(BIDIR_MIN_BYTES)} each way)", thresholds=thresholds)]
        return [Finding(name, "clear", "every connection/host carrying both directions used both at once: "
                        + "; ".join(ok[:6]), thresholds=thresholds)]
    worst = min(e.values["duplex_overlap"] for e in low)
    ns = sorted({e.values["world_size"] for e in low if e.values["world_size"]})
    statement = (f"the link's full duplex goes unused at N={','.join(map(str, ns)) or '?'}: a connection or host "
                 f"that carries both directions moves them at once only {worst:.0%} of the time")
    fine_ns = sorted({n for n in (c.world_size for c in captures) if n and n not in ns})
    if fine_ns:
        statement += f" (captures at N={','.join(map(str, fine_ns))} show no such loss)"
    strength = _strength(DUPLEX_OVERLAP_LOW - worst, 0.3, 0.15)
    return [Finding(name, "fired", statement, _weaken(strength) if unreliable else strength, tuple(low), thresholds)]


def _capture_op(capture: CaptureSet) -> str | None:
    ops = Counter(p.get("phase", {}).get("op") for p in capture.phases if p.get("connections"))
    ops.pop(None, None)
    return ops.most_common(1)[0][0] if ops else None


def _bidirectional(capture: CaptureSet) -> list[tuple[dict[str, Any], float, int]]:
    """(connection, duplex overlap, bytes of the smaller direction) for connections that carry both ways."""
    out = []
    for conn in capture.connections:
        moved = [d.get("payload_bytes", 0) or 0 for _, d in _directions(conn)]
        overlap = conn.get("duplex_overlap")
        if min(moved) >= BIDIR_MIN_BYTES and isinstance(overlap, (int, float)):
            out.append((conn, float(overlap), min(moved)))
    return sorted(out, key=lambda item: -item[2])


def rule_turn_taking(run: RunData) -> list[Finding]:
    """At N=2 a backend's one connection carries both directions in turns while raw TCP on one shared
    connection, on the same hosts, carries both at once: the turn-taking is the backend's, not TCP's."""
    name = "turn_taking"
    thresholds = {"TURN_TAKING_GAP": TURN_TAKING_GAP, "DUPLEX_OVERLAP_LOW": DUPLEX_OVERLAP_LOW,
                  "BIDIR_MIN_BYTES": BIDIR_MIN_BYTES}
    pairs = [c for c in _analysed(run) if c.world_size == 2 and _bidirectional(c)]
    backend = [c for c in pairs if (c.transport or "").startswith("torch:") and _capture_op(c) == "all_gather"]
    raw = [c for c in pairs if (c.transport or "").startswith("raw")]
    if not backend:
        return _undecided(name, "no capture of a backend all_gather at N=2 with a connection carrying both "
                          "directions: cannot test turn-taking", **thresholds)
    if not raw:
        return _undecided(name, "no capture of raw TCP on one shared connection at N=2 (raw --conn shared or "
                          "--emulate gloo): no reference for what one connection can do", **thresholds)
    best_raw = max(raw, key=lambda c: _bidirectional(c)[0][1])
    raw_conn, raw_overlap, _ = _bidirectional(best_raw)[0]
    findings = []
    for c in backend:
        conn, overlap, _ = _bidirectional(c)[0]
        evidence = (
            Evidence(f"{c.label}: connection {conn.get('a')} <-> {conn.get('b')} moves both directions at once "
                     f"{overlap:.0%} of its active time", {"world_size": 2, "duplex_overlap": overlap,
                                                           "transport": c.transport},
                     f"analysis/{c.tag}.json", "duplex_overlap.png"),
            Evidence(f"{best_raw.label}: raw TCP, one connection {raw_conn.get('a')} <-> {raw_conn.get('b')} "
                     f"carrying both directions, overlaps them {raw_overlap:.0%} of its active time",
                     {"world_size": 2, "duplex_overlap": raw_overlap, "transport": best_raw.transport},
                     f"analysis/{best_raw.tag}.json", "duplex_overlap.png"),
        )
        if overlap < DUPLEX_OVERLAP_LOW and raw_overlap - overlap >= TURN_TAKING_GAP:
            strength = _strength(raw_overlap - overlap - TURN_TAKING_GAP, 0.3, 0.15)
            findings.append(Finding(
                name, "fired",
                f"{c.transport} all_gather at N=2 sends and receives on its one connection in turns "
                f"({overlap:.0%} overlap), while raw TCP on one shared connection between the same hosts overlaps "
                f"them {raw_overlap:.0%}: one TCP connection can carry both directions at once, so the turns "
                "come from how the backend drives the pair, not from TCP or the link",
                _weaken(strength) if c.kernel_dropped or best_raw.kernel_dropped else strength, evidence,
                thresholds))
        else:
            findings.append(Finding(name, "clear", f"{c.transport} all_gather at N=2 overlaps the two directions "
                                    f"of its connection {overlap:.0%} (raw shared connection: {raw_overlap:.0%})",
                                    thresholds=thresholds))
    return findings


def rule_half_duplex(run: RunData) -> list[Finding]:
    """Does a half-duplex schedule (raw --io alternate) reproduce the backend's N=2 busbw?"""
    name = "half_duplex_match"
    thresholds = {"HALF_DUPLEX_MATCH": HALF_DUPLEX_MATCH}
    rows = [r for r in run.records if r.op == "all_gather" and r.world_size == 2]
    alternate = [r for r in rows if r.backend == "raw" and r.knobs.get("io") == "alternate"]
    duplex = [r for r in rows if r.backend == "raw" and r.knobs.get("io", "duplex") == "duplex"]
    backend = [r for r in rows if r.backend != "raw"]
    if not alternate or not backend:
        return _undecided(name, "no raw --io alternate rows at N=2 beside backend rows: cannot test whether a "
                          "half-duplex schedule explains the N=2 busbw", **thresholds)
    alt_by_volume = {r.volume_bytes: r for r in alternate}
    findings = []
    for r in backend:
        ref = alt_by_volume.get(r.volume_bytes)
        if ref is None or ref.busbw_Bps <= 0:
            continue
        full = max((d for d in duplex if d.volume_bytes == r.volume_bytes), key=lambda d: d.busbw_Bps, default=None)
        ratio = r.busbw_Bps / ref.busbw_Bps
        text = (f"at D={human_bytes(r.volume_bytes)}: {r.transport} N=2 busbw {human_rate(r.busbw_Bps)}, raw ring "
                f"alternating directions {human_rate(ref.busbw_Bps)} (ratio {ratio:.2f})"
                + (f", raw ring full duplex {human_rate(full.busbw_Bps)}" if full else ""))
        evidence = (Evidence(text, {"world_size": 2, "ratio": ratio, "volume_bytes": r.volume_bytes},
                             run.source_of(r), "busbw_vs_size.png"),)
        if abs(ratio - 1) <= HALF_DUPLEX_MATCH and (full is None or full.busbw_Bps > 1.2 * r.busbw_Bps):
            findings.append(Finding(name, "fired", f"{r.transport} at N=2 runs at the speed of a half-duplex "
                                    f"schedule: {text}", "moderate" if abs(ratio - 1) > HALF_DUPLEX_MATCH / 2
                                    else "strong", evidence, thresholds))
        else:
            findings.append(Finding(name, "clear", f"{r.transport} at N=2 does not match a half-duplex schedule: "
                                    f"{text}", thresholds=thresholds))
    if not findings:
        return _undecided(name, "raw --io alternate and backend rows share no per-device volume at N=2",
                          **thresholds)
    return findings


def _tcp_info_series(run: RunData) -> dict[str, list[dict[str, Any]]]:
    """Per connection, TCP_INFO samples from observers and raw side files, oldest first."""
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for s in run.observe_samples:
        if s.get("kind") == "tcp_info":
            out[f"pid {s.get('pid')} {s.get('local')}->{s.get('remote')}"].append(s)
    for s in run.tcpinfo:
        if s.get("kind", "tcp_info") == "tcp_info":
            out[f"rank {s.get('rank')} peer {s.get('peer')} conn {s.get('conn')}"].append(s)
    for samples in out.values():
        samples.sort(key=lambda s: s.get("t_ns", 0))
    return out


def _delta(samples: Sequence[dict[str, Any]], key: str) -> float | None:
    values = [s[key] for s in samples if isinstance(s.get(key), (int, float))]
    return (max(values) - min(values)) if len(values) >= 2 else None


def rule_window_limited(run: RunData) -> list[Finding]:
    """Receive-window limited (zero windows, full windows, TCP_INFO rwnd_limited) or send-buffer limited."""
    name = "window_limited"
    thresholds = {"RWND_LIMITED_FRACTION": RWND_LIMITED_FRACTION, "SNDBUF_LIMITED_FRACTION": SNDBUF_LIMITED_FRACTION}
    captures = _analysed(run)
    tcp = _tcp_info_series(run)
    if not captures and not tcp:
        return _undecided(name, "no capture analysis and no TCP_INFO samples: cannot see windows", **thresholds)
    hits: list[Evidence] = []
    for c in captures:
        for conn in c.connections:
            for label, d in _directions(conn):
                zero, full = d.get("zero_windows", 0) or 0, d.get("window_full", 0) or 0
                if zero or full:
                    hits.append(Evidence(f"{c.label} {label}: {zero} zero-window and {full} window-full events"
                                         f"{_drop_note(c)}", {"zero_windows": zero, "window_full": full, "world_size": c.world_size},
                                         f"analysis/{c.tag}.json", "window.png"))
    for conn, samples in sorted(tcp.items()):
        busy = _delta(samples, "busy_s")
        if not busy:
            continue
        for key, limit, what in (("rwnd_limited_s", RWND_LIMITED_FRACTION, "receive-window"),
                                 ("sndbuf_limited_s", SNDBUF_LIMITED_FRACTION, "send-buffer")):
            spent = _delta(samples, key)
            if spent is not None and spent / busy >= limit:
                hits.append(Evidence(f"{conn}: {what} limited {spent / busy:.0%} of its busy time "
                                     f"({spent:.3g} s of {busy:.3g} s, TCP_INFO)",
                                     {key: spent, "busy_s": busy, "fraction": spent / busy}, "TCP_INFO samples",
                                     "window.png"))
    if not hits:
        return [Finding(name, "clear", "no zero or full windows on the wire and no connection window- or "
                        "buffer-limited beyond the thresholds", thresholds=thresholds)]
    zero = sum(e.values.get("zero_windows", 0) for e in hits)
    strength = "strong" if zero or any(e.values.get("fraction", 0) >= 2 * RWND_LIMITED_FRACTION for e in hits) \
        else "moderate"
    return [Finding(name, "fired", f"the sender waited on the receiver's window or its own buffer "
                    f"({len(hits)} connection directions; {zero} zero windows)", strength, tuple(hits[:20]),
                    thresholds)]


def rule_retransmissions(run: RunData) -> list[Finding]:
    name = "retransmissions"
    thresholds = {"RETRANS_RATE": RETRANS_RATE, "RETRANS_MIN_COUNT": RETRANS_MIN_COUNT}
    captures = _analysed(run)
    tcp = _tcp_info_series(run)
    if not captures and not tcp:
        return _undecided(name, "no capture analysis and no TCP_INFO samples: cannot count retransmissions",
                          **thresholds)
    hits: list[Evidence] = []
    for c in captures:
        for conn in c.connections:
            for label, d in _directions(conn):
                retrans, packets = d.get("retransmissions", 0) or 0, d.get("packets", 0) or 0
                if packets and retrans >= RETRANS_MIN_COUNT and retrans / packets >= RETRANS_RATE:
                    hits.append(Evidence(f"{c.label} {label}: {retrans} retransmissions in {packets} packets "
                                         f"({retrans / packets:.2%}){_drop_note(c)}",
                                         {"retransmissions": retrans, "packets": packets, "rate": retrans / packets,
                                          "world_size": c.world_size},
                                         f"analysis/{c.tag}.json"))
    for conn, samples in sorted(tcp.items()):
        total = _delta(samples, "total_retrans")
        if total is None:
            values = [s.get("retrans", 0) for s in samples if isinstance(s.get("retrans"), (int, float))]
            total = max(values) if values else None
        if total and total >= RETRANS_MIN_COUNT:
            hits.append(Evidence(f"{conn}: {total:.0f} retransmitted segments (TCP_INFO)", {"retrans": total},
                                 "TCP_INFO samples"))
    if not hits:
        return [Finding(name, "clear", "retransmissions below the threshold everywhere", thresholds=thresholds)]
    worst = max(e.values.get("rate", 0) for e in hits)
    return [Finding(name, "fired", f"segments were lost and resent on {len(hits)} connection directions "
                    f"(worst {worst:.2%} of packets)", _strength(worst / RETRANS_RATE, 10, 3), tuple(hits[:20]),
                    thresholds)]


def _find_sysctl(env: Any, fragment: str) -> Any:
    """Search the fingerprint for a sysctl by name fragment, wherever the harness put it."""
    if isinstance(env, dict):
        for k, v in env.items():
            if fragment in str(k) and not isinstance(v, (dict, list)):
                return v
            found = _find_sysctl(v, fragment)
            if found is not None:
                return found
    return None


def rule_idle_gaps(run: RunData) -> list[Finding]:
    """Idle gaps in a direction; after an idle longer than the RTO Linux restarts from slow start."""
    name = "idle_gaps"
    thresholds = {"IDLE_RESTART_S": IDLE_RESTART_S, "IDLE_FRACTION": IDLE_FRACTION}
    captures = _analysed(run)
    if not captures:
        return _undecided(name, "no capture analysis: cannot see idle gaps", **thresholds)
    ssai = _find_sysctl(run.env, "slow_start_after_idle")
    hits: list[Evidence] = []
    restart = False
    for c in captures:
        for conn in c.connections:
            for label, d in _directions(conn):
                if (d.get("payload_bytes", 0) or 0) < BIDIR_MIN_BYTES:
                    continue  # an ACK-only direction idles by design
                gaps = d.get("idle_gaps") or {}
                first, last = d.get("first_ts"), d.get("last_ts")
                span = (last - first) if isinstance(first, (int, float)) and isinstance(last, (int, float)) else 0
                total, longest = gaps.get("total_s", 0) or 0, gaps.get("max_s", 0) or 0
                fraction = total / span if span > 0 else 0.0
                if longest >= IDLE_RESTART_S or fraction >= IDLE_FRACTION:
                    restart |= longest >= IDLE_RESTART_S
                    hits.append(Evidence(
                        f"{c.label} {label}: {gaps.get('count', 0)} idle gaps, {total:.3g} s idle of {span:.3g} s "
                        f"({fraction:.0%}), longest {longest:.3g} s{_drop_note(c)}",
                        {"count": gaps.get("count", 0), "total_s": total, "max_s": longest, "fraction": fraction,
                         "world_size": c.world_size},
                        f"analysis/{c.tag}.json", "conn_throughput.png"))
    if not hits:
        return [Finding(name, "clear", "no direction idles long enough to matter", thresholds=thresholds)]
    statement = f"connections sit idle between bursts ({len(hits)} directions)"
    if restart:
        statement += (f"; gaps longer than {IDLE_RESTART_S} s let Linux restart from slow start after idle"
                      + (f" (net.ipv4.tcp_slow_start_after_idle = {ssai})" if ssai is not None
                         else " (tcp_slow_start_after_idle not in the fingerprint)"))
        if str(ssai) == "0":
            statement += ", which is off here, so no cwnd reset"
    strength = "strong" if restart and str(ssai) != "0" else "moderate" if restart else "weak"
    return [Finding(name, "fired", statement, strength, tuple(hits[:20]), thresholds)]


def rule_cpu_pinned(run: RunData) -> list[Finding]:
    """A thread near 100% of a core, or every core of the machine busy: the CPU, not the network, sets
    the pace."""
    name = "cpu_bound"
    thresholds = {"CPU_PINNED_PCT": CPU_PINNED_PCT, "CPU_PINNED_SHARE": CPU_PINNED_SHARE,
                  "CPU_SATURATED_PCT": CPU_SATURATED_PCT}
    per_thread: dict[tuple[str, Any, Any], list[dict[str, Any]]] = defaultdict(list)
    sources: dict[tuple[str, Any, Any], str] = {}
    for c in run.captures.values():
        for s in c.observe:
            if s.get("kind") == "cpu_thread" and isinstance(s.get("cpu_pct"), (int, float)):
                key = (c.tag, s.get("pid"), s.get("tid"))
                per_thread[key].append(s)
                sources[key] = f"observe/{c.tag}.jsonl"
    per_host = _host_samples(run)
    if not per_thread and not per_host:
        return _undecided(name, "no per-thread CPU samples (observe/*.jsonl): cannot tell CPU-bound from "
                          "network-bound", **thresholds)
    hits: list[Evidence] = []
    carried: dict[int, float] = {}
    machine_reach = _machine_link_reach(run)
    raw_reach = _raw_link_reach(run, run.link_Bps)
    for tag, samples, share in _saturated_captures(per_host):
        capture = run.captures[tag]
        reach = machine_reach.get(capture.world_size) if capture.world_size is not None else None
        if reach is not None and reach >= CPU_LINK_REACHED:
            carried[capture.world_size] = reach  # busy, yet raw TCP (and iperf3's ring) fill the link at this N
            continue
        median = statistics.median(s["busy_pct"] for s in samples)
        cpus = samples[0].get("cpus")
        raw = raw_reach.get(capture.world_size) if capture.world_size is not None else None
        raw_text = (f"; raw TCP reached {raw:.0%} of the link at N={capture.world_size}" if raw is not None
                    else "; no raw-TCP rows at this N to tell whether the link could be filled")
        raw_text += _ring_pattern_text(run, capture.world_size, raw)
        hits.append(Evidence(
            f"{capture.label}: the machine's {cpus} CPUs were >= {CPU_SATURATED_PCT:.0f}% busy in {share:.0%} "
            f"of {len(samples)} samples (median {median:.0f}%){raw_text}",
            {"share": share, "median_pct": median, "world_size": capture.world_size, "cpus": cpus,
             "raw_link_share": raw, "machine_link_share": reach, "kind": "host"}, f"observe/{tag}.jsonl",
            "cpu_threads.png"))
    for key, samples in sorted(per_thread.items(), key=lambda kv: str(kv[0])):
        if len(samples) < CPU_MIN_SAMPLES:
            continue
        busy = [s["cpu_pct"] for s in samples if s["cpu_pct"] >= CPU_PINNED_PCT]
        share = len(busy) / len(samples)
        if share >= CPU_PINNED_SHARE:
            capture = run.captures[key[0]]
            hits.append(Evidence(
                f"{capture.label}: thread {samples[0].get('name', '?')} (pid {key[1]}, tid {key[2]}) at >= "
                f"{CPU_PINNED_PCT:.0f}% of a core in {share:.0%} of {len(samples)} samples "
                f"(median {statistics.median(s['cpu_pct'] for s in samples):.0f}%)",
                {"share": share, "median_pct": statistics.median(s["cpu_pct"] for s in samples),
                 "world_size": capture.world_size, "thread": samples[0].get("name")}, sources[key], "cpu_threads.png"))
    busy_note = ""
    if carried:
        who = "raw TCP and iperf3's ring pattern" if run.ring_pattern_Bps else "raw TCP"
        busy_note = (f"the machine's CPUs were busy at N={','.join(str(n) for n in sorted(carried))}, yet {who} "
                     f"reached {min(carried.values()):.0%}-{max(carried.values()):.0%} of the link there, so the "
                     f"CPU could carry the traffic")
    thresholds["CPU_LINK_REACHED"] = CPU_LINK_REACHED
    if not hits:
        return [Finding(name, "clear", f"no thread stays near {CPU_PINNED_PCT:.0f}% of a core"
                        + (f" and the machine's CPUs are not saturated (< {CPU_SATURATED_PCT:.0f}% busy)"
                           if per_host and not carried else "")
                        + (f"; {busy_note}" if busy_note else "") + ": not CPU-bound", thresholds=thresholds)]
    cpus = run.meta.get("cpu_count")
    saturated = sorted({e.values["world_size"] for e in hits if e.values.get("kind") == "host"} - {None})
    pinned = [e for e in hits if e.values.get("kind") != "host"]
    parts = []
    if saturated:
        parts.append(f"every CPU of the machine was busy at N={','.join(str(n) for n in saturated)} and raw TCP "
                     f"did not fill the link there either: at those N the CPU, not the link, sets the pace "
                     f"(compare those rows with care)")
    if pinned:
        parts.append(f"{len(pinned)} thread(s) pinned near 100% of a core: those runs are CPU-bound, not "
                     f"network-bound" + (f" ({cpus} CPUs)" if cpus else ""))
    if busy_note:
        parts.append(busy_note)
    statement = "; ".join(parts)
    return [Finding(name, "fired", statement, "strong" if max(e.values["share"] for e in hits) >= 0.8 else "moderate",
                    tuple(hits[:20]), thresholds)]


def _host_samples(run: RunData) -> dict[str, list[dict[str, Any]]]:
    """Whole-machine CPU samples (observe kind cpu_host) per capture tag."""
    per_host: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for c in run.captures.values():
        for s in c.observe:
            if s.get("kind") == "cpu_host" and isinstance(s.get("busy_pct"), (int, float)):
                per_host[c.tag].append(s)
    return per_host


def _saturated_captures(per_host: dict[str, list[dict[str, Any]]]
                        ) -> list[tuple[str, list[dict[str, Any]], float]]:
    """(tag, samples, share of saturated samples) of the runs whose machine had every core busy."""
    out = []
    for tag, samples in sorted(per_host.items()):
        if len(samples) < CPU_MIN_SAMPLES:
            continue
        share = sum(1 for s in samples if s["busy_pct"] >= CPU_SATURATED_PCT) / len(samples)
        if share >= CPU_PINNED_SHARE:
            out.append((tag, samples, share))
    return out


def cpu_limited_world_sizes(run: RunData) -> set[int]:
    """The N at which the CPU rather than the link set the pace: every core busy, and raw TCP or the iperf3
    ring pattern at that N (if any) short of CPU_LINK_REACHED of the link. Rows at these N understate what the
    network does."""
    reach = _machine_link_reach(run)
    limited = set()
    for tag, _samples, _share in _saturated_captures(_host_samples(run)):
        n = run.captures[tag].world_size
        if n is not None and (reach.get(n) is None or reach[n] < CPU_LINK_REACHED):
            limited.add(n)
    return limited


def _machine_link_reach(run: RunData) -> dict[int, float]:
    """Per N: the share of the link this machine carried, the lower of raw TCP's best busbw and the iperf3
    ring pattern (run.json link.ring_pattern, where measured): either short of the link at a busy N means
    the CPU, not the link, set the pace there."""
    link = run.link_Bps
    reach = _raw_link_reach(run, link)
    if link:
        for n, pattern_Bps in run.ring_pattern_Bps.items():
            reach[n] = min(reach.get(n, pattern_Bps / link), pattern_Bps / link)
    return reach


def raw_link_reach(run: RunData) -> dict[int, float]:
    """Per N: raw TCP's best busbw at a large size as a share of the measured link rate."""
    return _raw_link_reach(run, run.link_Bps)


def _ring_pattern_text(run: RunData, world_size: int | None, raw_reach: float | None) -> str:
    """How raw TCP compares with the machine's own limit at N (the iperf3 ring pattern), where measured."""
    pattern_Bps = run.ring_pattern_Bps.get(world_size) if world_size is not None else None
    if pattern_Bps is None or not run.link_Bps:
        return ""
    text = (f"; the machine's own limit there, iperf3 in the same ring pattern, carried "
            f"{pattern_Bps / run.link_Bps:.0%} of the link per edge")
    if raw_reach is not None:
        text += f" and raw TCP reached {raw_reach * run.link_Bps / pattern_Bps:.0%} of that limit"
    return text


def _raw_link_reach(run: RunData, link_Bps: float | None) -> dict[int, float]:
    """Per N: the best raw-TCP busbw at a large size (any op, size or knob set) as a share of the link rate:
    what this machine can carry at that N when nothing but TCP is in the way."""
    if not link_Bps:
        return {}
    best: dict[int, float] = {}
    by_series: dict[tuple[str, str, int], dict[int, Record]] = defaultdict(dict)
    for r in run.records:
        if r.backend == "raw":
            by_series[(series_label(r), r.op, r.world_size)][r.size_bytes] = r
    for (_label, _op, n), rows in by_series.items():
        large = _large_sizes(sorted(rows))
        if large:
            reach = max(rows[s].busbw_Bps for s in large) / link_Bps
            best[n] = max(best.get(n, 0.0), reach)
    return best


def rule_capture_drops(run: RunData) -> list[Finding]:
    name = "capture_drops"
    known = [c for c in run.captures.values() if c.kernel_dropped is not None
             or ((c.analysis or {}).get("capture") or {}).get("flagged")]
    if not known:
        return _undecided(name, "no capture metadata: whether the kernel dropped packets is unknown")
    bad = [c for c in known if (c.kernel_dropped or 0) > 0 or ((c.analysis or {}).get("capture") or {}).get("flagged")]
    if not bad:
        return [Finding(name, "clear", f"no kernel drops in {len(known)} captures")]
    return [Finding(name, "fired", f"{len(bad)} captures lost packets in the kernel: findings from them "
                    f"(duplex overlap, windows, retransmissions, gaps) are unreliable", "strong",
                    tuple(Evidence(f"{c.label}: kernel dropped {c.kernel_dropped} packets",
                                   {"kernel_dropped": c.kernel_dropped}, f"captures/{c.tag}.capture.json")
                          for c in bad))]


RULES: tuple[tuple[str, Rule], ...] = (
    ("n2_busbw_dip", rule_n2_dip),
    ("backend_below_raw", rule_backend_vs_raw),
    ("shared_connection", rule_conn_split),
    ("exchange_order", rule_exchange_order),
    ("low_duplex_overlap", rule_duplex_overlap),
    ("turn_taking", rule_turn_taking),
    ("half_duplex_match", rule_half_duplex),
    ("window_limited", rule_window_limited),
    ("retransmissions", rule_retransmissions),
    ("idle_gaps", rule_idle_gaps),
    ("cpu_bound", rule_cpu_pinned),
    ("capture_drops", rule_capture_drops),
    ("data_errors", rule_data_errors),
)

# Rules whose firing points at a mechanism behind an N=2 dip, with what each means.
_MECHANISM_READING = {
    "turn_taking": "on the wire, the backend's one connection at N=2 carries its two directions in turns, "
                   "where raw TCP on one connection between the same hosts carries both at once",
    "half_duplex_match": "a raw ring that alternates directions (half duplex) runs at the backend's N=2 speed",
    "shared_connection": "raw TCP reproduces the loss when both directions share one connection",
    "exchange_order": "the order of send and receive on a pair changes throughput",
    "low_duplex_overlap": "the wire shows both directions of one connection/host taking turns",
    "cpu_bound": "a thread is pinned at a full core, so the CPU may set the pace",
    "window_limited": "senders wait on windows or buffers",
    "retransmissions": "losses force retransmissions",
    "idle_gaps": "connections idle between bursts",
}


# Rules whose "clear" verdict rules a suspected mechanism out.
_RULED_OUT = ("shared_connection", "exchange_order", "cpu_bound")


def mechanism(findings: Sequence[Finding]) -> Finding:
    """Tie the N=2 dip to the experiments that explain it; undecided when none does."""
    name = "mechanism"
    dips = [f for f in findings if f.rule == "n2_busbw_dip" and f.status == "fired"]
    if not dips:
        checked = [f for f in findings if f.rule == "n2_busbw_dip"]
        if checked and all(f.status == "undecided" for f in checked):
            return Finding(name, "undecided", "whether N=2 is slower could not be checked, so there is no "
                           "mechanism to name")
        return Finding(name, "clear", "no N=2 busbw dip to explain")
    support: list[Finding] = []
    everywhere: list[str] = []
    for f in findings:
        if f.status != "fired" or f.rule not in _MECHANISM_READING:
            continue
        sizes = {e.values.get("world_size") for e in f.evidence} - {None}
        if sizes and 2 not in sizes:
            continue  # seen only at other world sizes: says nothing about N=2
        if any(n >= 3 for n in sizes):
            everywhere.append(f.rule)  # present at N>=3 too, so it cannot explain what only N=2 suffers
            continue
        support.append(f)
    if not support:
        missing = sorted({f.rule for f in findings if f.status == "undecided" and f.rule in _MECHANISM_READING})
        return Finding(name, "undecided",
                       "N=2 is slower but no experiment here isolates why"
                       + (f"; seen at N>=3 as well, so not specific to N=2: {', '.join(everywhere)}"
                          if everywhere else "")
                       + (f"; missing evidence for: {', '.join(missing)}" if missing else ""))
    readings = "; ".join(_MECHANISM_READING[f.rule] for f in support)
    evidence = tuple(Evidence(f"{f.rule}: {f.statement}", {"rule": f.rule, "strength": f.strength},
                              f.evidence[0].source, f.evidence[0].plot) for f in [*dips[:1], *support])
    strong = sum(f.strength == "strong" for f in support)
    strength = "strong" if strong >= 2 else "moderate" if strong == 1 or len(support) >= 2 else "weak"
    # No surer than the dip it explains.
    weakest_dip = max(STRENGTHS.index(f.strength) for f in dips[:1])
    strength = STRENGTHS[max(STRENGTHS.index(strength), weakest_dip)]
    statement = f"the N=2 loss is supported by: {readings}"
    ruled_out = [f.statement for f in findings if f.status == "clear" and f.rule in _RULED_OUT]
    if ruled_out:
        statement += "; ruled out by experiment: " + "; ".join(ruled_out)
    if everywhere:
        statement += f" (not counted, seen at N>=3 too: {', '.join(everywhere)})"
    return Finding(name, "fired", statement, strength, evidence)


def diagnose(run: RunData) -> list[Finding]:
    findings: list[Finding] = []
    for _name, rule in RULES:
        findings.extend(rule(run))
    findings.append(mechanism(findings))
    return findings


def findings_to_json(findings: Sequence[Finding], run: RunData) -> dict[str, Any]:
    return {"schema": 1, "run_dir": str(run.root) if run.root else None, "missing_inputs": run.missing,
            "findings": [f.to_json() for f in findings]}


def format_threshold(value: float) -> str:
    return str(value) if isinstance(value, int) else f"{value:g}"


def render_text(findings: Sequence[Finding]) -> str:
    order = {"fired": 0, "undecided": 1, "clear": 2}
    lines: list[str] = []
    for f in sorted(findings, key=lambda f: order[f.status]):
        tag = {"fired": f"FINDING ({f.strength})", "undecided": "CANNOT DECIDE", "clear": "ok"}[f.status]
        lines.append(f"[{tag}] {f.rule}: {f.statement}")
        for e in f.evidence[:5]:
            where = e.source + (f", plot {e.plot}" if e.plot else "")
            lines.append(f"    - {e.text} [{where}]")
        if len(f.evidence) > 5:
            lines.append(f"    - ... {len(f.evidence) - 5} more in findings.json")
        if f.thresholds and f.status != "clear":
            lines.append("      thresholds: " + ", ".join(f"{k}={format_threshold(v)}" for k, v in f.thresholds.items()))
    return "\n".join(lines)

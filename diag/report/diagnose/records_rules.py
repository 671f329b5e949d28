"""Rules on the records alone: the backend against the raw-TCP reference, half-duplex speed, wrong data (the
N=2 dip has its own module, diag.report.diagnose.dip)."""

from __future__ import annotations

import statistics
from collections import defaultdict

from diag.records import Record
from diag.report.diagnose.base import strength_of, undecided
from diag.report.diagnose.findings import Evidence, Finding
from diag.report.queries import analysed, capture_series, large_sizes, raw_reference, two_way_connections
from diag.report.rundir import RunData
from diag.report.series import knob, mean_busbw, series_label
from diag.report.thresholds import (
    BACKEND_RAW_EFFICIENCY,
    BIDIR_MIN_BYTES,
    DUPLEX_OVERLAP_LOW,
    HALF_DUPLEX_MATCH,
    LARGE_SIZE_BYTES,
    used,
)
from diag.units import human_bytes, human_rate


def backend_below_raw(run: RunData) -> list[Finding]:
    """A torch backend far below the raw-TCP reference on the same op, N and sizes."""
    name = "backend_below_raw"
    limits = (BACKEND_RAW_EFFICIENCY, LARGE_SIZE_BYTES)
    thresholds = used(*limits)
    torch_rows = [r for r in run.records if r.backend != "raw"]
    best_raw = raw_reference(run.records)
    if not best_raw:
        return undecided(name, "no raw rows: cannot compare the backend with the raw-TCP reference", *limits)
    if not torch_rows:
        return undecided(name, "no torch backend rows: nothing to compare with the raw reference", *limits)
    groups: dict[tuple[str, str, int], list[Record]] = defaultdict(list)
    for r in torch_rows:
        if (r.op, r.world_size, r.size_bytes) in best_raw:
            groups[(series_label(r), r.op, r.world_size)].append(r)
    if not groups:
        return undecided(name, "raw and backend rows share no (op, N, size): cannot compare", *limits)
    low: list[Evidence] = []
    fine: dict[tuple[str, str], list[tuple[int, float]]] = defaultdict(list)
    for (label, op, n), rows in sorted(groups.items()):
        by_size = {r.size_bytes: r for r in rows}
        large = large_sizes(sorted(by_size))
        effs = [mean_busbw(by_size[s]) / mean_busbw(best_raw[(op, n, s)]) for s in large
                if mean_busbw(best_raw[(op, n, s)]) > 0]
        if not effs:
            continue
        eff = statistics.median(effs)
        ref = best_raw[(op, n, large[-1])]
        text = (f"{label} {op} N={n}: busbw {eff:.0%} of raw ({series_label(ref)}) at "
                f"{human_bytes(large[0])}..{human_bytes(large[-1])} (mean busbw "
                f"{human_rate(mean_busbw(by_size[large[-1]]))} vs {human_rate(mean_busbw(ref))} at {human_bytes(large[-1])})")
        if eff < BACKEND_RAW_EFFICIENCY.value:
            low.append(Evidence(text, {"world_size": n, "op": op, "efficiency": eff, "raw": series_label(ref)},
                                run.source_of(by_size[large[-1]]), "efficiency.png"))
        else:
            fine[(label, op)].append((n, eff))
    if not low:
        return [Finding(name, "clear", "backend busbw is within reach of raw TCP: " + efficiency_summary(fine),
                        thresholds=thresholds)]
    worst = min(e.values["efficiency"] for e in low)
    ns = sorted({e.values["world_size"] for e in low})
    statement = (f"the backend is far below raw TCP on the same link at N={','.join(map(str, ns))} "
                 f"(lowest efficiency {worst:.0%})")
    if fine:
        statement += "; elsewhere it keeps up: " + efficiency_summary(fine)
    # one standard of evidence: each row is one launch of its own (one block), so the ratio is a point with no
    # interval over launches: never more than moderate (the N=2 trial holds the backend beside the link)
    strength = strength_of(BACKEND_RAW_EFFICIENCY.value - worst, 0.3, 0.1)
    statement += "; separate launches, one block each"
    return [Finding(name, "fired", statement, "moderate" if strength == "strong" else strength, tuple(low), thresholds)]


def efficiency_summary(fine: dict[tuple[str, str], list[tuple[int, float]]]) -> str:
    """'torch:gloo all_gather N=3,4,5: 86-107% of raw; ...' (large-size busbw medians per N)."""
    parts = []
    for (label, op), items in sorted(fine.items()):
        ns = ",".join(str(n) for n, _ in sorted(items))
        low, high = min(e for _, e in items), max(e for _, e in items)
        span = f"{low:.0%}" if round(low * 100) == round(high * 100) else f"{low * 100:.0f}-{high:.0%}"
        parts.append(f"{label} {op} N={ns}: {span} of raw")
    return "; ".join(parts)


def half_duplex_match(run: RunData) -> list[Finding]:
    """Does a half-duplex schedule (raw --io alternate) reproduce the backend's N=2 busbw?"""
    name = "half_duplex_match"
    thresholds = used(HALF_DUPLEX_MATCH, DUPLEX_OVERLAP_LOW)
    rows = [r for r in run.records if r.op == "all_gather" and r.world_size == 2]
    alternate = [r for r in rows if r.backend == "raw" and knob(r, "io") == "alternate"]
    duplex = [r for r in rows if r.backend == "raw" and knob(r, "io") == "duplex"]
    backend = [r for r in rows if r.backend != "raw"]
    if not alternate or not backend:
        return undecided(name, "no raw --io alternate rows at N=2 beside backend rows: cannot test whether a "
                         "half-duplex schedule explains the N=2 busbw", HALF_DUPLEX_MATCH, DUPLEX_OVERLAP_LOW)
    # The reference counts only where the wire shows it half duplex: a schedule meant to alternate that the
    # capture shows moving both directions at once tests nothing.
    wire = {label: half_duplex_on_wire(run, label) for label in {series_label(r) for r in alternate}}
    usable = {label for label, overlap in wire.items() if overlap is not None and overlap < DUPLEX_OVERLAP_LOW.value}
    if not usable:
        seen = {label: overlap for label, overlap in wire.items() if overlap is not None}
        why = ("; ".join(f"{label} moved both directions at once {overlap:.0%} of its active time on the wire"
                         for label, overlap in sorted(seen.items())) + ": not half duplex, so no reference"
               if seen else "no capture of the raw --io alternate run at N=2: the wire cannot show it half duplex, "
                            "so it is no reference")
        return undecided(name, why, HALF_DUPLEX_MATCH, DUPLEX_OVERLAP_LOW)
    alt_by_volume = {r.volume_bytes: r for r in alternate if series_label(r) in usable}
    findings = []
    for r in backend:
        ref = alt_by_volume.get(r.volume_bytes)
        if ref is None or mean_busbw(ref) <= 0:
            continue
        full = max((d for d in duplex if d.volume_bytes == r.volume_bytes), key=mean_busbw, default=None)
        ratio = mean_busbw(r) / mean_busbw(ref)
        text = (f"at D={human_bytes(r.volume_bytes)}: {r.transport} N=2 mean busbw {human_rate(mean_busbw(r))}, raw ring "
                f"alternating directions {human_rate(mean_busbw(ref))} (ratio {ratio:.2f}; on the wire its directions "
                f"overlap {wire[series_label(ref)]:.0%})"
                + (f", raw ring full duplex {human_rate(mean_busbw(full))}" if full else ""))
        evidence = (Evidence(text, {"world_size": 2, "ratio": ratio, "volume_bytes": r.volume_bytes},
                             run.source_of(r), "busbw_vs_size.png"),)
        if abs(ratio - 1) <= HALF_DUPLEX_MATCH.value and (full is None or mean_busbw(full) > 1.2 * mean_busbw(r)):
            # A speed that matches is how the loss looks, not why: an observation.
            findings.append(Finding(name, "observed", f"{r.transport} at N=2 runs at the speed of a half-duplex "
                                    f"schedule: {text}", evidence=evidence, thresholds=thresholds,
                                    explains="none: a speed that matches a half-duplex schedule describes the "
                                             "loss, does not explain it"))
        else:
            findings.append(Finding(name, "clear", f"{r.transport} at N=2 does not match a half-duplex schedule: "
                                    f"{text}", thresholds=thresholds))
    if not findings:
        return undecided(name, "raw --io alternate and backend rows share no per-device volume at N=2",
                         HALF_DUPLEX_MATCH, DUPLEX_OVERLAP_LOW)
    return findings


def half_duplex_on_wire(run: RunData, label: str) -> float | None:
    """How much a series' N=2 capture overlaps its directions: the mean over hosts that send and receive in
    bulk, else over its two-way connections; None without such a capture."""
    overlaps: list[float] = []
    for c in analysed(run):
        if c.world_size != 2 or capture_series(run, c) != label:
            continue
        hosts = [h.duplex_overlap for h in c.hosts if isinstance(h.duplex_overlap, (int, float))
                 and min(h.tx_bytes, h.rx_bytes) >= BIDIR_MIN_BYTES.value]
        overlaps += [float(o) for o in hosts] or [t.overlap for t in two_way_connections(c)]
    return statistics.mean(overlaps) if overlaps else None


def data_errors(run: RunData) -> list[Finding]:
    name = "data_errors"
    bad = [r for r in run.records if r.nwrong > 0]
    if not bad:
        return [Finding(name, "clear", f"all {len(run.records)} rows verified with 0 wrong elements")]
    return [Finding(name, "fired", f"{len(bad)} rows delivered wrong data: their timings are not trustworthy",
                    "strong", tuple(Evidence(f"{series_label(r)} {r.op} N={r.world_size} {human_bytes(r.size_bytes)}: "
                                             f"{r.nwrong} wrong elements", {"nwrong": r.nwrong}, run.source_of(r))
                                    for r in bad[:20]))]

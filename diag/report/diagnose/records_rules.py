"""Rules on the records alone: the N=2 dip, the backend against the raw-TCP reference, half-duplex speed,
wrong data."""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from dataclasses import dataclass

from diag.records import Record
from diag.report.diagnose.base import strength_of, undecided
from diag.report.diagnose.cpu_rules import cpu_limited_world_sizes
from diag.report.diagnose.findings import STRENGTHS, Evidence, Finding
from diag.report.queries import analysed, capture_series, large_sizes, raw_reference, two_way_connections
from diag.report.rundir import RunData
from diag.report.series import PAIRWISE_OPS, by_series, knob, series_label
from diag.report.thresholds import (
    BACKEND_RAW_EFFICIENCY,
    BIDIR_MIN_BYTES,
    DUPLEX_OVERLAP_LOW,
    HALF_DUPLEX_MATCH,
    LARGE_SIZE_BYTES,
    N2_DIP_RATIO,
    N2_DIP_STRONG,
    used,
)
from diag.stats import Arm, Interval, Modes, bootstrap_means, interval, modes
from diag.trialspec import arms_of
from diag.units import human_bytes, human_rate
from diag.verdicts import MIN_ROUNDS, Control, control


def n2_busbw_dip(run: RunData) -> list[Finding]:
    """busbw at N=2 below N>=3 at the same size, and the size from which the dip holds; where an interleaved
    trial ran the backend beside the link at N=2, its control makes the dip surer (two sizes: strong).

    Each size is judged on all its samples: the ratio of mean busbw (N=2 over the median of N>=3) with a
    bootstrap interval, so a bimodal N=2 row (fast and slow iterations) counts with its slow share rather
    than by which mode its median fell in. A size dips when the ratio is at most N2_DIP_RATIO and its
    interval stays below 1; it does not when the whole interval is at least N2_DIP_RATIO."""
    name = "n2_busbw_dip"
    thresholds = used(N2_DIP_RATIO, N2_DIP_STRONG)
    findings: list[Finding] = []
    for dip in series_dips(run):
        label, op, per_n, axis, reference, left_out, ratios = (dip.label, dip.op, dip.per_n, dip.axis, dip.reference,
                                                               dip.left_out, dip.ratios)
        note = (f"; N={','.join(map(str, left_out))} left out of the reference: CPU-bound there (cpu_bound)"
                if left_out else "")
        sizes = sorted(ratios)
        source = run.source_of(per_n[2][sizes[-1]])
        table = dip.table()
        dipping = [s for s in sizes if ratios[s].status == "dip"]
        if not dipping:
            # The interleaved trial is the surer of the two: where it shows this backend's N=2 below the link at
            # two sizes, a survey that finds no dip against N>=3 (separate launches, one N after the other)
            # does not clear it; the two disagree and the finding says so.
            against_link = link_controls(run, label, op)
            contradicted = [v for v, c in against_link.items() if c.status == "shown"]
            if len(contradicted) >= 2:
                findings.append(Finding(name, "undecided", f"{label} {op}: the survey finds N=2 not below N>=3 "
                                        f"(N=2 / N>=3 mean busbw, ratio by size: {table}; 95% intervals), but the "
                                        "interleaved N=2 trial shows it below the link: " + ", ".join(
                                            f"D={human_bytes(v)} {against_link[v].text()}" for v in sorted(contradicted))
                                        + f"{note}", thresholds=thresholds))
            elif dip.status == "no_dip":
                findings.append(Finding(name, "clear", f"{label} {op}: busbw at N=2 is not below N>=3 (N=2 / N>=3 mean "
                                        f"busbw, ratio by size: {table}; 95% intervals){note}",
                                        thresholds=thresholds))
            else:
                findings.append(Finding(name, "undecided", f"{label} {op}: whether N=2 is slower cannot be told from "
                                        f"these samples (N=2 / N>=3 mean busbw, ratio by size: {table}; 95% intervals){note}", thresholds=thresholds))
            continue
        onset = dipping[-1]
        for s in reversed(sizes):
            if ratios[s].ratio.point > N2_DIP_RATIO.value:
                break
            onset = s
        confirmed = [s for s in dipping if ratios[s].ratio.high < N2_DIP_RATIO.value]
        worst = min(ratios[s].ratio.point for s in dipping)
        strength = ("strong" if len(dipping) >= 2 and (confirmed or worst < N2_DIP_STRONG.value)
                    else "moderate" if len(dipping) >= 2 or confirmed else "weak")
        # A second, interleaved line of evidence: the N=2 trial ran this backend beside the link (raw TCP, one
        # connection per direction) in the same rounds. Where it shows the loss there too, the dip is one
        # step surer; the statement says which.
        against_link = link_controls(run, label, op)   # at N=2 a per-rank size is its D
        shown_by_trial = [v for v, c in against_link.items() if c.status == "shown"]
        why_not = ""
        if len(shown_by_trial) >= 2:
            strength = "strong"      # the survey dips, and the interleaved trial shows the loss at two sizes
        elif shown_by_trial and strength != "strong":
            strength = STRENGTHS[STRENGTHS.index(strength) - 1]
        if strength != "strong":
            why_not = (f"; not strong: {len(dipping)} of {len(sizes)} sizes dip"
                       + ("" if confirmed else f", none confirmed below {N2_DIP_RATIO.value}")
                       + ("" if against_link else "; no interleaved trial beside the link"))
        trial_note = ("; in the interleaved N=2 trial beside the link: " + ", ".join(
            f"D={human_bytes(v)} {c.text()} ({'shows the loss' if c.status == 'shown' else c.status})"
            for v, c in sorted(against_link.items()))) if against_link else ""
        ns = sorted(reference)
        reference_label = f"N={','.join(map(str, ns))}" if left_out else f"N>={ns[0]}"
        deepest = min(dipping, key=lambda s: ratios[s].ratio.point)
        evidence = [Evidence(
            f"at {axis}{human_bytes(s)}{' per rank' if not axis else ''}, N=2 mean busbw {human_rate(ratios[s].n2_Bps)} "
            f"vs median N={','.join(map(str, ns))} {human_rate(ratios[s].reference_Bps)} (ratio "
            f"{ratios[s].ratio.text()}; N=2 {ratios[s].modes.text()})",
            {"size_bytes": s, "ratio": ratios[s].ratio.point, "ratio_low": ratios[s].ratio.low,
             "ratio_high": ratios[s].ratio.high, "busbw_n2_Bps": ratios[s].n2_Bps,
             "busbw_n3plus_Bps": ratios[s].reference_Bps, "slow_fraction": ratios[s].modes.slow_fraction,
             "series": label, "op": op, "world_size": 2},
            source, "busbw_vs_size.png") for s in dipping]
        findings.append(Finding(
            name, "fired",
            f"{label} {op}: busbw at N=2 is {1 - ratios[deepest].ratio.point:.0%} below {reference_label} at "
            f"{axis}{human_bytes(deepest)}, dipping at {len(dipping)} of {len(sizes)} sizes"
            f"{f' ({len(confirmed)} confirmed below {N2_DIP_RATIO.value})' if confirmed else ''}, from "
            f"{axis}{human_bytes(onset)}{' per rank' if not axis else ''} upward (N=2 / N>=3 mean busbw, ratio by "
            f"size: {table}; 95% intervals){note}{trial_note}{why_not}",
            strength, tuple(evidence), thresholds))
    if not findings:
        return undecided(name, "no series has both N=2 and N>=3 rows at the same sizes: cannot compare "
                         "(sweep --nproc 2,3,4)", N2_DIP_RATIO, N2_DIP_STRONG)
    return findings


@dataclass(frozen=True)
class SeriesDip:
    """One series' N=2 against its N>=3 rows, size by size (the figures n2_busbw_dip and negative_control read)."""

    label: str
    op: str
    per_n: dict[int, dict[int, Record]]     # N -> size (or volume D) -> row
    axis: str                               # "" (per-rank size) or "D=" (per-device volume)
    reference: list[int]                    # the N>=3 the N=2 rows are held against
    left_out: list[int]                     # N>=3 left out of the reference: CPU-bound there
    ratios: dict[int, DipRatio]             # size -> N=2 / reference ratio

    @property
    def status(self) -> str:
        """"dip" (some size dips), "no_dip" (the largest size does not, nor any size that is unsure below the
        threshold), else "unsure": the survey's own reading, before any trial."""
        sizes = sorted(self.ratios)
        if any(self.ratios[s].status == "dip" for s in sizes):
            return "dip"
        largest = self.ratios[sizes[-1]]
        if largest.status == "no_dip" or (largest.ratio.point > N2_DIP_RATIO.value and all(
                self.ratios[s].status != "unsure" or self.ratios[s].ratio.point > N2_DIP_RATIO.value for s in sizes)):
            return "no_dip"
        return "unsure"

    def table(self) -> str:
        return ", ".join(f"{self.axis}{human_bytes(s)}: {self.ratios[s].ratio.text()}" for s in sorted(self.ratios))


def series_dips(run: RunData) -> list[SeriesDip]:
    """Every collective series with N=2 and N>=3 rows at the same sizes (or the same D), with its ratios. N>=3
    runs where the CPU, not the link, set the pace would drag the reference down and hide a dip: they are left
    out of it while link-bound N>=3 runs remain (cpu_bound names them)."""
    return run.remember("series_dips", lambda: _series_dips(run))


def _series_dips(run: RunData) -> list[SeriesDip]:
    cpu_limited = cpu_limited_world_sizes(run)
    out = []
    for (label, op), per_series in sorted(by_series(run.records).items()):
        if op in PAIRWISE_OPS or 2 not in per_series or not any(n >= 3 for n in per_series):
            continue
        per_n, axis = match_axis(per_series)
        reference = [n for n in per_n if n >= 3 and n not in cpu_limited] or [n for n in per_n if n >= 3]
        left_out = sorted(n for n in per_n if n >= 3 and n not in reference)
        ratios: dict[int, DipRatio] = {}
        for size, row2 in sorted(per_n[2].items()):
            others = [per_n[n][size] for n in reference if size in per_n[n]]
            if others and row2.busbw_Bps > 0 and row2.times_s:
                ratios[size] = dip_ratio(row2, others)
        if ratios:
            out.append(SeriesDip(label, op, per_n, axis, reference, left_out, ratios))
    return out


@dataclass(frozen=True)
class DipRatio:
    ratio: Interval            # N=2 mean busbw / median of the N>=3 rows' mean busbw
    status: str                # "dip" | "no_dip" | "unsure"
    n2_Bps: float
    reference_Bps: float
    modes: Modes


def link_controls(run: RunData, label: str, op: str) -> dict[int, Control]:
    """Per volume D (per-rank size at N=2), the backend's N=2 busbw against the link in an interleaved trial:
    its arm of this series beside the trial's raw reference arm, the knock-out control of diag.verdicts."""
    out: dict[int, Control] = {}
    for spec, blocks, _end in run.trials:
        backend = [a for a in spec.arms if a.backend != "raw" and a.op == op
                   and (row := _row_of(blocks, a.name)) is not None and series_label(row) == label]
        link = [a for a in spec.arms if a.backend == "raw" and a.op == op and not a.knobs]
        if not backend or not link:
            continue
        for size in spec.sizes:
            arms = arms_of(blocks, spec.name, size)
            if backend[0].name in arms and link[0].name in arms:
                g, r = arms[backend[0].name], arms[link[0].name]
                if min(len(g.blocks), len(r.blocks)) < MIN_ROUNDS.value:
                    continue
                out[size] = control(g, r, spec.seed)
    return out


def _row_of(blocks: list[Record], arm: str) -> Record | None:
    """The first block of an arm (None where a trial that died early never ran it)."""
    return next((b for b in blocks if b.block.get("arm") == arm), None)


def dip_ratio(row2: Record, others: list[Record]) -> DipRatio:
    """The N=2 / N>=3 busbw ratio of one size, on all samples, with a bootstrap interval (one block a row)."""
    import numpy as np

    def factor(r: Record) -> float:   # busbw x time: busbw scales as 1/time
        return r.busbw_Bps * r.time_s

    arms = [Arm.of(f"r{i}", [r.times_s]) for i, r in enumerate([row2, *others])]
    boot = bootstrap_means(arms)
    n2 = factor(row2) / arms[0].mean_s
    refs = [factor(r) / a.mean_s for r, a in zip(others, arms[1:], strict=True)]
    ref = statistics.median(refs)
    resampled_ref = np.median(np.stack([factor(r) / boot[a.name] for r, a in zip(others, arms[1:], strict=True)]),
                              axis=0)
    ratio = interval(n2 / ref if ref > 0 else math.inf, (factor(row2) / boot["r0"]) / resampled_ref)
    status = ("dip" if ratio.point <= N2_DIP_RATIO.value and ratio.high < 1.0
              else "no_dip" if ratio.low >= N2_DIP_RATIO.value else "unsure")
    return DipRatio(ratio, status, n2, ref, modes(row2.times_s))


def match_axis(per_n: dict[int, dict[int, Record]]) -> tuple[dict[int, dict[int, Record]], str]:
    """Compare N=2 with N>=3 at equal per-rank size S, or at equal per-device volume D = (N-1) x S (the
    user's own axis, and what diag reproduce sweeps) when that matches more rows. Returns the maps and a
    label prefix for sizes ("" for S, "D=" for volume)."""
    by_volume = {n: {row.volume_bytes: row for row in rows.values()} for n, rows in per_n.items()}

    def matches(maps: dict[int, dict[int, Record]]) -> int:
        return sum(1 for key in maps.get(2, {}) if any(key in maps[n] for n in maps if n >= 3))

    return (by_volume, "D=") if matches(by_volume) > matches(per_n) else (per_n, "")


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
        effs = [by_size[s].busbw_Bps / best_raw[(op, n, s)].busbw_Bps for s in large
                if best_raw[(op, n, s)].busbw_Bps > 0]
        if not effs:
            continue
        eff = statistics.median(effs)
        ref = best_raw[(op, n, large[-1])]
        text = (f"{label} {op} N={n}: busbw {eff:.0%} of raw ({series_label(ref)}) at "
                f"{human_bytes(large[0])}..{human_bytes(large[-1])} "
                f"({human_rate(by_size[large[-1]].busbw_Bps)} vs {human_rate(ref.busbw_Bps)} at {human_bytes(large[-1])})")
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
    return [Finding(name, "fired", statement, strength_of(BACKEND_RAW_EFFICIENCY.value - worst, 0.3, 0.1),
                    tuple(low), thresholds)]


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
        if ref is None or ref.busbw_Bps <= 0:
            continue
        full = max((d for d in duplex if d.volume_bytes == r.volume_bytes), key=lambda d: d.busbw_Bps, default=None)
        ratio = r.busbw_Bps / ref.busbw_Bps
        text = (f"at D={human_bytes(r.volume_bytes)}: {r.transport} N=2 busbw {human_rate(r.busbw_Bps)}, raw ring "
                f"alternating directions {human_rate(ref.busbw_Bps)} (ratio {ratio:.2f}; on the wire its directions "
                f"overlap {wire[series_label(ref)]:.0%})"
                + (f", raw ring full duplex {human_rate(full.busbw_Bps)}" if full else ""))
        evidence = (Evidence(text, {"world_size": 2, "ratio": ratio, "volume_bytes": r.volume_bytes},
                             run.source_of(r), "busbw_vs_size.png"),)
        if abs(ratio - 1) <= HALF_DUPLEX_MATCH.value and (full is None or full.busbw_Bps > 1.2 * r.busbw_Bps):
            findings.append(Finding(name, "fired", f"{r.transport} at N=2 runs at the speed of a half-duplex "
                                    f"schedule: {text}", "moderate" if abs(ratio - 1) > HALF_DUPLEX_MATCH.value / 2
                                    else "strong", evidence, thresholds))
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

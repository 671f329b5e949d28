"""The N=2 dip: a series' busbw at N=2 against a healthy reference measured in the same run, and every N it left
out of that reference with the reason.

Two references, in order:

* **N>=3 of the same series** (the survey), at the same per-device volume D (or the same per-rank size): the
  anomaly's own definition. A row at N>=3 belongs to D where its per-rank size is D / (N-1) rounded down to
  whole elements (diag.plan.per_rank_size): N=4's 1 MiB is 349,524 bytes a rank, 1,048,572 bytes in all, and is
  matched to D = 1 MiB within (N-1) elements, never dropped for a few bytes. An N>=3 that cannot serve is left
  out and named with its reason: CPU-bound there (cpu_bound), its subgroup holds a host or link the link matrix
  finds slow (slow_host_link), or no row within (N-1) elements of that D.
* **The link measured beside the backend in the same run**, where no N>=3 can serve: the interleaved N=2
  trial's raw arm (raw TCP, one connection per direction, the same hosts, the same rounds: its knock-out control
  of diag.verdicts), else the link matrix's edge between the two N=2 hosts with both directions at once (one
  measurement, not interleaved: never strong).

Where the survey can serve, the trial beside the link is a second line of evidence: it makes a dip surer, and
where it shows the loss the survey missed, the dip is undecided, never clear: the run measured a loss.

Rows are blocks, one after another, so load that comes or goes between them reads as a difference of N: where
the machine was busy through N=2's rows and through none of their reference's (its CPU samples in each row's
window), the survey's dip is undecided unless the trial shows it; and the link matrix, measured before the
rows, is no reference for an N=2 whose pace the CPU set.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field, replace

from diag.records import Record
from diag.report.diagnose.base import undecided, weaken
from diag.report.diagnose.cpu_rules import cpu_limited_world_sizes
from diag.report.diagnose.findings import STRENGTHS, Evidence, Finding
from diag.report.rundir import RunData
from diag.report.series import PAIRWISE_OPS, by_series, mean_busbw, series_label
from diag.report.thresholds import (
    CPU_MIN_SAMPLES,
    CPU_PINNED_SHARE,
    CPU_SATURATED_PCT,
    N2_DIP_RATIO,
    N2_DIP_STRONG,
    used,
)
from diag.stats import Arm, Interval, Modes, bootstrap_means, interval, modes
from diag.trialspec import arms_of
from diag.units import human_bytes, human_rate
from diag.verdicts import MIN_ROUNDS, Control, control

NAME = "n2_busbw_dip"
CPU_AT_2 = ("; the machine's CPUs were saturated at N=2 too and raw TCP did not fill the link there (cpu_bound): "
            "part of this loss may be the CPU's")
# The survey's reference, and the link's two: what each finding's evidence names as "reference_kind".
SURVEY, TRIAL_LINK, MATRIX_LINK = "survey", "trial", "matrix"
TRIAL_TEXT = "the link measured beside it in the same interleaved rounds (raw TCP, one connection per direction)"
MATRIX_TEXT = "the link matrix's edge between its two hosts, both directions at once"


@dataclass(frozen=True)
class DipRatio:
    ratio: Interval            # N=2 mean busbw / median of the reference rows' mean busbw
    status: str                # "dip" | "no_dip" | "unsure"
    n2_Bps: float
    reference_Bps: float
    modes: Modes
    reference: tuple[int, ...] = ()          # the N>=3 held against at this size


@dataclass(frozen=True)
class SeriesDip:
    """One series' N=2 against its N>=3 rows, size by size (what n2_busbw_dip and negative_control read)."""

    label: str
    op: str
    per_n: dict[int, dict[int, Record]]     # N -> size (or volume D) -> row
    axis: str                               # "" (per-rank size) or "D=" (per-device volume)
    reference: list[int]                    # the N>=3 held against at some size
    left_out: dict[int, str]                # N>=3 left out at every size -> why
    ratios: dict[int, DipRatio]             # size -> N=2 / reference ratio (sizes with a reference)
    missing: dict[int, dict[int, str]] = field(default_factory=dict)   # size -> N -> why not at this size

    @property
    def status(self) -> str:
        """"dip" (some size dips), "no_dip" (the largest size does not, nor any size that is unsure below the
        threshold), "unsure", or "no_reference" (no N>=3 can serve): the survey's own reading."""
        sizes = sorted(self.ratios)
        if not sizes:
            return "no_reference"
        if any(self.ratios[s].status == "dip" for s in sizes):
            return "dip"
        largest = self.ratios[sizes[-1]]
        if largest.status == "no_dip" or (largest.ratio.point > N2_DIP_RATIO.value and all(
                self.ratios[s].status != "unsure" or self.ratios[s].ratio.point > N2_DIP_RATIO.value for s in sizes)):
            return "no_dip"
        return "unsure"

    def table(self) -> str:
        return ", ".join(f"{self.axis}{human_bytes(s)}: {self.ratios[s].ratio.text()}" for s in sorted(self.ratios))

    def reference_label(self) -> str:
        """'N=3,4' (every N>=3 there was), or the N used where some were left out."""
        return f"N={','.join(map(str, self.reference))}" if self.reference else "no N>=3"

    def exclusions(self) -> str:
        """Every N>=3 left out of the reference, and why: '; N=4 left out of the reference: CPU-bound there ...'."""
        reasons: dict[str, list[int]] = {}
        for n, why in sorted(self.left_out.items()):
            reasons.setdefault(why, []).append(n)
        parts = [f"N={','.join(map(str, ns))} left out of the reference: {why}" for why, ns in reasons.items()]
        by_n: dict[int, list[str]] = {}
        for size, why_n in sorted(self.missing.items()):
            for n, why in why_n.items():
                by_n.setdefault(n, []).append(f"{self.axis}{human_bytes(size)} ({why})")
        parts += [f"N={n} left out at {', '.join(where)}" for n, where in sorted(by_n.items())]
        return "".join(f"; {p}" for p in parts)


def series_dips(run: RunData) -> list[SeriesDip]:
    """Every collective series with N=2 rows and N>=3 rows, with its ratios against the N>=3 that can serve
    as the healthy reference (none: ``ratios`` empty, status "no_reference")."""
    return run.remember("series_dips", lambda: _series_dips(run))


def _series_dips(run: RunData) -> list[SeriesDip]:
    cpu_limited = cpu_limited_world_sizes(run)
    slow = slow_world_sizes(run)
    out = []
    for (label, op), per_series in sorted(by_series(run.records).items()):
        if op in PAIRWISE_OPS or 2 not in per_series or not any(n >= 3 for n in per_series):
            continue
        per_n, axis, unmatched = match_axis(per_series)
        left_out: dict[int, str] = {}
        for n in sorted(per_n):
            if n < 3:
                continue
            if n in cpu_limited:
                left_out[n] = "CPU-bound there (cpu_bound)"
            elif n in slow:
                left_out[n] = slow[n]
            elif not per_n[n]:
                left_out[n] = f"no row at any of N=2's {'volumes D' if axis else 'sizes'} ({unmatched.get(n, '')})"
        usable = [n for n in sorted(per_n) if n >= 3 and n not in left_out]
        ratios: dict[int, DipRatio] = {}
        missing: dict[int, dict[int, str]] = {}
        for size, row2 in sorted(per_n[2].items()):
            at = [n for n in usable if size in per_n[n]]
            absent = {n: _no_row(axis, n, row2) for n in usable if size not in per_n[n]}
            if absent:
                missing[size] = absent
            if at and mean_busbw(row2) > 0 and row2.times_s:
                ratios[size] = dip_ratio(row2, [per_n[n][size] for n in at], tuple(at))
        reference = sorted({n for r in ratios.values() for n in r.reference})
        out.append(SeriesDip(label, op, per_n, axis, reference, left_out, ratios, missing))
    return out


def _no_row(axis: str, n: int, row2: Record) -> str:
    element = max(1, row2.size_bytes // row2.count) if row2.count else 4
    return (f"no row within {(n - 1) * element} bytes of that D" if axis else "no row at that size")


def slow_world_sizes(run: RunData) -> dict[int, str]:
    """N>=3 whose subgroup holds a host or a link the link matrix finds slow (slow_host_link) while N=2's does
    not: such an N is paced by that host, so it understates what N=2's link carries and would hide a dip. Where
    N=2 holds it too, every N runs at its pace and N>=3 is held against N=2 like for like. N -> why."""
    from diag.report.diagnose.host_rules import slow_host_link
    from diag.report.nodes import subgroup_nodes

    findings = run.remember("slow_host_link", lambda: slow_host_link(run))
    groups = subgroup_nodes(run)
    pair = set(groups.get(2, ()))
    out: dict[int, str] = {}
    for f in findings:
        if f.status != "fired" or not f.evidence:
            continue
        values = f.evidence[0].values
        node, src, dst = values.get("node"), values.get("src"), values.get("dst")
        if (node and node in pair) or (src and dst and {src, dst} <= pair):
            continue
        for n, members in groups.items():
            if n < 3 or n in out:
                continue
            if node and node in members:
                out[n] = f"its subgroup holds {node}, whose link is slow (slow_host_link), and N=2's does not"
            elif src and dst and src in members and dst in members:
                out[n] = f"its subgroup holds the slow link {src} -> {dst} (slow_host_link), and N=2's does not"
    return out


def dip_ratio(row2: Record, others: list[Record], reference: tuple[int, ...] = ()) -> DipRatio:
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
    return DipRatio(ratio, status, n2, ref, modes(row2.times_s), reference)


def match_axis(per_n: dict[int, dict[int, Record]]) -> tuple[dict[int, dict[int, Record]], str, dict[int, str]]:
    """Compare N=2 with N>=3 at equal per-rank size S, or at equal per-device volume D = (N-1) x S (the user's
    own axis, and what diag reproduce sweeps) when that matches more rows. At equal D a row at N belongs to
    N=2's D where its per-rank size is D / (N-1) rounded down to whole elements (diag.plan.per_rank_size): its
    volume within (N-1) elements below D. Returns the maps, a label prefix for sizes ("" for S, "D=" for
    volume), and per N what its rows' volumes were where none matched."""
    volumes = sorted(per_n.get(2, {}).values(), key=lambda r: r.volume_bytes)
    by_volume: dict[int, dict[int, Record]] = {2: {r.volume_bytes: r for r in volumes}}
    unmatched: dict[int, str] = {}
    for n, rows in per_n.items():
        if n == 2:
            continue
        matched: dict[int, Record] = {}
        for row in rows.values():
            element = max(1, row.size_bytes // row.count) if row.count else 4
            for d in by_volume[2]:
                if 0 <= d - row.volume_bytes < (n - 1) * element:
                    matched[d] = row
        by_volume[n] = matched
        if not matched and rows:
            unmatched[n] = "its volumes: " + ", ".join(human_bytes(r.volume_bytes) for r in rows.values())

    def matches(maps: dict[int, dict[int, Record]]) -> int:
        return sum(1 for key in maps.get(2, {}) if any(key in maps[n] for n in maps if n >= 3))

    if matches(by_volume) > matches(per_n):
        return by_volume, "D=", unmatched
    return {n: dict(rows) for n, rows in per_n.items()}, "", {}


def busy_share(run: RunData, row: Record) -> float | None:
    """The share of the machine CPU samples taken while ``row`` ran (by the captures of its N) that had every core
    busy (CPU_SATURATED_PCT); None where fewer than CPU_MIN_SAMPLES fell in its window."""
    if not (row.t_start_ns and row.t_end_ns):
        return None
    busy = [float(s["busy_pct"]) for c in run.captures.values() if c.world_size == row.world_size for s in c.observe
            if s.get("kind") == "cpu_host" and isinstance(s.get("busy_pct"), (int, float))
            and row.t_start_ns <= s.get("t_ns", 0) <= row.t_end_ns]
    if len(busy) < CPU_MIN_SAMPLES.value:
        return None
    return sum(1 for pct in busy if pct >= CPU_SATURATED_PCT.value) / len(busy)


def unlike_load(run: RunData, dip: SeriesDip, size: int) -> tuple[float, float] | None:
    """(N=2's busy share, the reference rows' highest) where the machine was busy through N=2's row at this size
    (CPU_PINNED_SHARE of its samples at every core busy) and through none of the rows it is held against: the
    blocks ran under different load (another job came or went between them), and the ratio is the load's as
    much as N's. None where the load was alike, or unknown."""
    ratio = dip.ratios[size]
    n2 = busy_share(run, dip.per_n[2][size])
    others = [busy_share(run, dip.per_n[n][size]) for n in ratio.reference]
    if n2 is None or n2 < CPU_PINNED_SHARE.value or not others or any(o is None for o in others):
        return None
    highest = max(o for o in others if o is not None)
    return (n2, highest) if highest < CPU_PINNED_SHARE.value else None


# --- the link beside the backend --------------------------------------------------------------------------


@dataclass(frozen=True)
class LinkReading:
    """The backend's N=2 busbw against the link measured beside it, at one D: from the interleaved trial (a
    bootstrap interval over rounds) or the link matrix (one measurement, a point)."""

    kind: str                  # TRIAL_LINK | MATRIX_LINK
    ratio: Interval            # backend busbw / the link's
    status: str                # "shown" (below by the dip threshold) | "absent" | "unsure"
    backend_Bps: float
    link_Bps: float
    rounds: int = 0
    modes: str = ""
    source: str = "run.json link.matrix"

    def text(self) -> str:
        where = (f"{self.rounds} interleaved rounds" if self.kind == TRIAL_LINK else
                 "the link matrix, one measurement, not interleaved")
        span = (f" [{self.ratio.low:.2f}, {self.ratio.high:.2f}]" if self.kind == TRIAL_LINK else "")
        return (f"mean busbw {human_rate(self.backend_Bps)} against the link's {human_rate(self.link_Bps)}: "
                f"{self.ratio.point:.2f}x{span} ({where})")


def link_controls(run: RunData, label: str, op: str) -> dict[int, Control]:
    """Per volume D (per-rank size at N=2), the backend's N=2 busbw against the link in an interleaved trial:
    its arm of this series beside the trial's raw reference arm, the knock-out control of diag.verdicts."""
    return {size: reading for size, (reading, _arms) in _trial_arms(run, label, op).items()}


def _trial_arms(run: RunData, label: str, op: str) -> dict[int, tuple[Control, tuple[Arm, Arm, float, str]]]:
    """Per size: the trial's control of this series' arm against its raw arm, with the two arms, the arm's busbw x
    time (to turn a mean time into busbw) and the records file of that trial."""
    out: dict[int, tuple[Control, tuple[Arm, Arm, float, str]]] = {}
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
                row = next(b for b in blocks if b.block.get("arm") == backend[0].name and b.size_bytes == size)
                out[size] = (control(g, r, spec.seed), (g, r, row.busbw_Bps * row.time_s, run.source_of(row)))
    return out


def link_readings(run: RunData, dip: SeriesDip) -> dict[int, LinkReading]:
    """Per D, a backend's N=2 busbw against the link beside it: the interleaved trial where it ran, else the link
    matrix's edge between N=2's hosts (both directions at once, as all_gather at N=2 moves them). A raw-TCP series
    is no backend: its N=2 against the link is a property of its own schedule (none)."""
    out: dict[int, LinkReading] = {}
    if dip.label.startswith("raw:"):
        return out
    for size, (c, (g, _r, factor, source)) in _trial_arms(run, dip.label, dip.op).items():
        backend = factor / g.mean_s
        out[size] = LinkReading(TRIAL_LINK, c.ratio, c.status, backend, backend / c.ratio.point if c.ratio.point
                                else math.inf, len(g.blocks), c.modes, source)
    if out:
        return out
    edge = _matrix_edge(run)
    if edge is None:
        return out
    for size, row in sorted(dip.per_n.get(2, {}).items()):
        backend = mean_busbw(row)
        point = backend / edge
        status = "shown" if point <= N2_DIP_RATIO.value else "absent" if point >= 1.0 else "unsure"
        out[size] = LinkReading(MATRIX_LINK, Interval(point, point, point), status, backend, edge,
                                modes=modes(row.times_s).text())
    return out


def _matrix_edge(run: RunData) -> float | None:
    """The lesser of the two directions between N=2's hosts, both at once (run.json link.matrix)."""
    from diag.report.nodes import subgroup_nodes

    matrix = run.link_matrix
    pair = subgroup_nodes(run).get(2)
    if matrix is None or not pair or len(pair) != 2:
        return None
    both = matrix.bidir()
    values = [both.get((pair[0], pair[1])), both.get((pair[1], pair[0]))]
    return min(values) if all(v for v in values) else None     # type: ignore[type-var]


def _row_of(blocks: list[Record], arm: str) -> Record | None:
    """The first block of an arm (None where a trial that died early never ran it)."""
    return next((b for b in blocks if b.block.get("arm") == arm), None)


# --- the rule ---------------------------------------------------------------------------------------------


def n2_busbw_dip(run: RunData) -> list[Finding]:
    """busbw at N=2 below the healthy reference of the same run (module docstring), the size from which the
    dip holds, and every N the reference left out with its reason.

    Against N>=3 each size is judged on all its samples: the ratio of mean busbw (N=2 over the median of the
    N>=3 that serve) with a bootstrap interval, so a bimodal N=2 row counts with its slow share. A size dips
    when the ratio is at most N2_DIP_RATIO and its interval stays below 1; it does not when the whole interval
    is at least N2_DIP_RATIO. Against the link beside it (the trial) a size shows the loss by the trial's own
    control (diag.verdicts.CONTROL_DIP, the same 0.8)."""
    thresholds = used(N2_DIP_RATIO, N2_DIP_STRONG)
    findings: list[Finding] = []
    cpu_at_2 = 2 in cpu_limited_world_sizes(run)
    for dip in series_dips(run):
        readings = link_readings(run, dip)
        found = (_against_survey(run, dip, readings, thresholds) if dip.ratios
                 else _against_link(run, dip, readings, thresholds, cpu_at_2))
        if found.status == "fired" and cpu_at_2:
            # A loss measured on a machine whose CPU was saturated at N=2 (raw TCP short of the link there too)
            # is a loss; whether the network or the CPU set it is not told apart: one step less sure.
            found = replace(found, strength=weaken(found.strength), statement=found.statement + CPU_AT_2)
        findings.append(found)
    if not findings:
        return undecided(NAME, "no series has both N=2 and N>=3 rows at the same sizes: cannot compare "
                         "(sweep --nproc 2,3,4)", N2_DIP_RATIO, N2_DIP_STRONG)
    return findings


def _reading_text(readings: dict[int, LinkReading], axis: str) -> str:
    return ", ".join(f"{axis}{human_bytes(v)} {r.text()} ({'shows the loss' if r.status == 'shown' else r.status})"
                     for v, r in sorted(readings.items()))


def _against_survey(run: RunData, dip: SeriesDip, readings: dict[int, LinkReading],
                    thresholds: dict[str, float]) -> Finding:
    label, op, axis, ratios = dip.label, dip.op, dip.axis, dip.ratios
    note = dip.exclusions()
    sizes = sorted(ratios)
    reference_label = dip.reference_label()
    table = f"N=2 / {reference_label} mean busbw, ratio by size: {dip.table()}; 95% intervals"
    dipping = [s for s in sizes if ratios[s].status == "dip"]
    shown = [v for v, r in readings.items() if r.status == "shown"]
    beside = (f"; against {TRIAL_TEXT if any(r.kind == TRIAL_LINK for r in readings.values()) else MATRIX_TEXT}: "
              + _reading_text(readings, axis)) if readings else ""
    if not dipping:
        if shown:
            # The run measured a loss against the link beside the backend: a survey that finds none against
            # N>=3 (separate launches, one N after the other) cannot clear it; the two disagree.
            return Finding(NAME, "undecided", f"{label} {op}: the survey finds N=2 not below {reference_label} "
                           f"({table}){note}, but at N=2 it runs below the link measured beside it: "
                           + ", ".join(f"{axis}{human_bytes(v)} {readings[v].text()}" for v in sorted(shown)),
                           evidence=tuple(_link_evidence(run, dip, readings, shown)), thresholds=thresholds)
        if dip.status == "no_dip":
            return Finding(NAME, "clear", f"{label} {op}: busbw at N=2 is not below {reference_label} ({table})"
                           f"{note}{beside}", thresholds=thresholds)
        return Finding(NAME, "undecided", f"{label} {op}: whether N=2 is slower cannot be told from these samples "
                       f"({table}){note}{beside}", thresholds=thresholds)
    trial_shown = [v for v in shown if readings[v].kind == TRIAL_LINK]
    loads = {s: unlike_load(run, dip, s) for s in dipping}
    if not trial_shown and all(loads.values()):
        # every dip is between blocks that ran under different load: the survey cannot tell N from the load
        load_text = ", ".join(f"{axis}{human_bytes(s)}: every core busy in {n2:.0%} of N=2's CPU samples, at most "
                              f"{other:.0%} of the reference rows'" for s, (n2, other) in sorted(
                                  (s, v) for s, v in loads.items() if v is not None))
        return Finding(NAME, "undecided", f"{label} {op}: N=2 reads below {reference_label} ({table}), but the machine "
                       f"was busy through N=2's rows and not through the rows held against them ({load_text}): the "
                       "blocks ran under different load, so this survey cannot say N=2 is slower; an interleaved trial "
                       f"holds N=2 against the link in the same rounds (the trials step){note}{beside}",
                       thresholds={**thresholds, **used(CPU_PINNED_SHARE, CPU_SATURATED_PCT)})
    onset = dipping[-1]
    for s in reversed(sizes):
        if ratios[s].ratio.point > N2_DIP_RATIO.value:
            break
        onset = s
    confirmed = [s for s in dipping if ratios[s].ratio.high < N2_DIP_RATIO.value]
    worst = min(ratios[s].ratio.point for s in dipping)
    strength = ("strong" if len(dipping) >= 2 and (confirmed or worst < N2_DIP_STRONG.value)
                else "moderate" if len(dipping) >= 2 or confirmed else "weak")
    # A second, interleaved line of evidence: the trial ran this backend beside the link in the same rounds.
    # Where it shows the loss there too, the dip is one step surer; the statement says which.
    interleaved = any(r.kind == TRIAL_LINK for r in readings.values())
    if len(trial_shown) >= 2:
        strength = "strong"
    elif trial_shown and strength != "strong":
        strength = STRENGTHS[STRENGTHS.index(strength) - 1]
    elif not interleaved and strength == "strong":
        # one standard of evidence: survey rows are separate launches, one block each; without the interleaved
        # trial beside the link a dip is at most moderate
        strength = "moderate"
    why_not = ""
    if strength != "strong":
        reasons = []
        if not (len(dipping) >= 2 and (confirmed or worst < N2_DIP_STRONG.value)):
            reasons.append(f"{len(dipping)} of {len(sizes)} sizes dip"
                           + ("" if confirmed else f", none confirmed below {N2_DIP_RATIO.value}"))
        if not interleaved:
            reasons.append("the survey rows are separate launches, one block each, and no interleaved trial ran "
                           "beside the link")
        why_not = "; not strong: " + "; ".join(reasons)
    deepest = min(dipping, key=lambda s: ratios[s].ratio.point)
    source = run.source_of(dip.per_n[2][sizes[-1]])
    evidence = [Evidence(
        f"at {axis}{human_bytes(s)}{' per rank' if not axis else ''}, N=2 mean busbw {human_rate(ratios[s].n2_Bps)} "
        f"vs the median of N={','.join(map(str, ratios[s].reference))} {human_rate(ratios[s].reference_Bps)} "
        f"(ratio {ratios[s].ratio.text()}; N=2 {ratios[s].modes.text()})",
        {"size_bytes": s, "ratio": ratios[s].ratio.point, "ratio_low": ratios[s].ratio.low,
         "ratio_high": ratios[s].ratio.high, "busbw_n2_Bps": ratios[s].n2_Bps,
         "busbw_reference_Bps": ratios[s].reference_Bps, "busbw_n3plus_Bps": ratios[s].reference_Bps,
         "reference": f"N={','.join(map(str, ratios[s].reference))}", "reference_kind": SURVEY,
         "statistic": "mean", "slow_fraction": ratios[s].modes.slow_fraction, "series": label, "op": op,
         "world_size": 2}, source, "busbw_vs_size.png") for s in dipping]
    return Finding(
        NAME, "fired",
        f"{label} {op}: busbw at N=2 is {1 - ratios[deepest].ratio.point:.0%} below {reference_label} at "
        f"{axis}{human_bytes(deepest)}, dipping at {len(dipping)} of {len(sizes)} sizes"
        f"{f' ({len(confirmed)} confirmed below {N2_DIP_RATIO.value})' if confirmed else ''}, from "
        f"{axis}{human_bytes(onset)}{' per rank' if not axis else ''} upward ({table}){note}{beside}{why_not}",
        strength, tuple(evidence), thresholds)


def _link_evidence(run: RunData, dip: SeriesDip, readings: dict[int, LinkReading], sizes: list[int]) -> list[Evidence]:
    return [Evidence(
        f"at {dip.axis}{human_bytes(v)}, N=2 {readings[v].text()}; N=2 {readings[v].modes}",
        {"size_bytes": v, "ratio": readings[v].ratio.point, "ratio_low": readings[v].ratio.low,
         "ratio_high": readings[v].ratio.high, "busbw_n2_Bps": readings[v].backend_Bps,
         "busbw_reference_Bps": readings[v].link_Bps, "reference": "the link beside it",
         "reference_kind": readings[v].kind, "statistic": "mean", "series": dip.label, "op": dip.op,
         "world_size": 2}, readings[v].source, "headline.png")
        for v in sorted(sizes)]


def _against_link(run: RunData, dip: SeriesDip, readings: dict[int, LinkReading],
                  thresholds: dict[str, float], cpu_at_2: bool = False) -> Finding:
    """No N>=3 can serve: the link measured beside the backend in the same run decides. The link matrix (one
    measurement before the rows) is no reference where the CPU set N=2's pace (``cpu_at_2``: every core busy and
    raw TCP short of the link at N=2): the rows fall short of the link by what the CPU allowed, and how much of
    that is the backend's only a reference that shared the CPU tells (the trial's raw arm, in the same rounds)."""
    label, op, axis = dip.label, dip.op, dip.axis
    why = f"N>=3 cannot serve as the reference: {dip.exclusions().removeprefix('; ')}"
    if not readings:
        beside = ("a raw-TCP series is held against its own N>=3 only" if label.startswith("raw:") else
                  "and no link was measured beside it (no interleaved N=2 trial, no link matrix between its hosts)")
        return Finding(NAME, "undecided", f"{label} {op}: no healthy reference for N=2: {why}; {beside}",
                       thresholds=thresholds)
    kind = next(iter(readings.values())).kind
    what = TRIAL_TEXT if kind == TRIAL_LINK else MATRIX_TEXT
    shown = sorted(v for v, r in readings.items() if r.status == "shown")
    table = _reading_text(readings, axis)
    if not shown:
        if all(r.status == "absent" for r in readings.values()):
            return Finding(NAME, "clear", f"{label} {op}: busbw at N=2 is not below {what}: {table} ({why})",
                           thresholds=thresholds)
        return Finding(NAME, "undecided", f"{label} {op}: whether N=2 runs below {what} cannot be told yet: {table} "
                       f"({why})", thresholds=thresholds)
    if kind == MATRIX_LINK:
        if cpu_at_2:
            return Finding(NAME, "undecided", f"{label} {op}: busbw at N=2 is below {what} ({table}), but every CPU of "
                           "the machine was busy at N=2 and raw TCP did not fill the link there either (cpu_bound): the "
                           "CPU, not the link, set N=2's pace, so the link is no reference for it; an interleaved trial "
                           f"holds N=2 against raw TCP in the same rounds (the trials step) ({why})", thresholds=thresholds)
        shares = [busy_share(run, dip.per_n[2][v]) for v in shown if v in dip.per_n.get(2, {})]
        busy = [b for b in shares if b is not None and b >= CPU_PINNED_SHARE.value]
        if busy and len(busy) == len(shares):
            return Finding(NAME, "undecided", f"{label} {op}: busbw at N=2 is below {what} ({table}), but every core "
                           f"of the machine was busy through N=2's rows (in {min(busy):.0%} or more of their CPU "
                           "samples) and the link matrix was measured at another time, under a load it does not share: "
                           "the load, not N, may be what the ratio shows; an interleaved trial holds N=2 against raw "
                           f"TCP in the same rounds (the trials step) ({why})",
                           thresholds={**thresholds, **used(CPU_PINNED_SHARE, CPU_SATURATED_PCT)})
    confirmed = [v for v in shown if readings[v].ratio.high < N2_DIP_RATIO.value]
    if kind == TRIAL_LINK:
        strength = "strong" if len(shown) >= 2 else "moderate"
    else:  # one measurement of the link, not interleaved with the rows it is held against
        strength = "moderate" if len(shown) >= 2 else "weak"
    deepest = min(shown, key=lambda v: readings[v].ratio.point)
    onset = shown[-1]
    for v in sorted(readings, reverse=True):
        if readings[v].status != "shown":
            break
        onset = v
    statement = (f"{label} {op}: busbw at N=2 is {1 - readings[deepest].ratio.point:.0%} below the link measured "
                 f"beside it at {axis}{human_bytes(deepest)}, below it at {len(shown)} of {len(readings)} sizes"
                 f"{f' ({len(confirmed)} confirmed below {N2_DIP_RATIO.value})' if confirmed else ''}, from "
                 f"{axis}{human_bytes(onset)} upward (against {what}: {table}); {why}")
    return Finding(NAME, "fired", statement, strength, tuple(_link_evidence(run, dip, readings, shown)), thresholds)

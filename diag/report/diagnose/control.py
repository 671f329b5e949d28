"""The negative control: a transport that does not take turns (raw TCP with one connection per direction,
both directions at once; the diag_tcp backend) must show no N=2 dip. Where it does, whatever slows N=2 slows
every transport (a host, a link, the CPU), and no backend's N=2 mechanism may be named from the run
(diag.report.diagnose.mechanism reads this finding)."""

from __future__ import annotations

from diag.records import Record
from diag.report.diagnose.base import strength_of, undecided
from diag.report.diagnose.dip import SeriesDip, link_readings, series_dips
from diag.report.diagnose.findings import STRENGTHS, Evidence, Finding
from diag.report.rundir import RunData
from diag.report.series import knob
from diag.report.thresholds import N2_DIP_RATIO, used
from diag.units import human_bytes, human_rate

# The values of the knobs that decide whether a transport takes turns, at which it does not (None: not given,
# the default): any other value (--conn shared, --io alternate, --handshake notify, --emulate gloo) makes the
# series an experiment, not the control.
CONTROL_KNOBS: dict[str, tuple[object, ...]] = {"conn": (None, "split"), "io": (None, "duplex"),
                                                "handshake": (None, "none"), "emulate": (None, "")}
# Backends whose rows are the control when no turn knob is set: diag's own raw TCP, and the same under torch.
CONTROL_BACKENDS = ("raw", "diag_tcp")
NAME = "negative_control"


def is_control(row: Record) -> bool:
    """A row of a transport that sends and receives at once on its own connections."""
    if row.backend not in CONTROL_BACKENDS:
        return False
    return all(knob(row, k) in values for k, values in CONTROL_KNOBS.items())


def _row(dip: SeriesDip) -> Record:
    return next(iter(dip.per_n[2].values()))


def negative_control(run: RunData) -> list[Finding]:
    """N=2 against its healthy reference for the control series, as n2_busbw_dip reads every series (against
    the N>=3 that serve, else, for the diag_tcp backend, against the link measured beside it): clear when none
    dips (the run says N=2 is not slower there), fired when one does (a slowdown that is not the backend's)."""
    from diag.report.diagnose.dip import n2_busbw_dip

    thresholds = used(N2_DIP_RATIO)
    every = [d for d in series_dips(run) if is_control(_row(d))]
    controls = [d for d in every if d.ratios]
    # a control series no N>=3 can serve (the diag_tcp backend under test on a busy machine) is held against the
    # link beside it, by the dip rule itself
    held = [f"{d.label} {d.op}: " for d in every if not d.ratios and link_readings(run, d)]
    linked = [f for f in run.remember("n2_busbw_dip", lambda: n2_busbw_dip(run)) if f.statement.startswith(tuple(held))]
    if not controls and not linked:
        if every:
            return undecided(NAME, "the control series have no N>=3 that can serve as their reference, nor a link "
                             "measured beside them: " + "; ".join(f"{d.label} {d.op}{d.exclusions()}" for d in every),
                             N2_DIP_RATIO)
        return undecided(NAME, "no raw-TCP (one connection per direction, both directions at once) or diag_tcp "
                         "series with N=2 and N>=3 rows at the same sizes: the negative control did not run",
                         N2_DIP_RATIO)
    tables = "; ".join([*(f"{d.label} {d.op} (N=2 / {d.reference_label()} mean busbw by size: {d.table()}"
                          f"{d.exclusions()})" for d in controls),
                        *(f.statement for f in linked if f.status != "clear")])
    dipping = [d for d in controls if d.status == "dip"]
    linked_dips = [f for f in linked if f.status == "fired"]
    if dipping or linked_dips:
        evidence = []
        for d in dipping:
            for size, ratio in sorted(d.ratios.items()):
                if ratio.status == "dip":
                    evidence.append(Evidence(
                        f"{d.label} {d.op} at {d.axis}{human_bytes(size)}: N=2 mean busbw {human_rate(ratio.n2_Bps)} "
                        f"vs N={','.join(map(str, ratio.reference))} {human_rate(ratio.reference_Bps)} (ratio "
                        f"{ratio.ratio.text()})",
                        {"series": d.label, "op": d.op, "size_bytes": size, "ratio": ratio.ratio.point,
                         "world_size": 2, "control": True}, run.source_of(d.per_n[2][size]), "busbw_vs_size.png"))
        for f in linked_dips:
            evidence += [Evidence(e.text, {**e.values, "control": True}, e.source, e.plot) for e in f.evidence]
        worst = min(e.values["ratio"] for e in evidence)
        strength = strength_of(N2_DIP_RATIO.value - worst, 0.2, 0.1)
        # no surer than the dip it reads (a link reading weakened where the CPU was saturated at N=2)
        weakest = [f.strength for f in linked_dips]
        if weakest:
            strength = STRENGTHS[max(STRENGTHS.index(strength), *(STRENGTHS.index(w) for w in weakest))]
        return [Finding(NAME, "fired", f"N=2 is slower for a transport that does not take turns too: {tables}: "
                        "what slows N=2 here slows every transport (a host, a link or the CPU: see the host "
                        "findings), so no backend's N=2 mechanism is named from this run", strength, tuple(evidence),
                        thresholds)]
    if all(d.status == "no_dip" for d in controls) and all(f.status == "clear" for f in linked):
        return [Finding(NAME, "clear", "N=2 is not slower with a transport that does not take turns: "
                        + "; ".join([*(f"{d.label} {d.op} (N=2 / {d.reference_label()} mean busbw by size: "
                                       f"{d.table()}{d.exclusions()})" for d in controls),
                                     *(f.statement for f in linked)]), thresholds=thresholds)]
    return [Finding(NAME, "undecided", f"whether N=2 is slower without turn-taking cannot be told from these "
                    f"samples: {tables}", thresholds=thresholds)]

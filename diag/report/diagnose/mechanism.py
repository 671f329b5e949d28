"""The mechanism verdict: the N=2 dip explained by the suspects an experiment shows (positive control,
most of the loss removed, diag.verdicts), with the observations consistent with it and the suspects that
experiments ruled out; undecided when no experiment isolates the cause. An observation (the wire taking
turns, a half-duplex match, idle gaps) describes how the loss looks, never why: it is listed, not counted."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from diag.report.diagnose.findings import STRENGTHS, Evidence, Finding
from diag.report.diagnose.paired import EXPERIMENTS

# Observations: rules whose firing describes how an N=2 loss looks on the wire or in the CPU, with what each
# means. They are consistent with a mechanism, never proof of one (only a toggling experiment is).
OBSERVATIONS: dict[str, str] = {
    "turn_taking": "on the wire, the backend's one connection at N=2 carries its two directions in turns, "
                   "where raw TCP on one connection between the same hosts carries both at once",
    "half_duplex_match": "a raw ring that alternates directions (half duplex) runs at the backend's N=2 speed",
    "low_duplex_overlap": "the wire shows both directions of one connection/host taking turns",
    "cpu_bound": "a thread is pinned at a full core, so the CPU may set the pace",
    "window_limited": "senders wait on windows or buffers",
    "retransmissions": "losses force retransmissions",
    "idle_gaps": "connections idle between bursts",
}

# The backend whose N=2 mechanisms the suspects and the raw protocol model (--emulate gloo) stand for.
MODELLED_BACKEND = "torch:gloo"
# What a shown experiment says about the mechanism behind an N=2 dip.
READINGS: dict[str, str] = {e.id: e.reading for e in EXPERIMENTS}


def mechanism(findings: Sequence[Finding]) -> Finding:
    """Tie the N=2 dip to the suspects shown by experiment; undecided when none is. ``findings`` holds the
    suspects' verdicts (suspects()) beside the rules' findings."""
    name = "mechanism"
    fired_dips = [f for f in findings if f.rule == "n2_busbw_dip" and f.status == "fired"]
    # The mechanism explains a backend's dip: a dip in a raw-TCP series is a property of that raw schedule
    # (e.g. --io alternate), reported by n2_busbw_dip, not the backend's mechanism.
    dips = [f for f in fired_dips if str(f.evidence[0].values.get("series", "torch:")).startswith("torch:")]
    if not dips:
        checked = [f for f in findings if f.rule == "n2_busbw_dip"]
        if checked and all(f.status == "undecided" for f in checked):
            return Finding(name, "undecided", "whether N=2 is slower could not be checked, so there is no "
                           "mechanism to name")
        # A backend series whose dip could not be decided is not a backend without a dip.
        open_backend = [f for f in checked if f.status == "undecided" and f.statement.startswith("torch:")]
        if open_backend:
            return Finding(name, "undecided", "whether the backend's N=2 is slower is undecided ("
                           + "; ".join(f.statement for f in open_backend) + "), so there is no mechanism to name yet")
        if fired_dips:
            raw = sorted({str(f.evidence[0].values.get("series")) for f in fired_dips})
            return Finding(name, "clear", "no backend N=2 busbw dip to explain; the N=2 dips are in raw-TCP series "
                           f"({'; '.join(raw)}): properties of those raw schedules, not a backend's mechanism")
        return Finding(name, "clear", "no N=2 busbw dip to explain")
    # The negative control: a transport that does not take turns dips at N=2 too, so what slows N=2 is not
    # specific to the backend (a host, link or CPU fault): no backend mechanism is named, whatever shows.
    control = [f for f in findings if f.rule == "negative_control" and f.status == "fired"]
    if control:
        return Finding(name, "undecided", "N=2 is slower for a transport that does not take turns too (negative "
                       f"control: {control[0].evidence[0].text}), so the backend's N=2 dip is not its own: no backend "
                       "mechanism is named; see the host findings for what slows N=2 for every transport")
    # The suspects and their experiments are gloo's (the raw protocol model emulates gloo's pair): they explain
    # a gloo dip, not another backend's.
    modelled = [f for f in dips if str(f.evidence[0].values.get("series")) == MODELLED_BACKEND]
    if not modelled:
        others = sorted({str(f.evidence[0].values.get("series")) for f in dips})
        return Finding(name, "undecided", f"{', '.join(others)} is slower at N=2, but the suspected mechanisms M1-M4 "
                       f"and the experiments that toggle them are {MODELLED_BACKEND}'s (the raw protocol model "
                       "emulates its pair): none of them explains another backend's loss")
    dips = modelled
    verdicts = [f for f in findings if f.rule.startswith("suspect_")]
    shown = [f for f in verdicts if f.status == "fired"]
    ruled_out = [f for f in verdicts if f.status == "clear"]
    consistent, everywhere = _observations(findings)
    if not shown:
        open_ = [f.statement for f in verdicts if f.status == "undecided"]
        return Finding(name, "undecided",
                       "N=2 is slower but no experiment here isolates why"
                       + (f"; ruled out by experiment: {'; '.join(_name(f) for f in ruled_out)}" if ruled_out else "")
                       + (f"; not isolated: {'; '.join(open_)}" if open_ else "")
                       + (f"; observed (describes the loss, does not explain it): {', '.join(consistent)}"
                          if consistent else "")
                       + (f"; seen at N>=3 too, so not specific to N=2: {', '.join(everywhere)}" if everywhere else ""))
    statement = "the N=2 loss is explained by: " + "; ".join(f"{_name(f)} (shown by {f.statement.split(': shown by ')[1].split(':')[0]})"
                                                             for f in shown)
    if consistent:
        statement += f"; consistent with the observations: {', '.join(consistent)}"
    if ruled_out:
        statement += "; ruled out by experiment: " + "; ".join(_name(f) for f in ruled_out)
    if everywhere:
        statement += f" (seen at N>=3 too, so not specific to N=2: {', '.join(everywhere)})"
    evidence = tuple(Evidence(f"{f.rule}: {f.statement}", {"rule": f.rule, "strength": f.strength, "world_size": 2},
                              f.evidence[0].source, f.evidence[0].plot) for f in [*dips[:1], *shown])
    # No surer than the dip it explains, nor than the weakest experiment that shows it.
    weakest = max(STRENGTHS.index(f.strength) for f in [*dips[:1], *shown])
    return Finding(name, "fired", statement, STRENGTHS[weakest], evidence,
                   explains="; ".join(f"{f.rule.removeprefix('suspect_').upper()}: {f.explains}" for f in shown))


def _figures(experiment: Finding) -> str:
    """The figures of a paired experiment's statement, without its headline sentence."""
    rows = {e.id: e for e in EXPERIMENTS}
    row = rows.get(experiment.rule)
    for prefix in ((row.headline, row.clear) if row else ()):
        if experiment.statement.startswith(prefix + ": "):
            return experiment.statement[len(prefix) + 2:]
    return experiment.statement


def _name(verdict: Finding) -> str:
    """'M4: ACKs queued behind reverse data on one connection' of a suspect's verdict."""
    return verdict.statement.split(": ruled out by")[0].split(": shown by")[0]


def _observations(findings: Sequence[Finding]) -> tuple[list[str], list[str]]:
    """Fired observations seen at N=2 only (consistent with an N=2 mechanism), and those seen at N>=3 too."""
    consistent: list[str] = []
    everywhere: list[str] = []
    for f in findings:
        if f.status not in ("fired", "observed") or f.rule not in OBSERVATIONS:
            continue
        sizes = {e.values.get("world_size") for e in f.evidence} - {None}
        if 2 not in sizes:
            continue
        (everywhere if any(n >= 3 for n in sizes) else consistent).append(f"{f.rule} ({OBSERVATIONS[f.rule]})")
    return consistent, everywhere


@dataclass(frozen=True)
class Suspect:
    """One suspected mechanism behind gloo's N=2 dip and the experiment that switches it on and off."""

    id: str                    # the finding's rule id
    name: str                  # what the mechanism is, in one phrase
    experiment: str | None     # the paired-experiment rule that toggles it; None: nothing here can
    shown: str                 # what a fired experiment means for this suspect
    ruled_out: str             # what a clear experiment means
    why_not_isolated: str      # why nothing here isolates it (with no experiment, or an undecided one)


# The four suspected mechanisms of gloo's N=2 dip (docs/raw-tcp.md). Only an experiment that toggles a suspect can show it or rule it out; everything
# else (CPU samples, the wire) may support a reading but never convicts or clears a suspect on its own.
SUSPECTS: tuple[Suspect, ...] = (
    Suspect("suspect_m1", "M1: the ready-to-receive notice queued behind the rank's own data on the shared pair",
            "notice_behind_data",
            "the raw protocol model of gloo's pair runs faster with only the notice moved to its own connection",
            "moving the notice to its own connection changes nothing in the protocol model",
            "no raw rows toggle --notice in-band / own-conn under --emulate gloo"),
    Suspect("suspect_m2", "M2: one lock per pair serialising both directions", None, "", "",
            "no experiment here can switch gloo's per-pair lock from user level; the protocol model drives both "
            "directions of a pair from one loop, so where M1 is shown, one driver per pair is not enough to slow "
            "N=2 by itself"),
    Suspect("suspect_m3", "M3: per-byte copies in PyTorch", None, "", "",
            "no experiment here switches torch's copies off; see cpu_bound for whether any thread was pinned"),
    Suspect("suspect_m4", "M4: ACKs queued behind reverse data on one connection", "shared_connection",
            "raw TCP with both directions (and their ACKs) on one connection reproduces most of the backend's N=2 "
            "loss; ACKs behind reverse data are one cost of sharing, not told apart from the others",
            "raw TCP with both directions, and each direction's ACKs behind the other's data, on one connection "
            "reproduces none of the backend's N=2 loss",
            "no raw rows with both --conn shared and --conn split at N=2"),
)


def suspects(findings: Sequence[Finding]) -> list[Finding]:
    """One verdict per suspected mechanism: shown or ruled out only by the experiment that toggles it, else
    'not isolated' (undecided) with the reason. Runs whether or not a dip fired, so a clean run still says
    which suspects its experiments cleared."""
    by_rule = {f.rule: f for f in findings}
    out: list[Finding] = []
    for s in SUSPECTS:
        experiment = by_rule.get(s.experiment) if s.experiment else None
        if experiment is not None and experiment.status == "fired":
            out.append(Finding(s.id, "fired", f"{s.name}: shown by {s.experiment} ({s.shown}): {_figures(experiment)}",
                               experiment.strength, experiment.evidence, experiment.thresholds,
                               explains=experiment.explains))
        elif experiment is not None and experiment.status == "observed":
            # shown in gloo's protocol model, in a run whose backend under test is another: a fact about gloo
            out.append(Finding(s.id, "observed", f"{s.name}: shown by {s.experiment} in {MODELLED_BACKEND}'s protocol "
                               f"model, not in the backend under test: {_figures(experiment)}",
                               evidence=experiment.evidence, thresholds=experiment.thresholds,
                               explains=experiment.explains))
        elif experiment is not None and experiment.status == "clear":
            out.append(Finding(s.id, "clear", f"{s.name}: ruled out by {s.experiment} ({s.ruled_out}): "
                               f"{_figures(experiment)}", evidence=experiment.evidence,
                               thresholds=experiment.thresholds, explains="none: ruled out"))
        else:
            why = s.why_not_isolated
            if experiment is not None:
                # the experiment's own statement already opens with "<id> could not decide:": not said twice
                statement = experiment.statement
                opening = f"{experiment.rule} could not decide: "
                why = f"{s.experiment} could not decide: {statement.removeprefix(opening)}"
            out.append(Finding(s.id, "undecided", f"{s.name}: not isolated ({why})", explains="undecided"))
    return out

"""The mechanism verdict: tie the N=2 dip to the fired findings that explain it, and name the experiments
that ruled suspects out; undecided when nothing isolates it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from diag.report.diagnose.findings import STRENGTHS, Evidence, Finding
from diag.report.diagnose.paired import EXPERIMENTS

# Rules whose firing points at a mechanism behind an N=2 dip, with what each means (the paired experiments
# bring their own reading).
READINGS: dict[str, str] = {
    "turn_taking": "on the wire, the backend's one connection at N=2 carries its two directions in turns, "
                   "where raw TCP on one connection between the same hosts carries both at once",
    "half_duplex_match": "a raw ring that alternates directions (half duplex) runs at the backend's N=2 speed",
    **{e.id: e.reading for e in EXPERIMENTS},
    "low_duplex_overlap": "the wire shows both directions of one connection/host taking turns",
    "cpu_bound": "a thread is pinned at a full core, so the CPU may set the pace",
    "window_limited": "senders wait on windows or buffers",
    "retransmissions": "losses force retransmissions",
    "idle_gaps": "connections idle between bursts",
}

# Rules whose "clear" verdict rules a suspected mechanism out.
RULED_OUT: tuple[str, ...] = (*(e.id for e in EXPERIMENTS if e.rules_out), "cpu_bound")


def mechanism(findings: Sequence[Finding]) -> Finding:
    """Tie the N=2 dip to the experiments that explain it; undecided when none does."""
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
        if fired_dips:
            raw = sorted({str(f.evidence[0].values.get("series")) for f in fired_dips})
            return Finding(name, "clear", "no backend N=2 busbw dip to explain; the N=2 dips are in raw-TCP series "
                           f"({'; '.join(raw)}): properties of those raw schedules, not a backend's mechanism")
        return Finding(name, "clear", "no N=2 busbw dip to explain")
    support: list[Finding] = []
    everywhere: list[str] = []
    for f in findings:
        if f.status != "fired" or f.rule not in READINGS:
            continue
        sizes = {e.values.get("world_size") for e in f.evidence} - {None}
        if 2 not in sizes:
            continue  # seen only at other world sizes, or at no known one: says nothing about N=2
        if any(n >= 3 for n in sizes):
            everywhere.append(f.rule)  # present at N>=3 too, so it cannot explain what only N=2 suffers
            continue
        support.append(f)
    if not support:
        missing = sorted({f.rule for f in findings if f.status == "undecided" and f.rule in READINGS})
        return Finding(name, "undecided",
                       "N=2 is slower but no experiment here isolates why"
                       + (f"; seen at N>=3 as well, so not specific to N=2: {', '.join(everywhere)}"
                          if everywhere else "")
                       + (f"; missing evidence for: {', '.join(missing)}" if missing else ""))
    readings = "; ".join(READINGS[f.rule] for f in support)
    evidence = tuple(Evidence(f"{f.rule}: {f.statement}", {"rule": f.rule, "strength": f.strength},
                              f.evidence[0].source, f.evidence[0].plot) for f in [*dips[:1], *support])
    strong = sum(f.strength == "strong" for f in support)
    strength = "strong" if strong >= 2 else "moderate" if strong == 1 or len(support) >= 2 else "weak"
    # No surer than the dip it explains.
    weakest_dip = max(STRENGTHS.index(f.strength) for f in dips[:1])
    strength = STRENGTHS[max(STRENGTHS.index(strength), weakest_dip)]
    statement = f"the N=2 loss is supported by: {readings}"
    ruled_out = [f.statement for f in findings if f.status == "clear" and f.rule in RULED_OUT]
    if ruled_out:
        statement += "; ruled out by experiment: " + "; ".join(ruled_out)
    if everywhere:
        statement += f" (not counted, seen at N>=3 too: {', '.join(everywhere)})"
    return Finding(name, "fired", statement, strength, evidence)


@dataclass(frozen=True)
class Suspect:
    """One suspected mechanism behind gloo's N=2 dip and the experiment that switches it on and off."""

    id: str                    # the finding's rule id
    name: str                  # what the mechanism is, in one phrase
    experiment: str | None     # the paired-experiment rule that toggles it; None: nothing here can
    shown: str                 # what a fired experiment means for this suspect
    ruled_out: str             # what a clear experiment means
    why_not_isolated: str      # why nothing here isolates it (with no experiment, or an undecided one)


# Issue 10's four suspects. Only an experiment that toggles a suspect can show it or rule it out; everything
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
            "raw TCP is slower with both directions (and their ACKs) on one connection than with one per direction; "
            "ACKs behind reverse data are one cost of sharing, not told apart from the others",
            "raw TCP with both directions, and each direction's ACKs behind the other's data, on one connection is "
            "as fast as one connection per direction",
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
            out.append(Finding(s.id, "fired", f"{s.name}: shown by {s.experiment} ({s.shown})",
                               experiment.strength, experiment.evidence, experiment.thresholds))
        elif experiment is not None and experiment.status == "clear":
            out.append(Finding(s.id, "clear", f"{s.name}: ruled out by {s.experiment} ({s.ruled_out}): "
                               f"{experiment.statement}", thresholds=experiment.thresholds))
        else:
            why = s.why_not_isolated
            if experiment is not None:
                why = f"{s.experiment} could not decide: {experiment.statement}"
            out.append(Finding(s.id, "undecided", f"{s.name}: not isolated ({why})"))
    return out

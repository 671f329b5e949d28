"""The verdict card: the answer a person reads in ten seconds, before any rule id.

It says what is slow (with the figure that shows it), why (the mechanism an experiment showed, or "not
isolated"), how sure, the one experiment that shows it, what to do (the measured workaround, its speed-up,
its code) and what was ruled out. It decides nothing itself: it only reads the findings the diagnosis rules
wrote (their rule ids, statuses, strengths, statements and evidence values) and the run's advise.json for
the code, so it can never claim more than the findings do; where they could not decide, it says so plainly.
The rule ids stay in the report's Findings section, which the card points to.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from diag.report.diagnose.findings import STRENGTHS, Finding
from diag.units import human_bytes, human_rate

HEADLINE = "headline.png"
# The rule ids the card reads. A rule the diagnosis does not have (renamed, or not run) reads as absent.
DIP, BELOW_RAW, MECHANISM, WORKAROUNDS, DATA_ERRORS = (
    "n2_busbw_dip", "backend_below_raw", "mechanism", "workarounds", "data_errors")
SUSPECT_PREFIX = "suspect_"
# Clear findings besides the suspects' that rule a suspected cause out (an experiment on the same run).
# (the paired experiments that toggle a suspect speak through the suspect's own finding).
RULED_OUT_RULES = {"cpu_bound": "the CPU", "exchange_order": "the order of send and receive",
                   "half_duplex_match": "a half-duplex schedule"}


# What the card calls the rules a statement may name (the card shows no rule ids; an id not here stays as it is).
PLAIN_NAMES = {
    "cpu_bound": "CPU samples", "exchange_order": "the send/receive order experiment",
    "half_duplex_match": "a half-duplex raw ring", "idle_gaps": "idle gaps on the wire",
    "low_duplex_overlap": "duplex overlap on the wire", "notice_behind_data": "the ready-notice experiment (M1)",
    "retransmissions": "retransmissions", "shared_connection": "the one-vs-two-connections experiment (M4)",
    "turn_taking": "turn-taking on the wire", "window_limited": "window and buffer limits",
    "backend_below_raw": "the raw-TCP reference", "n2_busbw_dip": "the N=2 dip",
}


def plain(text: str) -> str:
    """A statement with the rule ids it names replaced by what they look at."""
    return re.sub(r"\b[a-z][a-z0-9]*(?:_[a-z0-9]+)+\b", lambda m: PLAIN_NAMES.get(m.group(0), m.group(0)), text)


@dataclass(frozen=True)
class Fix:
    title: str
    speedup: float | None            # the smallest speed-up over the sizes it ran (gloo time / its time)
    p_value: float | None            # the largest p-value over those sizes (Welch)
    code: str = ""


@dataclass(frozen=True)
class Verdict:
    slow: str                        # what is slow, one sentence (or that nothing is, or that it cannot tell)
    slow_status: str                 # "fired" | "clear" | "undecided", of the finding it comes from
    why: str                         # the mechanism, or "not isolated" and why
    sure: str                        # strong | moderate | weak | "undecided" | "" (nothing to explain)
    shown_by: str                    # the one experiment that shows it ("" when none does)
    todo: str                        # what to do, one sentence
    fixes: tuple[Fix, ...] = ()
    ruled_out: tuple[str, ...] = ()
    not_isolated: tuple[str, ...] = ()
    figure: str | None = HEADLINE           # the report PNG that shows what is slow
    rules: tuple[str, ...] = field(default_factory=tuple)   # the findings read (the detail section has them)
    sure_detail: str = ""            # how sure of each link: the experiment, and its tie to this dip


def _by_rule(findings: Sequence[Finding]) -> dict[str, list[Finding]]:
    out: dict[str, list[Finding]] = {}
    for f in findings:
        out.setdefault(f.rule, []).append(f)
    return out


def _strongest(findings: Sequence[Finding]) -> Finding | None:
    fired = [f for f in findings if f.status == "fired"]
    if not fired:
        return None
    return min(fired, key=lambda f: STRENGTHS.index(f.strength) if f.strength in STRENGTHS else len(STRENGTHS))


def _is_backend(f: Finding) -> bool:
    series = str(f.evidence[0].values.get("series", "")) if f.evidence else ""
    return not series.startswith("raw:")


def _what_is_slow(rules: dict[str, list[Finding]]) -> tuple[str, str, list[str]]:
    dips = rules.get(DIP, [])
    dip = _strongest([f for f in dips if _is_backend(f)])
    if dip is not None:
        values = dip.evidence[-1].values
        first = dip.evidence[0].values
        axis = "D=" if " at D=" in dip.statement else ""
        per_rank = "" if axis else " per rank"
        series, op = values.get("series", "the backend"), values.get("op", "")
        ratio = values.get("ratio")
        # the reference the rule held N=2 against ("N>=3", or "N=3" where CPU-bound N were left out)
        named = re.search(r" below (N[>=][=\d,]*\d) at ", dip.statement)
        reference = named.group(1) if named else "N>=3"
        text = (f"{series} {op} at N=2: busbw is {1 - ratio:.0%} below {reference}" if isinstance(ratio, (int, float))
                else f"{series} {op}: busbw at N=2 is below {reference}")
        if isinstance(values.get("busbw_n2_Bps"), (int, float)) and isinstance(values.get("busbw_n3plus_Bps"),
                                                                                   (int, float)):
            text += (f" ({human_rate(values['busbw_n2_Bps'])} vs {human_rate(values['busbw_n3plus_Bps'])} at "
                     f"{axis}{human_bytes(int(values.get('size_bytes', 0)))}{per_rank})")
        if isinstance(first.get("size_bytes"), int):
            text += f", from {axis}{human_bytes(first['size_bytes'])}{per_rank} upward"
        return text + f" ({dip.strength} evidence).", "fired", [DIP]
    below = _strongest(rules.get(BELOW_RAW, []))
    if below is not None:
        return f"The backend is slower than raw TCP on the same link: {plain(below.statement)}.", "fired", [BELOW_RAW]
    wrong = _strongest(rules.get(DATA_ERRORS, []))
    if wrong is not None:
        return f"Wrong data, not speed, is the problem: {wrong.statement}.", "fired", [DATA_ERRORS]
    if dips and all(f.status == "undecided" for f in dips):
        return f"Cannot tell whether N=2 is slow: {plain(dips[0].statement)}.", "undecided", [DIP]
    if any(f.status == "fired" for f in dips):
        return ("No backend is slower at N=2; only raw-TCP experiment series dip there (their own schedules, "
                "by design)."), "clear", [DIP]
    if dips:
        return "Nothing is slow: busbw at N=2 is not below N>=3.", "clear", [DIP]
    return "Cannot tell whether anything is slow: no rule compared N=2 with N>=3.", "undecided", []


def _suspect_name(f: Finding) -> str:
    """'M4: ACKs queued ...' from a suspect finding's statement ('<name>: shown by ...', '<name>: ruled out
    by ...', '<name>: not isolated (...)')."""
    for marker in (": shown by ", ": ruled out by ", ": not isolated"):
        if marker in f.statement:
            return f.statement.split(marker, 1)[0]
    return f.statement


def _reading(text: str) -> str:
    """'experiment_id (what it means): figures (...)' -> 'what it means': the card names no rule ids. The
    reading is the first parenthesis, to its matching close (figures after it may hold their own)."""
    start = text.find("(")
    if start < 0:
        return ""
    depth = 0
    for index in range(start, len(text)):
        depth += {"(": 1, ")": -1}.get(text[index], 0)
        if depth == 0:
            return text[start + 1:index]
    return ""


def _after(text: str, marker: str) -> str:
    return text.split(marker, 1)[1] if marker in text else text


def _why(rules: dict[str, list[Finding]], slow_status: str) -> tuple[str, str, str, list[str], str]:
    suspects = [f for rule, fs in rules.items() if rule.startswith(SUSPECT_PREFIX) for f in fs]
    shown = _strongest(suspects)
    mech = (rules.get(MECHANISM) or [None])[0]
    if shown is not None:
        others = [f for f in suspects if f.status == "fired" and f is not shown]
        why = _suspect_name(shown)
        reading = _reading(_after(shown.statement, ": shown by "))
        if reading:
            why += f" ({reading})"
        if others:
            why += "; also shown: " + "; ".join(_suspect_name(f) for f in others)
        shown_by = shown.evidence[0].text if shown.evidence else ""
        if slow_status != "fired":
            why += " (shown by its experiment, though no backend dip was found to explain)"
        # No surer than the weaker link: the experiment shows the mechanism, the mechanism finding ties it to
        # this run's dip (and is itself no surer than the dip).
        sure, tie = shown.strength, ""
        if mech is not None and mech.status == "fired" and mech.strength in STRENGTHS:
            sure = STRENGTHS[max(STRENGTHS.index(mech.strength), STRENGTHS.index(shown.strength))]
            tie = (f"{shown.strength} that the experiment shows {why.split(':', 1)[0]}, {mech.strength} that it "
                   f"explains this run's dip")
        elif slow_status == "fired":
            tie = f"{shown.strength} that the experiment shows {why.split(':', 1)[0]}; not tied to the dip"
        return why, sure, shown_by, [shown.rule, *(f.rule for f in others)], tie
    if mech is not None and mech.status == "fired":
        support = _after(mech.statement, "supported by: ").split("; ruled out by experiment:", 1)[0]
        first = mech.evidence[1].text if len(mech.evidence) > 1 else ""
        return (f"Not isolated to one mechanism; the loss is consistent with: {plain(support)}",
                mech.strength, plain(first), [MECHANISM], "")
    if mech is not None and mech.status == "undecided":
        return f"Not isolated: {plain(mech.statement)}.", "undecided", "", [MECHANISM], ""
    if slow_status == "fired":
        return "Not isolated: no experiment here explains it.", "undecided", "", [MECHANISM] if mech else [], ""
    return "Nothing to explain.", "", "", [MECHANISM] if mech else [], ""


def _fixes(rules: dict[str, list[Finding]], advise: dict[str, Any] | None) -> tuple[str, list[Fix], list[str]]:
    found = (rules.get(WORKAROUNDS) or [None])[0]
    if found is None:
        return "No workaround was measured (no workarounds finding).", [], []
    if found.status == "undecided":
        return ("No workaround was measured in this run: `diag advise --lab NAME` (or the advise step of "
                "diag reproduce) measures each beside plain gloo.", [], [WORKAROUNDS])
    if found.status == "clear":
        return "No measured workaround is significantly faster than plain gloo here.", [], [WORKAROUNDS]
    codes = {w.get("name"): w for w in (advise or {}).get("workarounds", [])}
    fixes = []
    for e in found.evidence:
        name = e.values.get("workaround")
        entry = codes.get(name, {})
        fixes.append(Fix(str(entry.get("title") or name), e.values.get("speedup_min"), e.values.get("p_value_max"),
                         str(entry.get("code") or "")))
    fixes.sort(key=lambda f: -(f.speedup or 0))
    best = fixes[0]
    speed = f" ({best.speedup:.2f}x faster than plain gloo, measured in this run)" if best.speedup else ""
    also = "".join(f" Also faster: {f.title}" + (f" ({f.speedup:.2f}x)." if f.speedup else ".") for f in fixes[1:])
    return f"Use {best.title}{speed}.{also}", fixes, [WORKAROUNDS]


def _ruled_out(rules: dict[str, list[Finding]]) -> tuple[list[str], list[str], list[str]]:
    out, open_, used = [], [], []
    for rule, fs in rules.items():
        if not rule.startswith(SUSPECT_PREFIX):
            continue
        for f in fs:
            if f.status == "clear":
                reading = _reading(_after(f.statement, ": ruled out by ").split("): ", 1)[0] + ")")
                out.append(f"{_suspect_name(f)}" + (f" ({reading})" if reading else ""))
                used.append(rule)
            elif f.status == "undecided":
                open_.append(_suspect_name(f))
                used.append(rule)
    for rule, what in RULED_OUT_RULES.items():
        for f in rules.get(rule, []):
            if f.status == "clear":
                out.append(f"{what}: {plain(f.statement)}")
                used.append(rule)
    return out, open_, used


def _figure(rules: dict[str, list[Finding]]) -> str:
    """The figure on the axis the dip was found on: the headline (busbw against N at equal per-device volume
    D) for a dip at equal D, else the plot the finding cites (busbw against per-rank size)."""
    dip = _strongest([f for f in rules.get(DIP, []) if _is_backend(f)])
    if dip is None or " at D=" in dip.statement or not dip.evidence[0].plot:
        return HEADLINE
    return dip.evidence[0].plot


def build_verdict(run: Any, findings: Sequence[Finding], figure: str | None = None) -> Verdict:
    """The card from the findings (and advise.json for the workaround code)."""
    rules = _by_rule(findings)
    figure = figure or _figure(rules)
    slow, status, used_slow = _what_is_slow(rules)
    why, sure, shown_by, used_why, sure_detail = _why(rules, status)
    todo, fixes, used_fix = _fixes(rules, getattr(run, "advise", None))
    ruled_out, open_, used_out = _ruled_out(rules)
    used = tuple(dict.fromkeys([*used_slow, *used_why, *used_fix, *used_out]))
    return Verdict(slow, status, why, sure, shown_by, todo, tuple(fixes), tuple(ruled_out), tuple(open_), figure,
                   used, sure_detail)


def sure_text(v: Verdict) -> str:
    text = {"": "", "undecided": "undecided"}.get(v.sure, f"{v.sure} evidence")
    return f"{text} ({v.sure_detail})" if v.sure_detail and text else text


def verdict_lines(v: Verdict) -> list[str]:
    """The card for a terminal: the first thing diag reproduce, report and diagnose print."""
    lines = ["verdict:", f"  slow:       {v.slow}", f"  why:        {v.why}"]
    if v.sure:
        lines.append(f"  how sure:   {sure_text(v)}" + (f"; the experiment: {v.shown_by}" if v.shown_by else ""))
    lines.append(f"  to do:      {v.todo}")
    lines.append("  ruled out:  " + ("; ".join(v.ruled_out) if v.ruled_out else "nothing, by experiment"))
    if v.not_isolated:
        lines.append("  not tested: " + "; ".join(v.not_isolated))
    return lines

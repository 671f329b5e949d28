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
DIP, BELOW_RAW, MECHANISM, WORKAROUNDS, DATA_ERRORS, CONTROL = (
    "n2_busbw_dip", "backend_below_raw", "mechanism", "workarounds", "data_errors", "negative_control")
SUSPECT_PREFIX = "suspect_"
# Findings that name a host as the cause of a slowdown, with what each says the host does. cpu_bound names a
# host only through its evidence of kind "starved" (a node whose CPU is full while its link idles).
HOST_FAULTS = {"slow_host_link": "its link carries less than the other hosts' in the link matrix",
               "loss_at_host": "segments are lost on its directions",
               "window_at_host": "its receive window or send buffer holds its peers back",
               "cpu_bound": "its CPU is full while its link idles"}
# What to do about each, {place} being the host (or the link) the finding names.
FAULT_TODO = {"slow_host_link": "Check {place}'s NIC, cable and switch port (ethtool: speed, duplex, errors); every N "
                                "that includes it runs at its pace until then.",
              "loss_at_host": "Find where {place}'s packets drop (ethtool -S, tc -s qdisc, the switch port's buffers "
                              "and counters); every retransmission costs its flows time.",
              "window_at_host": "Give {place} the other nodes' TCP buffer settings (net.ipv4.tcp_rmem / tcp_wmem, "
                                "net.core.rmem_max / wmem_max).",
              "cpu_bound": "Free {place}'s CPU (other jobs, a CPU quota, its clock) or give its ranks more cores."}
# Findings shown beside the faults: how the nodes differ explains nothing alone, but says where to look.
HOST_NOTES = ("node_fingerprints",)
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
    "negative_control": "the negative control (raw TCP)", "slow_host_link": "the link matrix",
    "loss_at_host": "retransmissions per host", "window_at_host": "window limits per host",
    "node_fingerprints": "the node fingerprints",
}


def plain(text: str) -> str:
    """A statement with the rule ids it names replaced by what they look at."""
    return re.sub(r"\b[a-z][a-z0-9]*(?:_[a-z0-9]+)+\b", lambda m: PLAIN_NAMES.get(m.group(0), m.group(0)), text)


@dataclass(frozen=True)
class Fix:
    title: str
    speedup: float | None            # the smallest speed-up over the sizes it ran (gloo time / its time)
    speedup_low: float | None        # the smallest lower end of its speed-up's interval over those sizes (the
                                     # advise trial's block bootstrap, the statistic that advised it)
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
    hosts: tuple[str, ...] = ()      # what the host findings name (faults, then how the nodes differ)


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


def host_faults(rules: dict[str, list[Finding]]) -> list[Finding]:
    """The fired findings that name a host as a cause, strongest first."""
    found = [f for rule in HOST_FAULTS for f in rules.get(rule, []) if f.status == "fired"
             and (rule != "cpu_bound" or any(e.values.get("kind") == "starved" for e in f.evidence))]
    return sorted(found, key=lambda f: STRENGTHS.index(f.strength) if f.strength in STRENGTHS else len(STRENGTHS))


def _control_dipped(rules: dict[str, list[Finding]]) -> Finding | None:
    return next((f for f in rules.get(CONTROL, []) if f.status == "fired"), None)


def _backend_dips(rules: dict[str, list[Finding]]) -> list[Finding]:
    return [f for f in rules.get(DIP, []) if _is_backend(f) and not f.statement.startswith("raw:")]


def _what_is_slow(rules: dict[str, list[Finding]]) -> tuple[str, str, list[str]]:
    dips = rules.get(DIP, [])
    dip = _strongest(_backend_dips(rules))
    control = _control_dipped(rules)
    faults = host_faults(rules)
    if dip is not None and control is not None:
        text, status, used = _dip_text(dip)
        itself = any(e.values.get("series") == _series_of(dip) for e in control.evidence)
        tail = ("; it takes no turns on a connection itself (the negative control), so what slows it is no "
                "turn-taking mechanism's." if itself else "; so is a transport that does not take turns (the "
                "negative control), so the slowdown is not the backend's own.")
        return text[:-1] + tail, status, [*used, CONTROL]
    if dip is not None:   # a host fault beside it has its own row (at the hosts) and its own "to do"
        return _dip_text(dip)
    open_dip = next((f for f in _backend_dips(rules) if f.status == "undecided"), None)
    if faults:
        head = plain(faults[0].statement).split("; ", 1)[0]
        text = f"One host slows the run: {head}."
        if open_dip is not None and _link_loss(open_dip):
            text += f" Whether the backend loses more at N=2 is undecided: {_link_loss(open_dip)}."
        return text, "fired", [faults[0].rule]
    return _not_a_dip(rules, dips)


def _series_of(f: Finding) -> str:
    return str(f.evidence[0].values.get("series", "")) if f.evidence else ""


def _cpu_at(rules: dict[str, list[Finding]], world_size: int) -> Finding | None:
    """cpu_bound fired with evidence at this N (the machine, or a thread, saturated there)."""
    return next((f for f in rules.get("cpu_bound", []) if f.status == "fired"
                 and any(e.values.get("world_size") == world_size for e in f.evidence)), None)


def _link_loss(f: Finding) -> str:
    """'torch:gloo at N=2 ran at 0.69x the link measured beside it ...' from an undecided dip whose evidence is
    the link (the survey and the link disagree), else ''."""
    links = [e.values for e in f.evidence if e.values.get("reference_kind") in ("trial", "matrix")]
    if not links:
        return ""
    worst = min(links, key=lambda v: v.get("ratio", 1.0))
    where = "in the same interleaved rounds" if worst.get("reference_kind") == "trial" else "in the link matrix"
    return (f"{worst.get('series', 'the backend')} {worst.get('op', '')} at N=2 ran at {worst['ratio']:.2f}x the link "
            f"measured beside it {where} ({_busbw_pair(worst)} at D={human_bytes(int(worst.get('size_bytes', 0)))})")


def _busbw_pair(values: dict[str, Any]) -> str:
    n2, reference = values.get("busbw_n2_Bps"), values.get("busbw_reference_Bps", values.get("busbw_n3plus_Bps"))
    if isinstance(n2, (int, float)) and isinstance(reference, (int, float)):
        return f"mean busbw {human_rate(n2)} vs {human_rate(reference)}"
    return "mean busbw"


def _dip_text(dip: Finding) -> tuple[str, str, list[str]]:
    """What is slow, from the strongest backend dip: its ratio against the reference it names (N>=3 that served,
    or the link beside it), its figures at its deepest size, its onset, and what the reference left out."""
    deepest = min(dip.evidence, key=lambda e: e.values.get("ratio", 1.0))
    values = deepest.values
    first = dip.evidence[0].values
    axis = "D=" if " at D=" in dip.statement else ""
    per_rank = "" if axis else " per rank"
    series, op = values.get("series", "the backend"), values.get("op", "")
    ratio = values.get("ratio")
    kind = values.get("reference_kind", "survey")
    # the reference the rule held N=2 against: the N>=3 that served ("N=3,4", "N=3"), or the link beside it
    named = re.search(r" below (N[>=][=\d,]*\d) at ", dip.statement)
    reference = {"trial": "the link measured beside it in the same interleaved rounds",
                 "matrix": "the link matrix's edge between its hosts"}.get(
                     kind, str(values.get("reference") or (named.group(1) if named else "N>=3")))
    text = (f"{series} {op} at N=2: busbw is {1 - ratio:.0%} below {reference}" if isinstance(ratio, (int, float))
            else f"{series} {op}: busbw at N=2 is below {reference}")
    if isinstance(values.get("busbw_n2_Bps"), (int, float)):
        text += f" ({_busbw_pair(values)} at {axis}{human_bytes(int(values.get('size_bytes', 0)))}{per_rank})"
    if isinstance(first.get("size_bytes"), int):
        text += f", from {axis}{human_bytes(first['size_bytes'])}{per_rank} upward"
    left = [part.removeprefix("N>=3 cannot serve as the reference: ") for part in dip.statement.split("; ")
            if " left out " in part]
    if left:
        text += "; " + "; ".join(plain(part) for part in left)
    return text + f" ({dip.strength} evidence).", "fired", [DIP]


def _not_a_dip(rules: dict[str, list[Finding]], dips: list[Finding]) -> tuple[str, str, list[str]]:
    below = _strongest(rules.get(BELOW_RAW, []))
    if below is not None:
        return f"The backend is slower than raw TCP on the same link: {plain(below.statement)}.", "fired", [BELOW_RAW]
    wrong = _strongest(rules.get(DATA_ERRORS, []))
    if wrong is not None:
        return f"Wrong data, not speed, is the problem: {wrong.statement}.", "fired", [DATA_ERRORS]
    backend = _backend_dips(rules)
    open_ = [f for f in backend if f.status == "undecided"]
    if open_:
        loss = next((_link_loss(f) for f in open_ if _link_loss(f)), "")
        if loss:
            return (f"Cannot tell whether N=2 is slower than N>=3, but {loss}: {plain(open_[0].statement)}.",
                    "undecided", [DIP])
        return f"Cannot tell whether N=2 is slow: {plain(open_[0].statement)}.", "undecided", [DIP]
    if any(f.status == "fired" for f in dips):
        return ("No backend is slower at N=2; only raw-TCP experiment series dip there (their own schedules, "
                "by design)."), "clear", [DIP]
    if backend:
        reference = backend[0].statement.split(": busbw at N=2 is not below ", 1)[-1].split(" (", 1)[0]
        return f"Nothing is slow: busbw at N=2 is not below {reference}.", "clear", [DIP]
    if dips:
        return (f"Cannot tell whether the backend is slow: no backend series was compared ({plain(dips[0].statement)})."
                , "undecided", [DIP])
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


def fault_place(f: Finding) -> str:
    """'h3', or 'the link h1 -> h3', from a host finding's evidence values."""
    for e in f.evidence:
        if e.values.get("node"):
            return str(e.values["node"])
        if e.values.get("src") and e.values.get("dst"):
            return f"the link {e.values['src']} -> {e.values['dst']}"
    return "one host"


def _fault_why(f: Finding) -> str:
    place = fault_place(f)
    what = ("it carries less than its ends do on their other links" if place.startswith("the link")
            else HOST_FAULTS[f.rule])
    return f"{place}: {what}"


def _host_lines(rules: dict[str, list[Finding]], shown: Finding | None) -> list[str]:
    """The host findings for the card's own row: every fault but the one already shown as what is slow, then
    how the nodes differ."""
    lines = [f"{_fault_why(f)} ({plain(f.statement)})" for f in host_faults(rules) if f is not shown]
    lines += [plain(f.statement) for rule in HOST_NOTES for f in rules.get(rule, []) if f.status in ("fired", "observed")]
    return lines


def _why(rules: dict[str, list[Finding]], slow_status: str) -> tuple[str, str, str, list[str], str]:
    control = _control_dipped(rules)
    faults = host_faults(rules)
    if control is not None:
        causes = [_fault_why(f) for f in faults]
        cpu = _cpu_at(rules, 2)
        if cpu is not None and cpu not in faults:
            causes.append(f"the CPU: {plain(cpu.statement).split('; ', 1)[0]}")
        named = ("; what the findings name: " + "; ".join(causes)) if causes else "; no host finding names what slows it"
        return (f"Not the backend's N=2 protocol: N=2 is slower for a transport that does not take turns too{named}.",
                control.strength, plain(control.evidence[0].text), [CONTROL, *(f.rule for f in faults)], "")
    backend_dip = _strongest(_backend_dips(rules))
    if backend_dip is None and faults:
        # The rest of the fault's statement (after what "slow" shows) is why it slows the run: the N it paces,
        # the sysctl it is tied to, what the loss costs. Observations, not an experiment: no "shown by".
        first = faults[0]
        rest = plain(first.statement).split("; ", 1)[1:]
        return (f"A fault at {_fault_why(first)}, not the backend's N=2 mechanism" + (f": {rest[0]}." if rest else "."),
                first.strength, "", [first.rule], f"from {PLAIN_NAMES.get(first.rule, first.rule)}")
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
        fixes.append(Fix(str(entry.get("title") or name), e.values.get("speedup_min"), e.values.get("speedup_low_min"),
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
    """The card from the findings (and advise.json for the workaround code); a run of ``diag trial`` gets the
    card of its arms (diag.report.arms), not of the N=2 anomaly it did not look for."""
    from diag.report.arms import arm_card

    programs = arm_card(run) if run is not None else None
    if programs is not None:
        return Verdict(**programs)
    rules = _by_rule(findings)
    figure = figure or _figure(rules)
    slow, status, used_slow = _what_is_slow(rules)
    why, sure, shown_by, used_why, sure_detail = _why(rules, status)
    todo, fixes, used_fix = _fixes(rules, getattr(run, "advise", None))
    ruled_out, open_, used_out = _ruled_out(rules)
    faults = host_faults(rules)
    shown = faults[0] if faults and faults[0].rule in used_slow else None
    backend_dip = _strongest(_backend_dips(rules))
    if shown is not None:   # the run is slowed at a host, not by the backend: the host is what to fix
        todo, fixes = FAULT_TODO[shown.rule].format(place=fault_place(shown)), []
    elif faults and backend_dip is not None and _control_dipped(rules) is None:
        # Two causes in one run: the backend's N=2 loss against its own link (what is slow, why) and a host
        # fault (at the hosts). The card names both, and both are what to do.
        todo += " And at the hosts: " + FAULT_TODO[faults[0].rule].format(place=fault_place(faults[0]))
    hosts = _host_lines(rules, shown)
    if shown is not None and figure == HEADLINE:
        figure = shown.evidence[0].plot or figure
    used = tuple(dict.fromkeys([*used_slow, *used_why, *used_fix, *used_out]))
    return Verdict(slow, status, why, sure, shown_by, todo, tuple(fixes), tuple(ruled_out), tuple(open_), figure,
                   used, sure_detail, tuple(hosts))


def sure_text(v: Verdict) -> str:
    text = {"": "", "undecided": "undecided"}.get(v.sure, f"{v.sure} evidence")
    return f"{text} ({v.sure_detail})" if v.sure_detail and text else text


# A card line longer than this shows its first clause; the rest is in the report (HTML: one click away).
FOLD_CHARS = 320


def first_clause(text: str, limit: int = FOLD_CHARS) -> tuple[str, str]:
    """(head, rest): text up to the end of its first clause ('; ' or '. ' outside parentheses) within limit
    characters, else up to the last space before it; (text, "") when text is not longer than limit."""
    if len(text) <= limit:
        return text, ""
    depth, cut = 0, -1
    for i, ch in enumerate(text[:limit]):
        depth += (ch == "(") - (ch == ")")
        if depth == 0 and ch in ";." and text[i + 1:i + 2] == " ":
            cut = i
            break
    if cut < 0:
        cut = text.rfind(" ", 0, limit)
    return text[:cut + 1].rstrip(), text[cut + 1:].strip()


def _terminal(text: str) -> str:
    head, rest = first_clause(text)
    return head + (f" [{len(rest.split())} more words: report.html, Verdict]" if rest else "")


def verdict_lines(v: Verdict) -> list[str]:
    """The card for a terminal: the first thing diag reproduce, report and diagnose print (a long why or
    at-hosts line shows its first clause; the report has all of it)."""
    lines = ["verdict:", f"  slow:       {v.slow}", f"  why:        {_terminal(v.why)}"]
    if v.sure:
        lines.append(f"  how sure:   {sure_text(v)}" + (f"; the experiment: {v.shown_by}" if v.shown_by else ""))
    if v.hosts:
        lines.append("  at hosts:   " + _terminal("; ".join(v.hosts)))
    lines.append(f"  to do:      {v.todo}")
    lines.append("  ruled out:  " + ("; ".join(v.ruled_out) if v.ruled_out else "nothing, by experiment"))
    if v.not_isolated:
        lines.append("  not tested: " + "; ".join(v.not_isolated))
    return lines

"""One rule for every paired experiment: arms that differ in one knob, held against each other by a design
that earns its verdict (diag.verdicts): a positive control, the share of the anomaly the toggle explains,
bootstrap intervals over blocks, and "undecided" whenever the data cannot decide.

An experiment is a row of data (``EXPERIMENTS``): the knob, its two values (``on``: the suspect switched on),
the design, the reference rows it needs, and the sentences its finding uses. Its evidence comes first from
the run's interleaved trials (diag/trial.py: the comparisons whose ``rule`` is the experiment's id, decided
exactly as the trial decided them while it ran); without a trial, from survey rows paired by knob, one
block per launch, which the finding says are not interleaved. Every size the experiment ran is judged: a
suspect shown at one size and ruled out at another is undecided, with both.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

from diag.records import Record
from diag.report.diagnose.base import undecided
from diag.report.diagnose.findings import Evidence, Finding
from diag.report.rundir import RunData
from diag.report.series import knob, series_label
from diag.report.thresholds import (
    CONTROL_DIP,
    CPU_CONFOUND_MARGIN,
    CPU_CONFOUNDED,
    MIN_ROUNDS,
    ORDER_EFFECT,
    RULED_OUT_SHARE,
    SHOWN_SHARE,
    Threshold,
    used,
)
from diag.stats import Arm, Interval
from diag.trialspec import arms_of, cpu_of
from diag.units import human_bytes
from diag.verdicts import Decision, control, difference, explained_share, loss_share


@dataclass(frozen=True)
class Judged:
    """One decision of an experiment: where (series, op, N, size), what, and the share of the backend's
    N=2 loss it accounts for where that can be measured in the same rounds."""

    label: str
    op: str
    world_size: int
    size_bytes: int
    decision: Decision
    source: str
    budget_spent: bool = False
    loss_share: Interval | None = None     # of the backend's loss against the healthy arm, same rounds

    def text(self) -> str:
        d = self.decision
        how = (f"{d.rounds} interleaved rounds" if d.interleaved else f"{d.rounds} separate launch(es) an arm, "
               "not interleaved")
        p = f", Mann-Whitney p={d.p_value:.2g}" if d.p_value is not None else ""
        budget = "; undecided (budget): the trial's time ran out" if self.budget_spent and d.verdict == "undecided" else ""
        share = (f"; accounts for {self.loss_share.point:.0%} [{self.loss_share.low:.0%}, "
                 f"{self.loss_share.high:.0%}] of the backend's N=2 loss" if self.loss_share else "")
        return (f"{self.label} {self.op} N={self.world_size} {human_bytes(self.size_bytes)}: {d.reason}{share} "
                f"({how}{p}){budget}")

    def short(self) -> str:
        """The figures a verdict rests on, in one clause (the evidence has the whole sentence)."""
        d = self.decision
        how = f"{d.rounds} {'interleaved rounds' if d.interleaved else 'launches an arm'}"
        where = f"N={self.world_size} {human_bytes(self.size_bytes)}"
        if d.share is None:
            ratio = f"time ratio {d.ratio.text()}" if d.ratio else d.reason
            return f"{self.label} {where}: {ratio} ({how})"
        what = "removes" if d.design == "knock-out" else "reproduces"
        loss = (f", {self.loss_share.point:.0%} [{self.loss_share.low:.0%}, {self.loss_share.high:.0%}] of the "
                "backend's N=2 loss" if self.loss_share is not None and d.design == "knock-out" else "")
        return (f"{where}: the toggle {what} {d.share.point:.0%} [{d.share.low:.0%}, {d.share.high:.0%}] of the "
                f"{'base arm' if d.design == 'knock-out' else 'backend'}'s loss{_beyond(d.share.point)}{loss} ({how})")


def _beyond(share: float) -> str:
    """What a share outside 0..100% means, said where it is quoted (a ratio of two noisy differences)."""
    if share > 1:
        return " (over 100%: with the toggle the arm ran faster than the healthy reference)"
    if share < 0:
        return " (below 0: the toggle made the arm slower)"
    return ""


@dataclass(frozen=True)
class PairedExperiment:
    id: str                          # the rule id of its findings (and of the trial comparisons it reads)
    knob: str                        # the knob toggled
    on: str                          # knob value with the suspected mechanism on (difference: the changed value)
    off: str                         # knob value with it off (difference: the reference value)
    design: str                      # diag.verdicts.DESIGNS
    headline: str                    # shown: "<headline>: <where>"
    clear: str                       # ruled out: "<clear>: <where>"
    absent: str                      # undecided: no rows toggle the knob
    one_value: str                   # undecided: rows at one of the two values only
    reading: str                     # what a shown finding says about the mechanism behind an N=2 dip
    effect: Threshold | None = None  # difference: the smallest change that counts
    rules_out: bool = True           # a clear finding rules the suspected mechanism out
    backend: str | None = None       # only rows of this backend toggle the knob ("raw"); None: any
    hold: tuple[str, ...] = ()       # further knobs that may differ within a pair (left out of its label)
    # survey rows only: the reference rows of a pair (knock-out: the healthy reference; knock-in: the anomaly)
    reference: Callable[[Record], bool] | None = None

    # A rule's id is its __name__, for functions and experiments alike.
    @property
    def __name__(self) -> str:
        return self.id

    def thresholds(self) -> dict[str, float]:
        if self.design == "difference":
            return used(*(t for t in (self.effect, MIN_ROUNDS, CPU_CONFOUNDED, CPU_CONFOUND_MARGIN) if t is not None))
        return used(CONTROL_DIP, SHOWN_SHARE, RULED_OUT_SHARE, MIN_ROUNDS, CPU_CONFOUNDED, CPU_CONFOUND_MARGIN)

    def value_of(self, record: Record) -> str | None:
        if self.backend is not None and record.backend != self.backend:
            return None
        value = knob(record, self.knob)
        return str(value) if value in (self.on, self.off) else None

    def __call__(self, run: RunData) -> list[Finding]:
        judged = self.from_trials(run)
        if not judged:
            judged_or_why = self.from_rows(run)
            if isinstance(judged_or_why, str):
                return undecided(self.id, judged_or_why, *(t for t in (self.effect, MIN_ROUNDS) if t))
            judged = judged_or_why
        return [self.finding(judged)]

    # --- evidence from interleaved trials ---------------------------------------------------------------
    def from_trials(self, run: RunData) -> list[Judged]:
        out: list[Judged] = []
        for spec, blocks, end in run.trials:
            source = run.source_of(blocks[0]) if blocks else "?"
            anomaly = next((a.name for a in spec.arms if a.backend != "raw"), None)
            for comparison in spec.comparisons:
                if comparison.rule != self.id:
                    continue
                for size in spec.sizes:
                    arms = arms_of(blocks, spec.name, size)
                    if not all(name in arms for name in comparison.arm_names):
                        continue
                    decision = comparison.decide(arms, cpu_of(blocks, spec.name, size), spec.seed)
                    stopped = (end.get("sizes") or {}).get(str(size), {}).get("stopped")
                    arm = spec.arm(comparison.on)
                    label = f"{spec.name}: {comparison.on} vs {comparison.off}"
                    share = None
                    # A share of the backend's loss only where the backend shows one (its positive control):
                    # a toggle's gain over a backend that is not slow is no share of anything (diag_tcp).
                    if (comparison.design == "knock-out" and anomaly and anomaly in arms and anomaly != comparison.on
                            and control(arms[anomaly], arms[comparison.reference], spec.seed).status == "shown"):
                        share = loss_share(arms[anomaly], arms[comparison.reference], arms[comparison.on],
                                           arms[comparison.off], spec.seed)
                    elif comparison.design == "knock-in":
                        share = decision.share
                    out.append(Judged(label, arm.op, blocks[0].world_size, size, decision, source,
                                      stopped == "budget", share))
        return out

    # --- evidence from survey rows (no trial): one block per launch --------------------------------------
    def from_rows(self, run: RunData) -> list[Judged] | str:
        groups: dict[tuple[str, str, int, int], dict[str, list[Record]]] = defaultdict(lambda: defaultdict(list))
        for r in run.records:
            value = self.value_of(r)
            if value is not None:
                label = series_label(r, without=(self.knob, *self.hold))
                groups[(label, r.op, r.world_size, r.size_bytes)][value].append(r)
        both = {k: v for k, v in groups.items() if len(v) == 2}
        if not both:
            return self.one_value if groups else self.absent
        out: list[Judged] = []
        reasons: list[str] = []
        for (label, op, n, size), rows in sorted(both.items()):
            on = Arm.of(self.on, [r.times_s for r in rows[self.on]])
            off = Arm.of(self.off, [r.times_s for r in rows[self.off]])
            source = run.source_of(rows[self.on][0])
            if self.design == "difference":
                assert self.effect is not None
                decision = difference(off, on, float(self.effect.value))
            else:
                refs = [r for r in run.records if self.reference is not None and self.reference(r)
                        and r.op == op and r.world_size == n and r.size_bytes == size]
                if not refs:
                    reasons.append(f"{label} {op} N={n} {human_bytes(size)}: no reference rows for the "
                                   f"{self.design} design")
                    continue
                reference = Arm.of("reference", [r.times_s for r in refs])
                decision = (explained_share(on, off, on, reference, "knock-out") if self.design == "knock-out"
                            else explained_share(on, off, reference, off, "knock-in"))
            out.append(Judged(label, op, n, size, decision, source,
                              loss_share=decision.share if self.design == "knock-in" else None))
        return out or "; ".join(reasons)

    # --- the finding -----------------------------------------------------------------------------------
    def finding(self, judged: list[Judged]) -> Finding:
        """Per subject (a trial comparison, or a series of rows), its sizes combine: shown where some size shows
        it and none rules it out, and the other way round; sizes that disagree leave the subject undecided.
        Across subjects: fired if one is shown, clear if all are ruled out."""
        thresholds = self.thresholds()
        subjects: dict[str, list[Judged]] = defaultdict(list)
        for j in judged:
            subjects[j.label].append(j)
        shown: list[Judged] = []
        ruled: list[Judged] = []
        disagree: list[str] = []
        for label, items in subjects.items():
            yes = [j for j in items if j.decision.verdict == "shown"]
            no = [j for j in items if j.decision.verdict == "ruled_out"]
            if yes and no:
                disagree.append(f"{label}: the sizes disagree: shown at " + "; ".join(j.text() for j in yes)
                                + "; ruled out at " + "; ".join(j.text() for j in no))
            elif yes:
                shown.extend(yes)
            elif no and len(no) == len(items):
                ruled.extend(no)
        if disagree and not shown:
            return Finding(self.id, "undecided", "; ".join(disagree), thresholds=thresholds)
        if ruled and len({j.label for j in ruled}) < len(subjects) and not shown:
            ruled = []          # some subject ruled out, another undecided: not cleared as a whole
        if shown:
            evidence = tuple(self.evidence(j) for j in shown)
            lows = [j.decision.share.low if j.decision.share else 0.0 for j in shown]
            strong = len(shown) >= 2 or max(lows) >= 0.75 or (self.design == "difference" and len(shown) >= 1
                                                                and all(j.decision.interleaved for j in shown))
            rest = [j for j in judged if j not in shown]
            statement = f"{self.headline}: " + "; ".join(j.short() for j in shown)
            if rest:
                statement += "; elsewhere: " + "; ".join(j.short() for j in rest)
            return Finding(self.id, "fired", statement, "strong" if strong else "moderate", evidence, thresholds,
                           explains=explained(shown))
        if ruled:
            rest = [j for j in judged if j not in ruled]
            statement = f"{self.clear}: " + "; ".join(j.short() for j in ruled)
            if rest:
                statement += "; elsewhere: " + "; ".join(j.short() for j in rest)
            return Finding(self.id, "clear", statement, thresholds=thresholds, explains="none: ruled out",
                           evidence=tuple(self.evidence(j) for j in judged))
        return Finding(self.id, "undecided", f"{self.id} could not decide: " + "; ".join(j.text() for j in judged),
                       thresholds=thresholds)

    def evidence(self, j: Judged) -> Evidence:
        d = j.decision
        values: dict[str, object] = {"world_size": j.world_size, "size_bytes": j.size_bytes, "verdict": d.verdict,
                                     "design": d.design, "rounds": d.rounds, "interleaved": d.interleaved,
                                     "p_value": d.p_value, "means_s": d.means_s}
        if d.share is not None:
            values["share"] = d.share.to_json()
        if d.ratio is not None:
            values["ratio"] = d.ratio.to_json()
        if d.control is not None:
            values["control_ratio"] = d.control.ratio.to_json()
        if j.loss_share is not None:
            values["loss_share"] = j.loss_share.to_json()
        return Evidence(j.text(), values, j.source, "busbw_vs_size.png")


def explained(shown: list[Judged]) -> str:
    """'85% [70%, 98%] at 16 MiB; ...' of the backend's N=2 loss, where the trial measured it."""
    parts = [f"{j.loss_share.point:.0%} [{j.loss_share.low:.0%}, {j.loss_share.high:.0%}] at "
             f"{human_bytes(j.size_bytes)}" for j in shown if j.loss_share is not None]
    return "; ".join(parts) or "not measured: no backend arm in the same rounds"


def is_raw_reference(record: Record) -> bool:
    """Raw TCP ring at the raw transport's defaults (one connection per direction): the healthy link."""
    return (record.backend == "raw" and record.algo == "ring"
            and series_label(record, without=("order",)) == "raw:ring")


EXCHANGE_ORDER = PairedExperiment(
    id="exchange_order", knob="order", on="send-first", off="recv-first", design="difference",
    effect=ORDER_EFFECT,
    headline="the order of send and receive changes throughput",
    clear="the exchange order does not change throughput",
    absent="no rows record an order (exchange --order): cannot tell whether the order matters",
    one_value="rows ran in one order only: run exchange with --order recv-first and send-first: cannot tell "
              "whether the order matters",
    reading="the order of send and receive on a pair changes throughput")

# M4: raw TCP with both directions (and each direction's ACKs behind the other's data) on one connection,
# against one connection per direction: does switching sharing ON reproduce most of the backend's N=2 loss?
SHARED_CONNECTION = PairedExperiment(
    id="shared_connection", knob="conn", on="shared", off="split", design="knock-in", backend="raw",
    hold=("emulate",), reference=lambda r: r.backend != "raw",
    headline="both directions on one TCP connection reproduce most of the backend's N=2 loss",
    clear="sharing one connection for both directions reproduces none of the backend's N=2 loss",
    absent="no raw rows with both --conn shared and --conn split: cannot tell what sharing one connection for "
           "both directions costs",
    one_value="no raw rows with both --conn shared and --conn split: cannot tell what sharing one connection "
              "for both directions costs",
    reading="raw TCP reproduces the loss when both directions share one connection")

# Mechanism M1: gloo's ready-to-receive notice travels in-band on the pair's one byte stream, so a rank that
# is already writing data queues its notice behind that data and the peer's send waits. The raw transport's
# protocol model (--emulate gloo) must show the loss against the link in the same run (positive control);
# then moving only the notice to its own connection must remove most of it to show M1, or none to rule it out.
NOTICE_CHANNEL = PairedExperiment(
    id="notice_behind_data", knob="notice", on="in-band", off="own-conn", design="knock-out", backend="raw",
    reference=is_raw_reference,
    headline="M1 shown: the ready-to-receive notice queued behind the rank's own data on the shared pair costs "
             "throughput; on its own connection the same protocol runs most of the way to the link",
    clear="M1 ruled out by experiment: gloo's protocol model shows the loss, and moving the ready notice to its "
          "own connection removes none of it",
    absent="M1 (ready notice queued behind own data on the shared pair) not isolated: no raw rows toggle --notice "
           "in-band / own-conn (e.g. --emulate gloo beside --emulate gloo --notice own-conn)",
    one_value="M1 (ready notice queued behind own data on the shared pair) not isolated: the raw rows ran with one "
              "--notice value only (add --emulate gloo --notice own-conn beside --emulate gloo)",
    reading="M1: the ready notice waits behind the rank's own data on the shared pair (the raw protocol model "
            "with the notice on its own connection is faster)")

# The paired experiments diagnose runs, in report order.
EXPERIMENTS: tuple[PairedExperiment, ...] = (SHARED_CONNECTION, EXCHANGE_ORDER, NOTICE_CHANNEL)

"""How an experiment earns a verdict: positive controls, the share of an anomaly a toggle explains, and
intervals that decide (or say "undecided"). Pure functions of timed samples (diag.stats.Arm), used alike by
the interleaved trial while it runs (to stop once every verdict is decided) and by diagnose afterwards
(from the records files), so the run and its report can never disagree.

Three designs, each a comparison of arms by their mean time per iteration (docs/methodology.md):

* knock-out: the base arm runs with the suspected mechanism on and must show the anomaly against a healthy
  reference in the same run (the positive control); the toggle arm switches the mechanism off. The share
  of the base arm's loss the toggle removes, (T_on - T_off) / (T_on - T_healthy), shows the suspect when
  its whole interval is at least SHOWN_SHARE, and rules it out when its whole interval is at most
  RULED_OUT_SHARE. Without a positive control nothing is decided: a toggle of an effect that did not
  occur says nothing about its cause.
* knock-in: the healthy arm with the suspect switched on. The anomaly arm (the backend) must show the
  anomaly against the healthy arm; the share of the anomaly's loss that switching the suspect on
  reproduces, (T_on - T_off) / (T_anomaly - T_off), decides as above.
* difference: two arms, two-sided, an effect threshold: an effect when the interval of the time ratio
  excludes 1 and the point is at least the threshold away; none when the interval lies within it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from diag.stats import Arm, Interval, bootstrap_means, interval, mann_whitney_p, modes


@dataclass(frozen=True)
class Threshold:
    name: str
    value: float | int
    meaning: str


CONTROL_DIP = Threshold("CONTROL_DIP", 0.8, "an arm shows the anomaly (the positive control) when its busbw is "
                        "at most this fraction of the healthy reference's and the interval of that ratio stays "
                        "below 1; it does not show it when the whole interval is at least this")
SHOWN_SHARE = Threshold("SHOWN_SHARE", 0.5, "a toggle shows a suspect when the whole interval of the share of "
                        "the anomaly's loss it removes (knock-out) or reproduces (knock-in) is at least this: "
                        "most of the way to the healthy reference")
RULED_OUT_SHARE = Threshold("RULED_OUT_SHARE", 0.25, "a toggle rules a suspect out when the whole interval of "
                            "that share is at most this, with the positive control shown in the same run")
MIN_ROUNDS = Threshold("MIN_ROUNDS", 3, "fewest blocks (interleaved rounds, or launches) an arm needs before "
                       "any verdict is taken on it")
CPU_CONFOUNDED = Threshold("CPU_CONFOUNDED", 0.9, "an arm whose machine was at least this busy (all cores "
                           "averaged), or one of whose ranks had a thread at least this share of a core, while "
                           "the arm it is held against was not (CPU_CONFOUND_MARGIN below it on the same measure), "
                           "can neither convict nor clear a network mechanism")
CPU_CONFOUND_MARGIN = Threshold("CPU_CONFOUND_MARGIN", 0.1, "how far below CPU_CONFOUNDED the arm held against must "
                                "be, on the same measure, to have run unsaturated: arms interleaved in the same "
                                "rounds beside one load read 90% and 95% of the machine (beside the parallel test "
                                "suite, rank threads at 6% of a core), one condition and no confounder")
WORKAROUND_EFFECT = Threshold("WORKAROUND_EFFECT", 0.1, "a workaround (diag advise) runs beside plain gloo in the "
                              "same rounds; its time ratio must differ by at least this fraction, with the whole "
                              "interval of the ratio below 1, before it is advised")
CPU_LINK_REACHED = Threshold("CPU_LINK_REACHED", 0.85, "what a measured rate must reach of the link's to show the "
                             "link, not the CPU, sets the pace: below it a busy machine limits that N (raw TCP at N "
                             "against the measured link rate), the lab's one stream (against its shaped bound) and "
                             "the ring pattern of N flows at once (against the single stream: the pattern, not the "
                             "link, is then the reference at that N)")

DESIGNS = ("knock-out", "knock-in", "difference")
VERDICTS = ("shown", "ruled_out", "undecided")


@dataclass(frozen=True)
class Control:
    """Does an arm show the anomaly against the healthy reference? busbw ratio = T_healthy / T_arm."""

    ratio: Interval
    status: str            # "shown" | "absent" | "unsure"
    modes: str             # the arm's modes in words

    def text(self) -> str:
        return f"busbw {self.ratio.point:.2f}x the healthy reference [{self.ratio.low:.2f}, {self.ratio.high:.2f}]"


def control_status(ratio: Interval) -> str:
    if ratio.point <= CONTROL_DIP.value and ratio.high < 1.0:
        return "shown"
    if ratio.low >= CONTROL_DIP.value:
        return "absent"
    return "unsure"


@dataclass(frozen=True)
class ArmCpu:
    """What an arm's blocks saw of the CPU: the machine's busy share and the busiest thread of any rank."""

    machine_busy: float | None       # mean over blocks, 0..1 (all cores)
    busiest_thread: float | None     # max over blocks and ranks, share of one core

    def measures(self) -> dict[str, float | None]:
        return {"machine": self.machine_busy, "thread": self.busiest_thread}

    def text(self) -> str:
        parts = []
        if self.machine_busy is not None:
            parts.append(f"machine {self.machine_busy:.0%} busy")
        if self.busiest_thread is not None:
            parts.append(f"busiest rank thread {self.busiest_thread:.0%} of a core")
        return ", ".join(parts) or "no CPU samples"


@dataclass(frozen=True)
class Decision:
    """One comparison at one size: the verdict, why, and the figures it rests on."""

    design: str
    verdict: str                       # "shown" | "ruled_out" | "undecided"
    reason: str                        # one sentence with the figures
    final: bool                        # no more samples can change an undecided verdict (no control)
    share: Interval | None = None      # share of the anomaly's loss explained (knock-out / knock-in)
    ratio: Interval | None = None      # difference: time ratio on / off
    control: Control | None = None
    rounds: int = 0
    samples: dict[str, int] = field(default_factory=dict)
    means_s: dict[str, float] = field(default_factory=dict)
    p_value: float | None = None       # Mann-Whitney, on vs off, all samples
    interleaved: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"design": self.design, "verdict": self.verdict, "reason": self.reason, "final": self.final,
                "share": self.share.to_json() if self.share else None,
                "ratio": self.ratio.to_json() if self.ratio else None,
                "control": ({"ratio": self.control.ratio.to_json(), "status": self.control.status,
                             "modes": self.control.modes} if self.control else None),
                "rounds": self.rounds, "samples": self.samples, "means_s": self.means_s,
                "p_value": self.p_value, "interleaved": self.interleaved}


def _rounds(arms: Sequence[Arm]) -> int:
    return min(len(a.blocks) for a in arms)


def _interleaved(arms: Sequence[Arm]) -> bool:
    keys = {tuple(sorted(set(a.rounds))) for a in arms}
    return len(keys) == 1 and len(arms) > 1


def _cpu_confound(cpu: Mapping[str, ArmCpu] | None, held: Sequence[tuple[str, str]]) -> str | None:
    """The first pair (arm, against) where one ran CPU-saturated and the other did not: on one measure (the
    machine, or the busiest rank thread), one at CPU_CONFOUNDED or more and the other CPU_CONFOUND_MARGIN below
    it (or unmeasured). Arms that read either side of CPU_CONFOUNDED within the margin ran under one load."""
    if not cpu:
        return None
    unsaturated = CPU_CONFOUNDED.value - CPU_CONFOUND_MARGIN.value
    for a, b in held:
        ca, cb = cpu.get(a), cpu.get(b)
        if ca is None or cb is None:
            continue
        for hot, cool in ((a, b), (b, a)):
            mine, theirs = cpu[hot].measures(), cpu[cool].measures()
            if any(value is not None and value >= CPU_CONFOUNDED.value and (theirs[key] is None or theirs[key] < unsaturated)
                   for key, value in mine.items()):
                return (f"the {hot} arm ran CPU-saturated ({cpu[hot].text()}) while the {cool} arm did not "
                        f"({cpu[cool].text()}): a CPU-bound arm can neither convict nor clear a network mechanism")
    return None


def _share_verdict(share: Interval) -> str:
    if share.low >= SHOWN_SHARE.value:
        return "shown"
    if share.high <= RULED_OUT_SHARE.value:
        return "ruled_out"
    return "undecided"


def explained_share(on: Arm, off: Arm, control_arm: Arm, healthy: Arm, design: str,
                    cpu: Mapping[str, ArmCpu] | None = None, seed: int = 0) -> Decision:
    """knock-out: on = base (suspect on), off = toggle, control_arm = on, healthy = reference.
    knock-in: on = healthy + suspect, off = healthy, control_arm = the anomaly (backend), healthy = off."""
    arms = {a.name: a for a in (on, off, control_arm, healthy)}
    samples = {name: a.count for name, a in arms.items()}
    means = {name: a.mean_s for name, a in arms.items()}
    rounds = _rounds(list(arms.values()))
    interleaved = _interleaved(list(arms.values()))
    boot = bootstrap_means(list(arms.values()), seed=seed)
    control = _control(boot, control_arm, healthy)
    share = _share(boot, on, off, control_arm, healthy)
    p = mann_whitney_p(on.samples, off.samples)
    common = {"design": design, "share": share, "control": control, "rounds": rounds, "samples": samples,
              "means_s": means, "p_value": p, "interleaved": interleaved}
    subject = "the base arm" if design == "knock-out" else "the anomaly"
    if rounds < MIN_ROUNDS.value:
        return Decision(verdict="undecided", final=False, reason=f"{rounds} block(s) an arm, fewer than "
                        f"{MIN_ROUNDS.value}: too few to decide", **common)
    if control.status == "absent":
        return Decision(verdict="undecided", final=True, reason=f"{subject} did not show the effect in this run "
                        f"({control.text()}; "
                        f"{control.modes}): no positive control, so the toggle can neither show nor rule out "
                        "the suspect", **common)
    if control.status == "unsure":
        return Decision(verdict="undecided", final=False, reason=f"whether {subject} shows the effect is not "
                        f"yet clear ({control.text()}; {control.modes})", **common)
    held = [(on.name, off.name)] + ([(control_arm.name, healthy.name)] if design == "knock-in" else [])
    confound = _cpu_confound(cpu, held)
    if confound:
        return Decision(verdict="undecided", final=False, reason=confound, **common)
    verdict = _share_verdict(share)
    what = "removes" if design == "knock-out" else "reproduces"
    reason = (f"{subject} shows the effect ({control.text()}; {control.modes}); the toggle {what} "
              f"{share.point:.0%} [{share.low:.0%}, {share.high:.0%}] of its loss")
    return Decision(verdict=verdict, final=False, reason=reason, **common)


def difference(a: Arm, b: Arm, effect: float, cpu: Mapping[str, ArmCpu] | None = None, seed: int = 0) -> Decision:
    """Two-sided: does b's mean time differ from a's by at least ``effect`` (a fraction)?"""
    boot = bootstrap_means([a, b], seed=seed)
    ratio = interval(b.mean_s / a.mean_s, boot[b.name] / boot[a.name])
    common = {"design": "difference", "ratio": ratio, "rounds": _rounds([a, b]),
              "samples": {a.name: a.count, b.name: b.count}, "means_s": {a.name: a.mean_s, b.name: b.mean_s},
              "p_value": mann_whitney_p(a.samples, b.samples), "interleaved": _interleaved([a, b])}
    if common["rounds"] < MIN_ROUNDS.value:
        return Decision(verdict="undecided", final=False, reason=f"{common['rounds']} block(s) an arm, fewer "
                        f"than {MIN_ROUNDS.value}: too few to decide", **common)
    confound = _cpu_confound(cpu, [(a.name, b.name)])
    if confound:
        return Decision(verdict="undecided", final=False, reason=confound, **common)
    text = f"time ratio {ratio.point:.2f} [{ratio.low:.2f}, {ratio.high:.2f}]"
    if (ratio.low > 1 or ratio.high < 1) and abs(ratio.point - 1) >= effect:
        return Decision(verdict="shown", final=False, reason=f"{text}: differs by at least {effect:.0%}", **common)
    if ratio.low >= 1 - effect and ratio.high <= 1 + effect:
        return Decision(verdict="ruled_out", final=False, reason=f"{text}: within {effect:.0%}", **common)
    return Decision(verdict="undecided", final=False, reason=f"{text}: cannot tell yet", **common)


def _control(boot: Mapping[str, Any], arm: Arm, healthy: Arm) -> Control:
    """Does ``arm`` show the anomaly against ``healthy``, from bootstrap means already drawn?"""
    ratio = interval(healthy.mean_s / arm.mean_s, boot[healthy.name] / boot[arm.name])
    return Control(ratio, control_status(ratio), modes(arm.samples).text())


def _share(boot: Mapping[str, Any], on: Arm, off: Arm, slow: Arm, healthy: Arm) -> Interval:
    """(T_on - T_off) / (T_slow - T_healthy): the share of slow's loss that the toggle on -> off accounts for."""
    import numpy as np

    loss = slow.mean_s - healthy.mean_s
    # Divisions by a resampled zero give inf/nan, which the interval drops; say nothing about them.
    with np.errstate(divide="ignore", invalid="ignore"):
        resampled = (boot[on.name] - boot[off.name]) / (boot[slow.name] - boot[healthy.name])
    return interval((on.mean_s - off.mean_s) / loss if loss > 0 else math.nan, resampled)


def control(arm: Arm, healthy: Arm, seed: int = 0) -> Control:
    """The positive control of one arm against the healthy one (e.g. the backend beside the link in a trial)."""
    return _control(bootstrap_means([arm, healthy], seed=seed), arm, healthy)


def loss_share(anomaly: Arm, healthy: Arm, on: Arm, off: Arm, seed: int = 0) -> Interval:
    """Share of the anomaly arm's loss against the healthy arm that the toggle removes from ``on``, from the
    same rounds: (T_on - T_off) / (T_anomaly - T_healthy)."""
    arms = {a.name: a for a in (anomaly, healthy, on, off)}
    return _share(bootstrap_means(list(arms.values()), seed=seed), on, off, anomaly, healthy)


TABLE: tuple[Threshold, ...] = (CONTROL_DIP, SHOWN_SHARE, RULED_OUT_SHARE, MIN_ROUNDS, CPU_CONFOUNDED,
                                CPU_CONFOUND_MARGIN, WORKAROUND_EFFECT)

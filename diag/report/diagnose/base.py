"""What every rule shares: the Rule signature, strength helpers, and "cannot decide" findings."""

from __future__ import annotations

from collections.abc import Callable

from diag.report.diagnose.findings import STRENGTHS, Finding
from diag.report.rundir import CaptureSet, RunData
from diag.report.thresholds import Threshold, used

# A rule reads a run (files only) and returns its findings; its id is its __name__ (a function's name, or
# a PairedExperiment's id), and is the `rule` of every finding it returns.
Rule = Callable[[RunData], list[Finding]]


def strength_of(margin: float, strong: float, moderate: float) -> str:
    """margin: how far past the threshold (bigger = clearer)."""
    return "strong" if margin >= strong else "moderate" if margin >= moderate else "weak"


def weaken(strength: str) -> str:
    return STRENGTHS[min(STRENGTHS.index(strength) + 1, len(STRENGTHS) - 1)]


def undecided(rule: str, why: str, *thresholds: Threshold) -> list[Finding]:
    return [Finding(rule, "undecided", why, thresholds=used(*thresholds))]


def drop_note(capture: CaptureSet) -> str:
    dropped = capture.kernel_dropped
    return f" (capture dropped {dropped} packets: unreliable)" if dropped else ""

"""The cpu_bound rule: the CPU readings of ``cpu_rules`` judged against the loss the run measured
(``loss.measured_loss``). Apart from cpu_rules because the measured loss reads the dip, whose reference
leaves CPU-bound N out through cpu_rules: the readings sit below the dip, the judgement above it."""

from __future__ import annotations

from dataclasses import replace

from diag.report.diagnose.cpu_rules import unjudged
from diag.report.diagnose.findings import Finding
from diag.report.diagnose.loss import measured_loss
from diag.report.rundir import RunData


def cpu_bound(run: RunData) -> list[Finding]:
    """A thread near 100% of a core, or every core of the machine busy: the CPU, not the network, sets
    the pace. With nodes (the in-place layout), per node: a node whose CPU is saturated while its link idles
    is named (its ranks are CPU-starved); a machine several nodes share (the lab) is judged once, as before.

    A finding where it costs time in this run: a node CPU-starved (its link waits on its CPU), or the CPU full
    at an N where the backend has a measured loss (loss.measured_loss: the CPU may be part of that loss). Else
    an observation: the CPU set the pace at N where nothing is measured slow (n2_busbw_dip leaves those N out
    of its reference, and says so)."""
    found = unjudged(run)
    loss = measured_loss(run)
    out = []
    for f in found:
        if f.status != "fired":
            out.append(f)
            continue
        starved = any(e.values.get("kind") == "starved" for e in f.evidence)
        costly = sorted({e.values.get("world_size") for e in f.evidence} & set(loss))
        if starved or costly:
            out.append(f)
            continue
        out.append(replace(f, status="observed", strength="", explains="none: the CPU set the pace at N where the "
                           "backend has no measured loss; the dip leaves those N out of its reference"))
    return out


__all__ = ["cpu_bound"]

"""Observations against a measured loss: where the backend loses time in this run, and what the raw-TCP
reference shows on the same link, so an observation (retransmissions, a zero window, idle gaps) is judged as
the issue of Intel Cluster Checker's observations and diagnoses puts it: objective information unless it
accounts for part of a measured loss (docs/report.md, "Findings and observations").

* ``measured_loss``: N -> the backend's loss measured there (n2_busbw_dip fired for a backend series at N=2;
  backend_below_raw fired at N).
* ``side_by_side``: per N, one wire quantity (a rate of retransmissions, of zero windows, an idle share) on
  the backend's captures and on the raw reference's (raw TCP, one connection per direction, no mechanism
  knob) at the same N: the same hosts, the same link. What the raw reference shows too is the link's.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from diag.report.queries import analysed, capture_series
from diag.report.rundir import CaptureSet, RunData

RAW_REFERENCE = "raw:ring"


def measured_loss(run: RunData) -> dict[int, str]:
    """N -> the backend's loss measured at N, in words (its finding's first clause)."""
    from diag.report.diagnose.dip import n2_busbw_dip
    from diag.report.diagnose.records_rules import backend_below_raw

    out: dict[int, str] = {}
    for f in run.remember("n2_busbw_dip", lambda: n2_busbw_dip(run)):
        if f.status == "fired" and not f.statement.startswith("raw:"):
            out[2] = f.statement.split(" (", 1)[0]
    for f in run.remember("backend_below_raw", lambda: backend_below_raw(run)):
        if f.status == "fired":
            for e in f.evidence:
                n = e.values.get("world_size")
                if isinstance(n, int):
                    out.setdefault(n, e.text.split(" (", 1)[0])
    return out


def without_order(label: str | None) -> str | None:
    """'raw:ring [order=recv-first]' -> 'raw:ring': the exchange order is no mechanism of a collective's series."""
    if label is None:
        return None
    stripped = re.sub(r"order=[a-z-]+(, )?", "", label).replace(", ]", "]").replace(" []", "")
    return stripped


def is_backend_capture(capture: CaptureSet) -> bool:
    return (capture.transport or "").startswith("torch:")


def is_reference_capture(run: RunData, capture: CaptureSet) -> bool:
    """A capture of the raw-TCP reference (raw ring, one connection per direction, no mechanism knob)."""
    return without_order(capture_series(run, capture)) == RAW_REFERENCE


@dataclass(frozen=True)
class SideBySide:
    """One wire quantity at one N: the backend's captures against the raw reference's on the same link."""

    world_size: int
    backend: float
    reference: float | None          # None: no capture of the raw reference at this N
    loss: str | None                 # the backend's measured loss at this N, None where none was measured

    def text(self, unit: Callable[[float], str]) -> str:
        reference = (f"the raw reference's {unit(self.reference)} on the same link" if self.reference is not None
                     else "no capture of the raw reference at this N")
        return f"N={self.world_size}: the backend's {unit(self.backend)}, {reference}"


def side_by_side(run: RunData, quantity: Callable[[list[CaptureSet]], float | None]) -> list[SideBySide]:
    """Per N with a backend capture: ``quantity`` of its backend captures and of its raw reference captures."""
    captures = analysed(run)
    loss = measured_loss(run)
    out = []
    for n in sorted({c.world_size for c in captures if c.world_size is not None}):
        backend = [c for c in captures if c.world_size == n and is_backend_capture(c)]
        reference = [c for c in captures if c.world_size == n and is_reference_capture(run, c)]
        value = quantity(backend) if backend else None
        if value is None:
            continue
        out.append(SideBySide(n, value, quantity(reference) if reference else None, loss.get(n)))
    return out

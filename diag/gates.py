"""Gates a CI job can rely on: the nccl-tests closing lines of a sweep and the exit status each gate returns.

nccl-tests ends every run with ``# Out of bounds values : N OK|FAILED`` and ``# Avg bus bandwidth : X``
(GB/s there; MB/s here, diag's one rate unit; the mean over the run's rows) and exits non-zero on wrong data or when that average is below
NCCL_TESTS_MIN_BW. diag sweep does the same (EXIT_WRONG_DATA, EXIT_BELOW_MIN_BUSBW); diag compare and diag
diagnose gate on a regression or a fired finding (EXIT_SLOWER, EXIT_FIRED). Codes: diag.errors.EXIT_CODES.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from diag.errors import (
    EXIT_BELOW_MIN_BUSBW,
    EXIT_FIRED,
    EXIT_OK,
    EXIT_SLOWER,
    EXIT_USAGE,
    EXIT_WRONG_DATA,
    DiagError,
)
from diag.units import RATE_UNIT, human_bytes, human_rate, rate_number


def closing_lines(records: Sequence[Any]) -> list[str]:
    """nccl-tests' two closing lines over a run's rows (busbw in MB/s, as the table above them: units.RATE_UNIT)."""
    checked = [r for r in records if r.nwrong >= 0]
    wrong = sum(r.nwrong for r in checked)
    if records and not checked:
        bounds = "unchecked (--no-check)"
    else:
        bounds = f"{wrong} {'OK' if wrong == 0 else 'FAILED'}"
    avg = statistics.fmean(r.busbw_Bps for r in records) if records else 0.0
    return [f"# Out of bounds values : {bounds}", f"# Avg bus bandwidth    : {rate_number(avg)} {RATE_UNIT}", "#"]


def sweep_status(records: Sequence[Any], min_busbw_GBps: float | None = None) -> tuple[int, str | None]:
    """EXIT_WRONG_DATA when a row has #wrong > 0, else EXIT_BELOW_MIN_BUSBW when the average busbw is below
    ``min_busbw_GBps``, else EXIT_OK; with a one-line reason."""
    wrong = sum(max(r.nwrong, 0) for r in records)
    if wrong:
        rows = sum(r.nwrong > 0 for r in records)
        return EXIT_WRONG_DATA, f"{wrong} wrong elements in {rows} row(s): the data check failed"
    if min_busbw_GBps is not None and records:
        avg = statistics.fmean(r.busbw_Bps for r in records) / 1e9
        if avg < min_busbw_GBps:
            return EXIT_BELOW_MIN_BUSBW, (f"average bus bandwidth {human_rate(avg * 1e9)} is below --min-busbw "
                                          f"{min_busbw_GBps:g} GB/s ({human_rate(min_busbw_GBps * 1e9)})")
    return EXIT_OK, None


@dataclass(frozen=True)
class CompareGate:
    """``slower:5%``: fail when a row of B is slower than A by at least 5% (its interval over launches above 1);
    a gate that checked nothing (no row in common, or none with enough launches to test) fails too."""

    kind: str
    threshold: float

    @classmethod
    def parse(cls, text: str) -> CompareGate:
        kind, _, amount = text.partition(":")
        if kind != "slower":
            raise DiagError(f"--fail-on takes slower:PERCENT, e.g. slower:5%, not {text!r}")
        amount = amount.strip() or "0%"
        try:
            value = float(amount.removesuffix("%")) / (100 if amount.endswith("%") else 1)
        except ValueError:
            raise DiagError(f"--fail-on slower:PERCENT needs a number, e.g. slower:5%, not {text!r}") from None
        if value < 0:
            raise DiagError("--fail-on slower:PERCENT must not be negative")
        return cls(kind, value)

    def check(self, result: Any) -> tuple[int, str | None]:
        """``result``: a diag.report.compare.Comparison."""
        rows = result.rows
        if not rows:
            return EXIT_USAGE, "no rows in common between A and B: the gate checked nothing, so it does not pass"
        tested = [r for r in rows if r.verdict != "untested"]
        if not tested:
            return EXIT_USAGE, (f"none of the {len(rows)} rows in common has 3 launches (or trial rounds) a side: the "
                                "gate checked nothing, so it does not pass (run each side 3 times into one file)")
        slower = [r for r in tested if r.verdict == "slower" and r.time_ratio - 1 >= self.threshold]
        if not slower:
            return EXIT_OK, (None if len(tested) == len(rows) else
                             f"the gate checked {len(tested)} of {len(rows)} rows; the others have fewer than 3 "
                             "launches a side")
        worst = max(slower, key=lambda r: r.time_ratio)
        return EXIT_SLOWER, (f"{len(slower)} row(s) slower in B by >= {self.threshold:.0%} (interval over launches "
                             f"above 1); worst {worst.op} N={worst.world_size} {human_bytes(worst.size_bytes)}: "
                             f"{worst.time_ratio:.2f}x")


FAIL_ON_FINDINGS = ("fired", "strong")


def findings_status(findings: Sequence[Any], fail_on: str) -> tuple[int, str | None]:
    """``fired``: fail when any finding fired; ``strong``: when a strong one did."""
    hits = [f for f in findings if f.status == "fired" and (fail_on == "fired" or f.strength == "strong")]
    if not hits:
        return EXIT_OK, None
    return EXIT_FIRED, f"{len(hits)} finding(s) fired ({', '.join(sorted({f.rule for f in hits}))})"

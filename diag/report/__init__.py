"""Report, diagnose, compare and model: everything here reads files (records, run directories), never live
objects, so it can be re-run on a copied run directory on any machine, without torch.

Public API:
  load_run(paths) -> RunData                  run directory or plain record files
  diagnose(run) -> list[Finding]              rules with named thresholds (diag.report.diagnose)
  write_report(run, out_dir) -> ReportResult  report.html, report.md, PNGs, findings.json, model.json
  compare(a_records, b_records, ...)          row ratios with Welch's t-test (diag.report.compare)

The model a report writes (model.json) is diag.model's: ``diag.model.fit(run.records)``, ``diag.model.load``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from diag.report.compare import compare
from diag.report.diagnose import Finding, diagnose
from diag.report.rundir import RunData, load_run

__all__ = ["Finding", "RunData", "compare", "diagnose", "load_run", "write_report"]


if TYPE_CHECKING:
    from diag.report.render import ReportResult


def write_report(run: RunData, out_dir: Path) -> ReportResult:
    """Lazy, so that importing diag.report does not import matplotlib."""
    from diag.report.render import write_report as _write

    return _write(run, out_dir)

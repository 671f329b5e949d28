"""Render report.html (self-contained), report.md, PNG plots, findings.json and model.json from a run directory.

Reads files only (records/*.jsonl, run.json, analysis/, observe/, tcpinfo/, captures/*.capture.json), so it
can be re-run at any time, on any machine, without torch. Missing parts are listed in the report.

examples:
  diag report runs/reproduce-20250101-120000
  diag report runs/sweep-a.jsonl runs/sweep-b.jsonl --out report-ab/
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", nargs="+", metavar="RUN_DIR|RECORDS",
                        help="a run directory (from diag reproduce), or record .jsonl files")
    parser.add_argument("--out", type=Path, default=None,
                        help="output directory (default: RUN_DIR/report; required for plain record files)")


def run(args: argparse.Namespace) -> int:
    from diag.errors import DiagError
    from diag.report import load_run, write_report
    from diag.report.diagnose import summary_lines
    from diag.textsafe import lines, visible

    data = load_run(args.paths)
    out = args.out
    if out is None:
        if data.root is None:
            raise DiagError("plain record files: say where the report goes with --out DIR")
        out = data.root / "report"
    from diag import validate

    validate.output_dir(out, "--out")   # created 0700, or an existing one of yours closed to others
    for warning in data.duplicate_rows():
        print(f"diag report: warning: {visible(warning)}", file=sys.stderr)
    result = write_report(data, out)
    from diag.report.verdict import verdict_lines

    if result.verdict is not None:
        print(lines("\n".join(verdict_lines(result.verdict))))   # it quotes what nodes wrote: escaped
    print(f"report: {out / 'report.html'} ({len(result.files)} files)")
    for line in summary_lines(result.findings):
        print(f"  {visible(line)}")
    skipped = [p for p in result.plots if not hasattr(p, "filename")]
    for p in skipped:
        print(f"  plot not drawn: {visible(p.title)}: {visible(p.reason)}")
    return 0

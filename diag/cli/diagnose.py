"""Findings with evidence from a run directory (or record files): rules with named thresholds.

Each finding says what, how sure (strong/moderate/weak), the evidence (numbers, source file, plot, phase)
and the threshold that fired; a rule that lacks its inputs says it cannot decide. Exit status 0 either way.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from diag import safefs


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", nargs="+", metavar="RUN_DIR|RECORDS",
                        help="a run directory (from diag reproduce), or record .jsonl files")
    parser.add_argument("--json", action="store_true", help="print findings as JSON (as findings.json)")
    parser.add_argument("--write", type=Path, default=None, metavar="FILE",
                        help="also write findings JSON to FILE")


def run(args: argparse.Namespace) -> int:
    from diag.report import load_run
    from diag.report.diagnose import diagnose, findings_to_json, render_text

    data = load_run(args.paths)
    findings = diagnose(data)
    document = findings_to_json(findings, data)
    if args.write:
        safefs.write_file(safefs.make_parent(args.write), json.dumps(document, indent=1, default=str) + "\n",
                          flag="--write")
    if args.json:
        print(json.dumps(document, indent=1, default=str))
    else:
        print(render_text(findings))
        if data.missing:
            print("\nmissing inputs: " + "; ".join(data.missing))
    return 0

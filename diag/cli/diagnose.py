"""Findings with evidence from a run directory (or record files): rules with named thresholds.

Each finding says what, how sure (strong/moderate/weak), the evidence (numbers, source file, plot, phase)
and the threshold that fired; a rule that lacks its inputs says it cannot decide. Exit status 0 either way,
unless --fail-on fired|strong makes a fired finding a failure (exit 9).

examples:
  diag diagnose runs/reproduce-20250101-120000
  diag diagnose RUN_DIR --json --write findings.json
  diag diagnose RUN_DIR --fail-on fired            # exit 9 when a rule fired (CI gate)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from diag import safefs


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", nargs="+", metavar="RUN_DIR|RECORDS",
                        help="a run directory (from diag reproduce), or record .jsonl files")
    parser.add_argument("--json", action="store_true", help="print findings as JSON (as findings.json)")
    parser.add_argument("--write", type=Path, default=None, metavar="FILE",
                        help="also write findings JSON to FILE")
    parser.add_argument("--fail-on", choices=["fired", "strong"], default=None,
                        help="exit 9 when a finding fired (strong: only a strong one): a CI gate")


def run(args: argparse.Namespace) -> int:
    from diag.report import load_run
    from diag.report.diagnose import diagnose, findings_to_json, render_text
    from diag.report.verdict import build_verdict, verdict_lines
    from diag.textsafe import lines, visible

    data = load_run(args.paths)
    findings = diagnose(data)
    from diag.typedjson import strict_document

    # the same strict JSON as findings.json (diag.report.render.FINDINGS_NONFINITE, without matplotlib)
    document = strict_document(findings_to_json(findings, data),
                               "a ratio or rate over zero (a zero time or bandwidth): no finite value")
    if args.write:
        safefs.write_file(safefs.make_parent(args.write), json.dumps(document, indent=1, default=str, allow_nan=False) + "\n",
                          flag="--write")
    if args.json:
        print(json.dumps(document, indent=1, default=str, allow_nan=False))
    else:
        # the findings quote what nodes wrote (names, fingerprints): no escape sequence reaches the terminal
        print(lines("\n".join(verdict_lines(build_verdict(data, findings)))) + "\n")
        print(lines(render_text(findings)))
        if data.missing:
            print("\nmissing inputs: " + visible("; ".join(data.missing)))
    for warning in data.duplicate_rows():
        print(f"diag diagnose: warning: {visible(warning)}", file=sys.stderr)
    if args.fail_on is None:
        return 0
    from diag.gates import findings_status

    code, why = findings_status(findings, args.fail_on)
    if why:
        print(f"diag diagnose: {why}", file=sys.stderr)
    return code

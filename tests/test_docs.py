"""docs/ stays true: the CLI reference is generated from the parser."""

from __future__ import annotations

from pathlib import Path

from diag.cli.docgen import render

ROOT = Path(__file__).resolve().parent.parent


def test_cli_reference_is_current():
    current = (ROOT / "docs" / "cli.md").read_text()
    assert current == render(), "docs/cli.md is stale: run python -m diag.cli.docgen > docs/cli.md"


def test_readme_test_command_is_what_ci_runs():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    command = next(line for line in ci.splitlines() if line.startswith("bash .ci/setup"))
    assert command in readme

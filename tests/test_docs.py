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


def test_every_subcommand_help_shows_what_it_does_and_examples():
    """--help prints the command's whole description and its examples (not only the docstring's first line,
    which cut `diag model --help` mid-sentence)."""
    import argparse

    from diag.__main__ import SUBCOMMANDS, build_parser

    for name in SUBCOMMANDS:
        parser = build_parser(only=name)
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[name]
        text = sub.format_help()
        assert "\nexamples:\n" in text, name
        examples = text.split("\nexamples:\n", 1)[1].split("\n\n", 1)[0].splitlines()
        assert examples and all(line.startswith("  ") for line in examples), (name, examples)
        assert any(f"diag {name}" in line for line in examples), (name, examples)
    model = build_parser(only="model")
    help_text = next(a for a in model._actions if isinstance(a, argparse._SubParsersAction)).choices["model"].format_help()
    assert "predictions with an interval\nfrom the samples; exports for Vidur and ASTRA-sim (docs/model.md)." in help_text


def test_cli_reference_covers_sub_actions_and_exit_codes():
    from diag.errors import EXIT_CODES

    current = (ROOT / "docs" / "cli.md").read_text()
    for action in ("up", "down", "status", "exec"):
        assert f"\n### diag lab {action}\n" in current
    for action in ("fit", "predict", "check", "export"):
        assert f"\n### diag model {action}\n" in current
    assert "\n## Exit codes\n" in current
    for code in EXIT_CODES:
        assert f"\n| {code} | " in current

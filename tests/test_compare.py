"""compare: Welch's t-test on synthetic samples with known answers, row matching, and the CLI."""

from __future__ import annotations

import json
import math

import pytest
from report_helpers import MiB, make_record, timed, write_records

from diag.__main__ import main
from diag.report.compare import compare, compare_rows, welch_test


def test_welch_matches_the_textbook_formula() -> None:
    a = [1.0, 1.1, 0.9, 1.05, 0.95]
    b = [1.3, 1.4, 1.2, 1.35, 1.25]
    mean_a, mean_b = sum(a) / 5, sum(b) / 5
    var_a = sum((x - mean_a) ** 2 for x in a) / 4
    var_b = sum((x - mean_b) ** 2 for x in b) / 4
    t = (mean_a - mean_b) / math.sqrt(var_a / 5 + var_b / 5)
    result = welch_test(a, b)
    assert result.statistic == pytest.approx(t)
    assert result.p_value is not None and result.p_value < 0.001


def test_same_distribution_is_not_significant() -> None:
    a = make_record("gloo", "all_gather", 2, MiB, timed(0.1, count=20, spread=0.05, seed=1))
    b = make_record("gloo", "all_gather", 2, MiB, timed(0.1, count=20, spread=0.05, seed=2))
    row = compare_rows(a, b)
    assert row.verdict == "same" and not row.significant
    assert row.p_value is not None and row.p_value > 0.05
    assert "not significantly different" in row.sentence


def test_a_50_percent_slowdown_is_significant() -> None:
    a = make_record("gloo", "all_gather", 2, MiB, timed(0.1, seed=1))
    b = make_record("gloo", "all_gather", 2, MiB, timed(0.15, seed=2))
    row = compare_rows(a, b)
    assert row.verdict == "slower" and row.significant
    assert row.time_ratio == pytest.approx(1.5, rel=0.03)
    assert row.busbw_ratio == pytest.approx(1 / 1.5, rel=0.03)
    assert "1.5" in row.sentence and "slower" in row.sentence
    assert compare_rows(b, a).verdict == "faster"


def test_significant_but_below_threshold_counts_as_same() -> None:
    a = make_record("gloo", "all_gather", 2, MiB, timed(0.100, count=50, spread=0.001, seed=1))
    b = make_record("gloo", "all_gather", 2, MiB, timed(0.102, count=50, spread=0.001, seed=2))
    row = compare_rows(a, b, threshold=0.05)
    assert row.p_value is not None and row.p_value < 0.05
    assert row.verdict == "same"
    assert compare_rows(a, b, threshold=0.01).verdict == "slower"


def test_one_sample_cannot_be_tested() -> None:
    a = make_record("gloo", "all_gather", 2, MiB, [0.1])
    b = make_record("gloo", "all_gather", 2, MiB, [0.2, 0.21])
    row = compare_rows(a, b)
    assert row.verdict == "untested" and row.p_value is None
    assert "cannot test" in row.sentence


def test_rows_match_by_key_and_across_backends() -> None:
    gloo = [make_record("gloo", "all_gather", n, MiB, timed(0.2 if n == 2 else 0.1, seed=n)) for n in (2, 3)]
    raw = [make_record("raw", "all_gather", n, MiB, timed(0.1, seed=10 + n)) for n in (2, 3)]
    same_backend = compare(gloo, raw)
    assert same_backend.rows == [] and len(same_backend.only_a) == 2
    across = compare(raw, gloo, across=True)
    verdicts = {r.world_size: r.verdict for r in across.rows}
    assert verdicts == {2: "slower", 3: "same"}
    with pytest.raises(Exception, match="several transports"):
        compare(gloo + raw, gloo, across=True)
    picked = compare(gloo + raw, gloo + raw, across=True, a_transport="raw:ring", b_transport="gloo")
    assert {r.world_size: r.verdict for r in picked.rows} == {2: "slower", 3: "same"}


def test_cli_text_and_json(tmp_path, capsys) -> None:
    a = write_records(tmp_path / "a.jsonl", [make_record("gloo", "all_gather", 2, MiB, timed(0.1, seed=1))])
    b = write_records(tmp_path / "b.jsonl", [make_record("gloo", "all_gather", 2, MiB, timed(0.2, seed=2))])
    assert main(["compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "slower, significant" in out and "1 rows compared: 1 significantly slower" in out
    assert main(["compare", str(a), str(b), "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["rows"][0]["verdict"] == "slower"
    assert document["summary"] == {"slower": 1}
    assert main(["compare", str(a), str(tmp_path / "missing.jsonl")]) == 2
    assert "no such file" in capsys.readouterr().err


def _before_after(tmp_path, slowdown: float):
    sizes = (MiB, 4 * MiB, 16 * MiB)
    before = [make_record("gloo", "all_gather", n, s, timed(0.01 * s / MiB, count=12, seed=n + s % 7))
              for n in (2, 3) for s in sizes]
    after = [make_record("gloo", "all_gather", n, s,
                         timed(0.01 * s / MiB * (slowdown if n == 2 else 1.0), count=12, seed=n + s % 7 + 50))
             for n in (2, 3) for s in sizes]
    return (write_records(tmp_path / "before.jsonl", before), write_records(tmp_path / "after.jsonl", after))


def test_fail_on_slower_gates_a_regression(tmp_path, capsys) -> None:
    a, b = _before_after(tmp_path, 1.3)
    assert main(["compare", str(a), str(b)]) == 0                         # no gate: exit 0 either way
    assert main(["compare", str(a), str(b), "--fail-on", "slower:5%"]) == 8
    err = capsys.readouterr().err
    assert "3 row(s) significantly slower in B by >= 5%" in err
    assert main(["compare", str(a), str(b), "--fail-on", "slower:50%"]) == 0  # a 30% regression passes a 50% gate
    assert main(["compare", str(a), str(a), "--fail-on", "slower:5%"]) == 0
    assert main(["compare", str(a), str(b), "--fail-on", "faster"]) == 2     # a bad gate is a usage error


def test_compare_html_overlays_both_runs_per_n(tmp_path, capsys) -> None:
    import base64
    import re

    from matplotlib.image import imread

    a, b = _before_after(tmp_path, 1.3)
    page = tmp_path / "out" / "compare.html"
    assert main(["compare", str(a), str(b), "--html", str(page)]) == 0
    text = page.read_text()
    assert "all_gather" in text and text.count("<tr class='slower'>") == 3 and text.count("<tr class='same'>") == 3
    png = base64.b64decode(re.search(r"data:image/png;base64,([^']+)'", text).group(1))
    (tmp_path / "overlay.png").write_bytes(png)
    pixels = imread(tmp_path / "overlay.png")[..., :3]
    assert pixels.shape[1] > 2 * pixels.shape[0]            # two panels side by side: N=2 and N=3
    from diag.records import load_records
    from diag.report.overlay import _series

    panels = _series(load_records(a).records)
    assert sorted(panels) == [("all_gather", 2), ("all_gather", 3)]


def test_report_warns_when_two_files_hold_the_same_row(tmp_path, capsys) -> None:
    a, b = _before_after(tmp_path, 1.3)
    assert main(["report", str(a), str(b), "--out", str(tmp_path / "rep")]) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning:" in line]
    assert len(warnings) == 6
    assert warnings[0].startswith("diag report: warning: torch:gloo all_gather N=2 1 MiB per rank is in 2 records")
    assert "before.jsonl" in warnings[0] and "after.jsonl" in warnings[0]
    assert main(["report", str(a), "--out", str(tmp_path / "rep1")]) == 0
    assert "warning:" not in capsys.readouterr().err

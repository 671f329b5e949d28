"""compare: decided on launches and trial rounds (a bootstrap over blocks), Welch's t-test shown beside it and
never deciding; rows keyed by series identity; the CLI and its gate."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
from report_helpers import MiB, make_record, timed, write_records

from diag.__main__ import main
from diag.report.compare import compare, compare_rows, welch_test

# computes in this process: may run beside an `alone` test (tests/conftest.py)
pytestmark = pytest.mark.in_process


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


def launches(backend: str, n: int, size: int, seconds: float, count: int = 3, *, spread: float = 0.02,
             drift: list[float] | None = None, seed: int = 0, knobs: dict | None = None, iters: int = 8):
    """``count`` launches of one row (each its own run id, as `diag sweep --out F` run again); ``drift``: each
    launch's own factor (background load that moved between launches)."""
    factors = drift or [1.0] * count
    return [dataclasses.replace(make_record(backend, "all_gather", n, size,
                                            timed(seconds * factors[i], count=iters, spread=spread, seed=seed + i),
                                            knobs=knobs), run_id=f"launch-{seed}-{i}")
            for i in range(len(factors))]


def test_one_launch_a_side_is_untested_whatever_welch_says() -> None:
    """Iterations of one launch are not independent samples: a 50% slowdown between two single launches is
    shown with its ratio and Welch's p, and decides nothing."""
    a = make_record("gloo", "all_gather", 2, MiB, timed(0.1, seed=1))
    b = make_record("gloo", "all_gather", 2, MiB, timed(0.15, seed=2))
    row = compare_rows(a, b)
    assert row.verdict == "untested" and not row.significant
    assert row.p_value is not None and row.p_value < 1e-6          # Welch would have called it
    assert row.time_ratio == pytest.approx(1.5, rel=0.03)
    assert "untested: 1 launch(es) on a side" in row.sentence and "Welch p=" in row.sentence
    assert "not used" in row.sentence


def test_a_50_percent_slowdown_over_three_launches_is_slower() -> None:
    a = launches("gloo", 2, MiB, 0.1, seed=1)
    b = launches("gloo", 2, MiB, 0.15, seed=11)
    row = compare_rows(a, b)
    assert row.verdict == "slower" and row.significant and (row.a_blocks, row.b_blocks) == (3, 3)
    assert row.time_ratio == pytest.approx(1.5, rel=0.03) and 1 < row.ratio_low <= row.ratio_high
    assert row.busbw_ratio == pytest.approx(1 / 1.5, rel=0.03)
    assert "1.50x [" in row.sentence and ": slower" in row.sentence and "over 3 vs 3 launches" in row.sentence
    assert compare_rows(b, a).verdict == "faster"


def test_same_distribution_over_launches_is_the_same() -> None:
    row = compare_rows(launches("gloo", 2, MiB, 0.1, seed=1, spread=0.01),
                       launches("gloo", 2, MiB, 0.1, seed=21, spread=0.01))
    assert row.verdict == "same" and not row.significant and row.ratio_low >= 0.95 and row.ratio_high <= 1.05


def test_load_drifting_between_launches_leaves_a_small_change_undecided() -> None:
    """Each launch tight inside (1%) but launches 15% apart (background load that moved): a 6% change is
    "significant" to Welch on the pooled iterations, yet over launches it is undecided."""
    drift_a, drift_b = [1.0, 1.15, 0.92], [1.14, 0.96, 1.12]
    a = launches("gloo", 2, MiB, 0.1, drift=drift_a, spread=0.01, seed=3, iters=12)
    b = launches("gloo", 2, MiB, 0.1, drift=drift_b, spread=0.01, seed=33, iters=12)
    row = compare_rows(a, b)
    assert row.p_value is not None and row.p_value < 0.05           # iterations would convict
    assert row.verdict == "undecided" and row.ratio_low < 1 < row.ratio_high


def test_significant_but_below_threshold_is_not_a_change() -> None:
    a = launches("gloo", 2, MiB, 0.100, spread=0.001, seed=1, iters=30)
    b = launches("gloo", 2, MiB, 0.102, spread=0.001, seed=41, iters=30)
    row = compare_rows(a, b, threshold=0.05)
    assert row.ratio_low > 1 and row.verdict == "same"
    assert compare_rows(a, b, threshold=0.01).verdict == "slower"


def test_one_sample_a_side_has_no_welch() -> None:
    row = compare_rows(make_record("gloo", "all_gather", 2, MiB, [0.1]),
                       make_record("gloo", "all_gather", 2, MiB, [0.2, 0.21]))
    assert row.verdict == "untested" and row.p_value is None and "no Welch test" in row.sentence


def test_rows_match_by_series_and_across_backends() -> None:
    gloo = [r for n in (2, 3) for r in launches("gloo", n, MiB, 0.2 if n == 2 else 0.1, seed=n)]
    raw = [r for n in (2, 3) for r in launches("raw", n, MiB, 0.1, seed=10 + n)]
    same_backend = compare(gloo, raw)
    assert same_backend.rows == [] and len(same_backend.only_a) == 2
    across = compare(raw, gloo, across=True)
    verdicts = {r.world_size: r.verdict for r in across.rows}
    assert verdicts == {2: "slower", 3: "same"}
    with pytest.raises(Exception, match="several series"):
        compare(gloo + raw, gloo, across=True)
    picked = compare(gloo + raw, gloo + raw, across=True, a_transport="raw:ring", b_transport="gloo")
    assert {r.world_size: r.verdict for r in picked.rows} == {2: "slower", 3: "same"}


def test_series_of_one_transport_are_never_compared_with_each_other() -> None:
    """The raw-TCP reference, gloo's protocol model and a half-duplex ring share a transport (raw:ring) but
    are three rows: comparing a file with itself compares every row, each with itself."""
    reference = make_record("raw", "all_gather", 2, MiB, timed(0.047, seed=1))
    model = make_record("raw", "all_gather", 2, MiB, timed(0.068, seed=2), knobs={"emulate": "gloo"})
    alternate = make_record("raw", "all_gather", 2, MiB, timed(0.09, seed=3), knobs={"io": "alternate"})
    rows = [reference, model, alternate]
    result = compare(rows, rows)
    assert len(result.rows) == 3 and not result.only_a and not result.only_b
    assert {r.a_transport for r in result.rows} == {"raw:ring", "raw:ring [emulate=gloo]", "raw:ring [io=alternate]"}
    assert all(r.a_transport == r.b_transport and r.time_ratio == 1.0 for r in result.rows)
    by_series = {r.a_transport: r.a_time_s for r in result.rows}
    assert by_series["raw:ring"] == pytest.approx(reference.mean_s)     # the reference's own time, not the model's
    # a series is picked by its label (raw:ring is the reference's own); a backend picks every series of it
    assert len(compare(rows, rows, a_transport="raw:ring [emulate=gloo]", b_transport="raw:ring [emulate=gloo]").rows) == 1
    assert [r.a_transport for r in compare(rows, rows, across=True, a_transport="raw:ring",
                                           b_transport="raw:ring [io=alternate]").rows] == ["raw:ring"]
    with pytest.raises(Exception, match="several series"):
        compare(rows, rows, across=True, a_transport="raw", b_transport="raw:ring")


def test_trial_arms_are_rows_with_their_rounds_as_blocks() -> None:
    """An interleaved trial's arm is a row of its own (never pooled with the survey row of the same series),
    its rounds the blocks: two runs' trials can be told apart where two single launches cannot."""
    from report_helpers import ANOMALY_SHAPES, n2_trial, shaped_times, trial_records

    spec = n2_trial()
    before = trial_records(spec, shaped_times(ANOMALY_SHAPES), rounds=6)
    slowed = {**ANOMALY_SHAPES, "gloo": (0.73 * 1.5, 1.12 * 1.5, 0.7)}
    after = trial_records(spec, shaped_times(slowed), rounds=6)
    survey = make_record("gloo", "all_gather", 2, 16 * MiB, timed(1.0, seed=5))
    result = compare([*before, survey], [*after, survey])
    trial_rows = {r.a_transport: r for r in result.rows if r.origin == "trial n2-trial"}
    assert set(trial_rows) == {"torch:gloo", "raw:ring [order=recv-first]", "raw:ring [emulate=gloo, order=recv-first]",
                               "raw:ring [emulate=gloo, order=recv-first, notice=own-conn]",
                               "raw:ring [conn=shared, order=recv-first]"} or len(trial_rows) == 5
    assert trial_rows["torch:gloo"].verdict == "slower" and trial_rows["torch:gloo"].a_blocks == 6
    assert [r.verdict for r in result.rows if r.origin == "survey"] == ["untested"]


def test_cli_text_and_json(tmp_path, capsys) -> None:
    a = write_records(tmp_path / "a.jsonl", launches("gloo", 2, MiB, 0.1, seed=1))
    b = write_records(tmp_path / "b.jsonl", launches("gloo", 2, MiB, 0.2, seed=11))
    assert main(["compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert ": slower" in out and "1 rows compared: 1 slower in B" in out and "never on iterations" in out
    assert main(["compare", str(a), str(b), "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["rows"][0]["verdict"] == "slower" and document["rows"][0]["a_blocks"] == 3
    assert document["summary"] == {"slower": 1}
    assert main(["compare", str(a), str(tmp_path / "missing.jsonl")]) == 2
    assert "no such file" in capsys.readouterr().err


def _before_after(tmp_path, slowdown: float):
    sizes = (MiB, 4 * MiB, 16 * MiB)
    before = [r for n in (2, 3) for s in sizes
              for r in launches("gloo", n, s, 0.01 * s / MiB, iters=12, seed=n + s % 7)]
    after = [r for n in (2, 3) for s in sizes
             for r in launches("gloo", n, s, 0.01 * s / MiB * (slowdown if n == 2 else 1.0), iters=12,
                               seed=n + s % 7 + 50)]
    return (write_records(tmp_path / "before.jsonl", before), write_records(tmp_path / "after.jsonl", after))


def test_fail_on_slower_gates_a_regression(tmp_path, capsys) -> None:
    a, b = _before_after(tmp_path, 1.3)
    assert main(["compare", str(a), str(b)]) == 0                         # no gate: exit 0 either way
    assert main(["compare", str(a), str(b), "--fail-on", "slower:5%"]) == 8
    err = capsys.readouterr().err
    assert "3 row(s) slower in B by >= 5%" in err
    assert main(["compare", str(a), str(b), "--fail-on", "slower:50%"]) == 0  # a 30% regression passes a 50% gate
    assert main(["compare", str(a), str(a), "--fail-on", "slower:5%"]) == 0
    assert main(["compare", str(a), str(b), "--fail-on", "faster"]) == 2     # a bad gate is a usage error


def test_a_gate_that_checked_nothing_does_not_pass(tmp_path, capsys) -> None:
    """No row in common, or no row with three launches a side: the gate says so and exits non-zero."""
    gloo = write_records(tmp_path / "gloo.jsonl", launches("gloo", 2, MiB, 0.1, seed=1))
    raw = write_records(tmp_path / "raw.jsonl", launches("raw", 2, MiB, 0.1, seed=2))
    assert main(["compare", str(gloo), str(raw)]) == 0                     # no gate: the text says it
    assert "no rows in common" in capsys.readouterr().out
    assert main(["compare", str(gloo), str(raw), "--fail-on", "slower:5%"]) == 2
    assert "no rows in common between A and B: the gate checked nothing" in capsys.readouterr().err
    one = write_records(tmp_path / "one.jsonl", [make_record("gloo", "all_gather", 2, MiB, timed(0.1, seed=3))])
    assert main(["compare", str(one), str(one), "--fail-on", "slower:5%"]) == 2
    assert "has 3 launches (or trial rounds) a side" in capsys.readouterr().err


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
    sizes = (MiB, 4 * MiB, 16 * MiB)
    a, b = (write_records(tmp_path / name, [make_record("gloo", "all_gather", n, s, timed(0.01 * s / MiB, seed=n + k))
                                            for n in (2, 3) for s in sizes])
            for k, name in enumerate(("before.jsonl", "after.jsonl")))
    assert main(["report", str(a), str(b), "--out", str(tmp_path / "rep")]) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning:" in line]
    assert len(warnings) == 6
    assert warnings[0].startswith("diag report: warning: torch:gloo all_gather N=2 1 MiB per rank is in 2 records")
    assert "before.jsonl" in warnings[0] and "after.jsonl" in warnings[0]
    assert main(["report", str(a), "--out", str(tmp_path / "rep1")]) == 0
    assert "warning:" not in capsys.readouterr().err

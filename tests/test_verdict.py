"""The verdict card reads the findings and never claims more than they do: what is slow, why (or "not
isolated"), how sure, the experiment, what to do (the measured workaround and its code), what was ruled out."""

from __future__ import annotations

from pathlib import Path

import pytest
from report_helpers import (
    ANOMALY_SHAPES,
    advise_doc,
    anomaly_records,
    flat_records,
    make_record,
    n2_trial,
    shaped_times,
    timed,
    trial_records,
    write_run_dir,
    write_trial,
)

from diag.report import diagnose, load_run
from diag.report.diagnose.findings import Evidence, Finding
from diag.report.verdict import build_verdict, verdict_lines

# computes in this process: may run beside an `alone` test (tests/conftest.py)
pytestmark = pytest.mark.in_process


def _verdict(root: Path, records, **parts):
    run = load_run([write_run_dir(root, records, **parts)])
    return build_verdict(run, diagnose(run))


def test_anomaly_with_experiment_and_measured_workaround(tmp_path: Path) -> None:
    """The survey dips and the interleaved N=2 trial shows M1 (and rules M4 out): the card names M1 with its
    experiment's reading and figures, the measured workaround with its code, M4 ruled out."""
    root = write_run_dir(tmp_path / "run", anomaly_records(), advise=advise_doc())
    spec = n2_trial()
    write_trial(root / "records" / "n2-trial.jsonl", spec, trial_records(spec, shaped_times(ANOMALY_SHAPES), rounds=8))
    run = load_run([root])
    v = build_verdict(run, diagnose(run))
    # the reference names the N it used; the figures are of the size the finding names as the deepest
    assert v.slow_status == "fired" and v.slow.startswith("torch:gloo all_gather at N=2: busbw is 48% below N=3,4 "
                                                          "(mean busbw 5.96 MB/s vs 11.4 MB/s at 256 KiB per rank)")
    assert v.why.startswith("M1: the ready-to-receive notice queued behind the rank's own data")
    assert "(the raw protocol model of gloo's pair runs faster" in v.why   # the suspect's reading travels with it
    assert v.sure in ("strong", "moderate") and "the toggle removes" in v.shown_by and "interleaved" in v.shown_by
    assert v.todo.startswith("Use all_gather from batch_isend_irecv") and "1.62x" in v.todo
    assert [f.title for f in v.fixes] == ["all_gather from batch_isend_irecv, receives posted first"]
    assert "batch_isend_irecv(ops)" in v.fixes[0].code      # the code from advise.json
    assert any(item.startswith("M4:") for item in v.ruled_out)
    assert any(item.startswith("M2:") for item in v.not_isolated)
    lines = verdict_lines(v)
    assert lines[0] == "verdict:" and lines[1].startswith("  slow:")
    # the card names no rule ids: they stay in the detail section
    assert not any(rule in "\n".join(lines) for rule in ("n2_busbw_dip", "suspect_m4", "shared_connection"))


def test_survey_rows_alone_show_no_suspect(tmp_path: Path) -> None:
    """One launch an arm (no trial) convicts nothing: the card says "not isolated", never M4 from two launches."""
    v = _verdict(tmp_path / "run", anomaly_records(), advise=advise_doc())
    assert v.slow_status == "fired" and v.why.startswith("Not isolated:") and v.shown_by == ""


def test_dip_without_experiments_says_not_isolated_and_no_workaround(tmp_path: Path) -> None:
    gloo_only = [r for r in anomaly_records() if r.backend == "gloo" and r.op == "all_gather"]
    v = _verdict(tmp_path / "run", gloo_only)
    assert v.slow_status == "fired"
    assert v.why.startswith("Not isolated:") and v.sure == "undecided" and v.shown_by == ""
    # the mechanism's reason, in words: the rule ids it names become what they look at
    assert "the one-vs-two-connections experiment (M4)" in v.why
    assert not any(rule in v.why for rule in ("shared_connection", "notice_behind_data", "cpu_bound"))
    assert v.todo.startswith("No workaround was measured in this run") and v.fixes == ()
    assert v.ruled_out == ()
    assert "  ruled out:  nothing, by experiment" in verdict_lines(v)


def test_clean_run_says_nothing_is_slow(tmp_path: Path) -> None:
    v = _verdict(tmp_path / "run", flat_records(), advise=advise_doc(speedup=1.01, verdict="same"))
    assert v.slow == "Nothing is slow: busbw at N=2 is not below N=3,4."
    assert v.why == "Nothing to explain." and v.sure == ""
    assert v.todo == "No measured workaround is significantly faster than plain gloo here."
    # nothing is slow, so no experiment has a loss to explain: no suspect is ruled out by one
    assert v.ruled_out == ()


def test_one_world_size_cannot_tell(tmp_path: Path) -> None:
    rows = [make_record("gloo", "all_gather", 2, s, timed(0.01 * (i + 1))) for i, s in enumerate((1 << 20, 4 << 20))]
    v = _verdict(tmp_path / "run", rows)
    assert v.slow_status == "undecided" and v.slow.startswith("Cannot tell whether N=2 is slow")
    assert v.why.startswith("Not isolated:") or v.why == "Nothing to explain."


def test_reads_only_the_findings() -> None:
    """A mechanism that fired without any suspect shown: 'not isolated to one mechanism', as sure as the
    mechanism finding, never stronger."""
    dip = Finding("n2_busbw_dip", "fired", "torch:gloo all_gather: busbw at N=2 is 40% below N>=3 at 8 MiB",
                  "moderate", (Evidence("x", {"series": "torch:gloo", "op": "all_gather", "ratio": 0.6,
                                               "size_bytes": 8 << 20}),))
    mech = Finding("mechanism", "fired", "the N=2 loss is supported by: the wire shows turns", "weak",
                   (Evidence("n2_busbw_dip: ..."), Evidence("low_duplex_overlap: the wire shows turns")))
    v = build_verdict(None, [dip, mech])
    assert v.why == "Not isolated to one mechanism; the loss is consistent with: the wire shows turns"
    assert v.sure == "weak" and v.shown_by == "duplex overlap on the wire: the wire shows turns"
    assert v.todo == "No workaround was measured (no workarounds finding)."


def test_the_figure_is_on_the_axis_the_dip_was_found_on(tmp_path: Path) -> None:
    per_rank = _verdict(tmp_path / "run", anomaly_records())
    assert per_rank.figure == "busbw_vs_size.png"             # compared at equal per-rank size
    dip = Finding("n2_busbw_dip", "fired", "torch:gloo all_gather: busbw at N=2 is 40% below N>=3 at D=16 MiB",
                  "strong", (Evidence("x", {"series": "torch:gloo", "op": "all_gather"}, plot="busbw_vs_size.png"),))
    assert build_verdict(None, [dip]).figure == "headline.png"  # at equal D: busbw against N


def test_no_surer_than_the_weaker_link() -> None:
    """An experiment that shows M1 strongly does not make the card strong when the mechanism finding ties it
    to this run's dip only weakly; the reference the dip names (N=3 here) is the card's too."""
    dip = Finding("n2_busbw_dip", "fired", "torch:gloo all_gather: busbw at N=2 is 21% below N=3 at D=16 MiB, "
                  "from D=16 MiB upward", "weak",
                  (Evidence("x", {"series": "torch:gloo", "op": "all_gather", "ratio": 0.79, "size_bytes": 16 << 20}),))
    mech = Finding("mechanism", "fired", "the N=2 loss is supported by: M1", "weak", (Evidence("a"), Evidence("b")))
    m1 = Finding("suspect_m1", "fired", "M1: the notice: shown by notice_behind_data (faster on its own connection)",
                 "strong", (Evidence("own-conn 22.8 MB/s vs in-band 15.1 MB/s"),))
    v = build_verdict(None, [dip, mech, m1])
    assert v.slow.startswith("torch:gloo all_gather at N=2: busbw is 21% below N=3")
    assert v.why == "M1: the notice (faster on its own connection)"
    assert v.sure == "weak" and v.sure_detail == "strong that the experiment shows M1, weak that it explains this run's dip"
    assert v.shown_by == "own-conn 22.8 MB/s vs in-band 15.1 MB/s"

"""How verdicts are earned (diag.stats, diag.verdicts, diag.trial): statistics that fit bimodal samples,
positive controls, interleaved rounds, CPU confounders, the budget stop; and the rules and the mechanism
verdict on trial records, including the run of the issue that read "M1 ruled out" and "M4 shown"."""

from __future__ import annotations

import random
import subprocess
import sys
from dataclasses import replace

import pytest
from report_helpers import (
    ANOMALY_SHAPES,
    MiB,
    anomaly_records,
    shaped_times,
    trial_records,
    write_run_dir,
    write_trial,
)
from report_helpers import n2_trial as reproduce_trial

from diag.report import load_run
from diag.report.diagnose import NOTICE_CHANNEL, SHARED_CONNECTION, diagnose
from diag.stats import Arm, bootstrap_means, modes
from diag.trialspec import Comparison, TrialArm, TrialSpec, round_order
from diag.verdicts import ArmCpu, difference, explained_share

ROUNDS = [f"r{i}" for i in range(16)]


def mixture(name: str, fast: float, slow: float, slow_share: float, rounds: int = 8, per_block: int = 2,
            seed: int = 0) -> Arm:
    """An arm whose iterations land in a fast or a slow mode (the N=2 shape), 2% jitter, deterministic."""
    rng = random.Random(f"{name}/{seed}")
    blocks = [[(slow if rng.random() < slow_share else fast) * (1 + rng.gauss(0, 0.02)) for _ in range(per_block)]
              for _ in range(rounds)]
    return Arm.of(name, blocks, ROUNDS[:rounds])


# --- statistics ----------------------------------------------------------------------------------------

def test_modes_find_the_slow_share_of_a_bimodal_sample_and_nothing_in_a_unimodal_one() -> None:
    two = modes([1.082, 0.734, 0.734, 0.733, 1.08])
    assert two.bimodal and two.slow_fraction == pytest.approx(0.4)
    assert two.fast_s == pytest.approx(0.7337, abs=1e-3) and two.slow_s == pytest.approx(1.081, abs=1e-3)
    one = modes([0.79, 0.78, 0.75, 0.79, 0.79, 0.77])
    assert not one.bimodal and one.slow_fraction == 0.0


def test_bootstrap_resamples_interleaved_arms_by_round_together() -> None:
    """A round-wide slowdown (background load) moves both arms of a resample alike: the paired ratio is tight
    where each arm alone varies widely."""
    drift = [1.0, 1.6, 1.0, 1.6, 1.0, 1.6, 1.0, 1.6]
    a = Arm.of("a", [[d * 1.0, d * 1.0] for d in drift], ROUNDS[:8])
    b = Arm.of("b", [[d * 1.2, d * 1.2] for d in drift], ROUNDS[:8])
    boot = bootstrap_means([a, b], resamples=500)
    ratio = boot["b"] / boot["a"]
    assert ratio.min() == pytest.approx(1.2) and ratio.max() == pytest.approx(1.2)
    assert boot["a"].max() / boot["a"].min() > 1.2
    unpaired = bootstrap_means([a, Arm.of("b", b.blocks)], resamples=500)
    assert (unpaired["b"] / unpaired["a"]).max() - (unpaired["b"] / unpaired["a"]).min() > 0.2


# --- decisions -------------------------------------------------------------------------------------------

def test_knock_out_shows_a_suspect_only_when_the_toggle_moves_most_of_the_way() -> None:
    healthy = mixture("raw", 0.72, 0.72, 0.0)
    base = mixture("model", 0.73, 1.10, 0.8)
    shown = explained_share(base, mixture("own", 0.75, 1.1, 0.05), base, healthy, "knock-out")
    assert shown.verdict == "shown" and shown.control.status == "shown" and shown.share.low >= 0.5
    # ruling out needs the loss pinned down: a base arm slow in 90% of 16 rounds, the toggle alike
    slow_base = mixture("model", 0.73, 1.10, 0.9, rounds=16, seed=9)
    healthy16 = mixture("raw", 0.72, 0.72, 0.0, rounds=16)
    ruled = explained_share(slow_base, mixture("own", 0.73, 1.10, 0.9, rounds=16, seed=1), slow_base, healthy16,
                            "knock-out")
    assert ruled.verdict == "ruled_out" and ruled.share.high <= 0.25
    partial = explained_share(base, mixture("own", 0.73, 1.10, 0.5, seed=2), base, healthy, "knock-out")
    assert partial.verdict == "undecided" and not partial.final


def test_no_positive_control_decides_nothing() -> None:
    """The base arm ran at the link: the toggle's "no change" says nothing about the suspect."""
    healthy = mixture("raw", 0.72, 0.72, 0.0)
    fast_base = mixture("model", 0.73, 1.1, 0.0)
    d = explained_share(fast_base, mixture("own", 0.74, 1.1, 0.0), fast_base, healthy, "knock-out")
    assert d.verdict == "undecided" and d.final and "did not show the effect" in d.reason


def test_the_issues_run_never_reads_m1_ruled_out() -> None:
    """The protocol model held [1.082, 0.734, 0.734, 0.733, 1.08] in-band beside [0.79, 0.78, 0.75, 0.79, 0.79]
    own-conn: with no positive control at that size, M1 is undecided, never ruled out; with too few blocks,
    nothing is decided at all."""
    in_band = [1.082, 0.734, 0.734, 0.733, 1.08]
    own = [0.79, 0.78, 0.75, 0.79, 0.79]
    link = [0.72, 0.71, 0.73, 0.72, 0.72]
    one_block = explained_share(Arm.of("m", [in_band]), Arm.of("o", [own]), Arm.of("m", [in_band]),
                                Arm.of("r", [link]), "knock-out")
    assert one_block.verdict == "undecided" and "fewer than" in one_block.reason
    keys = [f"r{i}" for i in range(5)]
    per_iteration = [Arm.of(n, [[t] for t in v], keys) for n, v in (("m", in_band), ("o", own), ("r", link))]
    d = explained_share(per_iteration[0], per_iteration[1], per_iteration[0], per_iteration[2], "knock-out")
    assert d.verdict == "undecided"


def test_knock_in_and_cpu_confounded_arms() -> None:
    """M4: raw TCP on one shared connection against one per direction, held to gloo's loss. A shared arm
    slowed by CPU contention while the split arm was not convicts nothing."""
    gloo = mixture("gloo", 0.73, 1.12, 0.7)
    split = mixture("split", 0.72, 0.72, 0.0)
    flat = explained_share(mixture("shared", 0.72, 0.72, 0.0, seed=3), split, gloo, split, "knock-in")
    assert flat.verdict == "ruled_out"
    contended = mixture("shared", 0.72, 1.0, 0.9, seed=4)
    convicted = explained_share(contended, split, gloo, split, "knock-in")
    assert convicted.verdict == "shown"
    cpu = {"shared": ArmCpu(0.97, 1.0), "split": ArmCpu(0.55, 0.3), "gloo": ArmCpu(0.6, 0.4)}
    confounded = explained_share(contended, split, gloo, split, "knock-in", cpu=cpu)
    assert confounded.verdict == "undecided" and "CPU-saturated" in confounded.reason
    # both arms beside the same busy machine: no confounder, the interleaved comparison stands
    busy = {"shared": ArmCpu(0.98, 0.5), "split": ArmCpu(0.97, 0.5), "gloo": ArmCpu(0.97, 0.5)}
    assert explained_share(contended, split, gloo, split, "knock-in", cpu=busy).verdict == "shown"
    # either side of CPU_CONFOUNDED within the margin is one load (a trial beside the parallel test suite read
    # 95% and 90% of the machine, rank threads at 6% of a core); a margin below it, or a rank's own thread
    # pinned on an equally busy machine, is a confounder
    one_load = {"shared": ArmCpu(0.95, 0.06), "split": ArmCpu(0.897, 0.06), "gloo": ArmCpu(0.93, 0.06)}
    assert explained_share(contended, split, gloo, split, "knock-in", cpu=one_load).verdict == "shown"
    for apart in ({"shared": ArmCpu(0.95, 0.06), "split": ArmCpu(0.79, 0.06), "gloo": ArmCpu(0.93, 0.06)},
                  {"shared": ArmCpu(0.85, 0.97), "split": ArmCpu(0.85, 0.3), "gloo": ArmCpu(0.85, 0.3)}):
        confounded = explained_share(contended, split, gloo, split, "knock-in", cpu=apart)
        assert confounded.verdict == "undecided" and "CPU-saturated" in confounded.reason, apart


def test_difference_is_two_sided_with_an_equivalence_band() -> None:
    a = mixture("recv", 0.70, 0.70, 0.0)
    assert difference(a, mixture("send", 1.1, 1.1, 0.0), 0.15).verdict == "shown"
    assert difference(a, mixture("send", 0.71, 0.71, 0.0, seed=5), 0.15).verdict == "ruled_out"
    # slower, but by less than the threshold or not surely within it: undecided
    assert difference(a, mixture("send", 0.70, 1.2, 0.15, seed=6), 0.15).verdict == "undecided"


# --- the trial's design ----------------------------------------------------------------------------------

def n2_trial(sizes: tuple[int, ...] = (16 * MiB,), **changes) -> TrialSpec:
    return replace(reproduce_trial(sizes), **changes)


def test_every_round_runs_every_arm_in_a_fresh_seeded_order() -> None:
    spec = n2_trial()
    orders = [round_order(spec, 0, r) for r in range(12)]
    assert all(sorted(o) == sorted(a.name for a in spec.arms) for o in orders)
    assert len({tuple(o) for o in orders}) > 6                          # randomized block order
    assert orders == [round_order(spec, 0, r) for r in range(12)]       # the same on every rank
    assert round_order(replace(spec, seed=8), 0, 0) != orders[0] or round_order(replace(spec, seed=8), 0, 1) != orders[1]
    with pytest.raises(Exception, match="unknown arms"):
        TrialSpec("t", (TrialArm("a"),), (Comparison("x", "difference", "a", "b"),), sizes=(1,))


ANOMALY = ANOMALY_SHAPES
_samples = shaped_times


def test_rules_read_the_trial_and_the_mechanism_names_m1(tmp_path) -> None:
    spec = n2_trial()
    root = write_run_dir(tmp_path / "run", anomaly_records())
    write_trial(root / "records" / "n2-trial.jsonl", spec, trial_records(spec, _samples(ANOMALY), rounds=8))
    run = load_run([root])
    assert len(run.trials) == 1 and not any(r.block for r in run.records)
    (m1,) = NOTICE_CHANNEL(run)
    assert m1.status == "fired" and "8 interleaved rounds" in m1.statement
    assert "of the backend's N=2 loss" in m1.statement
    (m4,) = SHARED_CONNECTION(run)
    assert m4.status == "clear"
    findings = {f.rule: f for f in diagnose(run)}
    assert findings["suspect_m1"].status == "fired" and findings["suspect_m4"].status == "clear"
    mech = findings["mechanism"]
    assert mech.status == "fired" and mech.statement.startswith("the N=2 loss is explained by: M1")
    assert "ruled out by experiment: M4" in mech.statement


def test_the_issues_run_with_a_contended_shared_arm_reads_neither_m1_ruled_out_nor_m4_shown(tmp_path) -> None:
    """The model's base arm bimodal and mostly fast (no positive control), own-conn steady; the raw shared arm
    slowed by CPU contention that the split arm did not see. Neither "M1 ruled out" nor "M4 shown"."""
    spec = n2_trial()
    shapes = {**ANOMALY, "model": (0.734, 1.082, 0.15), "model-own-conn": (0.78, 0.78, 0.0),
              "shared-conn": (0.72, 0.95, 0.9)}

    def cpu(arm: str, r: int) -> dict[str, list[float]]:
        return {"machine_busy": [0.99, 0.99] if arm == "shared-conn" else [0.6, 0.6],
                "busiest_thread": [1.0, 0.9] if arm == "shared-conn" else [0.3, 0.2]}

    root = write_run_dir(tmp_path / "run", anomaly_records())
    write_trial(root / "records" / "n2-trial.jsonl", spec, trial_records(spec, _samples(shapes), rounds=8, cpu=cpu))
    findings = {f.rule: f for f in diagnose(load_run([root]))}
    assert findings["suspect_m1"].status != "clear"
    assert findings["notice_behind_data"].status == "undecided"
    assert "did not show the effect" in findings["notice_behind_data"].statement
    assert findings["suspect_m4"].status != "fired"
    assert "CPU-saturated" in findings["shared_connection"].statement
    assert findings["mechanism"].status == "undecided"


def test_sizes_that_disagree_are_undecided(tmp_path) -> None:
    spec = n2_trial(sizes=(4 * MiB, 16 * MiB))

    def times(arm: str, size: int, r: int) -> list[float]:
        # the model always slow; its toggle removes the loss at 16 MiB and nothing at 4 MiB
        shapes = {**ANOMALY, "model": (1.10, 1.10, 0.0), "model-own-conn": (0.74, 0.74, 0.0)}
        fast, slow, share = shapes["model" if arm == "model-own-conn" and size == 4 * MiB else arm]
        rng = random.Random(f"{arm}/{size}/{r}")
        scale = size / (16 * MiB)
        return [scale * (slow if rng.random() < share else fast) for _ in range(2)]

    root = write_run_dir(tmp_path / "run", [])
    write_trial(root / "records" / "n2-trial.jsonl", spec, trial_records(spec, times, rounds=8))
    (m1,) = NOTICE_CHANNEL(load_run([root]))
    assert m1.status == "undecided" and "the sizes disagree" in m1.statement


# --- a real trial: gloo and raw TCP arms in one launch, interleaved, with a budget ---------------------------

@pytest.mark.slow
def test_a_live_trial_interleaves_arms_and_stops_on_its_budget(tmp_path) -> None:
    """Two ranks on loopback, three arms in one launch: every round runs each arm once in its recorded order,
    every block is checked data, and the trial stops on its budget with the stop reason in the end event."""
    script = f"""
import sys
from pathlib import Path
from diag.inplace.job import JobOptions
from diag.plan import Plan, Step
from diag.runplan import run_plan
from diag.trialspec import Comparison, TrialArm, TrialSpec
trial = TrialSpec("live", arms=(TrialArm("gloo", "gloo"), TrialArm("raw"), TrialArm("shared", knobs={{"conn": "shared"}})),
                  comparisons=(Comparison("shared_connection", "knock-in", "shared", "raw", "gloo"),),
                  sizes=(65536,), block_iters=2, min_rounds=3, max_rounds=400, budget_s=3.0, seed=3)
plan = Plan(world_sizes=(2,), steps=(Step("trial", "trial", volumes="given", trial=trial),), name="trial",
            probe=False, capture=False, observe=False, report=False, timeout_s=60)
out = Path({str(tmp_path / "run")!r})
sys.exit(run_plan(JobOptions(plan=plan.to_json(), command="advise", out=str(out), run_id="live")))
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    from diag.records import load_records

    rf = load_records(tmp_path / "run" / "records" / "trial.jsonl")
    blocks = [r for r in rf.records if r.block]
    assert blocks and all(r.nwrong == 0 and r.iters == 2 for r in blocks)
    rounds = sorted({r.block["round"] for r in blocks})
    assert rounds == list(range(len(rounds))) and len(rounds) >= 3
    for k in rounds:
        in_round = sorted((r for r in blocks if r.block["round"] == k), key=lambda r: r.t_start_ns)
        assert [r.block["arm"] for r in in_round] == in_round[0].block["order"]
        assert sorted(in_round[0].block["order"]) == ["gloo", "raw", "shared"]
        assert all(len(r.block["cpu"]["machine_busy"]) == 2 for r in in_round)
    (end,) = rf.ends
    summary = end["trial"]["sizes"]["65536"]
    assert summary["stopped"] in ("budget", "decided") and summary["rounds"] == len(rounds)
    if summary["stopped"] == "budget":
        assert summary["seconds"] < 3.0 + 10
    assert "shared_connection:shared/raw" in summary["decisions"]


def test_an_interleaved_trial_beside_the_link_makes_a_survey_dip_surer(tmp_path) -> None:
    """The survey dips at one size only (not strong, and it says why); the N=2 trial shows gloo below the link in the
    same rounds at two sizes, so the same dip is strong and quotes the trial."""
    from report_helpers import LINK_BPS, ideal_time, make_record, timed

    from diag.report.diagnose import n2_busbw_dip

    rows = []
    for k, size in enumerate((4 * MiB, 16 * MiB)):
        rows.append(make_record("gloo", "all_gather", 2, size,
                                timed(ideal_time("all_gather", 2, size, LINK_BPS, 1.6 if size == 16 * MiB else 1.1),
                                      seed=k)))
        rows.append(make_record("gloo", "all_gather", 3, size, timed(ideal_time("all_gather", 3, size, LINK_BPS),
                                                                      seed=k + 10)))
    survey_only = write_run_dir(tmp_path / "survey", rows)
    (weak,) = n2_busbw_dip(load_run([survey_only]))
    assert weak.status == "fired" and weak.strength != "strong" and "not strong: 1 of 2 sizes dip" in weak.statement
    with_trial = write_run_dir(tmp_path / "trial", rows)
    spec = reproduce_trial(sizes=(4 * MiB, 16 * MiB))
    write_trial(with_trial / "records" / "n2-trial.jsonl", spec, trial_records(spec, shaped_times(ANOMALY), rounds=8))
    (strong,) = [f for f in n2_busbw_dip(load_run([with_trial])) if f.statement.startswith("torch:gloo")]
    assert strong.strength == "strong" and "against the link measured beside it in the same interleaved rounds" in strong.statement
    assert strong.statement.count("(shows the loss)") == 2


def test_a_survey_without_a_dip_does_not_clear_what_the_interleaved_trial_shows(tmp_path) -> None:
    """Survey rows at N=2 and N=3 alike (no dip), the trial beside the link showing gloo's loss at two sizes:
    the two lines of evidence disagree, so the dip is undecided, never "clear"."""
    from report_helpers import LINK_BPS, ideal_time, make_record, timed

    from diag.report.diagnose import n2_busbw_dip

    rows = [make_record("gloo", "all_gather", n, size, timed(ideal_time("all_gather", n, size, LINK_BPS), seed=n))
            for size in (4 * MiB, 16 * MiB) for n in (2, 3)]
    (clear,) = n2_busbw_dip(load_run([write_run_dir(tmp_path / "survey", rows)]))
    assert clear.status == "clear"
    root = write_run_dir(tmp_path / "trial", rows)
    spec = reproduce_trial(sizes=(4 * MiB, 16 * MiB))
    write_trial(root / "records" / "n2-trial.jsonl", spec, trial_records(spec, shaped_times(ANOMALY), rounds=8))
    (gloo,) = [f for f in n2_busbw_dip(load_run([root])) if f.statement.startswith("torch:gloo")]
    assert gloo.status == "undecided" and "but at N=2 it runs below the link measured beside it" in gloo.statement


def test_an_undecided_backend_dip_leaves_the_mechanism_undecided_not_clear() -> None:
    from diag.report.diagnose import mechanism
    from diag.report.diagnose.findings import Evidence, Finding

    raw_dip = Finding("n2_busbw_dip", "fired", "raw:ring [emulate=gloo] all_gather: busbw at N=2 is 30% below",
                      "strong", (Evidence("x", {"series": "raw:ring [emulate=gloo]", "world_size": 2}),))
    open_gloo = Finding("n2_busbw_dip", "undecided", "torch:gloo all_gather: the survey finds N=2 not below N>=3")
    assert mechanism([raw_dip, open_gloo]).status == "undecided"
    assert mechanism([raw_dip]).status == "clear"


def test_a_trial_that_died_before_an_arm_ran_is_read_without_it(tmp_path) -> None:
    """A trial killed in its first round left no block of some arms: the rules read what is there."""
    spec = reproduce_trial()
    blocks = [r for r in trial_records(spec, shaped_times(ANOMALY), rounds=1) if r.block["arm"] != "gloo"]
    root = write_run_dir(tmp_path / "run", anomaly_records())
    write_trial(root / "records" / "n2-trial.jsonl", spec, blocks)
    findings = {f.rule: f for f in diagnose(load_run([root]))}
    assert findings["notice_behind_data"].status == "undecided"        # one round: too few to decide
    assert findings["shared_connection"].status == "undecided"          # its anomaly arm never ran
    assert any(f.rule == "n2_busbw_dip" and f.status == "fired" for f in diagnose(load_run([root])))

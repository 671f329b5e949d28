"""Every command's plan as data (diag/plan.py): a sweep is one step, advise one trial step, reproduce the full
plan; each survives its JSON (the job file, run.json) and names the process groups its steps need."""

from __future__ import annotations

import pytest

from diag.errors import DiagError
from diag.plan import (
    ADVISE,
    QUICK,
    Plan,
    advise_plan,
    capture_tag,
    resolve_plan,
    step_spec,
    step_trial,
    sweep_plan,
)
from diag.spec import SweepSpec


def test_every_plan_reads_back_equal_from_its_json() -> None:
    spec = SweepSpec(backend="diag_tcp", ops=("all_gather", "broadcast"), sizes=(1024, 12589), dtype="uint8",
                     gap_s=0.01, seed=3, check=False, timeout_s=7.0, knobs={"conn": "shared"})
    for plan in (QUICK, resolve_plan(False, 5, [4 << 20], "diag_tcp", ("knobs",)), sweep_plan(spec, (2, 3, 4)),
                 advise_plan((4096, 1 << 20), 3, warmup=1, min_rounds=4, budget_s=9.0)):
        assert Plan.from_json(plan.to_json()) == plan, plan.name


def test_a_sweep_is_one_step_run_as_given_at_every_n() -> None:
    """Every sweep row keeps what the user asked (sizes, ops, dtype, gap, seed, check, timeout, knobs) at every
    N of one launch of max(N) ranks; nothing around it but what --capture and --observe ask for."""
    spec = SweepSpec(backend="raw", ops=("all_gather", "exchange"), sizes=(1024, 12589), dtype="uint8", gap_s=0.01,
                     seed=3, check=False, timeout_s=7.0, algo="pairwise", knobs={"conn": "shared"})
    plan = sweep_plan(spec, (2, 3, 4), capture=True)
    (step,) = plan.steps
    assert plan.world_sizes == (2, 3, 4) and max(plan.world_sizes) == 4
    assert [step_spec(plan, step, n) for n in plan.world_sizes] == [spec] * 3
    assert (plan.probe, plan.capture, plan.observe, plan.report, plan.timeout_s) == (False, True, False, False, 7.0)
    assert step.kind == "sweep" and capture_tag(step, spec, 3) == "sweep--raw-pairwise-all_gather-exchange-n3"
    assert plan.groups_at(2) == ()                           # raw runs on gloo's subgroup (its store, its control)
    tcp = sweep_plan(spec.replace(backend="diag_tcp", algo="default"), (2,))
    assert tcp.groups_at(2) == (("diag_tcp", {"conn": "shared"}),)   # diag_tcp takes its knobs with its group
    assert sweep_plan(spec.replace(backend="nccl", algo="default", knobs={}), (2,)).groups_at(2) == (("nccl", {}),)
    with pytest.raises(DiagError, match="--nproc"):
        sweep_plan(spec, ())


def test_advise_is_one_trial_of_gloo_and_its_workarounds_on_two_backends() -> None:
    plan = advise_plan((16 << 20,), 2, warmup=2, min_rounds=5, budget_s=30.0)
    (step,) = plan.steps
    trial = step_trial(plan, step, seed=11)
    assert step.kind == ADVISE and plan.has_advise and trial.seed == 11 and trial.budget_s == 30.0
    assert [(a.name, a.backend, a.op) for a in trial.arms] == [
        ("gloo", "gloo", "all_gather"), ("p2p-recv-first", "gloo", "all_gather_p2p"), ("diag_tcp", "diag_tcp", "all_gather")]
    assert trial.torch_backends == ("gloo", "diag_tcp") and plan.groups_at(2) == (("diag_tcp", {}),)
    # each workaround against plain gloo, by the design that holds any difference: its effect threshold
    assert [(c.rule, c.design, c.on, c.off, c.effect) for c in trial.comparisons] == [
        ("workarounds", "difference", "p2p-recv-first", "gloo", 0.1), ("workarounds", "difference", "diag_tcp", "gloo", 0.1)]
    assert (plan.probe, plan.capture, plan.report) == (False, False, False)
    with pytest.raises(DiagError, match="at least 2"):
        advise_plan((4096,), 1)


def test_reproduce_runs_the_same_advise_step_last_unless_skipped_or_not_gloo() -> None:
    quick = resolve_plan(True, None, None)
    assert quick.steps[-1].kind == ADVISE and quick.probe and quick.capture and quick.report and quick.incast
    largest = step_trial(quick, quick.steps[-1])
    assert largest.sizes == ((16 << 20),) and largest.arms == advise_plan((1,)).steps[0].trial.arms
    assert not resolve_plan(True, None, None, skip=("advise",)).has_advise
    assert not resolve_plan(True, None, None, skip=("incast",)).incast
    negative = resolve_plan(True, None, None, backend="diag_tcp")
    assert not negative.has_advise and negative.groups_at(2) == (("diag_tcp", {}),)

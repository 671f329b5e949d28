"""The model's profile as a plan step: its steps and sizes, adaptive rows under a time budget, memory, and its
rows kept out of the diagnosis's survey but in the model."""

from __future__ import annotations

from dataclasses import replace

import pytest
from report_helpers import MiB, make_record, write_run_dir

from diag.errors import DiagError
from diag.plan import (
    PROFILE_MEMORY_SHARE,
    PROFILE_MIN_ITERS,
    PROFILE_SIZES,
    PROFILE_TARGET_SEM,
    profile_bytes_per_rank,
    profile_sizes_that_fit,
    resolve_plan,
    step_spec,
)
from diag.records import RecordWriter
from diag.report.rundir import load_run


def test_profile_sizes_reach_from_one_byte_to_200_mib() -> None:
    assert PROFILE_SIZES[0] == 1 and PROFILE_SIZES[-1] == 200 << 20 and list(PROFILE_SIZES) == sorted(PROFILE_SIZES)


def test_profile_added_to_the_plan_or_alone() -> None:
    quick = resolve_plan(True, None, None)
    added = resolve_plan(True, None, None, profile="add")
    # after the plan's own steps, before the advise trial (which stays last); never captured
    assert added.steps[:len(quick.steps) - 1] == quick.steps[:-1] and added.steps[-1] == quick.steps[-1]
    assert quick.steps[-1].kind == "advise" and added.has_advise
    profile = [s for s in added.steps if s.kind == "profile"]
    assert {(s.backend, s.op) for s in profile} == {("gloo", "all_gather"), ("gloo", "send_recv"),
                                                    ("gloo", "all_reduce"), ("raw", "all_gather"), ("raw", "send_recv")}
    assert not any(s.captured for s in profile)
    # a 200 MiB collective at N=8 on a slow link takes minutes: the subgroups wait for it
    assert added.timeout_s >= 600 and quick.timeout_s < 600
    alone = resolve_plan(False, 8, None, profile="only", profile_sizes=(1, 64 << 10, 200 << 20), profile_row_s=0.5)
    assert [s.kind for s in alone.steps] == ["profile"] * 5 and not alone.has_advise and not alone.capture
    # the plan travels to every rank as JSON (the job file, run.json): the profile's sizes come back
    from diag.plan import Plan

    assert Plan.from_json(alone.to_json()) == alone
    assert alone.world_sizes == tuple(range(2, 9)) and all(alone.world_sizes_of(s) == alone.world_sizes
                                                           for s in alone.steps)
    # the backend under test profiles itself (diag_tcp: the negative control's own numbers)
    tested = resolve_plan(True, None, None, backend="diag_tcp", profile="only")
    assert {s.backend for s in tested.steps} == {"diag_tcp", "raw"}
    assert "profile-diag_tcp-all_gather" in {s.name for s in tested.steps}
    with pytest.raises(DiagError, match="choose add"):
        resolve_plan(True, None, None, profile="everything")
    with pytest.raises(DiagError, match="profile-row-seconds"):
        resolve_plan(True, None, None, profile="add", profile_row_s=-1)


def test_profile_rows_sample_until_known_or_their_budget_is_spent() -> None:
    plan = resolve_plan(True, None, None, profile="only", profile_sizes=(1, 3, 4096, 200 << 20), profile_row_s=1.5)
    by_op = {s.op: step_spec(plan, s, 4) for s in plan.steps if s.backend == "gloo"}
    for spec in by_op.values():
        assert spec.iters == PROFILE_MIN_ITERS and spec.max_iters > 100 * PROFILE_MIN_ITERS
        assert spec.row_budget_s == 1.5 and spec.target_sem == PROFILE_TARGET_SEM
        assert spec.timeout_s >= 600        # 200 MiB at N=8 over a slow link takes minutes
    assert by_op["all_gather"].sizes == (1, 3, 4096, 200 << 20) and by_op["all_gather"].dtype == "uint8"
    assert by_op["all_reduce"].sizes == (4096, 200 << 20) and by_op["all_reduce"].dtype == "float32"


def test_profile_sizes_fit_the_memory_of_the_machines_the_ranks_share() -> None:
    plan = resolve_plan(True, None, None, profile="only")
    gather = next(s for s in plan.steps if s.op == "all_gather")
    gigabyte = 1 << 30
    # the lab: 8 ranks on one machine with 8 GiB available; all_gather at N=8 holds 2 x (1 + 8) x S per rank
    kept, left = profile_sizes_that_fit(gather, 8, PROFILE_SIZES, [(8, 8 * gigabyte)])
    assert left == (64 * MiB, 200 * MiB) and kept == PROFILE_SIZES[:-2]
    assert 8 * profile_bytes_per_rank("all_gather", 8, 16 * MiB) <= PROFILE_MEMORY_SHARE * 8 * gigabyte
    assert 8 * profile_bytes_per_rank("all_gather", 8, 64 * MiB) > PROFILE_MEMORY_SHARE * 8 * gigabyte
    # ... and at N=2 on the same machine 200 MiB fits
    assert not profile_sizes_that_fit(gather, 2, PROFILE_SIZES, [(2, 8 * gigabyte)])[1]
    # in place: one rank per machine, each with 8 GiB: everything fits
    kept, left = profile_sizes_that_fit(gather, 8, PROFILE_SIZES, [(1, 8 * gigabyte)] * 8)
    assert not left
    # the smallest size is always kept
    assert profile_sizes_that_fit(gather, 8, (1 << 30,), [(8, 1)]) == ((1 << 30,), ())


def test_profile_rows_feed_the_model_not_the_survey(tmp_path) -> None:
    # the job names one launch per N: every step at N, survey and profile, shares its run id (run-n2, run-n3);
    # the profile is told by its own records file's start events
    survey = [replace(make_record("gloo", "all_gather", n, s, [s / 10e6 * (n - 1) + 1e-3] * 4), run_id=f"run-n{n}")
              for n in (2, 3) for s in (MiB, 4 * MiB)]
    root = write_run_dir(tmp_path / "run", survey)
    profile = [replace(make_record("gloo", "all_gather", n, s, [s / 10e6 * (n - 1) + 1e-3] * 4),
                       run_id=f"run-n{n}") for n in (2, 3) for s in (1, 4096, MiB)]
    with RecordWriter(root / "records" / "profile-gloo-all_gather.jsonl") as writer:
        for n in (2, 3):
            writer.start(f"run-n{n}", env={}, spec={}, meta={"profile": True})
            for r in profile:
                if r.world_size == n:
                    writer.record(r)
            writer.end(f"run-n{n}", "ok")
    run = load_run([root])
    assert len(run.records) == len(survey) and len(run.profile_records) == len(profile)
    assert len(run.model_records) == len(survey) + len(profile)
    assert not run.duplicate_rows()       # the profile's 1 MiB rows are not the survey's twice
    from diag.model import fit

    (m,) = fit(run.model_records).series_models
    assert m.sizes_bytes[0] == 1 and m.sizes_bytes[-1] == 4 * MiB

"""Every statement matches its evidence: the dip's reference (every N it used, every N it left out and why, the
link beside the backend where N>=3 cannot serve), observations that are not alarms, one statistic in the card,
the table and the plots, and both causes of a run that has two. Fixtures are built by code at the figures the
saved quick runs showed (a 4-host 200 Mbit/s lab on a busy 2-core machine)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from report_helpers import (
    ANOMALY_SHAPES,
    LINK_BPS,
    MiB,
    analysis,
    connection,
    direction,
    host_cpu_samples,
    ideal_time,
    make_record,
    n2_trial,
    shaped_times,
    timed,
    trial_records,
    write_run_dir,
    write_trial,
)

from diag.gates import findings_status
from diag.plan import per_rank_size
from diag.records import Record
from diag.report import diagnose, load_run
from diag.report.diagnose import n2_busbw_dip, negative_control
from diag.report.diagnose.dip import match_axis, series_dips
from diag.report.series import by_series, mean_busbw
from diag.report.verdict import build_verdict

# computes in this process: may run beside an `alone` test (tests/conftest.py)
pytestmark = pytest.mark.in_process

VOLUMES = (MiB, 4 * MiB, 16 * MiB)
# Each rank's busbw as a share of the link, per N: gloo 0.75 at N=2 (the anomaly), N=3 and N=4 at the link.
HEALTHY = {2: 1.0, 3: 1.0, 4: 1.0}


def float32_row(backend: str, n: int, volume: int, speed: float, seed: int, **knobs: str) -> Record:
    """A row of diag reproduce's survey: per-rank size D / (N-1) rounded down to whole float32 elements, so
    N=4's 1 MiB is 349,524 bytes a rank and 1,048,572 bytes in all."""
    size = per_rank_size(volume, n)
    row = make_record(backend, "all_gather", n, size, timed(ideal_time("all_gather", n, size, LINK_BPS, 1 / speed),
                                                            seed=seed), knobs=dict(knobs))
    return dataclasses.replace(row, dtype="float32", count=size // 4)


def survey(gloo: dict[int, float], raw: dict[int, float] | None = None, volumes=VOLUMES) -> list[Record]:
    rows = []
    for k, (n, volume) in enumerate((n, v) for n in sorted(gloo) for v in volumes):
        rows.append(float32_row("gloo", n, volume, gloo[n], seed=k))
        rows.append(float32_row("raw", n, volume, (raw or HEALTHY)[n], seed=100 + k, order="recv-first"))
    return rows


def gloo_dip(run) -> object:
    (f,) = [f for f in n2_busbw_dip(run) if f.statement.startswith("torch:gloo")]
    return f


# --- 1: the dip's reference drops no N silently ---


def test_n4_rows_of_a_volume_that_is_not_whole_elements_are_in_the_reference(tmp_path: Path) -> None:
    rows = survey({2: 0.75, 3: 1.0, 4: 0.9})
    assert {r.volume_bytes for r in rows if r.world_size == 4} == {1048572, 4194300, 16777212}
    run = load_run([write_run_dir(tmp_path / "r", rows)])
    per_n, axis, _unmatched = match_axis(by_series(run.records)[("torch:gloo", "all_gather")])
    assert axis == "D=" and {n: sorted(rows) for n, rows in per_n.items()} == {n: list(VOLUMES) for n in (2, 3, 4)}
    dip = gloo_dip(run)
    assert dip.status == "fired" and "below N=3,4 at D=" in dip.statement
    # the median of N=3 (1.0) and N=4 (0.9): 0.75 / 0.95, not 0.75 / 1.0 as with N=3 alone
    for e in dip.evidence:
        assert e.values["reference"] == "N=3,4" and e.values["ratio"] == pytest.approx(0.75 / 0.95, rel=0.04)


def test_a_row_more_than_its_elements_off_the_volume_is_left_out_and_named(tmp_path: Path) -> None:
    rows = [r for r in survey({2: 0.75, 3: 1.0, 4: 1.0})
            if not (r.world_size == 4 and r.volume_bytes < 2 * MiB)]
    off = float32_row("gloo", 4, MiB, 1.0, seed=7)
    off = dataclasses.replace(off, size_bytes=off.size_bytes - 400, volume_bytes=off.volume_bytes - 1200)
    run = load_run([write_run_dir(tmp_path / "r", [*rows, off])])
    dip = gloo_dip(run)
    assert "N=4 left out at D=1 MiB (no row within 12 bytes of that D)" in dip.statement
    at_1m = next(e for e in dip.evidence if e.values["size_bytes"] == MiB)
    assert at_1m.values["reference"] == "N=3"
    assert all(e.values["reference"] == "N=3,4" for e in dip.evidence if e.values["size_bytes"] > MiB)


# --- 2: the loss against the link when N>=3 cannot serve ---


def _cpu_bound_n3_n4(tmp_path: Path, name: str, gloo_shapes: dict) -> Path:
    """N=3,4 CPU-bound (every core busy, raw TCP at 55% of the link there too), so the survey sees no dip
    (N=2 at 0.7 and N>=3 at 0.55-0.6); the interleaved N=2 trial beside the link decides."""
    rows = survey({2: 0.7, 3: 0.6, 4: 0.55}, raw={2: 1.0, 3: 0.55, 4: 0.55})
    observe = {"gloo_n3": host_cpu_samples(98.0), "gloo_n4": host_cpu_samples(98.0),
               "gloo_n2": host_cpu_samples(60.0)}
    root = write_run_dir(tmp_path / name, rows, meta={"link": {"single_stream_Bps": LINK_BPS}}, observe=observe)
    spec = n2_trial(sizes=(4 * MiB, 16 * MiB))
    write_trial(root / "records" / "n2-trial.jsonl", spec, trial_records(spec, shaped_times(gloo_shapes), rounds=6))
    return root


def test_n3_n4_cpu_bound_while_the_trial_shows_the_n2_loss(tmp_path: Path) -> None:
    run = load_run([_cpu_bound_n3_n4(tmp_path, "loss", ANOMALY_SHAPES)])
    dip = gloo_dip(run)
    assert dip.status == "fired" and dip.strength == "strong"
    assert "below the link measured beside it" in dip.statement
    assert "N>=3 cannot serve as the reference: N=3,4 left out of the reference: CPU-bound there" in dip.statement
    assert {e.values["reference_kind"] for e in dip.evidence} == {"trial"}
    findings = diagnose(run)
    assert findings_status(findings, "strong")[0] == 9        # the N=2 loss, shown beside the link: strong
    card = build_verdict(run, findings)
    assert card.slow_status == "fired" and not card.slow.startswith("Nothing is slow")
    assert card.slow.startswith("torch:gloo all_gather at N=2: busbw is ")
    assert "below the link measured beside it in the same interleaved rounds" in card.slow
    assert "N=3,4 left out of the reference: CPU-bound there" in card.slow
    assert card.why.startswith("M1:")


def test_n3_n4_cpu_bound_and_a_healthy_trial_say_nothing_is_slow_against_the_link(tmp_path: Path) -> None:
    healthy = {**ANOMALY_SHAPES, "gloo": (0.73, 0.73, 0.0)}
    run = load_run([_cpu_bound_n3_n4(tmp_path, "fine", healthy)])
    dip = gloo_dip(run)
    assert dip.status == "clear" and "not below the link measured beside it" in dip.statement
    card = build_verdict(run, diagnose(run))
    assert card.slow.startswith("Nothing is slow: busbw at N=2 is not below the link measured beside it")


def test_the_survey_and_the_trial_disagree_and_the_card_says_the_loss(tmp_path: Path) -> None:
    """N>=3 link-bound and level with N=2 in the survey, yet the trial shows gloo below the link at N=2: the
    dip is undecided, and the card names the measured loss instead of "nothing is slow"."""
    rows = [r for r in survey({2: 1.0, 3: 1.0, 4: 1.0}) if r.backend == "gloo"]
    root = write_run_dir(tmp_path / "r", rows)
    spec = n2_trial(sizes=(4 * MiB, 16 * MiB))
    write_trial(root / "records" / "n2-trial.jsonl", spec, trial_records(spec, shaped_times(ANOMALY_SHAPES), rounds=6))
    run = load_run([root])
    assert gloo_dip(run).status == "undecided"
    card = build_verdict(run, diagnose(run))
    assert card.slow_status == "undecided" and "Nothing is slow" not in card.slow
    assert "ran at 0." in card.slow and "the link measured beside it in the same interleaved rounds" in card.slow


# --- 3: observations are not alarms ---


def _fault_free_lab(tmp_path: Path, backend: str) -> Path:
    """A quick run's shape without a fault: the backend at the link at every N (diag_tcp, the negative
    control), or gloo with its N=2 loss; the raw reference resending a few segments (0.002% at N=2, 0.09% at
    N=4, as the saved quiet run), one zero window in 368 packets, idle gaps between the iterations."""
    speed = {2: 1.0 if backend == "diag_tcp" else 0.75, 3: 1.0, 4: 1.0}
    rows = [dataclasses.replace(r, backend=backend) if r.backend == "gloo" else r for r in survey(speed)]
    n2 = next(r for r in rows if r.backend == backend and r.world_size == 2 and r.size_bytes == 4 * MiB)
    raw2 = next(r for r in rows if r.backend == "raw" and r.world_size == 2 and r.size_bytes == 4 * MiB)
    raw4 = next(r for r in rows if r.backend == "raw" and r.world_size == 4 and r.volume_bytes > 2 * MiB
                and r.volume_bytes < 8 * MiB)

    def capture(row: Record, d: dict) -> dict:
        doc = analysis(row.world_size, [connection("10.77.0.1:1", "10.77.0.2:2", d, direction(MiB), 0.9)],
                       backend=row.backend)
        doc["phases"][0]["phase"].update(algo=row.algo, size_bytes=row.size_bytes, t_start_ns=row.t_start_ns,
                                         t_end_ns=row.t_start_ns + 1)
        # inside the timed iterations the direction never idles: its gaps fall between iterations
        busy = {**d, "idle_gaps": {"count": 0, "total_s": 0.0, "max_s": 0.0}}
        doc["phases"][0]["connections"] = [connection("10.77.0.1:1", "10.77.0.2:2", busy, direction(MiB), 0.9)]
        return doc

    rows = [dataclasses.replace(r, t_start_ns=r.t_start_ns + 10_000_000_000 * i, t_end_ns=r.t_end_ns + 10_000_000_000 * i)
            for i, r in enumerate(rows)]
    by = {(r.backend, r.world_size, r.size_bytes): r for r in rows}
    n2, raw2, raw4 = (by[(x.backend, x.world_size, x.size_bytes)] for x in (n2, raw2, raw4))
    analyses = {
        f"{backend}_n2": capture(n2, direction(8 * MiB, packets=250_000, retrans=1, zero_windows=1,
                                               idle_count=40, idle_total_s=0.8, idle_max_s=0.25)),
        "raw_n2": capture(raw2, direction(8 * MiB, packets=240_000, retrans=4)),
        "raw_n4": capture(raw4, direction(8 * MiB, packets=154_359, retrans=303)),
    }
    root = write_run_dir(tmp_path / backend, rows, analyses=analyses, meta={"link": {"single_stream_Bps": LINK_BPS}})
    if backend == "diag_tcp":
        spec, times = diag_tcp_trial((0.72, 0.72, 0.0))
    else:
        spec, times = n2_trial(sizes=(4 * MiB, 16 * MiB)), shaped_times(ANOMALY_SHAPES)
    write_trial(root / "records" / "n2-trial.jsonl", spec, trial_records(spec, times, rounds=6))
    return root


def test_a_fault_free_lab_shows_no_observation_as_an_alarm(tmp_path: Path) -> None:
    findings = diagnose(load_run([_fault_free_lab(tmp_path, "gloo")]))
    rules = {f.rule: f for f in findings}
    for rule in ("retransmissions", "window_limited", "idle_gaps"):
        assert rules[rule].status == "observed" and rules[rule].strength == "", rule
    assert ("N=2: the backend's 0.0004% of packets, the raw reference's 0.0017% of packets on the same link"
            in rules["retransmissions"].statement)
    # what fires is the N=2 loss, and the experiment that explains it: no observation is strong
    strong = {f.rule for f in findings if f.status == "fired" and f.strength == "strong"}
    assert "n2_busbw_dip" in strong and not strong & {"retransmissions", "window_limited", "idle_gaps"}
    assert all(f.strength == "" for f in findings if f.status == "observed")


def test_the_diag_tcp_control_on_a_fault_free_lab_has_nothing_strong(tmp_path: Path) -> None:
    run = load_run([_fault_free_lab(tmp_path, "diag_tcp")])
    findings = diagnose(run)
    rules = {f.rule: f for f in findings}
    (dip,) = [f for f in findings if f.rule == "n2_busbw_dip" and f.statement.startswith("torch:diag_tcp")]
    assert dip.status == "clear"
    assert negative_control(run)[0].status == "clear"
    # gloo's protocol model still shows M1 in the trial: a fact about gloo, not a finding of this run
    assert rules["notice_behind_data"].status == "observed" and rules["suspect_m1"].status == "observed"
    assert findings_status(findings, "strong") == (0, None)
    card = build_verdict(run, findings)
    assert card.slow.startswith("Nothing is slow") and card.why == "Nothing to explain."


def diag_tcp_trial(shape: tuple[float, float, float]):
    """The N=2 trial as diag reproduce --backend diag_tcp runs it (plan.under_test): diag_tcp where gloo was."""
    spec = n2_trial(sizes=(4 * MiB, 16 * MiB))
    spec = dataclasses.replace(spec, arms=tuple(dataclasses.replace(a, name="diag_tcp", backend="diag_tcp")
                                                if a.backend == "gloo" else a for a in spec.arms),
                               comparisons=tuple(dataclasses.replace(c, reference="diag_tcp")
                                                 if c.reference == "gloo" else c for c in spec.comparisons))
    shapes = {k: v for k, v in ANOMALY_SHAPES.items() if k != "gloo"}
    return spec, shaped_times({**shapes, "diag_tcp": shape})


def test_the_control_backend_below_the_link_is_the_negative_control_dipping(tmp_path: Path) -> None:
    """diag_tcp (no turns) below the link beside it at N=2 where N>=3 cannot serve (CPU-bound there): the
    control dips, so no backend mechanism is named, and the card says the backend takes no turns itself."""
    rows = [dataclasses.replace(r, backend="diag_tcp") if r.backend == "gloo" else r
            for r in survey({2: 0.7, 3: 0.6, 4: 0.55}, raw={2: 1.0, 3: 0.55, 4: 0.55})]
    observe = {"gloo_n3": host_cpu_samples(98.0), "gloo_n4": host_cpu_samples(98.0)}
    root = write_run_dir(tmp_path / "r", rows, meta={"link": {"single_stream_Bps": LINK_BPS}}, observe=observe)
    spec, times = diag_tcp_trial((1.1, 1.1, 0.0))
    write_trial(root / "records" / "n2-trial.jsonl", spec, trial_records(spec, times, rounds=6))
    run = load_run([root])
    findings = diagnose(run)
    control = next(f for f in findings if f.rule == "negative_control")
    assert control.status == "fired" and "torch:diag_tcp all_gather: busbw at N=2 is" in control.statement
    mechanism = next(f for f in findings if f.rule == "mechanism")
    assert mechanism.status == "undecided" and "not its own" in mechanism.statement
    card = build_verdict(run, findings)
    assert "it takes no turns on a connection itself (the negative control)" in card.slow
    assert card.why.startswith("Not the backend's N=2 protocol")


def test_a_busy_machine_s_n2_below_the_link_matrix_is_not_a_dip_of_the_control(tmp_path: Path) -> None:
    """diag_tcp (the control) at N=2 a fifth below the link matrix's edge, on a machine whose every CPU was busy
    at N=2 and N=3 with raw TCP short of the link at both (a fault-free lab beside other load): N=3 cannot
    serve, and the matrix, measured before the rows on a CPU that then had room, is no reference for a pace the
    CPU set. Neither the dip nor the negative control fires; both say why. Where the CPU had room at N=2 (busy
    at N=3 only), the same rows dip against the matrix."""
    from node_helpers import LAB_Bps, link_matrix, ring_records, write_inplace_run

    def run_at(name: str, busy_pct: dict[int, float], raw_at_2: float = 0.8):
        rows = [dataclasses.replace(r, backend="diag_tcp") if r.backend == "gloo" else r
                for r in ring_records({2: 0.78 * LAB_Bps, 3: 0.7 * LAB_Bps}, backends=("gloo",))]
        raw = ring_records({2: raw_at_2 * LAB_Bps, 3: 0.7 * LAB_Bps}, backends=("raw",), seed=50)
        tags = ("diag_tcp-all_gather--diag_tcp-all_gather-n2", "diag_tcp-all_gather--diag_tcp-all_gather-n3")
        # the machine's samples through each of the N's rows, as the observer takes them
        def samples(n: int) -> list[dict[str, object]]:
            return [*host_cpu_samples(busy_pct[n]), *(
                {"kind": "cpu_host", "t_ns": r.t_start_ns + (r.t_end_ns - r.t_start_ns) * i // 6, "cpus": 2,
                 "busy_pct": busy_pct[n], "per_cpu_pct": [busy_pct[n]] * 2}
                for r in rows if r.world_size == n and r.t_start_ns and r.t_end_ns for i in range(1, 6))]
        observe = {n: {tag: samples(int(tag[-1])) for tag in tags} for n in ("h0", "h1", "h2")}
        return load_run([write_inplace_run(tmp_path / name, [*rows, *raw], nodes=("h0", "h1", "h2"),
                                           observe=observe, matrix=link_matrix(nodes=("h0", "h1", "h2")))])

    busy = run_at("busy", {2: 99.0, 3: 99.0})
    (dip,) = [f for f in n2_busbw_dip(busy) if f.statement.startswith("torch:diag_tcp")]
    assert dip.status == "undecided" and "the CPU, not the link, set N=2's pace" in dip.statement
    assert "N=3 left out of the reference: CPU-bound there" in dip.statement
    (control,) = negative_control(busy)
    assert control.status == "undecided" and "the link is no reference for it" in control.statement
    room = run_at("room", {2: 40.0, 3: 99.0})
    (dip,) = [f for f in n2_busbw_dip(room) if f.statement.startswith("torch:diag_tcp")]
    assert dip.status == "fired" and "below the link measured beside it" in dip.statement
    assert negative_control(room)[0].status == "fired"
    # every core busy through N=2's rows while raw TCP still reached the link there (the CPU could carry it): the
    # matrix, measured at another time, shares none of that load (a fault-free lab beside the parallel suite:
    # diag_tcp 0.78x the matrix, slow in 18% of its iterations), so neither fires
    carried = run_at("carried", {2: 99.0, 3: 99.0}, raw_at_2=0.95)
    (dip,) = [f for f in n2_busbw_dip(carried) if f.statement.startswith("torch:diag_tcp")]
    assert dip.status == "undecided" and "under a load it does not share" in dip.statement, dip.statement
    assert negative_control(carried)[0].status == "undecided"


def test_a_dip_between_blocks_under_different_load_is_not_claimed(tmp_path: Path) -> None:
    """The survey's N=2 rows a fifth below N=3's, but another job kept every core busy through N=2's rows and was
    gone for N=3's (the machine's CPU samples in each row's window say so): the blocks differ in load as well as
    in N, so the dip is undecided and says why. The same rows with the machine busy through both, or through
    neither, dip."""

    def run_at(name: str, busy_at: dict[int, float]):
        rows = []
        for k, row in enumerate(survey({2: 0.8, 3: 1.0})):
            start = 10_000_000_000 * (k + 1)
            rows.append(dataclasses.replace(row, t_start_ns=start, t_end_ns=start + 5_000_000_000))
        observe: dict[str, list[dict[str, object]]] = {}
        for row in rows:
            tag = f"{row.backend}_n{row.world_size}"
            observe.setdefault(tag, []).extend(
                {"kind": "cpu_host", "t_ns": row.t_start_ns + i * 500_000_000, "cpus": 2,
                 "busy_pct": busy_at[row.world_size], "per_cpu_pct": [busy_at[row.world_size]] * 2}
                for i in range(1, 9))
        # raw TCP at the link at every N: a busy machine there is no CPU-bound N (cpu_bound)
        return load_run([write_run_dir(tmp_path / name, rows, observe=observe,
                                       meta={"link": {"single_stream_Bps": LINK_BPS}})])

    (dip,) = [f for f in n2_busbw_dip(run_at("came-and-went", {2: 99.0, 3: 40.0}))
              if f.statement.startswith("torch:gloo")]
    assert dip.status == "undecided" and "the blocks ran under different load" in dip.statement
    assert "every core busy in 100% of N=2's CPU samples, at most 0% of the reference rows'" in dip.statement
    for name, busy_at in (("busy-throughout", {2: 99.0, 3: 99.0}), ("quiet", {2: 40.0, 3: 40.0})):
        (dip,) = [f for f in n2_busbw_dip(run_at(name, busy_at)) if f.statement.startswith("torch:gloo")]
        assert dip.status == "fired" and "below N=3" in dip.statement, (name, dip.statement)


# --- 7: one number per measurement ---


def test_the_card_the_table_and_the_plot_quote_one_statistic(tmp_path: Path) -> None:
    """Bimodal N=2 rows (mean and median apart): the card's N=2 busbw is the dip evidence's mean busbw, and the
    records table shows the same number, under a header that names the statistic."""
    from diag.report.render import RECORD_HEADER, record_row
    from diag.units import human_rate

    rows = survey({2: 1.0, 3: 1.0, 4: 1.0})
    slow = [r for r in rows if r.world_size == 2 and r.backend == "gloo"]
    for r in slow:    # 8 fast iterations at the link, 4 at half of it: mean and median differ
        fast = r.times_s[0]
        times = [fast] * 8 + [2 * fast] * 4
        rows[rows.index(r)] = make_record("gloo", "all_gather", 2, r.size_bytes, times)
    run = load_run([write_run_dir(tmp_path / "r", rows)])
    card = build_verdict(run, diagnose(run))
    dip = gloo_dip(run)
    deepest = min(dip.evidence, key=lambda e: e.values["ratio"])
    n2 = human_rate(deepest.values["busbw_n2_Bps"])
    assert f"(mean busbw {n2} vs" in card.slow
    row = next(r for r in run.records if r.backend == "gloo" and r.world_size == 2
               and r.size_bytes == deepest.values["size_bytes"])
    assert human_rate(mean_busbw(row)) == n2 and human_rate(row.busbw_Bps) != n2   # the median's is not quoted
    assert record_row(row)[RECORD_HEADER.index("busbw (mean time)")] == n2
    assert RECORD_HEADER[5] == "time (mean)"


# --- the card reads the dips of every series it has ---


def test_series_dips_keep_a_series_whose_n3_cannot_serve(tmp_path: Path) -> None:
    observe = {"gloo_n3": host_cpu_samples(98.0), "gloo_n4": host_cpu_samples(98.0)}
    rows = survey({2: 0.7, 3: 0.6, 4: 0.55}, raw={2: 1.0, 3: 0.55, 4: 0.55})
    run = load_run([write_run_dir(tmp_path / "r", rows, meta={"link": {"single_stream_Bps": LINK_BPS}},
                                  observe=observe)])
    dips = {d.label: d for d in series_dips(run)}
    assert dips["torch:gloo"].status == "no_reference" and dips["torch:gloo"].left_out == {
        3: "CPU-bound there (cpu_bound)", 4: "CPU-bound there (cpu_bound)"}
    # no trial and no link matrix: nothing to hold N=2 against, and the finding says so
    dip = gloo_dip(run)
    assert dip.status == "undecided" and "no link was measured beside it" in dip.statement


# --- 8: two causes, both said ---


def test_a_slow_host_beside_the_n2_mechanism_names_both(tmp_path: Path) -> None:
    """h3 stuck at half the link (the link matrix shows it) paces N=4, the one N that holds it; gloo loses a
    quarter at N=2 against N=3 and against the link beside it, and the trial shows M1. The dip leaves N=4 out of
    its reference and says why (it never hides the loss behind a paced N=4), and the card names the mechanism
    and the host: at the hosts, and in what to do."""
    from node_helpers import LAB_Bps, link_matrix, ring_records, write_inplace_run
    from report_helpers import advise_doc

    rates = {2: LAB_Bps, 3: LAB_Bps, 4: 0.5 * LAB_Bps}
    gloo = ring_records({**rates, 2: 0.75 * LAB_Bps}, backends=("gloo",))
    raw = ring_records(rates, backends=("raw",), seed=50)
    root = write_inplace_run(tmp_path / "run", [*gloo, *raw],
                             matrix=link_matrix(out_Bps={"h3": 0.5 * LAB_Bps}, in_Bps={"h3": 0.5 * LAB_Bps}))
    spec = n2_trial(sizes=(4 * MiB, 16 * MiB))
    write_trial(root / "records" / "n2-trial.jsonl", spec, trial_records(spec, shaped_times(ANOMALY_SHAPES), rounds=8))
    (root / "advise").mkdir()
    (root / "advise" / "advise.json").write_text(__import__("json").dumps(advise_doc()))
    run = load_run([root])
    findings = diagnose(run)
    rules = {f.rule: f for f in findings if f.rule in ("slow_host_link", "mechanism")}
    assert rules["slow_host_link"].status == "fired" and "h3's link is slow" in rules["slow_host_link"].statement
    dip = gloo_dip(run)
    assert dip.status == "fired" and "below N=3 at" in dip.statement
    assert ("N=4 left out of the reference: its subgroup holds h3, whose link is slow (slow_host_link), and N=2's "
            "does not") in dip.statement
    card = build_verdict(run, findings)
    assert card.slow.startswith("torch:gloo all_gather at N=2: busbw is") and "below N=3" in card.slow
    assert card.why.startswith("M1:")
    assert any(line.startswith("h3: its link carries less") for line in card.hosts)
    assert card.todo.startswith("Use all_gather from batch_isend_irecv")
    assert "And at the hosts: Check h3's NIC, cable and switch port" in card.todo
    # the same run without the N=2 loss: the host is what is slow, and nothing of the mechanism is claimed
    flat = ring_records(rates, backends=("gloo",))
    root2 = write_inplace_run(tmp_path / "host-only", [*flat, *raw],
                              matrix=link_matrix(out_Bps={"h3": 0.5 * LAB_Bps}, in_Bps={"h3": 0.5 * LAB_Bps}))
    healthy = {**ANOMALY_SHAPES, "gloo": (0.73, 0.73, 0.0)}
    write_trial(root2 / "records" / "n2-trial.jsonl", spec, trial_records(spec, shaped_times(healthy), rounds=8))
    run2 = load_run([root2])
    card2 = build_verdict(run2, diagnose(run2))
    assert card2.slow.startswith("One host slows the run: h3's link is slow")
    assert not card2.why.startswith("M1:")


def test_trial_blocks_are_not_reported_as_duplicate_rows(tmp_path: Path) -> None:
    """A trial's rounds share their series, op, N and size with the survey row: they are its blocks, read as a
    trial, and no warning says "in 6 records: the later one is shown" of them."""
    root = write_run_dir(tmp_path / "r", survey({2: 0.75, 3: 1.0, 4: 1.0}))
    spec = n2_trial(sizes=(4 * MiB, 16 * MiB))
    write_trial(root / "records" / "n2-trial.jsonl", spec, trial_records(spec, shaped_times(ANOMALY_SHAPES), rounds=6))
    run = load_run([root])
    assert run.duplicate_rows() == []
    rows = run.records
    write_run_dir(tmp_path / "twice", [*rows, *rows])
    assert len(load_run([tmp_path / "twice"]).duplicate_rows()) == len(rows)

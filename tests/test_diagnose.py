"""Each diagnosis rule fires on inputs built to trigger it, stays silent on ones that should not, and says
when it cannot decide. Inputs are run directories written by code (report_helpers)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from report_helpers import (
    LINK_BPS,
    KiB,
    MiB,
    analysis,
    anomaly_records,
    connection,
    cpu_samples,
    direction,
    flat_records,
    host,
    host_cpu_samples,
    ideal_time,
    make_record,
    tcp_info_samples,
    timed,
    turn_taking_analyses,
    write_run_dir,
)

from diag.__main__ import main
from diag.records import Record
from diag.report import diagnose, load_run
from diag.report.diagnose import (
    EXCHANGE_ORDER,
    SHARED_CONNECTION,
    Evidence,
    Finding,
    backend_below_raw,
    capture_drops,
    cpu_bound,
    cpu_limited_world_sizes,
    data_errors,
    idle_gaps,
    low_duplex_overlap,
    n2_busbw_dip,
    retransmissions,
    window_limited,
)
from diag.report.thresholds import (
    CPU_PINNED_PCT,
    CPU_SATURATED_PCT,
    DUPLEX_OVERLAP_LOW,
    N2_DIP_RATIO,
)

# computes in this process: may run beside an `alone` test (tests/conftest.py)
pytestmark = pytest.mark.in_process


def statuses(findings: list[Finding]) -> set[str]:
    return {f.status for f in findings}


def fired(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f.status == "fired"]


@pytest.fixture
def anomaly_run(tmp_path):
    return load_run([write_run_dir(tmp_path / "anomaly", anomaly_records())])


@pytest.fixture
def flat_run(tmp_path):
    return load_run([write_run_dir(tmp_path / "flat", flat_records())])


def test_a_finding_needs_evidence() -> None:
    with pytest.raises(ValueError):
        Finding("x", "fired", "something", "strong")
    Finding("x", "fired", "something", "strong", (Evidence("1 > 0"),))


def test_n2_dip_fires_with_onset_and_evidence(anomaly_run) -> None:
    findings = fired(n2_busbw_dip(anomaly_run))
    gloo = [f for f in findings if f.statement.startswith("torch:gloo all_gather")]
    assert len(gloo) == 1
    f = gloo[0]
    assert "from 256 KiB per rank upward" in f.statement
    # three sizes dip, all confirmed, but the survey rows are separate launches with no interleaved trial beside
    # the link: moderate, and the statement says why (the trial makes it strong: test_experiments)
    assert f.strength == "moderate" and "not strong: the survey rows are separate launches" in f.statement
    assert f.thresholds["N2_DIP_RATIO"] == N2_DIP_RATIO.value
    sizes = [e.values["size_bytes"] for e in f.evidence]
    assert sizes == [256 * KiB, MiB, 4 * MiB]
    assert all(e.values["ratio"] < N2_DIP_RATIO.value and e.source == "records/sweep.jsonl" for e in f.evidence)
    # the raw split-connection reference has no dip; the shared-connection raw rows do
    labels = {f.statement.split(" all_gather")[0] for f in findings}
    assert any("conn=shared" in label for label in labels)
    assert not any(label.startswith("raw:ring [order") for label in labels)


def test_n2_dip_silent_on_flat_and_undecided_without_n3(flat_run, tmp_path) -> None:
    assert statuses(n2_busbw_dip(flat_run)) == {"clear"}
    only_n2 = load_run([write_run_dir(tmp_path / "n2", [make_record("gloo", "all_gather", 2, MiB, timed(0.1))])])
    (f,) = n2_busbw_dip(only_n2)
    assert f.status == "undecided" and "cannot compare" in f.statement


def test_backend_below_raw(anomaly_run, flat_run, tmp_path) -> None:
    (f,) = backend_below_raw(anomaly_run)
    assert f.status == "fired" and "N=2" in f.statement
    assert {e.values["world_size"] for e in f.evidence} == {2}
    assert all(e.values["efficiency"] < 0.7 for e in f.evidence)
    assert statuses(backend_below_raw(flat_run)) == {"clear"}
    no_raw = load_run([write_run_dir(tmp_path / "g", [make_record("gloo", "all_gather", 2, MiB, timed(0.1))])])
    (u,) = backend_below_raw(no_raw)
    assert u.status == "undecided" and u.statement.startswith("no raw rows: cannot compare")


def test_shared_connection_rule_needs_blocks_not_one_launch_an_arm(anomaly_run, flat_run) -> None:
    """One launch an arm cannot tell the knob from the time it ran at (the trials in test_experiments decide);
    the finding says why it cannot decide instead of reading a difference of two launches."""
    for run in (anomaly_run, flat_run):
        (f,) = SHARED_CONNECTION(run)
        assert f.status == "undecided" and "fewer than 3" in f.statement and "not interleaved" in f.statement


def test_exchange_order_rule(anomaly_run, flat_run, tmp_path) -> None:
    """Survey rows repeated in three launches an arm (no trial) decide, unpaired; one launch does not."""
    def repeated(records, name):
        rows = [Record(**{**r.__dict__, "run_id": f"{r.run_id}-{k}", "times_s": [t * (1 + 0.01 * k) for t in r.times_s]})
                for r in records if r.op == "exchange" and r.size_bytes == MiB for k in range(3)]
        return load_run([write_run_dir(tmp_path / name, rows)])

    (f,) = EXCHANGE_ORDER(repeated(anomaly_records(), "slow-repeated"))
    assert f.status == "fired" and "launches an arm" in f.statement
    assert f.evidence[0].values["ratio"]["point"] == pytest.approx(1.6, rel=0.1)
    assert statuses(EXCHANGE_ORDER(repeated(flat_records(), "flat-repeated"))) == {"clear"}
    assert statuses(EXCHANGE_ORDER(anomaly_run)) == {"undecided"}
    one_order = load_run([write_run_dir(tmp_path / "one", [make_record(
        "gloo", "exchange", 2, MiB, timed(0.1), knobs={"order": "recv-first"})])])
    (u,) = EXCHANGE_ORDER(one_order)
    assert u.status == "undecided" and "one order only" in u.statement


def test_duplex_overlap_rule(tmp_path) -> None:
    run = load_run([write_run_dir(tmp_path / "d", flat_records(), analyses=turn_taking_analyses())])
    (f,) = low_duplex_overlap(run)
    # how the wire looks, never why: an observation, no alarm
    assert f.status == "observed" and f.strength == "" and "N=2" in f.statement and "N=4" in f.statement
    assert f.explains.startswith("none: how the loss looks on the wire")
    assert {e.values["world_size"] for e in f.evidence} == {2}
    assert {e.values["kind"] for e in f.evidence} == {"connection", "host"}
    assert all(e.values["duplex_overlap"] < DUPLEX_OVERLAP_LOW.value for e in f.evidence)
    assert f.evidence[0].source == "analysis/gloo_n2.json"
    good = analysis(2, [connection("a:1", "b:2", direction(8 * MiB), direction(8 * MiB), 0.9)])
    (ok,) = low_duplex_overlap(load_run([write_run_dir(tmp_path / "ok", flat_records(), analyses={"n2": good})]))
    assert ok.status == "clear"
    (u,) = low_duplex_overlap(load_run([write_run_dir(tmp_path / "none", flat_records())]))
    assert u.status == "undecided"


def test_window_limited_rule(tmp_path) -> None:
    zero = analysis(2, [connection("a:1", "b:2", direction(MiB, zero_windows=3), direction(MiB), 0.9)])
    run = load_run([write_run_dir(tmp_path / "z", flat_records(), analyses={"n2": zero})])
    (f,) = window_limited(run)
    # nothing is measured slow in this run: three zero windows are an observation, not an alarm
    assert f.status == "observed" and f.strength == "" and "3 zero windows" in f.statement
    assert "no loss of the backend is measured at any N captured" in f.statement
    limited = load_run([write_run_dir(tmp_path / "t", flat_records(),
                                      observe={"n2": tcp_info_samples(rwnd_limited_s=0.5)})])
    (g,) = window_limited(limited)
    assert g.status == "observed" and g.evidence[-1].values["fraction"] == pytest.approx(0.5)
    fine = load_run([write_run_dir(tmp_path / "f", flat_records(), observe={"n2": tcp_info_samples(0.01)},
                                   analyses={"n2": analysis(2, [connection("a:1", "b:2", direction(MiB),
                                                                           direction(MiB), 0.9)])})])
    assert statuses(window_limited(fine)) == {"clear"}


def test_retransmission_rule(tmp_path) -> None:
    lossy = analysis(2, [connection("a:1", "b:2", direction(MiB, packets=1000, retrans=20), direction(MiB), 0.9)])
    (f,) = retransmissions(load_run([write_run_dir(tmp_path / "l", flat_records(), analyses={"n2": lossy})]))
    assert f.status == "observed" and f.evidence[-1].values["rate"] == pytest.approx(0.02)
    clean = analysis(2, [connection("a:1", "b:2", direction(MiB), direction(MiB), 0.9)])
    (ok,) = retransmissions(load_run([write_run_dir(tmp_path / "c", flat_records(), analyses={"n2": clean})]))
    assert ok.status == "clear"


def test_idle_gap_rule_names_slow_start_after_idle(tmp_path) -> None:
    idle = analysis(2, [connection("a:1", "b:2", direction(MiB, idle_count=4, idle_total_s=1.2, idle_max_s=0.4),
                                   direction(MiB), 0.9)])
    (f,) = idle_gaps(load_run([write_run_dir(tmp_path / "i", flat_records(), analyses={"n2": idle})]))
    assert f.status == "observed" and f.strength == ""
    assert "slow start after idle" in f.statement and "tcp_slow_start_after_idle = 1" in f.statement
    busy = analysis(2, [connection("a:1", "b:2", direction(MiB, idle_count=2, idle_total_s=0.01, idle_max_s=0.005),
                                   direction(MiB), 0.9)])
    (ok,) = idle_gaps(load_run([write_run_dir(tmp_path / "b", flat_records(), analyses={"n2": busy})]))
    assert ok.status == "clear"


def test_cpu_pinned_rule(tmp_path) -> None:
    hot = cpu_samples("gloo-worker", 99.0) + cpu_samples("main", 10.0, tid=12)
    (f,) = cpu_bound(load_run([write_run_dir(tmp_path / "h", flat_records(), observe={"gloo_n2": hot})]))
    # no loss measured at N=2 in a flat run: the pinned thread is an observation
    assert f.status == "observed" and "CPU-bound, not network-bound" in f.statement
    # the same thread where the backend is slow at N=2: the CPU may be part of that loss, a finding
    (g,) = cpu_bound(load_run([write_run_dir(tmp_path / "a", anomaly_records(), observe={"gloo_n2": hot})]))
    assert g.status == "fired" and g.strength == "strong"
    assert [e.values["thread"] for e in f.evidence] == ["gloo-worker"]
    cool = cpu_samples("gloo-worker", CPU_PINNED_PCT.value - 30)
    (ok,) = cpu_bound(load_run([write_run_dir(tmp_path / "c", flat_records(), observe={"gloo_n2": cool})]))
    assert ok.status == "clear"
    (u,) = cpu_bound(load_run([write_run_dir(tmp_path / "u", flat_records())]))
    assert u.status == "undecided"


def test_cpu_rule_sees_a_saturated_machine_without_a_pinned_thread(tmp_path) -> None:
    # 8 ranks on 2 cores: no thread near 100% of a core, yet every core busy in the N=8 run only.
    spread = cpu_samples("gloo-worker", 24.0)
    observe = {"gloo_n2": spread + host_cpu_samples(40.0), "gloo_n8": spread + host_cpu_samples(97.0)}
    (f,) = cpu_bound(load_run([write_run_dir(tmp_path / "s", flat_records(), observe=observe)]))
    assert f.status == "observed" and "every CPU of the machine was busy at N=8" in f.statement
    assert [(e.values["kind"], e.values["world_size"]) for e in f.evidence] == [("host", 8)]
    assert f.evidence[0].values["median_pct"] == 97.0 and f.thresholds["CPU_SATURATED_PCT"] == CPU_SATURATED_PCT.value
    # Busy at N=2 too, but raw TCP fills the link there on the same machine: the CPU is not the limit at N=2.
    link = {"link": {"single_stream_Bps": LINK_BPS}}
    observe_both = {"gloo_n2": spread + host_cpu_samples(97.0), "gloo_n8": spread + host_cpu_samples(97.0)}
    (both,) = cpu_bound(load_run([write_run_dir(tmp_path / "b", flat_records(), meta=link,
                                                      observe=observe_both)]))
    assert both.status == "observed" and [e.values["world_size"] for e in both.evidence] == [8]
    assert "busy at N=2, yet raw TCP reached" in both.statement
    (carried,) = cpu_bound(load_run([write_run_dir(tmp_path / "k", flat_records(), meta=link,
                                                         observe={"gloo_n2": observe_both["gloo_n2"]})]))
    assert carried.status == "clear" and "could carry the traffic" in carried.statement
    calm = {"gloo_n2": spread + host_cpu_samples(CPU_SATURATED_PCT.value - 20)}
    (ok,) = cpu_bound(load_run([write_run_dir(tmp_path / "c", flat_records(), observe=calm)]))
    assert ok.status == "clear" and "not saturated" in ok.statement


def test_cpu_rule_holds_raw_tcp_against_the_iperf3_ring_pattern(tmp_path) -> None:
    # Raw TCP fills the link at N=2,3 but reaches 60% of it at N=4, where iperf3 in the same ring pattern
    # (run.json link.ring_pattern) carried only 62%: the machine's own limit, not raw TCP, is short there.
    records = []
    for k, (n, size) in enumerate((n, size) for n in (2, 3, 4) for size in (MiB, 4 * MiB)):
        raw_slow = 1 / 0.6 if n == 4 else 1.0
        records.append(make_record("raw", "all_gather", n, size,
                                   timed(ideal_time("all_gather", n, size, LINK_BPS, raw_slow), seed=k)))
    pattern = {str(n): {"mean_edge_Bps": share * LINK_BPS, "min_edge_Bps": share * LINK_BPS, "tool": "iperf3"}
               for n, share in ((2, 0.99), (3, 0.97), (4, 0.62))}
    meta = {"link": {"single_stream_Bps": LINK_BPS, "ring_pattern": pattern}}
    observe = {"gloo_n3": host_cpu_samples(97.0), "gloo_n4": host_cpu_samples(97.0)}
    run = load_run([write_run_dir(tmp_path / "p", records, meta=meta, observe=observe)])
    assert run.ring_pattern_Bps == {n: pytest.approx(share * LINK_BPS) for n, share in ((2, 0.99), (3, 0.97),
                                                                                         (4, 0.62))}
    # the pattern is the reference only where the CPU held it below CPU_LINK_REACHED of the single stream, the
    # share at which cpu_bound calls an N CPU-limited (one threshold: the table and the rule name the same N)
    assert run.link_reference_Bps(4) == pytest.approx(0.62 * LINK_BPS)
    assert run.link_reference_Bps(3) == pytest.approx(LINK_BPS)
    (cpu,) = cpu_bound(run)
    assert cpu.status == "observed" and [e.values["world_size"] for e in cpu.evidence] == [4]
    assert "iperf3 in the same ring pattern, carried 62% of the link per edge" in cpu.evidence[0].text
    raw_share = cpu.evidence[0].values["raw_link_share"]
    assert 0.55 < raw_share < 0.65 and cpu.evidence[0].values["machine_link_share"] == min(raw_share, 0.62)
    assert f"raw TCP reached {raw_share / 0.62:.0%} of that limit" in cpu.evidence[0].text
    assert "busy at N=3, yet raw TCP and iperf3's ring pattern reached 97% of the link there" in cpu.statement
    assert cpu_limited_world_sizes(run) == {4}
    # raw TCP alone fills the link at N=3, yet iperf3's pattern there says the machine cannot: CPU-limited
    short = {**pattern, "3": {"mean_edge_Bps": 0.5 * LINK_BPS}}
    limited = load_run([write_run_dir(tmp_path / "s", records, meta={"link": {"single_stream_Bps": LINK_BPS,
                                                                                 "ring_pattern": short}},
                                      observe=observe)])
    assert cpu_limited_world_sizes(limited) == {3, 4}
    # no pattern in run.json: the old rule, raw TCP against the single stream
    plain = load_run([write_run_dir(tmp_path / "n", records, meta={"link": {"single_stream_Bps": LINK_BPS}},
                                    observe=observe)])
    assert plain.ring_pattern_Bps == {} and plain.link_reference_Bps(4) == pytest.approx(LINK_BPS)
    assert cpu_limited_world_sizes(plain) == {4}
    (report_cpu,) = cpu_bound(plain)
    assert "iperf3" not in report_cpu.statement + " ".join(e.text for e in report_cpu.evidence)


def test_n2_dip_leaves_cpu_bound_world_sizes_out_of_its_reference(tmp_path) -> None:
    # N=2 at 0.75 of the link, N=3 at the link, N=4 at half of it because every core was busy (raw TCP
    # halves there too). Against the median of N=3 and 4 the N=2 loss would vanish; against N=3 it shows.
    speed = {2: 0.75, 3: 1.0, 4: 0.5}
    records = []
    for k, (n, size) in enumerate((n, size) for n in (2, 3, 4) for size in (MiB, 4 * MiB)):
        records.append(make_record("gloo", "all_gather", n, size,
                                   timed(ideal_time("all_gather", n, size, LINK_BPS, 1 / speed[n]), seed=k)))
        raw_slow = 2.0 if n == 4 else 1.0
        records.append(make_record("raw", "all_gather", n, size,
                                   timed(ideal_time("all_gather", n, size, LINK_BPS, raw_slow), seed=100 + k)))
    meta = {"link": {"single_stream_Bps": LINK_BPS}}
    observe = {"gloo_n4": host_cpu_samples(98.0), "gloo_n3": host_cpu_samples(50.0)}
    run = load_run([write_run_dir(tmp_path / "r", records, meta=meta, observe=observe)])
    (cpu,) = cpu_bound(run)
    assert cpu.status == "observed" and [e.values["world_size"] for e in cpu.evidence] == [4]
    (dip,) = [f for f in n2_busbw_dip(run) if f.statement.startswith("torch:gloo")]
    assert dip.status == "fired" and "below N=3 at" in dip.statement
    assert "N=4 left out of the reference: CPU-bound there" in dip.statement
    assert dip.evidence[-1].values["ratio"] == pytest.approx(0.75, rel=0.05)
    # Without the CPU evidence, N=4 stays in the reference and hides the loss.
    blind = load_run([write_run_dir(tmp_path / "b", records, meta=meta)])
    (ok,) = [f for f in n2_busbw_dip(blind) if f.statement.startswith("torch:gloo")]
    assert ok.status == "clear"


def test_capture_drop_rule_and_weakened_wire_findings(tmp_path) -> None:
    analyses = turn_taking_analyses()
    analyses["gloo_n2"]["capture"] = {"kernel_dropped": 120, "flagged": True}
    run = load_run([write_run_dir(tmp_path / "d", flat_records(), analyses=analyses,
                                  captures={"gloo_n2": {"iface": "veth0", "kernel_dropped": 120, "packets": 9000}})])
    (f,) = capture_drops(run)
    # about the capture, not the run's speed: an observation that says which findings it makes unreliable
    assert f.status == "observed" and f.evidence[0].values["kernel_dropped"] == 120
    (duplex,) = low_duplex_overlap(run)
    assert "unreliable" in duplex.evidence[0].text
    clean = load_run([write_run_dir(tmp_path / "c", flat_records(), captures={"n2": {"kernel_dropped": 0}})])
    assert statuses(capture_drops(clean)) == {"clear"}
    assert statuses(capture_drops(load_run([write_run_dir(tmp_path / "n", flat_records())]))) == {"undecided"}


def test_data_errors_rule(tmp_path) -> None:
    bad = load_run([write_run_dir(tmp_path / "b", [make_record("gloo", "all_gather", 2, MiB, timed(0.1), nwrong=5)])])
    (f,) = data_errors(bad)
    assert f.status == "fired" and f.evidence[0].values["nwrong"] == 5


def test_mechanism_without_a_toggling_experiment_lists_observations_but_names_nothing(tmp_path) -> None:
    """The wire taking turns describes the loss; it does not say why. Without an experiment that shows a
    suspect the mechanism stays undecided and lists what was observed."""
    run = load_run([write_run_dir(tmp_path / "m", anomaly_records(), analyses=turn_taking_analyses())])
    mech = next(f for f in diagnose(run) if f.rule == "mechanism")
    assert mech.status == "undecided" and "no experiment here isolates why" in mech.statement
    assert "observed (describes the loss, does not explain it): low_duplex_overlap" in mech.statement


def test_mechanism_undecided_without_experiments(tmp_path) -> None:
    gloo_only = [r for r in anomaly_records() if r.backend == "gloo" and r.op == "all_gather"]
    mech = next(f for f in diagnose(load_run([write_run_dir(tmp_path / "g", gloo_only)])) if f.rule == "mechanism")
    assert mech.status == "undecided" and "no experiment here isolates why" in mech.statement


def test_flat_run_fires_nothing(flat_run) -> None:
    assert fired(diagnose(flat_run)) == []


def test_cli_json_and_plain_records(tmp_path, capsys) -> None:
    root = write_run_dir(tmp_path / "r", anomaly_records())
    assert main(["diagnose", str(root), "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    rules = {f["rule"]: f for f in document["findings"] if f["status"] == "fired"}
    assert {"n2_busbw_dip", "backend_below_raw"} <= set(rules)
    assert all(f["evidence"] for f in rules.values())
    assert any("analysis" in m for m in document["missing_inputs"])
    assert main(["diagnose", str(root / "records" / "sweep.jsonl")]) == 0
    out = capsys.readouterr().out
    assert "[FINDING (moderate)] n2_busbw_dip" in out and "[CANNOT DECIDE] low_duplex_overlap" in out
    assert main(["diagnose", str(tmp_path / "nothing")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_mechanism_ignores_evidence_seen_at_every_n(tmp_path) -> None:
    """Retransmissions at N=2 and N=4 alike cannot explain what only N=2 suffers."""
    gloo_only = [r for r in anomaly_records() if r.backend == "gloo" and r.op == "all_gather"]
    lossy = {f"gloo_n{n}": analysis(n, [connection("a:1", "b:2", direction(MiB, retrans=20), direction(MiB), 0.9)])
             for n in (2, 4)}
    findings = diagnose(load_run([write_run_dir(tmp_path / "l", gloo_only, analyses=lossy)]))
    # no raw reference captured to judge them against: an observation, listed by the mechanism
    assert next(f for f in findings if f.rule == "retransmissions").status == "observed"
    mech = next(f for f in findings if f.rule == "mechanism")
    assert mech.status == "undecided" and "not specific to N=2: retransmissions" in mech.statement
    assert "observed" not in mech.statement


def test_capture_metadata_named_after_the_pcap(tmp_path) -> None:
    """The capture tool writes <tag>.pcap.capture.json; it belongs to the same capture as analysis/<tag>.json."""
    no_count = analysis(2, [])
    no_count["capture"] = {}
    root = write_run_dir(tmp_path / "p", flat_records(), analyses={"gloo-all_gather-n2": no_count})
    (root / "captures").mkdir()
    (root / "captures" / "gloo-all_gather-n2.pcap.capture.json").write_text(json.dumps({"kernel_dropped": 7}))
    run = load_run([root])
    assert list(run.captures) == ["gloo-all_gather-n2"]
    assert run.captures["gloo-all_gather-n2"].kernel_dropped == 7
    assert run.captures["gloo-all_gather-n2"].world_size == 2
    (f,) = capture_drops(run)
    assert f.status == "observed" and f.evidence[0].values["kernel_dropped"] == 7


def _turn_taking_run(tmp_path, raw_overlap: float | None):
    analyses = {"gloo_n2": turn_taking_analyses()["gloo_n2"]}
    if raw_overlap is not None:
        analyses["raw_shared_n2"] = analysis(
            2, [connection("10.0.0.1:6000", "10.0.0.2:41000", direction(8 * MiB), direction(8 * MiB), raw_overlap)],
            backend="raw")
    return load_run([write_run_dir(tmp_path / f"tt{raw_overlap}", flat_records(), analyses=analyses)])


def test_turn_taking_fires_only_against_a_raw_shared_connection_that_overlaps(tmp_path) -> None:
    from diag.report.diagnose import turn_taking
    from diag.report.thresholds import TURN_TAKING_GAP

    (f,) = turn_taking(_turn_taking_run(tmp_path, 0.85))
    assert f.status == "observed" and "in turns (10% overlap)" in f.statement and "85%" in f.statement
    assert [e.values["duplex_overlap"] for e in f.evidence] == [0.1, 0.85]
    assert f.thresholds["TURN_TAKING_GAP"] == TURN_TAKING_GAP.value
    # raw TCP on one connection takes turns as well: nothing backend-specific to report
    (g,) = turn_taking(_turn_taking_run(tmp_path, 0.2))
    assert g.status == "clear"
    (h,) = turn_taking(_turn_taking_run(tmp_path, None))
    assert h.status == "undecided" and "no reference" in h.statement


def test_half_duplex_match(tmp_path) -> None:
    """The raw --io alternate reference counts only where its capture shows it half duplex on the wire."""
    from diag.report.diagnose import half_duplex_match

    size = 16 * MiB
    gloo = make_record("gloo", "all_gather", 2, size, timed(2.0))
    full = make_record("raw", "all_gather", 2, size, timed(1.0), knobs={"io": "duplex", "conn": "split"})

    def run_with(alternate_s: float, name: str, wire_overlap: float | None = 0.05):
        alternate = make_record("raw", "all_gather", 2, size, timed(alternate_s),
                                knobs={"io": "alternate", "conn": "split"}, t_start_ns=50_000_000_000)
        analyses = {}
        if wire_overlap is not None:
            capture = analysis(2, [connection("10.0.0.1:1", "10.0.0.2:2", direction(size), direction(size),
                                              wire_overlap)],
                               [host("10.0.0.1", size, size, wire_overlap)], backend="raw")
            capture["phases"][0]["phase"].update(algo="ring", size_bytes=size, t_start_ns=alternate.t_start_ns,
                                                 t_end_ns=alternate.t_start_ns + 1)
            analyses["raw_alternate_n2"] = capture
        return load_run([write_run_dir(tmp_path / name, [gloo, full, alternate], analyses=analyses)])

    (f,) = half_duplex_match(run_with(1.9, "match"))
    assert f.status == "observed" and f.evidence[0].values["ratio"] == pytest.approx(1.9 / 2.0, rel=0.05)
    assert "on the wire its directions overlap 5%" in f.statement
    (g,) = half_duplex_match(run_with(1.0, "nomatch"))
    assert g.status == "clear"
    (h,) = half_duplex_match(load_run([write_run_dir(tmp_path / "none", [gloo, full])]))
    assert h.status == "undecided"
    # the same speed match, but the wire shows the "alternate" run overlapping its directions: no reference
    (k,) = half_duplex_match(run_with(1.9, "overlapping", wire_overlap=0.9))
    assert k.status == "undecided" and "90% of its active time on the wire: not half duplex" in k.statement
    (m,) = half_duplex_match(run_with(1.9, "uncaptured", wire_overlap=None))
    assert m.status == "undecided" and "no capture of the raw --io alternate run" in m.statement


def test_a_large_difference_the_samples_cannot_confirm_is_undecided(tmp_path) -> None:
    """Few, noisy samples: a 1.9x order effect from three launches whose intervals overlap 1 is neither an
    effect nor its absence."""
    size = 16 * MiB
    rows = []
    for k, recv_s in enumerate(([0.7, 0.75], [2.5, 2.4], [0.72, 0.7])):
        rows.append(make_record("gloo", "exchange", 2, size, recv_s, knobs={"order": "recv-first"}))
        rows.append(make_record("gloo", "exchange", 2, size, [1.3, 1.45], knobs={"order": "send-first"}))
        rows[-2:] = [Record(**{**r.__dict__, "run_id": f"launch-{k}-{r.knobs['order']}"}) for r in rows[-2:]]
    (f,) = EXCHANGE_ORDER(load_run([write_run_dir(tmp_path / "u", rows)]))
    assert f.status == "undecided" and "cannot tell yet" in f.statement


def test_a_new_protocol_knob_is_one_row_of_the_paired_experiment_rule(tmp_path) -> None:
    """A knob the raw transport gains later is judged by the same rule once it is described as data: an
    effect when the knob moves the time, clear when not, and "absent" without rows."""
    from diag.report.diagnose import PairedExperiment
    from diag.report.thresholds import CONN_SPLIT_EFFECT

    notice = PairedExperiment(
        id="notice_channel", knob="notice", on="own", off="inband", design="difference", effect=CONN_SPLIT_EFFECT,
        backend="raw", headline="the in-band notice costs throughput", clear="where the notice travels does not matter",
        absent="no rows with --notice", one_value="rows with one --notice value only", reading="notice queued")
    assert notice.__name__ == "notice_channel"

    def run_with(own_s: float, name: str):
        rows = [Record(**{**make_record("raw", "all_gather", 2, 16 * MiB, timed(seconds, seed=k),
                                        knobs={"notice": value}).__dict__, "run_id": f"{value}-{k}"})
                for k in range(3) for value, seconds in (("inband", 2.0), ("own", own_s))]
        return load_run([write_run_dir(tmp_path / name, rows)])

    (f,) = notice(run_with(1.0, "effect"))
    assert f.status == "fired" and f.rule == "notice_channel"
    assert f.evidence[0].values["ratio"]["point"] == pytest.approx(0.5, rel=0.05)
    (g,) = notice(run_with(2.0, "flat"))
    assert g.status == "clear" and g.statement.startswith("where the notice travels does not matter")
    (u,) = notice(load_run([write_run_dir(tmp_path / "none", [make_record("gloo", "all_gather", 2, MiB, timed(0.1))])]))
    assert u.status == "undecided" and u.statement == "no rows with --notice"


def test_rules_are_registered_once_under_their_ids(anomaly_run) -> None:
    from diag.report.diagnose import RULES

    for rule_id, rule in RULES.items():
        assert rule.__name__ == rule_id
        assert {f.rule for f in rule(anomaly_run)} == {rule_id}


def test_evidence_without_a_world_size_is_not_n2_evidence(tmp_path) -> None:
    """TCP_INFO evidence names no world size: a window-limited connection somewhere in the run cannot
    explain what N=2 suffers."""
    gloo_only = [r for r in anomaly_records() if r.backend == "gloo" and r.op == "all_gather"]
    limited = load_run([write_run_dir(tmp_path / "t", gloo_only, observe={"x": tcp_info_samples(rwnd_limited_s=0.6)})])
    findings = diagnose(limited)
    window = next(f for f in findings if f.rule == "window_limited")
    assert window.status == "observed" and all("world_size" not in e.values for e in window.evidence)
    mech = next(f for f in findings if f.rule == "mechanism")
    assert mech.status == "undecided" and "window" not in mech.statement.split("missing")[0]
    # the same limit seen on an N=2 capture counts
    zero = analysis(2, [connection("a:1", "b:2", direction(MiB, zero_windows=3), direction(MiB), 0.9)])
    seen = diagnose(load_run([write_run_dir(tmp_path / "w", gloo_only, analyses={"n2": zero})]))
    mech2 = next(f for f in seen if f.rule == "mechanism")
    # observed at N=2, so listed; an observation never names the mechanism
    assert mech2.status == "undecided" and "senders wait on windows or buffers" in mech2.statement


def test_a_dip_in_a_raw_series_is_not_the_backends_mechanism(tmp_path) -> None:
    """Only the raw shared-connection series dips at N=2 (gloo is flat): the mechanism names no backend
    mechanism; with gloo dipping too it explains gloo's dip."""
    raw_only = [r for r in anomaly_records(n2_slowdown=1.9) if not (r.backend == "gloo" and r.op == "all_gather")]
    flat_gloo = [r for r in flat_records() if r.backend == "gloo" and r.op == "all_gather"]
    findings = diagnose(load_run([write_run_dir(tmp_path / "raw", raw_only + flat_gloo,
                                                analyses=turn_taking_analyses())]))
    dips = [f for f in findings if f.rule == "n2_busbw_dip" and f.status == "fired"]
    assert dips and all(f.evidence[0].values["series"].startswith("raw:") for f in dips)
    mech = next(f for f in findings if f.rule == "mechanism")
    assert mech.status == "clear" and "no backend N=2 busbw dip" in mech.statement and "conn=shared" in mech.statement
    both = diagnose(load_run([write_run_dir(tmp_path / "both", anomaly_records(), analyses=turn_taking_analyses())]))
    mech2 = next(f for f in both if f.rule == "mechanism")
    assert mech2.status == "undecided" and "N=2 is slower" in mech2.statement


def test_one_window_full_event_is_not_window_limited(tmp_path) -> None:
    def run_with(window_full: int, name: str):
        conn = connection("a:1", "b:2", direction(MiB, packets=5000, window_full=window_full), direction(MiB), 0.9)
        return load_run([write_run_dir(tmp_path / name, flat_records(), analyses={"n2": analysis(2, [conn])})])

    (one,) = window_limited(run_with(1, "one"))
    assert one.status == "clear"
    (many,) = window_limited(run_with(40, "many"))
    assert many.status == "observed" and many.evidence[-1].values["window_full"] == 40
    assert many.thresholds["WINDOW_FULL_RATE"] == 0.001


def test_low_duplex_overlap_headline_quotes_the_collective_not_the_exchange(tmp_path) -> None:
    """gloo all_gather at N=2 overlaps 33%, the exchange experiment 20%: the headline quotes 33% from the
    all_gather capture and names the exchange's 20% apart."""
    gather = analysis(2, [connection("10.0.0.1:1", "10.0.0.2:2", direction(8 * MiB), direction(8 * MiB), 0.33)])
    exchange = analysis(2, [connection("10.0.0.1:3", "10.0.0.2:4", direction(8 * MiB), direction(8 * MiB), 0.2)],
                        op="exchange")
    (f,) = low_duplex_overlap(load_run([write_run_dir(tmp_path / "b", flat_records(),
                                                      analyses={"gather_n2": gather, "exchange_n2": exchange})]))
    assert f.status == "observed" and "in the all_gather capture" in f.statement
    assert "only 33% of the time" in f.statement and "the exchange experiment's: 20%" in f.statement
    (g,) = low_duplex_overlap(load_run([write_run_dir(tmp_path / "e", flat_records(),
                                                      analyses={"exchange_n2": exchange})]))
    assert g.status == "observed" and "in the exchange capture" in g.statement and "only 20%" in g.statement


def _turns_run(tmp_path, name: str, cwnds: list[int] | None):
    """N=2: one connection whose directions take turns (overlap 10%); each direction idles 1.2 s of its 2 s
    span, all of it while the other direction sends. cwnds: the observer's TCP_INFO of that connection."""
    gloo_only = [r for r in anomaly_records() if r.backend == "gloo" and r.op == "all_gather"]
    ab = direction(8 * MiB, idle_count=10, idle_total_s=1.2, idle_max_s=0.3)
    ba = direction(8 * MiB, idle_count=10, idle_total_s=1.2, idle_max_s=0.3)
    ab["active_s"] = ba["active_s"] = 0.8
    conn = connection("10.0.0.1:5000", "10.0.0.2:40000", ab, ba, 0.1)
    observe = None
    if cwnds is not None:
        observe = {"gloo_n2": [{**sample, "cwnd": cwnd}
                               for sample, cwnd in zip(tcp_info_samples(0.0, count=len(cwnds)), cwnds, strict=True)]}
        for sample in observe["gloo_n2"]:
            sample.update(local="[::ffff:10.0.0.1]:5000", remote="[::ffff:10.0.0.2]:40000")
    return load_run([write_run_dir(tmp_path / name, gloo_only, analyses={"gloo_n2": analysis(2, [conn])},
                                   observe=observe)])


def test_idle_gaps_that_are_the_turns_are_not_slow_start_after_idle(tmp_path) -> None:
    (steady,) = idle_gaps(_turns_run(tmp_path, "steady", [40, 60, 80, 90, 100]))
    assert steady.status == "clear" and "slow start after idle" not in steady.statement
    assert "not counted: 2 direction(s) whose gaps are the other direction's turns" in steady.statement
    mech = next(f for f in diagnose(_turns_run(tmp_path, "steady2", [40, 60, 80, 90, 100])) if f.rule == "mechanism")
    assert "connections idle between bursts" not in mech.statement
    # the same gaps with cwnd collapsing to the restart window: a real idle restart, counted
    (collapsed,) = idle_gaps(_turns_run(tmp_path, "collapsed", [60, 90, 5, 8, 30]))
    assert "slow start after idle" in collapsed.statement
    assert all(e.values["cwnd_collapses"] == 1 for e in collapsed.evidence if "cwnd_collapses" in e.values)
    # ... an observation still: no capture of the raw reference at N=2 to judge the gaps against
    assert collapsed.status == "observed" and "no capture of the raw reference at N=2" in collapsed.statement
    # no TCP_INFO of the connection: whether cwnd collapsed is unknown, so the gaps stay, with the turns named
    (unknown,) = idle_gaps(_turns_run(tmp_path, "unknown", None))
    assert unknown.status == "observed" and "no TCP_INFO of this connection" in unknown.evidence[-1].text


def _judged_run(tmp_path, name: str, backend_direction: dict, reference_direction: dict, slow: bool = True):
    """gloo all_gather with (slow) or without an N=2 dip, and two N=2 captures of the same link: gloo's and
    the raw reference's (raw ring, one connection per direction), each tied to its rows by its phase."""
    rows = anomaly_records() if slow else flat_records()
    gloo = [r for r in rows if r.backend == "gloo" and r.op == "all_gather"]
    n2 = next(r for r in gloo if r.world_size == 2 and r.size_bytes == 4 * MiB)
    raw = make_record("raw", "all_gather", 2, 4 * MiB, timed(0.4), t_start_ns=50_000_000_000)

    def capture(backend: str, d: dict, start: int) -> dict:
        doc = analysis(2, [connection("10.0.0.1:1", "10.0.0.2:2", d, direction(MiB), 0.9)], backend=backend)
        doc["phases"][0]["phase"].update(algo="ring" if backend == "raw" else "default", size_bytes=4 * MiB,
                                         t_start_ns=start, t_end_ns=start + 1)
        return doc

    analyses = {"gloo_n2": capture("gloo", backend_direction, n2.t_start_ns),
                "raw_n2": capture("raw", reference_direction, raw.t_start_ns)}
    return load_run([write_run_dir(tmp_path / name, [*gloo, raw], analyses=analyses)])


def test_an_observation_becomes_a_finding_only_where_it_accounts_for_a_measured_loss(tmp_path) -> None:
    """Retransmissions, zero windows and idle gaps are judged against the raw reference on the same link at the
    N where the backend is slow: more than it, there, is a finding (moderate: what it costs is not measured);
    as much as it (the link's), or where nothing is measured slow, an observation."""
    lossy, clean = direction(MiB, packets=1000, retrans=20), direction(MiB, packets=1000)
    (own,) = retransmissions(_judged_run(tmp_path, "own", lossy, clean))
    assert own.status == "fired" and own.strength == "moderate"
    assert "where the backend is slow" in own.statement and "at least 4x the raw reference's" in own.statement
    assert own.evidence[0].values == {"world_size": 2, "backend": pytest.approx(0.01), "reference": 0.0,
                                      "measured_loss": own.evidence[0].values["measured_loss"]}
    assert own.evidence[0].values["measured_loss"].startswith("torch:gloo all_gather: busbw at N=2 is")
    (link,) = retransmissions(_judged_run(tmp_path, "link", lossy, lossy))
    assert link.status == "observed" and "this is the link's" in link.statement
    assert link.explains.startswith("none: where the backend is slow its own directions show no more")
    (unmeasured,) = retransmissions(_judged_run(tmp_path, "flat", lossy, clean, slow=False))
    assert unmeasured.status == "observed" and "no loss of the backend is measured" in unmeasured.statement
    zero = direction(MiB, packets=1000, zero_windows=10)
    (window,) = window_limited(_judged_run(tmp_path, "window", zero, clean))
    assert window.status == "fired" and window.strength == "moderate"
    (same,) = window_limited(_judged_run(tmp_path, "window-link", zero, zero))
    assert same.status == "observed"
    idle = direction(MiB, idle_count=4, idle_total_s=1.2, idle_max_s=0.4)
    (gaps,) = idle_gaps(_judged_run(tmp_path, "idle", idle, clean))
    assert gaps.status == "fired" and gaps.explains.startswith("at most")
    (shared,) = idle_gaps(_judged_run(tmp_path, "idle-link", idle, idle))
    assert shared.status == "observed"
    # observations are never gated: --fail-on strong and fired pass on a run whose only sightings are them
    from diag.gates import findings_status

    assert findings_status([link, unmeasured, same, shared], "fired") == (0, None)


def test_suspects_are_shown_or_ruled_out_only_by_their_toggling_experiment() -> None:
    """M1..M4: a suspect is shown (fired) or ruled out (clear) only by the experiment that toggles it; with no
    such experiment, or one that could not decide, it is 'not isolated' (undecided), never fired."""
    from diag.report.diagnose import Evidence, Finding, suspects

    notice_on = Finding("notice_behind_data", "fired", "M1 shown: ...", "strong",
                        (Evidence("raw N=2 16 MiB: own-conn 22.9 MB/s vs in-band 15.4 MB/s", {"world_size": 2}),))
    shared_clear = Finding("shared_connection", "clear", "sharing one connection costs nothing measurable: 0.99x")
    cpu_pinned = Finding("cpu_bound", "fired", "a thread is pinned", "strong", (Evidence("thread 99%"),))
    verdicts = {f.rule: f for f in suspects([notice_on, shared_clear, cpu_pinned])}
    assert list(verdicts) == ["suspect_m1", "suspect_m2", "suspect_m3", "suspect_m4"]
    assert verdicts["suspect_m1"].status == "fired" and "shown by notice_behind_data" in verdicts["suspect_m1"].statement
    assert verdicts["suspect_m1"].evidence == notice_on.evidence
    assert verdicts["suspect_m4"].status == "clear" and "ruled out by shared_connection" in verdicts["suspect_m4"].statement
    # M3 has no toggling experiment: a pinned thread supports a reading but convicts no suspect.
    assert verdicts["suspect_m3"].status == "undecided" and "not isolated" in verdicts["suspect_m3"].statement
    assert verdicts["suspect_m2"].status == "undecided"

    # Negative: the experiments absent or undecided -> every suspect is not isolated.
    unsure = Finding("notice_behind_data", "undecided", "moving the notice may change throughput, but ...")
    verdicts = {f.rule: f for f in suspects([unsure])}
    assert all(f.status == "undecided" for f in verdicts.values())
    assert "notice_behind_data could not decide" in verdicts["suspect_m1"].statement
    assert "no raw rows with both --conn shared" in verdicts["suspect_m4"].statement
    ruled = Finding("notice_behind_data", "clear", "M1 ruled out by experiment: 1.01x")
    assert suspects([ruled])[0].status == "clear"


def _advise_doc(rows: list[tuple[float, str, int]], schema: int = 2) -> dict:
    """advise.json as diag.advise writes it: one workaround, one row per (speedup, the trial's verdict, nwrong)."""
    from report_helpers import advise_row

    made = [advise_row(16 << 20 << i, s, v, w) for i, (s, v, w) in enumerate(rows)]
    return {"schema": schema, "world_size": 2, "lab": "t", "effect": 0.1, "workarounds": [
        {"name": "p2p-recv-first", "title": "all_gather from batch_isend_irecv", "code": "x = 1\n", "rows": made}]}


def test_workarounds_rule_fires_only_on_a_decided_checked_speed_up(tmp_path) -> None:
    from diag.report.diagnose import workarounds
    from diag.report.render import workaround_blocks
    from diag.report.rundir import RunData

    def verdict(advise):
        return workarounds(RunData(None, [], {}, {}, [], [], advise=advise))[0]

    shown = verdict(_advise_doc([(1.48, "faster", 0), (1.5, "faster", 0)]))
    assert shown.status == "fired" and "1.48x" in shown.statement and shown.evidence[0].values["speedup_min"] == 1.48
    assert "interleaved rounds" in shown.statement
    assert verdict(_advise_doc([(1.48, "undecided", 0)])).status == "clear"   # the trial could not tell (budget)
    assert "undecided (test)" in verdict(_advise_doc([(1.48, "undecided", 0)])).statement  # ... and says why
    assert verdict(_advise_doc([(1.03, "same", 0)])).status == "clear"        # within the effect threshold
    assert verdict(_advise_doc([(0.8, "slower", 0)])).status == "clear"       # slower is no fix
    assert verdict(_advise_doc([(1.5, "faster", 3)])).status == "clear"       # wrong data is no fix
    assert verdict(_advise_doc([(1.5, "faster", 0), (1.02, "same", 0)])).status == "clear"  # not at every size
    assert verdict(None).status == "undecided"
    blocks = workaround_blocks(_advise_doc([(1.48, "faster", 0)]))
    assert any(getattr(b, "text", None) == "x = 1\n" for b in blocks)        # the code a user copies
    assert workaround_blocks(None) == []


def test_an_advise_json_of_the_first_schema_is_read_but_decides_nothing(tmp_path) -> None:
    """A run directory of an earlier release keeps its advise.json (schema 1: arms one after another, Welch's
    test on iterations): the report still shows its speed-ups and code, and nothing is advised from it."""
    from diag.advisefile import load_advise
    from diag.report.diagnose import workarounds
    from diag.report.render import workaround_blocks
    from diag.report.rundir import RunData

    old = {"schema": 1, "world_size": 2, "lab": "t", "records": "records.jsonl", "workarounds": [
        {"name": "p2p-recv-first", "title": "all_gather from batch_isend_irecv", "code": "x = 1\n", "rows": [
            {"size_bytes": 16 << 20, "busbw_Bps": 22e6, "baseline_busbw_Bps": 14e6, "time_s": 0.7,
             "baseline_time_s": 1.1, "speedup": 1.57, "p_value": 1e-5, "significant": True, "verdict": "faster",
             "nwrong": 0, "baseline_nwrong": 0, "iterations": 5, "sentence": ""}]}]}
    (tmp_path / "advise.json").write_text(json.dumps(old))
    advise = load_advise(tmp_path / "advise.json")
    row = advise["workarounds"][0]["rows"][0]
    assert advise["schema"] == 2 and advise["read_from_schema"] == 1
    assert row["speedup"] == 1.57 and row["verdict"] == "undecided" and row["welch_p"] == 1e-5
    finding = workarounds(RunData(None, [], {}, {}, [], [], advise=advise))[0]
    assert finding.status == "clear" and "schema 1" in finding.statement
    text = " ".join(getattr(b, "text", "") or "" for b in workaround_blocks(advise))
    assert "earlier release" in text and "x = 1" in text


def test_advise_json_comes_from_the_trials_own_decisions(tmp_path) -> None:
    """diag.advise writes advise.json from the advise trial's block records with the trial's decisions: a
    workaround 1.5x faster in every round is faster, one within 2% the same; the rule advises the first."""
    from report_helpers import shaped_times, trial_records, write_trial

    from diag.advise import write_advise
    from diag.plan import ADVISE_STEP
    from diag.report.diagnose import workarounds
    from diag.report.rundir import RunData

    spec = replace(ADVISE_STEP.trial, sizes=(16 << 20,), seed=1)
    shapes = {"gloo": (1.0, 1.0, 0.0), "p2p-recv-first": (0.66, 0.66, 0.0), "diag_tcp": (0.99, 0.99, 0.0)}
    write_trial(tmp_path / "records" / "advise.jsonl", spec, trial_records(spec, shaped_times(shapes), rounds=8))
    result = write_advise(tmp_path, lab="t")
    assert json.loads((tmp_path / "advise" / "advise.json").read_text()) == result
    verdicts = {w["name"]: [r["verdict"] for r in w["rows"]] for w in result["workarounds"]}
    assert verdicts == {"p2p-recv-first": ["faster"], "diag_tcp": ["same"]}
    (p2p,) = result["workarounds"][0]["rows"]
    assert p2p["speedup"] == pytest.approx(1 / 0.66, rel=0.03) and p2p["speedup_low"] > 1.1 and p2p["rounds"] == 8
    assert p2p["decision"]["design"] == "difference" and p2p["decision"]["interleaved"]
    finding = workarounds(RunData(None, [], {}, {}, [], [], advise=result))[0]
    assert finding.status == "fired" and [e.values["workaround"] for e in finding.evidence] == ["p2p-recv-first"]


def test_fail_on_fired_gates_and_the_verdict_prints_first(anomaly_run, flat_run, capsys) -> None:
    """diag diagnose exits 0 whatever it finds, unless --fail-on makes a fired finding a failure (exit 9);
    its text opens with the verdict card, the rules follow."""
    assert main(["diagnose", str(anomaly_run.root)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("verdict:\n  slow:       torch:gloo all_gather at N=2")
    assert out.index("verdict:") < out.index("[FINDING")
    assert main(["diagnose", str(anomaly_run.root), "--fail-on", "fired"]) == 9
    assert "finding(s) fired (" in capsys.readouterr().err
    # survey rows alone (separate launches, no interleaved trial) make no finding strong: the strong gate
    # passes; with the trial beside the link it fails (test_evidence)
    assert main(["diagnose", str(anomaly_run.root), "--fail-on", "strong"]) == 0
    assert main(["diagnose", str(flat_run.root), "--fail-on", "fired"]) == 0
    with pytest.raises(SystemExit):
        main(["diagnose", str(flat_run.root), "--fail-on", "maybe"])


def test_findings_json_is_strict(tmp_path, capsys) -> None:
    """A ratio over a zero bandwidth is null in findings.json, listed under nonfinite, never Infinity."""
    from diag.typedjson import strict_document

    document = strict_document({"findings": [{"evidence": [{"values": {"ratio": float("inf"), "x": 1.0}}]}]},
                               "a ratio over zero")
    assert document["findings"][0]["evidence"][0]["values"] == {"ratio": None, "x": 1.0}
    assert document["nonfinite"] == [{"path": "findings[0].evidence[0].values.ratio", "was": "Infinity",
                                      "why": "a ratio over zero"}]
    json.dumps(document, allow_nan=False)

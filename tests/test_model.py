"""The model for simulators: terms recovered from synthetic samples of known parameters, one model per series
(never pooled), never a non-positive time, held-out errors, intervals from the samples (bimodal where they
are), extrapolation said, model.json, and the CLI (fit, predict, check, export)."""

from __future__ import annotations

import json
import math
import random
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from report_helpers import KiB, MiB, make_record, write_records

from diag.__main__ import main
from diag.errors import DiagError
from diag.model import Terms, load
from diag.model.fitting import Variant, _terms, fit
from diag.model.structure import structure_of

# computes in this process: may run beside an `alone` test (tests/conftest.py)
pytestmark = pytest.mark.in_process

LINK_BPS = 12.5e6                   # 100 Mbit/s
ALPHA_S = 200e-6
GLOO = Terms(ALPHA_S, 1 / LINK_BPS, ramp_s=1.5e-3, ramp_half_bytes=256 * KiB, n2_beta_s_per_byte=0.5 / LINK_BPS,
             n2_half_bytes=128 * KiB)
RAW = Terms(150e-6, 1 / LINK_BPS)
VOLUMES = [4 << k for k in range(8, 25)]          # D = 1 KiB .. 64 MiB
RING = structure_of("gloo", "default", "all_gather")


def per_rank(volume: int, n: int) -> int:
    return max(4, volume // (n - 1) // 4 * 4)


def sampled(terms: Terms, backend: str, op: str, ns, *, noise: float = 0.03, seed: int = 1, knobs=None,
            volumes=VOLUMES, iters: int = 8):
    """Records whose samples are the model's time times (1 + N(0, noise)), at equal D across N."""
    rng = random.Random(seed)
    structure = structure_of(backend, "ring" if backend == "raw" else "default", op)
    out = []
    for n in ns:
        for volume in volumes:
            s = per_rank(volume, n) if not structure.pairwise else volume
            t = float(terms.time_s(structure, n, s))
            out.append(make_record(backend, op, n, s, [t * (1 + rng.gauss(0, noise)) for _ in range(iters)],
                                   knobs=knobs))
    return out


@pytest.fixture(scope="module")
def gloo_model():
    return fit(sampled(GLOO, "gloo", "all_gather", range(2, 7)), world_sizes=(2, 3, 4))


def test_fit_recovers_the_terms_it_was_generated_from(gloo_model) -> None:
    (m,) = gloo_model.series_models
    t = m.terms
    assert t.alpha_s == pytest.approx(ALPHA_S, rel=0.05)
    assert t.beta_s_per_byte == pytest.approx(GLOO.beta_s_per_byte, rel=0.02)
    assert t.n2_turn_share == pytest.approx(1 / 3, abs=0.02)                 # the N=2 penalty, named
    assert GLOO.n2_half_bytes / 3 < t.n2_half_bytes < GLOO.n2_half_bytes * 3  # ... from where turns cost
    # TCP not yet at rate: what the samples identify is the extra cost per byte of small messages (ramp over
    # ramp_half); where the ramp levels off trades against its height within the noise (3% here)
    assert m.ramp and t.ramp_s > 0
    assert t.ramp_s / t.ramp_half_bytes == pytest.approx(GLOO.ramp_s / GLOO.ramp_half_bytes, rel=0.25)
    for n in (2, 3, 4):
        for volume in VOLUMES:
            s = per_rank(volume, n)
            assert float(m.mean_s(n, s)) == pytest.approx(float(GLOO.time_s(RING, n, s)), rel=0.03)
    low, high = m.intervals["n2_turn_share"]
    assert low <= 1 / 3 <= high + 0.01 and high - low < 0.05
    assert m.fit_error < 0.03 and m.within_stated


def test_a_reference_without_the_penalty_fits_none_and_no_ramp() -> None:
    (m,) = fit(sampled(RAW, "raw", "all_gather", range(2, 6))).series_models
    assert m.terms.n2_turn_share < 0.02
    assert not m.ramp                      # leave-one-size-out did not ask for it: the data has none
    assert m.terms.alpha_s == pytest.approx(RAW.alpha_s, rel=0.05)
    assert m.terms.beta_s_per_byte == pytest.approx(RAW.beta_s_per_byte, rel=0.02)


def test_series_are_never_pooled(tmp_path, capsys) -> None:
    """The raw-TCP reference, gloo's protocol model (--emulate gloo) and a half-duplex ring (--io alternate)
    share raw:ring, op, N and sizes but are three series: three models, each with its own per-byte cost, never
    one line through all three; predict picks one by its label, or the transport's reference."""
    slow, slower = Terms(150e-6, 1.5 / LINK_BPS), Terms(150e-6, 2 / LINK_BPS)
    records = (sampled(RAW, "raw", "all_gather", (2, 3, 4))
               + sampled(slow, "raw", "all_gather", (2, 3, 4), knobs={"emulate": "gloo"}, seed=2)
               + sampled(slower, "raw", "all_gather", (2, 3, 4), knobs={"io": "alternate"}, seed=3))
    model = fit(records)
    by_series = {m.series: m for m in model.series_models}
    assert set(by_series) == {"raw:ring", "raw:ring [emulate=gloo]", "raw:ring [io=alternate]"}
    for label, terms in (("raw:ring", RAW), ("raw:ring [emulate=gloo]", slow), ("raw:ring [io=alternate]", slower)):
        assert by_series[label].terms.beta_s_per_byte == pytest.approx(terms.beta_s_per_byte, rel=0.02)
        assert by_series[label].fit_error < 0.03
    path = tmp_path / "m.json"
    path.write_text(json.dumps(model.to_json()))
    assert main(["model", "predict", "--model", str(path), "--world-size", "5", "--size", "16M", "--series",
                 "raw:ring [emulate=gloo]", "--json"]) == 0
    (answer,) = json.loads(capsys.readouterr().out)
    assert answer["series"] == "raw:ring [emulate=gloo]"
    assert answer["time_s"] == pytest.approx(float(slow.time_s(structure_of("raw", "ring", "all_gather"), 5,
                                                                16 * MiB)), rel=0.03)
    assert main(["model", "predict", "--model", str(path), "--world-size", "5", "--size", "16M", "--series", "raw",
                 "--json"]) == 0
    assert [a["series"] for a in json.loads(capsys.readouterr().out)] == ["raw:ring"]


def test_an_unmeasured_n_is_predicted_with_its_interval_and_said_to_extrapolate(gloo_model) -> None:
    for n in (5, 6):
        for volume in (MiB, 64 * MiB):
            s = per_rank(volume, n)
            truth = float(GLOO.time_s(RING, n, s))
            p = gloo_model.predict("all_gather", n, s)
            assert p.extrapolated and f"N={n} is outside the measured N=2..4" in p.where
            assert p.time_s == pytest.approx(truth, rel=0.05)
            assert 0 < p.low_s < truth < p.high_s
    inside = gloo_model.predict("all_gather", 3, per_rank(4 * MiB, 3))
    assert not inside.extrapolated and inside.where == ""


def test_heldout_errors_are_reported_for_every_series(gloo_model) -> None:
    (m,) = gloo_model.series_models
    by_n = {h.value: h for h in m.heldout if h.kind == "world_size"}
    assert set(by_n) == {2, 3, 4}
    assert by_n[4].extrapolated and by_n[4].median_error < 0.05
    # N=2 left out: without N=2 there is no turn-taking term, and the error says how much it carries
    assert 0.15 < by_n[2].median_error < 1 / 3 + 0.02 and "turn-taking" in by_n[2].note
    sizes = [h for h in m.heldout if h.kind == "volume"]            # an equal-D sweep: D is left out
    assert len(sizes) == len(VOLUMES) and all(h.cells == 3 for h in sizes)
    document = m.to_json()
    assert document["heldout"]["groups"] and "extrapolates at N below 2 or above 4" in document["extrapolates"]


def test_a_model_that_cannot_predict_within_its_stated_error_says_so() -> None:
    """gloo at N=2 and 3 only: the N=2 term fits every cell, but N=3 left out is predicted from N=2's
    turn-taking rows alone, too slow: the model says it cannot predict within its stated error."""
    (m,) = fit(sampled(GLOO, "gloo", "all_gather", (2, 3), volumes=VOLUMES[::2])).series_models
    assert m.fit_error < 0.03
    assert m.heldout_error_of("world_size") > 0.15 and m.within_stated is False
    assert "cannot predict within its stated error: leave-one-N-out" in m.heldout_statement()


@pytest.mark.parametrize("case", ["gloo", "flat", "falling", "burst", "noisy", "one_n", "send_recv", "all_reduce"])
def test_no_fitted_series_predicts_a_non_positive_time(case) -> None:
    """Every series, fitted on data good or bad, predicts a positive mean and interval from 1 B to 1 GiB."""
    rng = random.Random(11)
    if case == "gloo":
        records = sampled(GLOO, "gloo", "all_gather", (2, 3, 4))
    elif case == "flat":                       # latency-bound: time does not grow with size
        records = [make_record("gloo", "all_gather", n, s, [1e-3 * (1 + 0.01 * i) for i in range(5)])
                   for n in (2, 3) for s in (KiB, 4 * KiB, 16 * KiB)]
    elif case == "falling":                    # time falls with size (noise or a cache): no negative slope
        records = [make_record("raw", "all_gather", 2, s, [2e-3 / (1 + i) ** 0.3 for _ in range(5)])
                   for i, s in enumerate((KiB, 8 * KiB, 64 * KiB, 512 * KiB))]
    elif case == "burst":                      # small messages faster than the sustained rate (token bucket)
        records = [make_record("raw", "all_gather", n, s, [(1e-4 + max(s - 16 * KiB, s / 50) / LINK_BPS * (n - 1))
                                                           * (1 + rng.gauss(0, 0.02)) for _ in range(6)])
                   for n in (2, 3, 4) for s in (KiB, 4 * KiB, 16 * KiB, 64 * KiB, 256 * KiB, MiB)]
    elif case == "noisy":
        records = sampled(GLOO, "gloo", "all_gather", (2, 3), noise=0.4, volumes=VOLUMES[::4])
    elif case == "one_n":
        records = sampled(RAW, "raw", "all_gather", (4,))
    elif case == "send_recv":
        records = sampled(RAW, "gloo", "send_recv", (2, 4))
    else:
        records = sampled(GLOO, "gloo", "all_reduce", (2, 4))
    model = fit(records)
    assert model.series_models, model.skipped
    sizes = sorted({1, 2, 3, 1000, *(int(v) for v in np.geomspace(1, 1 << 30, 60)), 1 << 30})
    for m in model.series_models:
        for n in (2, 3, 5, 8, 64):
            means = m.mean_s(np.full(len(sizes), n), np.array(sizes))
            assert (means > 0).all(), (m.series, n)
            for s in (1, 777, MiB, 1 << 30):
                p = m.predict(n, s)
                assert 0 < p.low_s <= p.median_s <= p.high_s and p.time_s > 0


@settings(max_examples=300, deadline=None)
@given(coefficients=st.lists(st.floats(0, 1e-2, allow_nan=False), min_size=5, max_size=5),
       ramp_half=st.floats(1, 1e9), n=st.integers(2, 256), size=st.integers(1, 1 << 30),
       op=st.sampled_from(["all_gather", "all_reduce", "send_recv", "ping_pong", "all_gather_p2p"]),
       backend=st.sampled_from(["gloo", "raw"]))
def test_every_non_negative_solution_is_a_positive_time(coefficients, ramp_half, n, size, op, backend) -> None:
    """The parametrisation itself: any non-negative NNLS solution, read back as terms (a negative ramp included),
    gives a time >= 0 on every structure, and > 0 unless every coefficient is 0."""
    structure = structure_of(backend, "ring" if backend == "raw" else "default", op)
    if structure is None:
        return
    terms = _terms(np.array(coefficients), Variant(ramp=True, n2=True), ramp_half)
    t = float(terms.time_s(structure, n, size))
    assert t >= 0
    if coefficients[0] > 0 or coefficients[1] > 0:
        assert t > 0


def test_bimodal_samples_give_a_bimodal_interval() -> None:
    """gloo's N=2 rows: fast and slow repetitions. The interval spans both modes, and the prediction names them."""
    rng = random.Random(3)
    records = []
    for n in (2, 3, 4):
        for v in VOLUMES[-6:]:
            s = per_rank(v, n)
            t = float(RAW.time_s(RING, n, s))
            times = ([t * (1.6 if i % 5 < 2 else 1.0) * (1 + rng.gauss(0, 0.01)) for i in range(20)] if n == 2
                     else [t * (1 + rng.gauss(0, 0.01)) for _ in range(20)])
            records.append(make_record("gloo", "all_gather", n, s, times))
    model = fit(records)
    p = model.predict("all_gather", 2, 16 * MiB)
    truth = float(RAW.time_s(RING, 2, 16 * MiB))
    assert p.modes is not None and p.modes["slow_fraction"] == pytest.approx(0.4, abs=0.1)
    assert p.modes["fast_s"] == pytest.approx(truth, rel=0.05) and p.modes["slow_s"] == pytest.approx(1.6 * truth, rel=0.05)
    assert p.low_s < truth * 1.02 and p.high_s > truth * 1.55
    assert model.predict("all_gather", 3, 8 * MiB).modes is None


def test_model_json_round_trip_and_old_files(tmp_path, gloo_model) -> None:
    path = tmp_path / "model.json"
    path.write_text(json.dumps(gloo_model.to_json(), allow_nan=False))
    back = load(path)
    a = gloo_model.predict("all_gather", 8, 16 * MiB)
    b = back.predict("all_gather", 8, 16 * MiB, series="gloo")
    assert (a.time_s, a.low_s, a.high_s) == pytest.approx((b.time_s, b.low_s, b.high_s))
    with pytest.raises(DiagError, match="no model for send_recv"):
        back.predict("send_recv", 2, 1024)
    for schema in (1, 2):       # an earlier release's line per N
        path.write_text(json.dumps({"schema": schema, "kind": "diag-model", "models": []}))
        with pytest.raises(DiagError, match=f"schema {schema}: an earlier release's line per N.*fit it again"):
            load(path)


@pytest.mark.parametrize("text", ['{"bad', '[1, 2]', '{"kind": "something else"}', '{"kind": "diag-model", '
                                  '"schema": 3, "series": [{"series": "torch:gloo"}]}', "\udcff"])
def test_a_bad_model_file_is_one_line_naming_it(tmp_path, capsys, text) -> None:
    path = tmp_path / "broken.json"
    path.write_text(text, errors="surrogateescape")
    assert main(["model", "predict", "--model", str(path), "--world-size", "5", "--size", "16M"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(path) in err and "Traceback" not in err
    assert main(["model", "predict", "--model", str(tmp_path / "missing.json"), "--world-size", "5",
                 "--size", "16M"]) == 2
    assert "missing.json" in capsys.readouterr().err


def test_cli_fit_predict_check(tmp_path, capsys) -> None:
    records = write_records(tmp_path / "r.jsonl", sampled(GLOO, "gloo", "all_gather", range(2, 7))
                            + sampled(RAW, "raw", "all_gather", range(2, 7), seed=4))
    model_path = tmp_path / "model.json"
    assert main(["model", "fit", str(records), "-o", str(model_path), "--world-sizes", "2,3,4"]) == 0
    out = capsys.readouterr().out
    assert "torch:gloo all_gather" in out and "raw:ring all_gather" in out
    assert "leave-one-N-out: N=2" in out and "leave-one-size-out (D, 17 sizes)" in out
    assert re.search(r"N=2 turn-taking share 3[234]\.\d%", out) and "extrapolates at N below 2 or above 4" in out
    document = json.loads(model_path.read_text())
    assert document["schema"] == 3 and {s["series"] for s in document["series"]} == {"torch:gloo", "raw:ring"}

    assert main(["model", "predict", "--model", str(model_path), "--world-size", "8", "--size", "2M",
                 "--series", "gloo", "--json"]) == 0
    (answer,) = json.loads(capsys.readouterr().out)
    truth = float(GLOO.time_s(RING, 8, 2 * MiB))
    assert answer["time_s"] == pytest.approx(truth, rel=0.05) and answer["low_s"] < truth < answer["high_s"]
    assert answer["extrapolated"] and "N=8" in answer["where"]
    assert main(["model", "predict", "--model", str(model_path), "--world-size", "8", "--size", "2M"]) == 0
    text = capsys.readouterr().out
    assert text.count("extrapolated: N=8") == 2 and "95% of operations" in text

    assert main(["model", "check", "--model", str(model_path), str(records), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    gloo = next(s for s in result["summary"] if s["series"] == "torch:gloo")
    assert gloo["rows_unseen_n"] == 2 * len(VOLUMES) and gloo["unseen_n_large"] < 0.05
    losses = [p for p in result["n2_loss"] if p["series"] == "torch:gloo" and p["volume_bytes"] >= MiB]
    assert losses and all(p["predicted_loss"] == pytest.approx(p["measured_loss"], abs=0.03) for p in losses)
    (n2,) = result["n2_loss_summary"]
    assert n2["series"] == "torch:gloo" and abs(n2["relative_difference"]) < 0.1
    assert main(["model", "check", "--model", str(model_path), str(records)]) == 0
    assert "N=2 loss at D=" in capsys.readouterr().out
    assert main(["model", "predict", "--model", str(model_path), "--op", "broadcast", "--world-size", "2",
                 "--size", "1M"]) == 2
    assert "no model for broadcast" in capsys.readouterr().err


VIDUR_COLUMNS = {  # the header of Vidur's own profiles (data/profiling/network/*/all_reduce.csv, send_recv.csv)
    op: ["Unnamed: 0", *(f"time_stats.{op}.{s}" for s in ("min", "max", "mean", "median", "std")), "rank",
         "num_workers", "size", "collective", "devices_per_node", "max_devices_per_node"]
    for op in ("all_reduce", "send_recv")}


def test_vidur_profiles_load_into_the_columns_its_predictor_reads(tmp_path, capsys) -> None:
    pd = pytest.importorskip("pandas", reason="pandas reads Vidur's CSVs (the test extra installs it)")
    records = (sampled(GLOO, "gloo", "all_reduce", (2, 4)) + sampled(RAW, "gloo", "send_recv", (2, 4), seed=2)
               + sampled(GLOO, "gloo", "all_gather", (2, 3, 4), seed=3))
    model_path = tmp_path / "model.json"
    assert main(["model", "fit", str(write_records(tmp_path / "r.jsonl", records)), "-o", str(model_path)]) == 0
    out = tmp_path / "vidur"
    assert main(["model", "export", "--model", str(model_path), "--vidur", str(out), "--world-sizes", "2,4,8",
                 "--max-size", "2M"]) == 0
    printed = capsys.readouterr().out
    assert "all_reduce.csv" in printed and "all_reduce.csv: num_workers 8 extrapolated (measured N=2,4)" in printed
    embedding_dim = 4096
    for op in ("all_reduce", "send_recv"):
        df = pd.read_csv(out / f"{op}.csv")
        assert list(df.columns) == VIDUR_COLUMNS[op]
        df = df.drop_duplicates()
        # the rows Vidur's sklearn predictor selects (_load_all_reduce_df, _load_send_recv_df)
        if op == "all_reduce":
            for tp in (2, 4, 8):
                rows = df[(df["num_workers"] == tp) & (df["devices_per_node"] == tp) & (df["collective"] == op)]
                assert len(rows) == 161          # its grid to 2 MiB: 1Ki..508Ki elements by 4Ki, 512Ki..1Mi by 16Ki
        else:
            for devices in (1, 2):
                assert len(df[(df["collective"] == op) & (df["devices_per_node"] == devices)]) == 161
        target = df[f"time_stats.{op}.median"]
        assert (target > 0).all() and (df[f"time_stats.{op}.min"] <= target).all()
        assert (target <= df[f"time_stats.{op}.max"]).all()
        tokens = df["size"] / embedding_dim / 2                       # its derived feature
        assert tokens.min() > 0 and df["size"].max() == 2 * MiB
        # times in ms: 2 MiB at 100 Mbit/s take ~170 ms
        big = df[(df["size"] == df["size"].max()) & (df["num_workers"] == 2)].iloc[0]
        assert big[f"time_stats.{op}.mean"] == pytest.approx(
            1e3 * float((GLOO if op == "all_reduce" else RAW).time_s(structure_of("gloo", "default", op), 2,
                                                                    int(big["size"]))), rel=0.05)
    assert (out / "all_gather.csv").exists()


def test_astra_sim_network_config_parses_as_its_network_config(tmp_path, capsys) -> None:
    yaml = pytest.importorskip("yaml", reason="PyYAML reads the config as ASTRA-sim's yaml-cpp does")
    # as sweeps label them: the raw reference shows its order; a raw series with a mechanism knob is not it
    records = (sampled(RAW, "raw", "all_gather", (2, 3, 4), knobs={"order": "recv-first"})
               + sampled(Terms(1e-3, 2 / LINK_BPS), "raw", "all_gather", (2, 3, 4),
                         knobs={"order": "recv-first", "emulate": "gloo"})
               + sampled(GLOO, "gloo", "all_gather", (2, 3, 4)))
    model_path = tmp_path / "model.json"
    assert main(["model", "fit", str(write_records(tmp_path / "r.jsonl", records)), "-o", str(model_path)]) == 0
    path = tmp_path / "network.yml"
    assert main(["model", "export", "--model", str(model_path), "--astra-sim", str(path), "--npus", "8"]) == 0
    assert "from raw:ring [order=recv-first] all_gather" in capsys.readouterr().out
    config = yaml.safe_load(path.read_text())
    # astra-network-analytical NetworkParser: per-dimension lists of equal length, known topologies,
    # npus_count > 1, bandwidth > 0 (GB/s, GB = 2^30 B), latency >= 0 (ns per hop)
    assert set(config) == {"topology", "npus_count", "bandwidth", "latency"}
    dims = len(config["topology"])
    assert dims == 1 and all(len(config[k]) == dims for k in ("npus_count", "bandwidth", "latency"))
    assert config["topology"] == ["Switch"] and config["npus_count"] == [8]
    assert config["bandwidth"][0] * (1 << 30) == pytest.approx(LINK_BPS, rel=0.02)
    assert config["latency"][0] == pytest.approx(RAW.alpha_s * 1e9 / 2, rel=0.05)      # a switch is two hops
    # a message of m bytes between two NPUs costs 2 x latency + m / bandwidth: the raw ring's step
    m = 4 * MiB
    step_ns = 2 * config["latency"][0] + m / (config["bandwidth"][0] * (1 << 30) / 1e9)
    assert step_ns * 1e-9 == pytest.approx(float(RAW.time_s(RING, 2, m)), rel=0.03)
    ring = tmp_path / "ring.yml"
    assert main(["model", "export", "--model", str(model_path), "--astra-sim", str(ring), "--topology", "Ring",
                 "--series", "gloo"]) == 0
    assert yaml.safe_load(ring.read_text())["latency"][0] == pytest.approx(ALPHA_S * 1e9, rel=0.1)
    assert main(["model", "export", "--model", str(model_path)]) == 2
    assert "nothing to export" in capsys.readouterr().err


def test_rows_with_wrong_data_and_ops_without_structure_are_named() -> None:
    records = [*sampled(RAW, "raw", "all_gather", (2, 3)),
               make_record("raw", "all_gather", 2, 3 * MiB, [1.0] * 3, nwrong=5),
               make_record("gloo", "broadcast", 2, MiB, [0.1] * 3), make_record("gloo", "broadcast", 2, 2 * MiB, [0.2] * 3)]
    model = fit(records)
    (m,) = model.series_models
    assert any("wrong data" in n for n in m.notes) and 3 * MiB not in m.sizes_bytes
    assert any(s["op"] == "broadcast" and "no step structure" in s["why"] for s in model.skipped)
    assert math.isfinite(m.terms.alpha_s)


def test_the_python_api_is_load_fit_predict(tmp_path) -> None:
    """diag.model.fit is the function whatever else imported the fitting module (a submodule named fit would
    replace it on the package)."""
    import diag.model
    import diag.model.fitting

    model = diag.model.fit(sampled(RAW, "raw", "all_gather", (2, 3)), world_sizes=(2, 3))
    path = tmp_path / "model.json"
    path.write_text(json.dumps(model.to_json()))
    p = diag.model.load(path).predict("all_gather", 5, 4 * MiB, series="raw")
    assert p.extrapolated and p.time_s == pytest.approx(float(RAW.time_s(RING, 5, 4 * MiB)), rel=0.05)

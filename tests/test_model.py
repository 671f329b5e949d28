"""Model fit: T(S) = alpha + beta*S recovered from synthetic samples; two-segment where the data bends;
`diag model fit` / `diag model predict` end to end."""

from __future__ import annotations

import json
import random

import pytest
from report_helpers import KiB, MiB, make_record, write_records

from diag.__main__ import main
from diag.errors import DiagError
from diag.report.model import fit_all, fit_group, models_from_json, models_to_json, select

ALPHA_S = 250e-6
BETA_S_PER_BYTE = 1 / 110e6  # 110 MB/s
SIZES = [2**k for k in range(10, 25)]  # 1 KiB .. 16 MiB


def linear_records(noise: float = 0.03, seed: int = 1, n: int = 4):
    rng = random.Random(seed)
    return [make_record("gloo", "all_gather", n, size,
                        [(ALPHA_S + BETA_S_PER_BYTE * size) * (1 + rng.gauss(0, noise)) for _ in range(10)])
            for size in SIZES]


def test_linear_fit_recovers_alpha_and_beta_within_5_percent() -> None:
    (model,) = fit_all(linear_records())
    assert model.linear.alpha_s == pytest.approx(ALPHA_S, rel=0.05)
    assert model.linear.beta_s_per_byte == pytest.approx(BETA_S_PER_BYTE, rel=0.05)
    assert model.best == "linear"
    assert 0.01 < model.linear.rel_rms < 0.06  # the fit error reflects the 3% noise put in


def test_two_segment_finds_the_bend() -> None:
    """Slow below 256 KiB (latency-ish regime), faster per byte above: breakpoint found near 256 KiB."""
    bend = 256 * KiB
    rng = random.Random(3)

    def t(size: int) -> float:
        low = ALPHA_S + 4 * BETA_S_PER_BYTE * min(size, bend)
        return low + BETA_S_PER_BYTE * max(size - bend, 0)

    records = [make_record("raw", "all_gather", 2, s, [t(s) * (1 + rng.gauss(0, 0.01)) for _ in range(8)])
               for s in SIZES]
    (model,) = fit_all(records)
    assert model.best == "two_segment"
    two = model.two_segment
    assert two is not None
    assert bend / 2 <= two.breakpoint_bytes <= bend * 2
    assert two.beta2_s_per_byte == pytest.approx(BETA_S_PER_BYTE, rel=0.1)
    assert two.rel_rms < model.linear.rel_rms
    predicted, _se = model.predict(8 * MiB)
    assert predicted == pytest.approx(t(8 * MiB), rel=0.05)


def test_groups_are_kept_apart_and_a_single_size_is_not_fitted() -> None:
    records = linear_records(n=2) + linear_records(n=3) + [make_record("gloo", "exchange", 2, 1024, [1e-3, 1e-3])]
    models = fit_all(records)
    assert sorted(m.world_size for m in models) == [2, 3]


def test_series_of_one_transport_are_never_pooled(tmp_path, capsys) -> None:
    """The raw-TCP reference, gloo's protocol model (--emulate gloo) and a half-duplex ring (--io alternate)
    share raw:ring but are three series: three models, each with its own bandwidth and a small fit error,
    never one line through all three (whose error would be the gap between them)."""
    rng = random.Random(5)

    def rows(knobs: dict, bandwidth: float) -> list:
        return [make_record("raw", "all_gather", 2, size, [(ALPHA_S + size / bandwidth) * (1 + rng.gauss(0, 0.01))
                                                          for _ in range(6)], knobs=knobs)
                for size in (MiB, 4 * MiB, 16 * MiB)]

    records = rows({}, 22e6) + rows({"emulate": "gloo"}, 15e6) + rows({"io": "alternate"}, 11e6)
    models = {m.label: m for m in fit_all(records)}
    assert set(models) == {"raw:ring", "raw:ring [emulate=gloo]", "raw:ring [io=alternate]"}
    for label, bandwidth in (("raw:ring", 22e6), ("raw:ring [emulate=gloo]", 15e6), ("raw:ring [io=alternate]", 11e6)):
        assert models[label].linear.bandwidth_Bps == pytest.approx(bandwidth, rel=0.05)
        assert models[label].linear.rel_rms < 0.03
    with pytest.raises(ValueError, match="one model per series"):
        fit_group(records)
    # the file names each model's series; predict picks one by it, or every series of a transport
    path = tmp_path / "m.json"
    assert main(["model", "fit", str(write_records(tmp_path / "r.jsonl", records)), "-o", str(path)]) == 0
    document = json.loads(path.read_text())
    assert document["schema"] == 2 and sorted(m["series"] for m in document["models"]) == sorted(models)
    capsys.readouterr()
    assert main(["model", "predict", "--model", str(path), "--world-size", "2", "--size", "16M", "--backend",
                 "raw:ring [emulate=gloo]", "--json"]) == 0
    (answer,) = json.loads(capsys.readouterr().out)
    assert answer["series"] == "raw:ring [emulate=gloo]"
    assert answer["time_s"] == pytest.approx(ALPHA_S + 16 * MiB / 15e6, rel=0.03)
    assert len(select(models_from_json(document), "all_gather", 2, "raw")) == 3


def test_json_round_trip_and_select() -> None:
    models = fit_all(linear_records())
    back = models_from_json(json.loads(json.dumps(models_to_json(models, ["x.jsonl"]))))
    assert back[0].predict(MiB) == pytest.approx(models[0].predict(MiB))
    assert select(back, "all_gather", 4, "torch:gloo")
    with pytest.raises(DiagError, match="no model for all_gather N=5"):
        select(back, "all_gather", 5)
    with pytest.raises(DiagError):
        models_from_json({"kind": "something else"})


def test_cli_fit_and_predict(tmp_path, capsys) -> None:
    records = write_records(tmp_path / "r.jsonl", linear_records(noise=0.01))
    model_path = tmp_path / "model.json"
    assert main(["model", "fit", str(records), "-o", str(model_path)]) == 0
    document = json.loads(model_path.read_text())
    assert document["models"][0]["linear"]["alpha_s"] == pytest.approx(ALPHA_S, rel=0.05)
    capsys.readouterr()
    assert main(["model", "predict", "--model", str(model_path), "--op", "all_gather", "--world-size", "4",
                 "--size", "16M", "--backend", "gloo", "--json"]) == 0
    (answer,) = json.loads(capsys.readouterr().out)
    expected = ALPHA_S + BETA_S_PER_BYTE * 16 * MiB
    assert answer["time_s"] == pytest.approx(expected, rel=0.03)
    assert answer["ci95_s"][0] < expected < answer["ci95_s"][1]
    assert answer["extrapolated"] is False
    assert main(["model", "predict", "--model", str(model_path), "--world-size", "4", "--size", "16M"]) == 0
    assert "+/-" in capsys.readouterr().out
    assert main(["model", "predict", "--model", str(model_path), "--world-size", "7", "--size", "1M"]) == 2
    assert "no model for all_gather N=7" in capsys.readouterr().err


def _strict_loads(text: str):
    def reject(constant: str):
        raise ValueError(f"not strict JSON: {constant}")

    return json.loads(text, parse_constant=reject)   # what jq and browsers do with Infinity / NaN


def test_model_json_is_strict_and_says_why_a_number_is_null(tmp_path, capsys) -> None:
    """Time that does not grow with size (latency-bound, flat) has no finite bandwidth: model.json writes
    null there, never Infinity, and its nonfinite list names the field and the reason."""
    flat = [make_record("gloo", "all_gather", 2, size, [1e-3 * (1 + 0.01 * (i % 3)) for i in range(6)])
            for size in (KiB, 2 * KiB)]
    flat[1] = make_record("gloo", "all_gather", 2, 2 * KiB, [0.9e-3 * (1 + 0.01 * (i % 3)) for i in range(6)])
    path = write_records(tmp_path / "flat.jsonl", flat)
    out = tmp_path / "m.json"
    assert main(["model", "fit", str(path), "-o", str(out)]) == 0
    document = _strict_loads(out.read_text())
    linear = document["models"][0]["linear"]
    assert linear["beta_s_per_byte"] < 0 and linear["bandwidth_Bps"] is None
    notes = {n["path"]: n for n in document["nonfinite"]}
    assert notes["models[0].linear.bandwidth_Bps"]["was"] == "Infinity"
    assert "time does not grow with size" in notes["models[0].linear.bandwidth_Bps"]["why"]
    # the file reads back: predict works on it
    assert main(["model", "predict", "--model", str(out), "--world-size", "2", "--size", "1K"]) == 0
    assert "on 2 ranks with torch:gloo" in capsys.readouterr().out
    # and the report's model.json is strict too
    assert all(n["was"] in ("Infinity", "-Infinity", "NaN") for n in models_to_json(fit_all(flat), [])["nonfinite"])

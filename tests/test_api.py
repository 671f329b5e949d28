"""The Python API: a real 2-rank gloo sweep on loopback through diag.sweep(SweepSpec(...)), its rows into
pandas, a run directory into pandas, and the package's type hints shipped (py.typed)."""

from __future__ import annotations

import csv
import re
import subprocess
import sys
from pathlib import Path

import pytest

import diag
from diag.records import SAMPLE_FIELDS, export_samples_csv

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_sweep_from_python_returns_its_rows_and_loads_into_pandas(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    pandas = pytest.importorskip("pandas")
    out = tmp_path / "api.jsonl"
    out.write_text("")  # an earlier run's file: sweep appends, and returns only its own rows
    spec = diag.SweepSpec(backend="gloo", ops=("all_gather",), sizes=(4096, 65536), world_sizes=(2,), iters=3,
                          warmup=1)
    run = diag.sweep(spec, out)
    assert [(r.world_size, r.size_bytes) for r in run.records] == [(2, 4096), (2, 65536)]
    assert run.complete and all(r.nwrong == 0 for r in run.records)
    again = diag.sweep(spec.replace(sizes=(8192,)), out)
    assert [r.size_bytes for r in again.records] == [8192]
    assert len(diag.load_records(out).records) == 3

    rows = diag.load_records(out).to_pandas()
    assert list(rows["size_bytes"]) == [4096, 65536, 8192] and rows["busbw_Bps"].gt(0).all()
    samples = run.to_pandas(samples=True)
    assert list(samples.columns) == ["source", *SAMPLE_FIELDS] and len(samples) == 6
    assert samples.groupby("size_bytes")["time_s"].median().to_dict() == pytest.approx(
        {r.size_bytes: r.time_s for r in run.records})
    # the samples CSV holds the same rows (what R or pandas.read_csv reads)
    export_samples_csv(run.records, tmp_path / "s.csv")
    read = pandas.read_csv(tmp_path / "s.csv")
    assert read["time_s"].tolist() == pytest.approx(samples["time_s"].tolist())
    with (tmp_path / "s.csv").open() as handle:
        assert next(csv.reader(handle)) == list(SAMPLE_FIELDS)

    from diag.report import load_run

    frame = load_run([out]).to_pandas(samples=True)
    assert len(frame) == 9 and set(frame["source"]) == {str(out)}


def test_to_pandas_without_pandas_is_one_clear_line(tmp_path: Path) -> None:
    code = ("import sys; sys.modules['pandas'] = None\n"
            "import diag\n"
            "from diag.records import RecordFile\n"
            "try:\n    RecordFile(None, [], [], []).to_pandas()\n"
            "except ImportError as e:\n    print(e)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.stdout.strip() == "to_pandas() needs pandas, which is not installed: pip install pandas", done.stderr


def test_package_ships_its_type_hints_and_scenarios() -> None:
    assert (REPO / "diag" / "py.typed").is_file()
    shipped = re.search(r"^diag = \[(.*)\]$", (REPO / "pyproject.toml").read_text(), re.MULTILINE)
    assert shipped is not None
    assert '"py.typed"' in shipped.group(1)
    # the lab's built-in fault scenarios are data files, installed only where package-data names them
    assert '"lab/scenarios/*.json"' in shipped.group(1) and list((REPO / "diag/lab/scenarios").glob("*.json"))

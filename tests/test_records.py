"""The records file survives killed writers: torn lines are fenced off and skipped, every complete row kept."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from report_helpers import make_record, write_records

from diag.errors import DiagError
from diag.records import Record, RecordWriter, load_records


def _rows(n: int) -> list:
    return [make_record("gloo", "all_gather", 2, 1024 << i, [0.001 * (i + 1)] * 3) for i in range(n)]


def test_append_after_a_torn_tail_keeps_every_complete_row(tmp_path: Path) -> None:
    path = write_records(tmp_path / "r.jsonl", _rows(3))
    with path.open("ab") as handle:
        handle.write(b'{"event":"record","schema":1,"backend":"gl')  # a writer killed mid-line
    # The next appender (the launcher's failure `end`, or the next sweep with the same --out).
    with RecordWriter(path) as writer:
        writer.end("test-gloo-n2", "failed", error="rank 1 was killed by SIGKILL")
    with RecordWriter(path) as writer:  # a third writer finds a clean tail and adds no empty line
        writer.record(make_record("gloo", "all_gather", 2, 1 << 20, [0.01] * 3))
    loaded = load_records(path)
    assert [r.size_bytes for r in loaded.records] == [1024, 2048, 4096, 1 << 20]
    assert loaded.torn_lines == 1
    assert [e["status"] for e in loaded.ends] == ["ok", "failed"]
    lines = path.read_bytes().split(b"\n")
    assert lines[-1] == b"" and b"" not in lines[:-1]  # one fence newline, no blank lines


def test_a_torn_tail_shorter_than_the_event_prefix(tmp_path: Path) -> None:
    path = write_records(tmp_path / "r.jsonl", _rows(2))
    with path.open("ab") as handle:
        handle.write(b'{"ev')
    assert len(load_records(path).records) == 2
    with RecordWriter(path) as writer:
        writer.record(make_record("gloo", "all_gather", 2, 99, [0.01] * 3))
    assert [r.size_bytes for r in load_records(path).records] == [1024, 2048, 99]


def test_foreign_lines_are_still_errors(tmp_path: Path) -> None:
    path = write_records(tmp_path / "r.jsonl", _rows(1))
    with path.open("ab") as handle:
        handle.write(b"hello, not json\n")
    with pytest.raises(DiagError, match=r"r.jsonl:\d+: not JSON"):
        load_records(path)
    binary = tmp_path / "bin.jsonl"
    binary.write_bytes(bytes(range(256)) * 8)
    with pytest.raises(DiagError, match="not JSON"):
        load_records(binary)
    with pytest.raises(DiagError, match="is a directory"):
        load_records(tmp_path)
    with pytest.raises(DiagError, match="is a directory"):
        RecordWriter(tmp_path)


def _last_byte(path: Path) -> bytes:
    with path.open("rb") as handle:
        handle.seek(0, os.SEEK_END)
        if handle.tell() == 0:
            return b""
        handle.seek(-1, os.SEEK_END)
        return handle.read(1)


def test_a_writer_killed_mid_line_then_appended_to(tmp_path: Path) -> None:
    """A real process writes big events through RecordWriter and is SIGKILLed while one is half on disk."""
    path = tmp_path / "killed.jsonl"
    script = textwrap.dedent(f"""
        from diag.records import RecordWriter
        writer = RecordWriter({str(path)!r})
        writer.start("run", spec={{}})
        print("started", flush=True)
        while True:
            writer.write({{"event": "start", "run_id": "padding", "pad": "x" * (32 << 20)}})
    """)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    for _attempt in range(5):
        path.unlink(missing_ok=True)
        proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=env)
        assert proc.stdout is not None and proc.stdout.readline().strip() == "started"
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not (path.stat().st_size > 200 and _last_byte(path) != b"\n"):
            time.sleep(0.0005)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        if _last_byte(path) != b"\n":
            break
    assert _last_byte(path) != b"\n", "the writer was never caught mid-line in 5 tries"
    with RecordWriter(path) as writer:
        writer.end("run", "failed", error="killed")
    loaded = load_records(path)
    assert loaded.starts[0]["run_id"] == "run" and loaded.ends[-1]["status"] == "failed"
    assert loaded.torn_lines == 1


def test_series_is_the_key_of_pandas_and_the_csvs(tmp_path: Path) -> None:
    """Two launches of one configuration share their series though their knobs differ in measured values (the
    socket buffers the kernel granted, the TCP_INFO directory); the reference and gloo's protocol model, of one
    transport, do not."""
    import csv

    pandas = pytest.importorskip("pandas")
    from report_helpers import MiB, timed

    from diag.records import CSV_FIELDS, SAMPLE_FIELDS, export_samples_csv, write_csv

    def raw(knobs: dict, seed: int) -> Record:
        return make_record("raw", "all_gather", 2, MiB, timed(0.05, count=3, seed=seed), knobs=knobs)

    rows = [raw({"so_sndbuf": 425984, "tcpinfo_dir": "/tmp/a"}, 1), raw({"so_sndbuf": 2626560, "tcpinfo_dir": "/tmp/b"}, 2),
            raw({"emulate": "gloo", "so_sndbuf": 425984}, 3)]
    frame = load_records(write_records(tmp_path / "r.jsonl", rows)).to_pandas()
    assert list(frame["series"]) == ["raw:ring", "raw:ring", "raw:ring [emulate=gloo]"]
    assert frame["knobs"].nunique() == 3                      # the knobs string tells no two rows apart
    assert frame.groupby("series").size().to_dict() == {"raw:ring": 2, "raw:ring [emulate=gloo]": 1}
    write_csv(rows, tmp_path / "rows.csv")
    with (tmp_path / "rows.csv").open() as handle:
        table = list(csv.DictReader(handle))
    assert list(table[0]) == list(CSV_FIELDS) and [r["series"] for r in table] == list(frame["series"])
    export_samples_csv(rows, tmp_path / "samples.csv")
    samples = pandas.read_csv(tmp_path / "samples.csv")
    assert list(samples.columns) == list(SAMPLE_FIELDS) and samples["series"].nunique() == 2

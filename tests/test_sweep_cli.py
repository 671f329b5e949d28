"""`diag sweep` end to end: real launchers, real gloo ranks, real failures."""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from diag.records import load_records
from tests.common import run_diag

DIAG = [sys.executable, "-m", "diag"]


def assert_one_line_error(proc: subprocess.CompletedProcess, *needles: str) -> None:
    assert proc.returncode != 0
    err = proc.stderr.strip()
    assert "Traceback" not in err, err
    assert len(err.splitlines()) == 1, err
    for needle in needles:
        assert needle in err, err


def test_sweep_two_world_sizes_writes_valid_records(tmp_path):
    """--nproc 2,3: one launch of 3 ranks, N=2 on a subgroup of them; one records run per N, as before, in --out
    and in the run directory beside it."""
    out, table = tmp_path / "run.jsonl", tmp_path / "run.csv"
    proc = run_diag("sweep", "--nproc", "2,3", "--sizes", "1K,12589", "--dtype", "uint8", "--iters", "3",
                    "--warmup", "1", "--out", str(out), "--csv", str(table))
    assert proc.returncode == 0, proc.stderr
    data = load_records(out)
    assert data.complete and len(data.starts) == 2 and len(data.ends) == 2
    assert [(r.world_size, r.size_bytes) for r in data.records] == [(2, 1024), (2, 12589), (3, 1024), (3, 12589)]
    assert len({s["run_id"].rsplit("-", 1)[0] for s in data.starts}) == 1      # one run, a run id per N
    assert [len(r.hosts) for r in data.records] == [2, 2, 3, 3]
    run_dir = tmp_path / "run.d"
    assert (run_dir / "records" / "sweep.jsonl").read_text() == out.read_text()   # the same events, both files
    assert list((run_dir / "logs").glob("job-n3.json")) and not list((run_dir / "logs").glob("job-n2.json"))
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["command"] == "sweep" and meta["plan"]["world_sizes"] == [2, 3] and meta["topology"]["subgroups"]["2"]
    assert all(r.nwrong == 0 and r.backend == "gloo" and r.op == "all_gather" for r in data.records)
    env = data.starts[0]["env"]
    assert "net.ipv4.tcp_rmem" in env["sysctl"] and env["torch"]
    assert data.starts[0]["world_size"] == 2 and data.starts[1]["world_size"] == 3
    # the table printed on stdout has one line per row
    assert sum(1 for line in proc.stdout.splitlines() if " all_gather " in line) == 4
    rows = list(csv.DictReader(table.open()))
    assert len(rows) == 4 and float(rows[0]["busbw_Bps"]) == pytest.approx(data.records[0].busbw_Bps)


def test_killed_rank_ends_sweep_with_one_line_and_keeps_rows(tmp_path):
    out = tmp_path / "killed.jsonl"
    run_dir = tmp_path / "killed.d"
    sizes = ",".join(f"{k}K" for k in range(1, 40))
    proc = subprocess.Popen([*DIAG, "sweep", "--nproc", "3", "--sizes", sizes, "--iters", "20", "--warmup", "1",
                             "--gap-ms", "10", "--timeout", "10", "--out", str(out), "--run-dir", str(run_dir),
                             "--quiet"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if out.exists() and out.read_text().count('"event":"record"') >= 2:
                break
            time.sleep(0.2)
        else:
            pytest.fail("the sweep wrote no rows in time")
        state = json.loads((run_dir / "logs" / "state-n3" / "rank2.json").read_text())
        killed_at = time.monotonic()
        os.kill(state["pid"], signal.SIGKILL)
        _, stderr = proc.communicate(timeout=10 + 30)
        stopped_after = time.monotonic() - killed_at
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    err = stderr.strip().splitlines()
    assert len(err) == 1, stderr
    assert "world size 3" in err[0] and "rank 2" in err[0] and "SIGKILL" in err[0], err[0]
    assert "all_gather" in err[0] and str(out) in err[0]
    assert stopped_after < 10 + 15  # within the timeout plus a few seconds
    data = load_records(out)
    assert len(data.records) >= 2 and all(r.nwrong == 0 for r in data.records)
    assert data.ends and data.ends[-1]["status"] == "failed"


def test_in_place_under_torchrun_captures_and_observes_every_node(need_root, tmp_path):
    """What users run on their own cluster: torchrun ... -m diag sweep --capture --observe. Every node captures
    its own NIC and analyses it against the records, and samples its ranks: all of it in the run directory."""
    if not shutil.which("tcpdump"):
        pytest.skip("tcpdump is not installed (.ci/setup installs it)")
    out = tmp_path / "tr.jsonl"
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         "-m", "diag", "sweep", "--capture", "--observe", "--iface", "lo", "--sizes", "64K,1M", "--iters", "3",
         "--warmup", "1", "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "# Out of bounds values : 0 OK" in proc.stdout
    records = load_records(out).records
    assert [(r.world_size, r.size_bytes) for r in records] == [(2, 64 << 10), (2, 1 << 20)]
    run_dir = tmp_path / "tr.d"
    (node,) = (run_dir / "nodes").iterdir()
    tag = "sweep--gloo-all_gather-n2"
    analysis = json.loads((node / "analysis" / f"{tag}.json").read_text())
    assert analysis["connections"] and {p["phase"]["size_bytes"] for p in analysis["phases"]} >= {64 << 10, 1 << 20}
    assert json.loads((node / "captures" / f"{tag}.pcap.capture.json").read_text())["iface"] == "lo"
    samples = [json.loads(line) for line in (node / "observe" / f"{tag}.jsonl").read_text().splitlines()]
    assert {"tcp_info", "cpu_thread", "cpu_host"} <= {s["kind"] for s in samples}
    assert json.loads((node / "fingerprint.json").read_text())["node"]["ranks"] == [0, 1]


def test_in_place_under_torchrun(tmp_path):
    out = tmp_path / "torchrun.jsonl"
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", "--rdzv-backend=static",
         "--master-addr=127.0.0.1", f"--master-port={port}", "--nnodes=1", "--node-rank=0",
         "-m", "diag", "sweep", "--op", "all_gather,exchange", "--sizes", "4K", "--iters", "2", "--warmup", "0",
         "--out", str(out)],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = load_records(out)
    assert len(data.starts) == 1 and data.complete  # only rank 0 writes
    assert [r.op for r in data.records] == ["all_gather", "exchange"]
    assert data.records[1].knobs["order"] == "recv-first"
    assert data.starts[0]["env"]["variables"]["MASTER_PORT"] == str(port)


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--nproc", "2", "--sizes", "12Q"], ["bad size unit", "12Q"]),
        (["--nproc", "2", "--sizes", "fast"], ["bad size"]),
        (["--nproc", "2", "--op", "all_gatherr"], ["unknown op"]),
        (["--sizes", "1K"], ["--nproc"]),
        (["--nproc", "2", "--sizes", "1K", "--iface", "nosuch0"], ["nosuch0", "does not exist"]),
        (["--nproc", "2", "--sizes", "1", "--dtype", "float32"], ["smaller than one float32"]),
    ],
)
def test_bad_arguments_give_one_line(args, needles, tmp_path):
    proc = run_diag("sweep", *args, "--out", str(tmp_path / "x.jsonl"), "--iters", "1", "--warmup", "0")
    assert_one_line_error(proc, *needles)


def test_port_in_use_gives_one_line(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = run_diag("sweep", "--nproc", "2", "--sizes", "1K", "--master-port", str(port),
                        "--out", str(tmp_path / "x.jsonl"))
    assert_one_line_error(proc, f"port {port}", "in use")


def test_nccl_without_cuda_says_so(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA is present: tests/test_nccl.py covers NCCL")
    proc = run_diag("sweep", "--backend", "nccl", "--nproc", "2", "--sizes", "1K", "--iters", "1",
                    "--out", str(tmp_path / "n.jsonl"))
    assert proc.returncode != 0
    assert "needs CUDA" in proc.stderr and "Traceback" not in proc.stderr


def test_help_does_not_import_torch():
    code = ("import sys; from diag.__main__ import build_parser; build_parser(); "
            "print('torch' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == "False", proc.stderr


@pytest.mark.slow
def test_records_survive_a_torn_last_line(tmp_path):
    out = tmp_path / "r.jsonl"
    proc = run_diag("sweep", "--nproc", "2", "--sizes", "1K", "--iters", "2", "--warmup", "0", "--out", str(out),
                    "--quiet")
    assert proc.returncode == 0, proc.stderr
    with out.open("a") as handle:
        handle.write('{"event":"record","schema":1,"backe')  # a writer killed mid-line
    assert len(load_records(Path(out)).records) == 1
    # The next sweep with the same --out appends after the torn line instead of gluing onto it.
    proc = run_diag("sweep", "--nproc", "2", "--sizes", "2K", "--iters", "2", "--warmup", "0", "--out", str(out),
                    "--quiet")
    assert proc.returncode == 0, proc.stderr
    loaded = load_records(Path(out))
    assert [r.size_bytes for r in loaded.records] == [1024, 2048] and loaded.complete and loaded.torn_lines == 1


@pytest.mark.slow
def test_sweep_closes_with_nccl_tests_lines_and_gates_on_min_busbw(tmp_path):
    """Like nccl-tests: '# Out of bounds values : 0 OK' and '# Avg bus bandwidth : X' close the table; exit 0,
    and exit 7 when the average busbw is below --min-busbw (NCCL_TESTS_MIN_BW); --samples-csv has one line per
    timed iteration."""
    out, samples = tmp_path / "run.jsonl", tmp_path / "samples.csv"
    proc = run_diag("sweep", "--nproc", "2", "--sizes", "4K,64K", "--iters", "3", "--warmup", "1", "--out", str(out),
                    "--samples-csv", str(samples))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert "# Out of bounds values : 0 OK" in lines
    avg = next(line for line in lines if line.startswith("# Avg bus bandwidth    : "))
    records = load_records(out).records
    expected = sum(r.busbw_Bps for r in records) / len(records) / 1e6
    number, unit = avg.split(":")[1].split()
    assert unit == "MB/s" and float(number) == pytest.approx(expected, rel=5e-3)  # the table's unit, 3 digits
    rows = list(csv.DictReader(samples.open()))
    assert len(rows) == 6 and {int(r["iteration"]) for r in rows} == {0, 1, 2}
    assert [float(r["time_s"]) for r in rows[:3]] == records[0].times_s

    gated = run_diag("sweep", "--nproc", "2", "--sizes", "4K", "--iters", "2", "--warmup", "0",
                     "--out", str(tmp_path / "gated.jsonl"), "--min-busbw", "1000")
    assert gated.returncode == 7, gated.stderr
    assert gated.stderr.strip().splitlines()[-1].startswith("diag sweep: average bus bandwidth ")
    assert "below --min-busbw 1000 GB/s" in gated.stderr


WRONG_IN_PLACE = """
import os, sys
sys.path.insert(0, {tests!r})
from harness_helpers import CorruptingTransport
import diag.worker
real = diag.worker.make_transport
diag.worker.make_transport = lambda spec, rank, world, *token: CorruptingTransport(real(spec, rank, world, *token), 0, "flip")
from diag.__main__ import main
sys.exit(main(["sweep", "--sizes", "64K", "--iters", "2", "--warmup", "0", "--out", {out!r}]))
"""


def test_wrong_data_exits_non_zero_with_nccl_tests_failed_line(tmp_path):
    """A sweep whose data check fails (#wrong > 0) exits 6, in place (diag/worker.py), as nccl-tests does."""
    out = tmp_path / "wrong.jsonl"
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(port)}
    code = WRONG_IN_PLACE.format(tests=str(Path(__file__).parent), out=str(out))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 6, proc.stdout[-2000:] + proc.stderr[-2000:]
    (record,) = load_records(out).records
    assert record.nwrong > 0
    assert f"# Out of bounds values : {record.nwrong} FAILED" in proc.stdout.splitlines()
    assert "the data check failed" in proc.stderr


def test_gate_status_over_launched_rows():
    """The launching diag sweep gates over every world size's rows (the ranks leave it to it)."""
    from report_helpers import make_record

    from diag.errors import EXIT_BELOW_MIN_BUSBW, EXIT_OK, EXIT_WRONG_DATA
    from diag.gates import closing_lines, sweep_status

    good = make_record("gloo", "all_gather", 2, 1 << 20, [0.01, 0.011])
    bad = make_record("gloo", "all_gather", 3, 1 << 20, [0.01, 0.011], nwrong=4)
    assert sweep_status([good])[0] == EXIT_OK
    assert sweep_status([good, bad])[0] == EXIT_WRONG_DATA
    assert sweep_status([good], min_busbw_GBps=good.busbw_Bps / 1e9 * 1.01)[0] == EXIT_BELOW_MIN_BUSBW
    assert sweep_status([good], min_busbw_GBps=good.busbw_Bps / 1e9 * 0.99)[0] == EXIT_OK
    assert closing_lines([good, bad])[0] == "# Out of bounds values : 4 FAILED"

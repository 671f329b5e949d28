"""Hostile or mistaken input to the CLI: one line that says what to do, exit code 2, before any rank starts,
and nothing already on disk lost. Captures are built by code (the fuzzer's seed builders and scapy)."""

from __future__ import annotations

import gzip
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from report_helpers import make_record, write_records

from bench.fuzz_analyze import link_frame, pcap_seed, pcapng_block, pcapng_option
from diag.records import load_records
from tests.common import run_diag

DIAG = [sys.executable, "-m", "diag"]  # for the commands built by hand (a shell pipe, a Popen)


def assert_usage_error(proc: subprocess.CompletedProcess[str], *needles: str) -> None:
    err = proc.stderr.strip()
    assert proc.returncode == 2, (proc.returncode, err)
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    for needle in needles:
        assert needle in err, err


def _pcapng(blocks: list[bytes]) -> bytes:
    shb = pcapng_block("<", 0x0A0D0D0A, struct.pack("<IHHq", 0x1A2B3C4D, 1, 0, -1))
    return shb + b"".join(blocks)


def _idb(linktype: int = 1, tsresol: bytes | None = None) -> bytes:
    body = struct.pack("<HHI", linktype, 0, 262144)
    if tsresol is not None:
        body += pcapng_option("<", 9, tsresol) + b"\0" * 4
    return pcapng_block("<", 1, body)


def _epb(ticks: int, frame: bytes) -> bytes:
    return pcapng_block("<", 6, struct.pack("<IIIII", 0, ticks >> 32, ticks & 0xFFFFFFFF, len(frame), len(frame))
                        + frame)


def _frame() -> bytes:
    from scapy.layers.inet import IP, TCP

    return link_frame(1, bytes(IP(src="10.0.0.1", dst="10.0.0.2") / TCP(sport=1, dport=2, flags="A") / b"x"), False)


@pytest.mark.parametrize(("name", "make", "needle"), [
    # an interface block of 12 bytes: no room for its link type and snaplen
    ("short-idb", lambda: _pcapng([struct.pack("<III", 1, 12, 12)]), "bad length 12"),
    # an enhanced packet block shorter than its fixed fields
    ("short-epb", lambda: _pcapng([_idb(), struct.pack("<IIII", 6, 16, 0, 16)]), "bad length 16"),
    # caplen that runs into the block's trailing length field
    ("epb-caplen", lambda: _pcapng([_idb(), pcapng_block("<", 6, struct.pack("<IIIII", 0, 0, 0, 8, 8))]),
     "inconsistent"),
    # 2^64 - 1 ticks of 1 s each: far beyond int64 nanoseconds
    ("huge-timestamp", lambda: _pcapng([_idb(tsresol=b"\x00"), _epb((1 << 64) - 1, _frame())]), "2262"),
    ("broken-gzip", lambda: gzip.compress(pcap_seed("s", 1, "<", False, False).data)[:-30] + b"\xff" * 30,
     "compressed data"),
])
def test_damaged_captures(tmp_path: Path, name: str, make, needle: str) -> None:
    path = tmp_path / f"{name}.pcapng"
    path.write_bytes(make())
    assert_usage_error(run_diag("analyze", str(path)), needle)


def test_piped_capture_is_read(tmp_path: Path) -> None:
    pcap = tmp_path / "seed.pcap"
    pcap.write_bytes(pcap_seed("s", 1, "<", False, False).data)
    direct = run_diag("analyze", "--json", "--no-series", str(pcap))
    assert direct.returncode == 0, direct.stderr
    expected = json.loads(direct.stdout)
    for producer in ("cat", "gzip -c"):
        piped = subprocess.run(["bash", "-c", f'{" ".join(DIAG)} analyze --json --no-series <({producer} "$0")',
                                str(pcap)], capture_output=True, text=True, timeout=120)
        assert piped.returncode == 0, piped.stderr
        got = json.loads(piped.stdout)
        assert got["files"][0]["path"].startswith("/dev/fd/")
        assert {k: v for k, v in got.items() if k != "files"} == {k: v for k, v in expected.items() if k != "files"}
        assert got["capture"]["packets"] > 0


def test_a_pcap_of_zeros_stays_small(tmp_path: Path) -> None:
    """64 MB of zero records (caplen 0): once 1.2 GB of candidate matrices, now a record walk."""
    path = tmp_path / "zeros.pcap"
    with path.open("wb") as handle:
        handle.write(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 262144, 1))
        handle.write(bytes(64 << 20))
    proc = subprocess.Popen([*DIAG, "analyze", "--json", "--no-series", str(path)], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    stdout = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)  # this child's own peak, whatever other tests ran before
    proc.returncode = os.waitstatus_to_exitcode(status)
    assert proc.returncode == 0
    assert json.loads(stdout)["capture"]["frames"] == 4194304
    assert usage.ru_maxrss / 1024 < 1024, f"peak RSS {usage.ru_maxrss / 1024:.0f} MB"


def test_analyze_arguments(tmp_path: Path) -> None:
    pcap = tmp_path / "seed.pcap"
    pcap.write_bytes(pcap_seed("s", 1, "<", False, False).data)
    binary = tmp_path / "bin.jsonl"
    binary.write_bytes(bytes(range(256)) * 4)
    assert_usage_error(run_diag("analyze", str(pcap), "--bin", "nan"), "--bin")
    assert_usage_error(run_diag("analyze", str(pcap), "--idle-gap", "inf"), "--idle-gap")
    assert_usage_error(run_diag("analyze", str(pcap), "--out", str(tmp_path)), "is a directory")
    assert_usage_error(run_diag("analyze", str(pcap), "--plot", str(pcap)), "not a directory")
    assert_usage_error(run_diag("analyze", str(pcap), "--records", str(tmp_path)), "is a directory")
    assert_usage_error(run_diag("analyze", str(pcap), "--records", str(binary)), "not JSON")
    assert_usage_error(run_diag("analyze", str(tmp_path)), "is a directory")


@pytest.mark.parametrize(("args", "needles"), [
    (["--sizes", "9" * 400], ["absurdly long"]),
    (["--sizes", "2T"], ["larger than 1 TiB"]),
    (["--min", "1K", "--max", "64M", "--factor", "1.0000001"], ["--factor", "at most 1000"]),
    (["--factor", "nan"], ["--factor"]),
    (["--sizes", "1K", "--timeout", "nan"], ["--timeout"]),
    (["--sizes", "1K", "--timeout", "inf"], ["--timeout"]),
    (["--sizes", "1K", "--timeout", "-1"], ["--timeout"]),
    (["--sizes", "1K", "--gap-ms", "nan"], ["--gap-ms"]),
    (["--sizes", "1K", "--backend", "raw", "--tcpinfo-interval", "inf"], ["--tcpinfo-interval"]),
    # raw knobs: checked in the CLI, not by each rank after torchrun started them
    (["--sizes", "1K", "--backend", "raw", "--streams", "0"], ["--streams", "between 1 and"]),
    (["--sizes", "1K", "--backend", "diag_tcp", "--streams", "65"], ["--streams", "between 1 and"]),
    (["--sizes", "1K", "--backend", "raw", "--chunks", "0"], ["--chunks", "between 1 and"]),
    (["--sizes", "1K", "--backend", "raw", "--chunks", "1025"], ["--chunks", "between 1 and"]),
    (["--sizes", "1K", "--backend", "raw", "--chunk-bytes", "1"], ["--chunk-bytes", "between"]),
    (["--sizes", "1K", "--backend", "raw", "--skew-us", "-1"], ["--skew-us", "between 0 and"]),
    (["--sizes", "1K", "--backend", "raw", "--sockbuf", "10"], ["--sockbuf", "between"]),
    (["--sizes", "1K", "--master-port", "70000"], ["--master-port", "between 1 and 65535"]),
    (["--sizes", "1K", "--master-port", "0"], ["--master-port", "between 1 and 65535"]),
])
def test_sweep_arguments_fail_before_any_rank(tmp_path: Path, args: list[str], needles: list[str]) -> None:
    out = write_records(tmp_path / "kept.jsonl", [make_record("gloo", "all_gather", 2, 1024, [0.001] * 3)])
    before = out.read_bytes()
    proc = run_diag("sweep", "--nproc", "2", *args, "--out", str(out), "--iters", "1", "--warmup", "0")
    assert_usage_error(proc, *needles)
    assert out.read_bytes() == before                         # nothing lost, nothing appended
    assert not (tmp_path / "kept.d" / "logs").exists()         # no launcher ever started


def test_sweep_out_is_a_directory(tmp_path: Path) -> None:
    proc = run_diag("sweep", "--nproc", "2", "--sizes", "1K", "--out", str(tmp_path), "--run-dir",
                    str(tmp_path / "rd"))
    assert_usage_error(proc, "--out", "is a directory")
    assert not (tmp_path / "rd" / "logs").exists()
    records = write_records(tmp_path / "r.jsonl", [make_record("gloo", "all_gather", 2, 1024, [0.001] * 3)])
    proc = run_diag("sweep", "--nproc", "2", "--sizes", "1K", "--out", str(records), "--run-dir", str(records))
    assert_usage_error(proc, "--run-dir", "not a directory")
    assert len(load_records(records).records) == 1
    assert_usage_error(run_diag("reproduce", "--out", str(records)), "--out", "not a directory")
    assert os.path.getsize(records) > 0


def test_capture_duration_must_be_finite(tmp_path: Path) -> None:
    for value in ("nan", "inf", "-2"):
        proc = run_diag("capture", "-i", "lo", "-w", str(tmp_path / "c.pcap"), "--duration", value)
        assert_usage_error(proc, "--duration")
        assert not (tmp_path / "c.pcap").exists()  # no capture was started

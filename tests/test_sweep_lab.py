"""`diag sweep --lab`: ranks in their own host namespaces, one launcher per host, as on a cluster."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from diag.lab import LabConfig, lab_session
from diag.records import load_records


@pytest.fixture
def lab3(need_root):
    with lab_session(LabConfig(name=f"sw{os.getpid() % 100000}", hosts=3, rate="100mbit")) as lab:
        yield lab


def _sweep(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "diag", "sweep", *args], capture_output=True, text=True,
                          timeout=300)


def test_lab_sweep_matches_local_format_and_is_slower_than_loopback(lab3, tmp_path):
    lab_out, local_out = tmp_path / "lab.jsonl", tmp_path / "local.jsonl"
    common = ["--backend", "gloo", "--op", "all_gather", "--nproc", "2,3", "--sizes", "1M", "--iters", "3",
              "--warmup", "1", "--quiet"]
    proc = _sweep("--lab", lab3.name, *common, "--out", str(lab_out), "--capture", "--observe", "--keep-pcaps")
    assert proc.returncode == 0, proc.stderr[-2000:]
    proc = _sweep(*common, "--out", str(local_out))
    assert proc.returncode == 0, proc.stderr[-2000:]

    lab_rows, local_rows = load_records(lab_out), load_records(local_out)
    assert lab_rows.complete and local_rows.complete
    assert [(r.world_size, r.size_bytes) for r in lab_rows.records] == [(2, 1 << 20), (3, 1 << 20)]
    for lab_row, local_row in zip(lab_rows.records, local_rows.records, strict=True):
        # the same record format, field for field
        assert set(lab_row.to_event()) == set(local_row.to_event())
        assert lab_row.nwrong == 0
        # each rank ran in its own host, on its own address
        assert [h.split("/")[-1] for h in lab_row.hosts] == [h.address for h in lab3.hosts[:lab_row.world_size]]
        # a 100 Mbit/s NIC (12.5 MB/s) is far slower than loopback, and busbw cannot beat the line rate
        assert lab_row.busbw_Bps < 12.5e6
        assert lab_row.time_s > local_row.time_s
    start = lab_rows.starts[0]
    assert start["meta"]["lab"] == lab3.name
    assert start["env"]["variables"]["GLOO_SOCKET_IFNAME"] == "eth0"
    # one launch of 3 ranks, N=2 on a subgroup of it; every node captured its own link and analysed it there
    assert [s["world_size"] for s in lab_rows.starts] == [2, 3]
    run_dir = tmp_path / "lab.d"
    for host in lab3.hosts:
        node = run_dir / "nodes" / host.name
        steps = ["n2", "n3"] if host.name != lab3.hosts[2].name else ["n3"]   # h2 is in N=3's subgroup only
        for n in steps:
            assert (node / "captures" / f"sweep--gloo-all_gather-{n}.pcap").stat().st_size > 0
            assert json.loads((node / "analysis" / f"sweep--gloo-all_gather-{n}.json").read_text())["connections"]
            assert (node / "observe" / f"sweep--gloo-all_gather-{n}.jsonl").stat().st_size > 0
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["command"] == "sweep" and meta["mode"] == "lab" and meta["records_out"] == str(lab_out.resolve())


def test_lab_sweep_needs_enough_hosts(lab3, tmp_path):
    proc = _sweep("--lab", lab3.name, "--nproc", "4", "--sizes", "1K", "--out", str(tmp_path / "x.jsonl"))
    assert proc.returncode != 0 and "fewer than N=4" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_lab_sweep_without_a_lab_says_how_to_make_one(need_root, tmp_path):
    proc = _sweep("--lab", "nolab123", "--nproc", "2", "--sizes", "1K", "--out", str(tmp_path / "x.jsonl"))
    assert proc.returncode != 0 and "diag lab up" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def _cfs_periods(cgroup: str) -> int:
    """CFS periods in which the cgroup's tasks ran under its quota (cpu.stat nr_periods, v1 and v2)."""
    with open(os.path.join(cgroup, "cpu.stat"), encoding="ascii") as stat:
        return int(dict(line.split() for line in stat if line.strip())["nr_periods"])


@pytest.mark.slow
def test_lab_sweep_ranks_on_a_cpu_starved_host_run_under_its_quota(need_root, tmp_path):
    """The launchers start through Lab.exec_prefix, so torchrun and the rank on h1 join h1's cgroup."""
    config = LabConfig(name=f"sq{os.getpid() % 100000}", hosts=2, rate="100mbit").with_faults(["h1:cpu=0.5"])
    with lab_session(config) as lab:
        cgroup = lab.hosts[1].cpu_cgroup
        assert cgroup is not None
        idle = _cfs_periods(cgroup)     # a few from setting the quota; nothing has run there yet
        out = tmp_path / "starved.jsonl"
        proc = _sweep("--lab", lab.name, "--backend", "gloo", "--op", "all_gather", "--nproc", "2", "--sizes",
                      "256K", "--iters", "2", "--warmup", "1", "--quiet", "--out", str(out))
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert load_records(out).records[0].nwrong == 0
        # 10 ms periods: torchrun and a rank starting and running for seconds fill hundreds of them
        assert _cfs_periods(cgroup) - idle >= 50, "the sweep's processes on h1 did not run in its cgroup"

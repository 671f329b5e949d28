"""The main job under a real Slurm: slurmctld and one slurmd per lab namespace, jobs submitted with sbatch.

Both sbatch scripts of docs/inplace.md run as they stand there (bench.slurm_lab reads them from the
docs): ``srun diag reproduce`` (diag takes its rank, node and rendezvous from Slurm's variables) and ``srun
torchrun ... -m diag reproduce`` (torchrun's variables win). One lab and one Slurm serve both; the plan is the
smallest that still runs every N, the link matrix and the report (the figures are not what is checked here:
tests/test_inplace.py and bench.slurm_lab hold the runs against each other).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from bench import slurm_lab
from diag.launchenv import expand_hostlist
from diag.records import load_records
from tests.lab_helpers import lab_netns, requires_root, unique_lab_name

pytestmark = [
    requires_root,
    pytest.mark.slow,
    pytest.mark.skipif(bool(slurm_lab.missing_tools()),
                       reason=f"needs Slurm and munge (missing {', '.join(slurm_lab.missing_tools())}): apt-get "
                              f"install {' '.join(slurm_lab.APT_PACKAGES)} (.ci/setup --test does)"),
]

PLAN = ["--quick", "--volumes", "512K", "--probe-seconds", "1", "--skip", "trials,knobs,advise,incast"]
TIMEOUT_S = 600


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    from diag.lab import LabConfig, bring_up, tear_down

    config = LabConfig(name=unique_lab_name("sl"), hosts=3, rate="100mbit")
    lab = bring_up(config)
    started: list[slurm_lab.SlurmCluster] = []
    try:
        with slurm_lab.slurm_cluster(lab) as slurm:
            started.append(slurm)
            work = tmp_path_factory.mktemp("slurm")
            work.chmod(0o755)
            yield slurm, work
    finally:
        tear_down(config.name)
    # everything this fixture started is gone: the daemons (by their PIDs), their files, the namespaces
    for slurm in started:
        assert all(d.proc.poll() is not None for d in slurm.daemons)
        assert not slurm.directory.exists() and not any(folder.exists() for folder in slurm.hosts_files)
    assert not lab_netns(config.name)


def _submit(slurm: slurm_lab.SlurmCluster, work: Path, script: str, nodes: int, args: list[str]) -> tuple[str, Path]:
    out = work / script.split(".")[0]
    log = work / f"{script}.log"
    code, seconds = slurm_lab.sbatch(slurm, slurm_lab.write_script(work, script), nodes, [*args, "--out", str(out)],
                                     log, TIMEOUT_S, env={"PATH": slurm_lab.diag_on_path(work)})
    output = log.read_text(errors="replace") if log.exists() else ""
    submitted = log.with_suffix(".sbatch").read_text(errors="replace")
    print(f"{script}: {seconds:.1f} s on {nodes} nodes")
    assert code == 0, f"{submitted}\n{output[-4000:]}"
    return output, out


def _check_run(run_dir: Path, output: str, lab, nodes: int) -> dict:
    """What tests/test_inplace.py checks of a run: its directory, nodes, link matrix, records and verdict."""
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["mode"] == "in-place" and not meta["failures"], meta["failures"]
    topology = meta["topology"]
    # Slurm's nodes are the lab's hosts: named by Slurm (their hostnames), at their lab addresses
    assert [(n["name"], n["address"]) for n in topology["nodes"]] == [
        (h.name, h.address) for h in lab.hosts[:nodes]]
    assert topology["iface"] == "eth0" and len({n["netns"] for n in topology["nodes"]}) == nodes
    matrix = meta["link"]["matrix"]
    assert matrix["nodes"] == [h.name for h in lab.hosts[:nodes]]
    assert len(matrix["edges"]) == nodes * (nodes - 1)
    assert all(e["alone_Bps"] > 0 and e["bidir_Bps"] > 0 for e in matrix["edges"])
    for host in lab.hosts[:nodes]:
        fingerprint = json.loads((run_dir / "nodes" / host.name / "fingerprint.json").read_text())
        assert fingerprint["node"]["name"] == host.name and fingerprint["capture"]["may_capture"]
        analysis = run_dir / "nodes" / host.name / "analysis" / f"gloo-all_gather--gloo-all_gather-n{nodes}.json"
        assert json.loads(analysis.read_text())["connections"]
    records = load_records(run_dir / "records" / "gloo-all_gather.jsonl").records
    assert sorted({r.world_size for r in records}) == list(range(2, nodes + 1))
    assert all(r.nwrong == 0 for p in (run_dir / "records").glob("*.jsonl") for r in load_records(p).records)
    findings = json.loads((run_dir / "report" / "findings.json").read_text())["findings"]
    assert {f["rule"] for f in findings} >= {"n2_busbw_dip", "mechanism"}
    assert (run_dir / "report" / "report.html").stat().st_size > 10_000
    assert "verdict:" in output and "findings (" in output
    return meta


def test_node_lists_expand_as_scontrol_does(cluster):
    slurm, _ = cluster
    for text in ("h[0-2]", "node[01-04,07],gpu1", "n[08-10]", "n[8-010]", "r[1-2]n[1-2],a-b[1,3]", "a,,b,a",
                 "rack[1-2]-n[01-02]"):
        shown = subprocess.run([*slurm.node_prefix(0), "scontrol", "show", "hostnames", text], capture_output=True,
                               text=True, env=slurm.env(), timeout=30, check=True).stdout.split()
        assert expand_hostlist(text) == shown, text


def test_srun_alone_runs_the_job_from_slurms_variables(cluster):
    """diag-srun.sbatch on three nodes: no torchrun, no --iface; rank, node, rendezvous and interface from
    Slurm."""
    slurm, work = cluster
    output, run_dir = _submit(slurm, work, "diag-srun.sbatch", 3, PLAN)
    meta = _check_run(run_dir, output, slurm.lab, 3)
    launch = meta["launch"]
    assert launch["launcher"] == "slurm" and (launch["rank"], launch["world_size"]) == (0, 3)
    assert launch["slurm"]["nodes"] == ["h0", "h1", "h2"] and launch["slurm"]["tasks_per_node"] == [1, 1, 1]
    assert launch["master_addr"] == slurm.lab.hosts[0].address
    assert launch["sources"]["master_addr"] == f"the step's first node h0, NodeAddr {slurm.lab.hosts[0].address} " \
                                              "from scontrol show node"
    job, step = launch["slurm"]["job_id"], launch["slurm"]["step_id"]
    assert launch["master_port"] == 20000 + int(job) % 1000 * 10 + int(step) % 10
    assert launch["sources"]["iface"] == "GLOO_SOCKET_IFNAME=eth0: the route to MASTER_ADDR"
    assert f"launch: Slurm job {job} step {step}: 3 tasks on 3 node(s) (h[0-2])" in output


def test_srun_torchrun_runs_the_job_from_torchruns_variables(cluster):
    """diag-torchrun.sbatch on two nodes: srun starts one torchrun per node (c10d rendezvous at the first)."""
    slurm, work = cluster
    output, run_dir = _submit(slurm, work, "diag-torchrun.sbatch", 2, PLAN)
    launch = _check_run(run_dir, output, slurm.lab, 2)["launch"]
    assert launch["launcher"] == "torchrun" and launch["sources"]["rank"] == "RANK"
    assert launch["slurm"]["nodes"] == ["h0", "h1"]   # the step torchrun runs in, recorded
    assert "torchrun started by srun" in output


def test_srun_alone_runs_an_in_place_sweep(cluster):
    """diag sweep in place takes its ranks from Slurm as diag reproduce does."""
    slurm, work = cluster
    out = work / "sweep.jsonl"
    code, seconds = slurm.submit(["srun", "--nodes", "2", "--ntasks-per-node", "1", "--kill-on-bad-exit=1", "diag",
                                  "sweep", "--op", "all_gather", "--sizes", "64K,256K", "--warmup", "1", "--iters",
                                  "3", "--out", str(out)], work / "sweep.log", TIMEOUT_S,
                                 env={"PATH": slurm_lab.diag_on_path(work)})
    print(f"srun diag sweep: {seconds:.1f} s on 2 nodes")
    assert code == 0, (work / "sweep.log").read_text(errors="replace")[-3000:]
    records = load_records(out)
    assert [(r.world_size, r.size_bytes, r.nwrong) for r in records.records] == [(2, 64 * 1024, 0), (2, 256 * 1024, 0)]
    # each rank on its node (Slurm's hostname), bound to the lab link diag chose for gloo
    assert records.starts[0]["hosts"] == [f"{h.name}/{h.address}" for h in slurm.lab.hosts[:2]]

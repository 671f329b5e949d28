"""The main job in place, started as an operator starts it: one torchrun per node, by hand.

The lab's namespaces stand in for the nodes; diag launches nothing itself. One node has no tcpdump on its
PATH, one runs without CAP_NET_RAW (its capabilities dropped with setpriv): both must say so and sample
TCP_INFO instead, without failing the run; two do not share the run directory and send their results to
rank 0. A node that dies mid-run fails the run in one line that names it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from pathlib import Path

import pytest

from bench.inplace_lab import start_nodes
from diag.records import load_records
from tests.lab_helpers import requires_root, unique_lab_name

pytestmark = [requires_root, pytest.mark.slow]
SPREAD = True   # its tests share no fixture: each goes to whichever worker is free (tests/conftest.py)

# The link probe's figures are not what these tests check: its shortest phases (the incast keeps its 2 s).
SMALL_PLAN = ["--quick", "--max-n", "3", "--volumes", "512K", "--iface", "eth0", "--probe-seconds", "1"]


def _path_without_tcpdump(directory: Path) -> str:
    """A PATH that holds every tool the job uses but tcpdump (they share /usr/bin on Debian)."""
    directory.mkdir()
    for tool in ("ss", "ip", "tc", "ethtool", "iperf3", "sysctl", "setpriv"):
        found = shutil.which(tool)
        if found:
            (directory / tool).symlink_to(found)
    return f"{directory}:{Path(os.sys.executable).parent}"


def processes_in_netns(netns: str) -> list[int]:
    inode = os.stat(f"/run/netns/{netns}").st_ino
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}/ns/net").st_ino == inode:
                    found.append(int(entry))
            except OSError:
                continue
    return found


@pytest.fixture
def lab3():
    from diag.lab import LabConfig, bring_up, tear_down

    config = LabConfig(name=unique_lab_name("ip"), hosts=3, rate="100mbit")
    lab = bring_up(config)
    try:
        yield lab
    finally:
        tear_down(config.name)


def _private_directory(directory: Path) -> list[str]:
    """A wrapper that gives a node its own empty tmpfs at ``directory`` (a private mount namespace), as on
    machines without a shared filesystem. Absolute paths: the node's own PATH may lack them."""
    unshare, sh, mount = (shutil.which(tool) or tool for tool in ("unshare", "sh", "mount"))
    return [unshare, "--mount", "--propagation", "private", "--", sh, "-c", f'{mount} -t tmpfs tmpfs "$0" && exec "$@"',
            str(directory)]


def test_in_place_by_hand_on_three_nodes(lab3, tmp_path):
    """h0 (rank 0) runs without CAP_NET_RAW; h1 and h2 do not share the run directory (each sees its own empty
    tmpfs there) and send their results to rank 0, h1 with its captures analysed where it took them, h2
    without tcpdump on its PATH."""
    shared = tmp_path / "shared"
    shared.mkdir()
    run_dir = shared / "run"
    no_net_raw = ["setpriv", "--bounding-set", "-net_raw", "--inh-caps", "-net_raw"]
    job = start_nodes(lab3, [*SMALL_PLAN, "--out", str(run_dir)], tmp_path / "logs",
                      master_port=29400 + os.getpid() % 500,
                      env={2: {"PATH": _path_without_tcpdump(tmp_path / "bin")}},
                      wrappers={0: no_net_raw, 1: _private_directory(shared), 2: _private_directory(shared)})
    codes = job.wait(600)
    assert codes == {"h0": 0, "h1": 0, "h2": 0}, {name: job.output(name)[-2000:] for name in codes}
    assert "not shared with every node" in job.output("h0")

    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["mode"] == "in-place" and not meta["failures"]
    nodes = meta["topology"]["nodes"]
    # three namespaces on one machine: one hostname, so the nodes are told apart by address and namespace
    assert [n["address"] for n in nodes] == [h.address for h in lab3.hosts]
    assert len({n["netns"] for n in nodes}) == 3 and len({n["name"] for n in nodes}) == 3
    assert meta["topology"]["subgroups"] == {"2": [0, 1], "3": [0, 1, 2]}
    names = [n["name"] for n in nodes]
    # the link probe: every ordered pair, then every node's incast (the two others sending into it at once), twice
    matrix = meta["link"]["matrix"]
    assert len(matrix["edges"]) == 6 and [phase["dst"] for phase in matrix["incast"]] == names * 2
    assert all(len(phase["flows"]) == 2 and all(f["goodput_Bps"] > 0 and isinstance(f["steady_retransmits"], int)
                                                for f in phase["flows"]) for phase in matrix["incast"])
    notes = " ".join(meta["notes"])
    assert f"{names[0]}: no root with CAP_NET_RAW" in notes and f"{names[2]}: tcpdump is not on PATH" in notes

    node_dirs = {name: run_dir / "nodes" / name for name in names}
    for name, directory in node_dirs.items():
        fingerprint = json.loads((directory / "fingerprint.json").read_text())
        assert fingerprint["node"]["name"] == name and fingerprint["sysctl"]["net.ipv4.tcp_rmem"]
    # h1 captured, analysed its captures where it took them and sent the analyses, not the pcaps
    shipped = node_dirs[names[1]]
    analysis = json.loads((shipped / "analysis" / "gloo-all_gather--gloo-all_gather-n2.json").read_text())
    assert analysis["connections"] and analysis["phases"]
    assert (shipped / "captures" / "gloo-all_gather--gloo-all_gather-n2.pcap.capture.json").exists()
    assert not list(shipped.rglob("*.pcap"))    # pcaps stay on their node without --keep-pcaps
    left = meta["left_on_nodes"][names[1]]      # and run.json says where, and why
    assert left["directory"] == str(run_dir / "nodes" / names[1])
    assert left["files"] and all(f["path"].endswith(".pcap") and "--keep-pcaps" in f["why"] for f in left["files"])
    assert list((shipped / "observe").glob("*.jsonl")) and list((shipped / "tcpinfo").glob("*.jsonl"))
    # the two others sampled TCP_INFO of their own ranks instead
    for name in (names[0], names[2]):
        assert not list((node_dirs[name] / "captures").glob("*.pcap"))
        samples = [json.loads(line) for path in (node_dirs[name] / "observe").glob("gloo-all_gather*.jsonl")
                   for line in path.read_text().splitlines()]
        assert any(s["kind"] == "tcp_info" and s["cwnd"] for s in samples), name
    # h2 is in the subgroup of 3 only
    assert {p.stem for p in (node_dirs[names[2]] / "observe").glob("*.jsonl")} == {
        "gloo-all_gather--gloo-all_gather-n3", "raw-ring-all_gather--raw-ring-all_gather-n3",
        "raw-ring-emulate-gloo-all_gather--raw-ring-emulate-gloo-all_gather-n3"}

    records = {p.stem: load_records(p) for p in (run_dir / "records").glob("*.jsonl")}
    assert sorted(r.world_size for r in records["gloo-all_gather"].records) == [2, 3]
    assert all(r.nwrong == 0 for f in records.values() for r in f.records)
    trial = [r for r in records["n2-trial"].records if r.block]
    assert {r.block["arm"] for r in trial} == {"gloo", "raw", "model", "model-own-conn", "shared-conn"}
    advice = json.loads((run_dir / "advise" / "advise.json").read_text())
    assert advice["complete"] and not advice["failures"]
    assert {w["name"] for w in advice["workarounds"] if w["rows"]} == {"p2p-recv-first", "diag_tcp"}
    assert {r.block["arm"] for r in records["advise"].records if r.block} == {"gloo", "p2p-recv-first", "diag_tcp"}
    assert (run_dir / "report" / "report.html").stat().st_size > 10_000
    assert "findings (" in job.output("h0")


@pytest.mark.waits
def test_a_node_that_dies_fails_the_run_in_one_line_naming_it(lab3, tmp_path):
    run_dir = tmp_path / "run"
    job = start_nodes(lab3, ["--quick", "--max-n", "3", "--volumes", "2M", "--iface", "eth0", "--skip", "incast",
                             "--probe-seconds", "1", "--out", str(run_dir)],
                      tmp_path / "logs", master_port=29900 + os.getpid() % 90)
    records = run_dir / "records" / "gloo-all_gather.jsonl"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not (records.exists() and load_records(records).records):
        time.sleep(0.2)
    assert records.exists(), job.output("h0")[-2000:]
    # the node dies: every process in its namespace (torchrun starts its ranks in sessions of their own)
    for pid in processes_in_netns(lab3.hosts[2].netns):
        os.kill(pid, signal.SIGKILL)
    codes = job.wait(300)
    assert codes["h0"] != 0
    output = job.output("h0")
    lines = [line for line in output.splitlines() if "diag reproduce: error:" in line]
    assert len(lines) == 1, output[-3000:]
    # named by its address; how it went depends on what saw it first (its connections closing, or the
    # monitored barrier's check): "died" or "stopped answering". h1, whose connections close once it has lost
    # h2, is not the one named (each rank says in the job's store which node it lost)
    assert lab3.hosts[2].address in lines[0] and ("died" in lines[0] or "stopped answering" in lines[0]), lines[0]
    assert lab3.hosts[1].address not in lines[0], lines[0]
    assert "diag/" not in output.split("Traceback", 1)[-1]   # torchrun's own report may follow; none of diag's frames
    # every step finished before the death is kept
    assert load_records(records).records
    meta = json.loads((run_dir / "run.json").read_text())
    assert any(lab3.hosts[2].address in f["error"] for f in meta["failures"])

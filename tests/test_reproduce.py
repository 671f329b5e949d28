"""The main job end to end on a real lab: a small plan, then the run directory must hold everything."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from diag.records import load_records
from diag.report.rundir import load_run


def _namespaces() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


@pytest.mark.slow
def test_reproduce_small_plan_writes_a_complete_run_dir(need_root, tmp_path):
    before = _namespaces()
    run_dir = tmp_path / "repro"
    with subprocess.Popen(
            [sys.executable, "-m", "diag", "reproduce", "--quick", "--max-n", "3", "--volumes", "512K",
             "--rate", "100mbit", "--probe-seconds", "1", "--out", str(run_dir),
             "--profile", "--profile-sizes", "1,64K", "--profile-row-seconds", "0.2"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as running:
        proc_pid = running.pid
        stdout, stderr = running.communicate(timeout=900)
    proc = subprocess.CompletedProcess(running.args, running.returncode, stdout, stderr)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "findings (" in proc.stdout
    # the terminal summary opens with the verdict card; every step line carries the plan-level bar and ETA
    assert "\nverdict:\n  slow:" in proc.stdout and proc.stdout.index("verdict:") < proc.stdout.index("findings (")
    steps = [line for line in proc.stderr.splitlines() if "] " in line and line.split("] ", 1)[0].split("[")[-1][:1].isdigit()]
    assert steps and all(" elapsed, eta " in line for line in steps if "failed" not in line)
    assert "[--------------------]   0%" in steps[0]
    # no namespace of ours is left behind (the lab is named after the diag process: other runs may be up)
    assert not {ns for ns in _namespaces() - before if ns.startswith(f"diag-repro{proc_pid % 100000}-")}

    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["lab"]["hosts"] == 3 and meta["link"]["single_stream_Bps"] > 0 and not meta["failures"]
    # the machine's own limit per N, iperf3 in the ring's flow pattern, one flow per edge
    if subprocess.run(["which", "iperf3"], capture_output=True).returncode == 0:
        pattern = meta["link"]["ring_pattern"]
        assert sorted(pattern) == ["2", "3"]
        assert [len(pattern[n]["flows"]) for n in ("2", "3")] == [2, 3]
        assert all(0 < f["goodput_Bps"] <= 100e6 / 8 for n in ("2", "3") for f in pattern[n]["flows"])
        assert "Link reference per N" in (run_dir / "report" / "report.md").read_text()
    records = {p.stem: load_records(p) for p in (run_dir / "records").glob("*.jsonl")}
    assert {"gloo-all_gather", "raw-ring-all_gather", "raw-ring-emulate-gloo-all_gather"} <= set(records)
    gloo = records["gloo-all_gather"].records
    assert sorted(r.world_size for r in gloo) == [2, 3]
    # equal per-device volume D at every N (the user's x axis), data verified
    assert {r.volume_bytes for r in gloo} == {512 * 1024}
    assert all(r.nwrong == 0 for recs in records.values() for r in recs.records)
    # the N=2 experiments ran as interleaved trials: every arm once a round, in the recorded order, and each
    # trial's end event says why it stopped; raw TCP's exchange runs in both orders beside gloo's
    for name, arms in (("n2-trial", {"gloo", "raw", "model", "model-own-conn", "shared-conn"}),
                       ("n2-exchange-trial", {"gloo-recv-first", "gloo-send-first", "raw-recv-first",
                                              "raw-send-first"})):
        blocks = [r for r in records[name].records if r.block]
        assert {r.block["arm"] for r in blocks} == arms
        for k in {r.block["round"] for r in blocks}:
            in_round = sorted((r for r in blocks if r.block["round"] == k), key=lambda r: r.t_start_ns)
            assert [r.block["arm"] for r in in_round] == in_round[0].block["order"]
        (end,) = records[name].ends
        assert all(v["stopped"] in ("decided", "budget", "max_rounds") for v in end["trial"]["sizes"].values())
    orders = {(r.backend, r.knobs.get("order")) for r in records["n2-exchange-trial"].records if r.op == "exchange"}
    assert orders == {(b, o) for b in ("gloo", "raw") for o in ("recv-first", "send-first")}

    # the model's profile ran in the same launch: every op at every N at its sizes (1 B too), adaptive rows, not
    # captured; the report's model.json is fitted on it and the survey together, the survey rows alone feed the rules
    profile = {name: f for name, f in records.items() if name.startswith("profile-")}
    assert set(profile) == {"profile-gloo-all_gather", "profile-gloo-send_recv", "profile-gloo-all_reduce",
                            "profile-raw-ring-all_gather", "profile-raw-ring-send_recv"}
    for name, f in profile.items():
        assert all((s.get("meta") or {}).get("profile") for s in f.starts), name
        sizes = {(r.world_size, r.size_bytes) for r in f.records}
        asked = (64 * 1024,) if name.endswith("all_reduce") else (1, 64 * 1024)   # all_reduce sums float32
        assert sizes == {(n, s) for n in (2, 3) for s in asked}, name
        assert all(len(r.times_s) >= 2 for r in f.records)
    tiny = [r for r in profile["profile-gloo-all_gather"].records if r.size_bytes == 1]
    assert tiny and all(len(r.times_s) > 2 for r in tiny)        # small sizes sample past the minimum
    assert not [p for p in (run_dir / "nodes").rglob("profile-*.pcap")]
    model = json.loads((run_dir / "report" / "model.json").read_text())
    assert {(m["series"], m["op"]) for m in model["series"]} >= {("torch:gloo", "send_recv"), ("torch:gloo", "all_reduce")}
    rules = json.loads((run_dir / "report" / "findings.json").read_text())
    rules = rules.get("findings", []) if isinstance(rules, dict) else rules
    assert all((e.get("values") or {}).get("size_bytes") not in (1, 64 * 1024)      # the survey's rows only
               for f in rules for e in f.get("evidence", []))
    assert "| 1 B |" not in (run_dir / "report" / "report.md").read_text()
    # every step at one N shares the launch's run id: the profile is told by its records file's start events
    run = load_run([run_dir])
    assert {(r.series, r.world_size) for r in run.records if r.op == "all_gather"} >= {("torch:gloo", 2),
                                                                                       ("torch:gloo", 3)}
    assert {r.size_bytes for r in run.profile_records} == {1, 64 * 1024}
    assert not {r.size_bytes for r in run.records} & {1, 64 * 1024}
    # the advise trial stays last, after the profile
    assert [s["name"] for s in meta["plan"]["steps"]][-1] == "advise"

    # the advise step ran on the same lab: each workaround beside plain gloo in one interleaved trial (gloo's
    # and diag_tcp's process groups of the same ranks), data checked, each decided by the trial's bootstrap
    advice = json.loads((run_dir / "advise" / "advise.json").read_text())
    assert advice["complete"] and not advice["failures"] and advice["lab"] == meta["lab"]["name"]
    assert all(row["nwrong"] == 0 and row["decision"]["interleaved"] and row["verdict"] in
               ("faster", "slower", "same", "undecided")
               for workaround in advice["workarounds"] for row in workaround["rows"])
    assert {w["name"] for w in advice["workarounds"] if w["rows"]} == {"p2p-recv-first", "diag_tcp"}
    arms = {r.block["arm"]: r.backend for r in records["advise"].records if r.block}
    assert arms == {"gloo": "gloo", "p2p-recv-first": "gloo", "diag_tcp": "diag_tcp"}

    # every node captured its own NIC for the steps it took part in and analysed its captures there
    assert meta["mode"] == "lab" and [n["name"] for n in meta["topology"]["nodes"]] == ["h0", "h1", "h2"]
    for node in ("h0", "h1", "h2"):
        # each capture analysed, its pcap deleted (no --keep-pcaps), its metadata kept
        captures = sorted((run_dir / "nodes" / node / "captures").glob("*.pcap.capture.json"))
        analyses = sorted((run_dir / "nodes" / node / "analysis").glob("*.json"))
        assert captures and len(analyses) == len(captures), node
        assert not list((run_dir / "nodes" / node / "captures").glob("*.pcap")), node
        assert list((run_dir / "nodes" / node / "observe").glob("*.jsonl"))
    def pcaps(node: str) -> int:
        return len(list((run_dir / "nodes" / node / "captures").glob("*.pcap.capture.json")))

    assert pcaps("h2") < pcaps("h0")   # h2 is in the subgroup of N=3 only
    analysis = json.loads(analyses[0].read_text())
    assert analysis["connections"] and analysis["phases"]

    report = run_dir / "report"
    assert (report / "report.html").stat().st_size > 10_000
    assert (report / "report.md").exists() and list(report.glob("*.png"))
    findings = json.loads((report / "findings.json").read_text())
    assert findings, "the diagnosis wrote no findings"
    if isinstance(findings, dict):
        findings = findings.get("findings", [])
    for finding in findings:
        if finding["status"] == "fired":
            assert finding["evidence"], finding


@pytest.mark.parametrize("args", [["--max-n", "1"], ["--rate", "fast"], ["--volumes", "12Q"]])
def test_reproduce_bad_arguments(args, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "diag", "reproduce", *args, "--out", str(tmp_path / "r")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr

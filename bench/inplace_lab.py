"""The main job in place, started as an operator starts it: one torchrun per node, by hand.

The lab's namespaces stand in for the nodes; diag itself launches nothing: every node gets
``ip netns exec NODE python -m torch.distributed.run --nnodes K --node-rank i --rdzv-backend static
--master-addr <h0> ... -m diag reproduce ...`` from here, exactly the command a user types on each machine.
tests/test_inplace.py starts its jobs through ``start_nodes``; the command below also holds the in-place run
against ``diag reproduce`` on an equal lab (diag's own launch), in one run:

    python -m bench.inplace_lab [--hosts 4] [--rate 200mbit] [--out DIR] [--skip-lab]

It prints both wall times and their ratio, the verdicts of both runs side by side (dip, mechanism,
workarounds) and every edge of the in-place link matrix against the lab's goodput.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from diag.lifeline import CHILD_CWD, child_env, python_command


@dataclass
class NodeProcess:
    name: str
    proc: subprocess.Popen[str]
    log: Path


@dataclass
class OperatorRun:
    nodes: list[NodeProcess]
    started: float = field(default_factory=time.monotonic)

    def wait(self, timeout_s: float) -> dict[str, int]:
        """Each node's exit status; a node still running at the deadline is killed (status -9)."""
        deadline = self.started + timeout_s
        codes = {}
        for node in self.nodes:
            try:
                codes[node.name] = node.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                node.proc.kill()
                codes[node.name] = node.proc.wait()
        return codes

    def kill(self) -> None:
        for node in self.nodes:
            if node.proc.poll() is None:
                os.killpg(node.proc.pid, 9)
                node.proc.wait()

    def output(self, name: str) -> str:
        node = next(n for n in self.nodes if n.name == name)
        return node.log.read_text(errors="replace")


def node_command(lab: Any, index: int, reproduce_args: Sequence[str], master_port: int,
                 wrapper: Sequence[str] = ()) -> list[str]:
    """What an operator runs on node ``index`` (inside its namespace here)."""
    host = lab.hosts[index]
    return [*lab.exec_prefix(host), *wrapper,
            *python_command("-m", "torch.distributed.run", f"--nnodes={len(lab.hosts)}", f"--node-rank={index}",
                            "--nproc-per-node=1", "--rdzv-backend=static", f"--master-addr={lab.hosts[0].address}",
                            f"--master-port={master_port}", "--max-restarts=0",
                            "-m", "diag", "reproduce", *reproduce_args)]


def start_nodes(lab: Any, reproduce_args: Sequence[str], log_dir: Path, master_port: int = 29400,
                env: Mapping[int, Mapping[str, str]] | None = None,
                wrappers: Mapping[int, Sequence[str]] | None = None) -> OperatorRun:
    """One torchrun per lab host, each in its own namespace and process group; ``env``/``wrappers`` per host
    index change one node (a PATH without tcpdump, capabilities dropped with setpriv)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    nodes = []
    for index, host in enumerate(lab.hosts):
        log = log_dir / f"{host.name}.log"
        node_env = child_env({**os.environ, "OMP_NUM_THREADS": "1", **((env or {}).get(index) or {})})
        with log.open("w") as out:
            proc = subprocess.Popen(node_command(lab, index, reproduce_args, master_port,
                                                 (wrappers or {}).get(index, ())),
                                    stdout=out, stderr=subprocess.STDOUT, text=True, env=node_env, cwd=CHILD_CWD,
                                    start_new_session=True)
        nodes.append(NodeProcess(host.name, proc, log))
    return OperatorRun(nodes)


# --- the A/B command ------------------------------------------------------------------------------------

def verdicts(run_dir: Path) -> dict[str, Any]:
    """What a run concluded: the dip's status/strength, the mechanism's statement, the workarounds' speed-ups."""
    findings = json.loads((run_dir / "report" / "findings.json").read_text())["findings"]
    by_rule = {f["rule"]: f for f in findings}

    def state(rule: str) -> str:
        finding = by_rule.get(rule)
        return f"{finding['status']}/{finding.get('strength') or '-'}" if finding else "absent"

    advise_file = run_dir / "advise" / "advise.json"   # absent where the plan skipped advise
    advise = json.loads(advise_file.read_text()) if advise_file.exists() else {"workarounds": []}
    speedups = {w["name"]: max((r.get("speedup") or 0.0 for r in w["rows"]), default=None)
                for w in advise["workarounds"]}
    mechanism = by_rule.get("mechanism", {})
    return {"dip": state("n2_busbw_dip"), "mechanism": state("mechanism"),
            "mechanism_names": sorted(f["rule"] for f in findings
                                      if f["rule"].startswith("suspect_") and f["status"] == "fired"),
            "mechanism_text": (mechanism.get("summary") or "")[:120], "speedups": speedups}


def main(argv: Sequence[str] | None = None) -> int:
    from diag.lab import LabConfig, lab_session

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hosts", type=int, default=4)
    parser.add_argument("--rate", default="200mbit")
    parser.add_argument("--out", type=Path, default=Path(f"/tmp/inplace-ab-{os.getpid()}"))
    parser.add_argument("--skip-lab", action="store_true", help="only the in-place run")
    parser.add_argument("--timeout", type=float, default=1800.0)
    args = parser.parse_args(argv)
    quick = ["--quick", "--max-n", str(args.hosts)]
    rows: dict[str, Any] = {}
    if not args.skip_lab:
        lab_dir = args.out / "lab"
        started = time.monotonic()
        done = subprocess.run([*python_command("-m", "diag"), "reproduce", *quick, "--rate", args.rate,
                               "--out", str(lab_dir)], env=child_env(), cwd=CHILD_CWD, capture_output=True,
                              text=True, timeout=args.timeout)
        rows["lab"] = {"seconds": time.monotonic() - started, "rc": done.returncode, **verdicts(lab_dir)}
    place_dir = args.out / "inplace"
    with lab_session(LabConfig(name=f"ip{os.getpid() % 100000}", hosts=args.hosts, rate=args.rate)) as lab:
        run = start_nodes(lab, [*quick, "--iface", lab.hosts[0].iface, "--out", str(place_dir)], args.out / "logs")
        codes = run.wait(args.timeout)
        seconds = time.monotonic() - run.started
    rows["in place"] = {"seconds": seconds, "rc": max(codes.values(), key=abs), **verdicts(place_dir)}
    for name, row in rows.items():
        print(f"{name:9s} {row['seconds'] / 60:5.1f} min rc={row['rc']} dip={row['dip']} mechanism={row['mechanism']} "
              f"{','.join(row['mechanism_names'])} workarounds="
              + ", ".join(f"{k} {v:.2f}x" for k, v in row["speedups"].items() if v))
    if "lab" in rows:
        print(f"in place / lab wall time: {rows['in place']['seconds'] / rows['lab']['seconds']:.2f}")
    meta = json.loads((place_dir / "run.json").read_text())
    expected = LabConfig(rate=args.rate).expected_goodput_Bps
    for edge in (meta.get("link") or {}).get("matrix", {}).get("edges", []):
        print(f"  {edge['src']} -> {edge['dst']}: alone {edge['alone_Bps'] / expected:.3f}, "
              f"both ways {edge['bidir_Bps'] / expected:.3f} of the lab's goodput")
    return 0 if all(row["rc"] == 0 for row in rows.values()) else 1


if __name__ == "__main__":
    sys.exit(main())

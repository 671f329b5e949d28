"""Every lab fault scenario through the real main job: what each should be named, and what diag named.

    python -m bench.fault_scenarios [--scenarios none,slow-nic,...] [--backend diag_tcp] [--hosts 4]
                                         [--rate 200mbit] [--out DIR] [--seed-anomaly]

For each scenario, ``diag reproduce --quick --lab-scenario NAME`` runs on a fresh lab (its faults on h1), and
the findings are read back: which host rules fired and which hosts they named, whether the N=2 mechanism
verdict fired, and the negative control's status. What each scenario should be called is the scenario's own
``expect`` (diag/lab/scenarios/NAME.json: the rules whose findings must name each faulty host); ``none``, no
fault at all, is the negative control: nothing named, N=2 not slower. With ``--backend diag_tcp`` (the default) the backend
under test takes no turns on a connection, so a fault is the only slowdown in the run: the seed anomaly's
mechanism must not fire, and ``none`` is the negative control (nothing slow, no host named). One line per
scenario, then whether every scenario was named right. ``--seed-anomaly`` also runs the gloo backend beside
one fault, where both the fault and gloo's N=2 mechanism are expected.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from diag.lab.faults import builtin_scenarios, load_scenario
from diag.lifeline import CHILD_CWD, child_env, python_command

NONE = "none"   # no fault: the negative control
HOST_RULES = ("slow_host_link", "loss_at_host", "window_at_host", "cpu_bound", "node_fingerprints")


def expected(scenario: str) -> dict[str, set[str]]:
    """rule -> the hosts its findings must name, from the scenario file's ``expect`` (none: nothing)."""
    return {} if scenario == NONE else load_scenario(scenario).expected_rules()


def scenarios() -> list[str]:
    return [NONE, *builtin_scenarios()]


@dataclass
class Outcome:
    scenario: str
    backend: str
    seconds: float
    rc: int
    named: dict[str, set[str]]       # host rule -> hosts its fired findings (node_fingerprints: observed) name
    mechanism: str                   # status of the mechanism verdict
    control: str                     # negative control's status
    dip: str

    def right(self, wanted: dict[str, set[str]] | None = None) -> bool:
        """Every expected rule names its faulty hosts and only them; other host rules may corroborate (name
        them too: a slow NIC's link also overflows its switch port, and its shaper shows in its fingerprint)
        but never name another host; without gloo no mechanism fires, and with no fault (the negative control)
        N=2 is not slower. Under a fault the control may dip: a fault that slows N=2 slows every transport,
        and the control is what keeps the mechanism from being named then. ``wanted``: rule -> hosts where the
        run's faults are not one scenario's (default: the scenario's own ``expect``)."""
        wanted = expected(self.scenario) if wanted is None else wanted
        faulty = set().union(*wanted.values()) if wanted else set()
        hosts_ok = all(self.named.get(rule) == hosts for rule, hosts in wanted.items())
        # a finding that names no host (a machine the lab's nodes share, busy) blames no host wrongly
        stray = [rule for rule, hosts in self.named.items() if rule not in wanted and hosts - faulty]
        control_ok = self.scenario != NONE or (self.control != "fired" and self.dip != "fired")
        mechanism_ok = self.backend == "gloo" or self.mechanism != "fired"   # gloo's own N=2 mechanism may fire
        return hosts_ok and not stray and control_ok and mechanism_ok


def named_hosts(finding: dict[str, Any]) -> set[str]:
    """The hosts a finding blames: its evidence's node (nodes, host); a slow edge's two ends (src, dst) only
    where the evidence names no node (a loss "into h1 from h0" blames h1, not its peer)."""
    hosts = set()
    for evidence in finding.get("evidence") or ():
        values = evidence.get("values") or {}
        blamed = {values[key] for key in ("node", "host") if isinstance(values.get(key), str)}
        if isinstance(values.get("nodes"), list):
            blamed.update(str(v) for v in values["nodes"])
        if not blamed:
            blamed = {values[key] for key in ("src", "dst") if isinstance(values.get(key), str)}
        hosts |= blamed
    return hosts


def read_outcome(scenario: str, backend: str, run_dir: Path, seconds: float, rc: int) -> Outcome:
    findings = json.loads((run_dir / "report" / "findings.json").read_text())["findings"]
    named: dict[str, set[str]] = {}
    status: dict[str, str] = {}
    for finding in findings:
        if finding["rule"] == "n2_busbw_dip" and not finding["statement"].startswith(f"torch:{backend} "):
            continue   # the dip that counts is the backend's under test (a raw model of gloo dips by design)
        status.setdefault(finding["rule"], finding["status"])
        # how the nodes differ is an observation (docs/report.md, "Findings and observations"), naming its nodes
        if finding["rule"] in HOST_RULES and (finding["status"] == "fired" or (
                finding["status"] == "observed" and finding["rule"] == "node_fingerprints")):
            named.setdefault(finding["rule"], set()).update(named_hosts(finding))
    return Outcome(scenario, backend, seconds, rc, named, status.get("mechanism", "absent"),
                   status.get("negative_control", "absent"), status.get("n2_busbw_dip", "absent"))


def run_scenario(scenario: str, backend: str, out: Path, hosts: int, rate: str, timeout: float) -> Outcome:
    run_dir = out / f"{scenario}-{backend}"
    argv = [*python_command("-m", "diag"), "reproduce", "--quick", "--max-n", str(hosts), "--rate", rate,
            "--backend", backend, "--out", str(run_dir)]
    if scenario != NONE:
        argv += ["--lab-scenario", scenario]
    started = time.monotonic()
    with (out / f"{scenario}-{backend}.log").open("w") as log:
        done = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, env=child_env(), cwd=CHILD_CWD,
                              timeout=timeout, check=False)
    return read_outcome(scenario, backend, run_dir, time.monotonic() - started, done.returncode)


def line(outcome: Outcome) -> str:
    wanted = ", ".join(f"{rule} {'/'.join(sorted(hosts))}" for rule, hosts in expected(outcome.scenario).items())
    expected_text = wanted or "nothing"
    named = ", ".join(f"{rule} {'/'.join(sorted(hosts)) or '?'}" for rule, hosts in sorted(outcome.named.items()))
    return (f"{outcome.scenario:15s} {outcome.backend:8s} {outcome.seconds / 60:4.1f} min  expected: {expected_text:45s} "
            f"named: {named or 'nothing':45s} mechanism {outcome.mechanism:9s} control {outcome.control:9s} "
            f"dip {outcome.dip:9s} {'RIGHT' if outcome.right() else 'WRONG'}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenarios", default=",".join(scenarios()))
    parser.add_argument("--backend", default="diag_tcp", choices=["diag_tcp", "gloo"])
    parser.add_argument("--hosts", type=int, default=4)
    parser.add_argument("--rate", default="200mbit")
    parser.add_argument("--out", type=Path, default=Path(f"/tmp/fault-scenarios-{int(time.time())}"))
    parser.add_argument("--seed-anomaly", action="store_true", help="also run gloo beside the slow-nic fault")
    parser.add_argument("--timeout", type=float, default=1800.0)
    args = parser.parse_args(argv)
    chosen = [s for s in args.scenarios.split(",") if s]
    unknown = [s for s in chosen if s not in scenarios()]
    if unknown:
        parser.error(f"unknown scenario(s) {', '.join(unknown)}: choose from {', '.join(scenarios())}")
    args.out.mkdir(parents=True, exist_ok=True)
    runs = [(s, args.backend) for s in chosen] + ([("slow-nic", "gloo")] if args.seed_anomaly else [])
    outcomes = []
    for scenario, backend in runs:
        outcome = run_scenario(scenario, backend, args.out, args.hosts, args.rate, args.timeout)
        outcomes.append(outcome)
        print(line(outcome), flush=True)
    right = sum(o.right() for o in outcomes)
    print(f"{right} of {len(outcomes)} scenarios named right (runs in {args.out})")
    return 0 if right == len(outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())

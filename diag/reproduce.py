"""The main job: reproduce (or rule out) the WORLD_SIZE=2 all_gather anomaly, with evidence.

One job (diag.inplace) runs the whole plan (diag.plan) in one launch of K ranks. Where it runs:

- **in place**: under torchrun / srun / any env:// launcher (RANK set), this process is one rank of the job,
  on the user's own hosts;
- **the lab** (root, iproute2): a cluster in a box, K namespace hosts with shaped full-duplex links, and one
  ``torch.distributed.run`` per host started inside its namespace, exactly as an operator starts one per
  node; the lab is always torn down;
- **loopback** (no root): K ranks on this machine, unshaped (the CPU, not a NIC, is the bottleneck there).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import sys
import time
from pathlib import Path

from diag import safefs
from diag.errors import DiagError
from diag.inplace.job import JobOptions, make_say
from diag.plan import resolve_plan
from diag.units import human_bits, parse_rate_bps


def run_reproduce(quick: bool, out: Path | None, rate: str | None, max_n: int | None, keep_going: bool,
                  volumes: list[int] | None = None, iface: str | None = None, keep_pcaps: bool = False,
                  lab_faults: tuple[str, ...] = (), lab_scenario: str | None = None, backend: str = "gloo",
                  skip: tuple[str, ...] = (), probe_seconds: int = 2, profile: str | None = None,
                  profile_sizes: tuple[int, ...] | None = None, profile_row_s: float | None = None) -> int:
    """In place under a launcher; else the lab (root) or loopback, launched here. ``lab_faults`` and
    ``lab_scenario``: per-host faults of the lab (docs/lab.md, "Per-host faults")."""
    options = JobOptions(quick=quick, out=str(out) if out else "", max_n=max_n,
                         volumes=tuple(volumes) if volumes else None, iface=iface, keep_pcaps=keep_pcaps,
                         keep_going=keep_going, backend=backend, skip=tuple(skip), probe_seconds=probe_seconds,
                         argv=tuple(sys.argv[1:]), profile=profile or "", profile_sizes=profile_sizes,
                         profile_row_s=profile_row_s)
    if os.environ.get("RANK") is not None:
        if lab_faults or lab_scenario:
            raise DiagError("--lab-fault and --lab-scenario shape diag's own lab; in place the hosts are yours")
        from diag.inplace.job import run_in_place

        return run_in_place(options)
    plan = resolve_plan(quick, max_n, volumes, backend, tuple(skip), profile, profile_sizes, profile_row_s)
    rate = rate or plan.rate
    parse_rate_bps(rate)
    from diag.lab import LabConfig

    # Checked before anything is built: a bad fault is one line, not a half-made lab.
    config = LabConfig(name=f"repro{os.getpid() % 100000}", hosts=max(plan.world_sizes), rate=rate).with_faults(
        lab_faults, lab_scenario, flag="--lab-fault", scenario_flag="--lab-scenario")
    run_dir = out or Path("runs") / f"reproduce-{time.strftime('%Y%m%d-%H%M%S')}"
    if (run_dir / "records").exists() and any((run_dir / "records").iterdir()):
        raise DiagError(f"{run_dir} already holds records: choose a new --out directory")
    safefs.private_dir(run_dir, "--out")
    options = JobOptions(**{**options.__dict__, "out": str(run_dir.resolve())})
    hosts = max(plan.world_sizes)
    say = make_say(time.monotonic(), 0)
    if os.geteuid() == 0 and shutil.which("ip") and shutil.which("tc"):
        from diag.lab import lab_session

        with lab_session(config) as lab:
            faults = "; ".join(f"{f.host}: {f.describe()}" for f in config.faults)
            say(f"[lab] {len(lab.hosts)} hosts, {human_bits(lab.rate_bps)} full duplex each"
                + (f" (faults: {faults})" if faults else "") + "; one torchrun per host, in its namespace")
            launches = [_host(h.name, 1, h.address, h.netns, h.iface, tuple(lab.exec_prefix(h))) for h in lab.hosts]
            code = _launch(JobOptions(**{**options.__dict__, "mode": "lab", "lab": lab_meta(lab),
                                         "iface": lab.hosts[0].iface}), launches, run_dir)
        say("[lab] torn down")
        return code
    if config.faults:
        raise DiagError("--lab-fault and --lab-scenario need the lab: run as root (CAP_NET_ADMIN) with iproute2")
    say("diag reproduce: no root (CAP_NET_ADMIN) or no iproute2: the job runs on unshaped loopback. There the "
        "CPU, not a NIC, is the bottleneck and the N=2 anomaly may not show; run as root for the lab.")
    return _launch(JobOptions(**{**options.__dict__, "mode": "loopback", "iface": "lo"}),
                   [_host("local", hosts, "127.0.0.1", None, "lo")], run_dir)


def lab_meta(lab: object) -> dict:
    """run.json's ``lab``: the lab's own description (docs/lab.md), with ``hosts`` the count the report reads
    and every host's details (address, namespace, faults) under ``host_list``."""
    meta = lab.to_json()
    meta["host_list"] = meta.pop("hosts")
    meta["hosts"] = len(meta["host_list"])
    meta["addresses"] = [host["address"] for host in meta["host_list"]]
    return meta


def _host(name: str, nproc: int, address: str, netns: str | None, iface: str,
          exec_prefix: tuple[str, ...] = ()) -> object:
    """``exec_prefix``: how the lab starts a command on the host (its namespace, and its CPU cgroup where a
    cpu fault starves it)."""
    from diag.launch import HostLaunch

    # OMP_NUM_THREADS: torchrun sets it to 1 anyway for several ranks a host, and says so at length;
    # TORCH_CPP_LOG_LEVEL: c10d warns on every connection that the lab's addresses have no host names.
    return HostLaunch(name, nproc, address, netns=netns, iface=iface, exec_prefix=exec_prefix,
                      env={"GLOO_SOCKET_IFNAME": iface, "DIAG_NODE_NAME": name, "OMP_NUM_THREADS": "1",
                           "TORCH_CPP_LOG_LEVEL": os.environ.get("TORCH_CPP_LOG_LEVEL", "ERROR")})


def _launch(options: JobOptions, hosts: list, run_dir: Path) -> int:
    """Start the job (one launcher per host) and wait for it; rank 0 prints the summary. A run whose report
    was written but some of whose steps failed exits 1 with the count; any other failure is one line."""
    from diag.launch import run_world
    from diag.transports.raw.wire import TOKEN_BYTES

    job = JobOptions(**{**options.__dict__, "token": secrets.token_hex(TOKEN_BYTES)})
    run_world(job, hosts, run_dir / "logs", tag="reproduce", run_dir=run_dir, console=True)
    # rank 0 finished the report and printed how many steps failed; the exit status says it too
    return 1 if _run_json(run_dir).get("failures") else 0


def _run_json(run_dir: Path) -> dict:
    try:
        return json.loads((run_dir / "run.json").read_text())
    except (OSError, ValueError):
        return {}


__all__ = ["run_reproduce"]

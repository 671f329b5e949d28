"""The main job: reproduce (or rule out) the WORLD_SIZE=2 all_gather anomaly, with evidence.

The full plan (diag.plan: --quick or the default) runs on the one job (diag.inplace) in one launch of K ranks
(diag.runplan). Where it runs:

- **in place**: under torchrun, srun (with or without torchrun) or any env:// launcher (diag.launchenv),
  this process is one rank of the job, on the user's own hosts;
- **the lab** (root, iproute2): a cluster in a box, K namespace hosts with shaped full-duplex links, and one
  ``torch.distributed.run`` per host started inside its namespace, exactly as an operator starts one per
  node; the lab is always torn down;
- **loopback** (no root): K ranks on this machine, unshaped (the CPU, not a NIC, is the bottleneck there).
"""

from __future__ import annotations

import os
import shutil
import sys
import time
import uuid
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
    ``lab_scenario``: per-host faults of the lab (docs/lab.md, "Per-host faults"). ``profile``: "add" or
    "only", the model's profile steps (diag.plan.with_profile)."""
    from diag.runplan import in_place, run_plan

    if in_place(iface):
        if lab_faults or lab_scenario:
            raise DiagError("--lab-fault and --lab-scenario shape diag's own lab; in place the hosts are yours")
        # in place, every N up to the job's ranks (or --max-n)
        world_size = int(os.environ.get("WORLD_SIZE", "0") or 0)
        if world_size < 2:
            raise DiagError("diag reproduce in place needs at least 2 ranks (torchrun --nnodes K or --nproc-per-node K)")
        max_n = min(max_n or world_size, world_size)
    plan = resolve_plan(quick, max_n, volumes, backend, tuple(skip), profile, profile_sizes, profile_row_s)
    options = JobOptions(plan=plan.to_json(), command="reproduce", out=str(out) if out else "",
                         run_id=uuid.uuid4().hex[:12], iface=iface, keep_pcaps=keep_pcaps, keep_going=keep_going,
                         probe_seconds=probe_seconds, argv=tuple(sys.argv[1:]))
    if in_place():
        return run_plan(options)
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
    say = make_say(time.monotonic(), 0)
    if os.geteuid() == 0 and shutil.which("ip") and shutil.which("tc"):
        from diag.lab import lab_session

        with lab_session(config) as lab:
            faults = "; ".join(f"{f.host}: {f.describe()}" for f in config.faults)
            say(f"[lab] {len(lab.hosts)} hosts, {human_bits(lab.rate_bps)} full duplex each"
                + (f" (faults: {faults})" if faults else "") + "; one torchrun per host, in its namespace")
            code = run_plan(options, lab=lab)
        say("[lab] torn down")
        return code
    if config.faults:
        raise DiagError("--lab-fault and --lab-scenario need the lab: run as root (CAP_NET_ADMIN) with iproute2")
    say("diag reproduce: no root (CAP_NET_ADMIN) or no iproute2: the job runs on unshaped loopback. There the "
        "CPU, not a NIC, is the bottleneck and the N=2 anomaly may not show; run as root for the lab.")
    return run_plan(JobOptions(**{**options.__dict__, "iface": "lo"}))


__all__ = ["run_reproduce"]

"""Run a sweep spec over several world sizes, locally or on the lab, with optional capture/observers.

Used by ``diag sweep`` and ``diag reproduce``; each world size is one launch (launch.run_world).
"""

from __future__ import annotations

import secrets
import sys
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

from diag import safefs
from diag.collectives import PAIRWISE_OPS
from diag.errors import DiagError
from diag.spec import SweepSpec
from diag.worker import Job


def transport_tag(spec: SweepSpec) -> str:
    label = spec.backend if spec.backend != "raw" else f"raw-{spec.algo}"
    if spec.knobs.get("emulate"):
        label += f"-emulate-{spec.knobs['emulate']}"
    return label


def make_job(spec: SweepSpec, out: Path, argv: list[str] | None = None, quiet: bool = False) -> Job:
    return Job(spec=spec, out=str(out.resolve()), run_id=uuid.uuid4().hex[:12], argv=argv or sys.argv[1:],
               quiet=quiet)


def run_worlds(spec: SweepSpec, job: Job, out: Path, run_dir: Path, world_sizes: list[int] | None = None,
               lab: Any = None, iface: str | None = None, master_addr: str = "127.0.0.1",
               master_port: int | None = None, capture: str | None = None, snaplen: int = 128,
               observe: bool = False, tag_prefix: str = "", tag: str | None = None) -> list[str]:
    """Run every world size in turn; returns the capture tags written. Raises DiagError on failure.
    ``tag``: what the captures and logs are named after (``<tag>-n<N>``; default: the transport and ops)."""
    from diag.harness import plan_rows
    from diag.hooks import CaptureHook, ObserveHook
    from diag.launch import HostLaunch, append_failure_end, run_world
    from diag.transports.raw.wire import TOKEN_BYTES

    sizes = list(world_sizes or ([len(lab.hosts)] if lab is not None else []))
    if not sizes:
        raise DiagError("no world sizes: pass --nproc, e.g. --nproc 2,3,4")
    if lab is not None and max(sizes) > len(lab.hosts):
        raise DiagError(f"lab {lab.name!r} has {len(lab.hosts)} hosts, fewer than N={max(sizes)}: "
                        f"run diag lab up --name {lab.name} --hosts {max(sizes)}")
    if min(sizes) < 2 and any(op in PAIRWISE_OPS for op in spec.ops):
        raise DiagError("point-to-point ops need at least 2 ranks")
    from diag.console import plan_weight

    plans = {n: plan_rows(spec, n) for n in sizes}
    rows_per_world = {n: len(rows) for n, rows in plans.items()}
    weights = {n: plan_weight(spec, rows, n) for n, rows in plans.items()}
    total = sum(rows_per_world.values())
    weight_done = 0.0
    logs = run_dir / "logs"
    safefs.private_dir(logs)
    if spec.backend == "raw" and "tcpinfo_dir" not in spec.knobs:
        spec = replace(spec, knobs={**spec.knobs, "tcpinfo_dir": str((run_dir / "tcpinfo").resolve())})
    done = 0
    tags = []
    for n in sizes:
        if lab is not None:
            hosts = [HostLaunch(h.name, 1, h.address, netns=h.netns, iface=h.iface,
                                env={"GLOO_SOCKET_IFNAME": h.iface}, exec_prefix=tuple(lab.exec_prefix(h)))
                     for h in lab.hosts[:n]]
        else:
            env = {"GLOO_SOCKET_IFNAME": iface} if iface else {}
            hosts = [HostLaunch("local", n, master_addr, iface=iface, env=env)]
        hooks: list[Any] = []
        if capture is not None:
            hooks.append(CaptureHook(iface=capture or None, snaplen=snaplen))
        if observe:
            hooks.append(ObserveHook())
        world_tag = f"{tag_prefix}{tag or transport_tag(spec) + '-' + '-'.join(spec.ops)}-n{n}"
        # The gate (closing lines, exit status) is the launching command's, over all its world sizes. Ranks diag
        # starts itself get the raw transport's run token in their 0600 job file, not the store.
        world_job = replace(job, spec=spec, rows_before=done, rows_total=total, run_id=f"{job.run_id}-n{n}",
                            weight_before=weight_done, weight_total=sum(weights.values()), gate=False,
                            token=secrets.token_hex(TOKEN_BYTES),
                            meta={**job.meta, "lab": lab.name if lab is not None else None, "capture": capture,
                                  "capture_tag": world_tag if capture is not None else None,
                                  "run_dir": str(run_dir.resolve())})
        try:
            run_world(world_job, hosts, logs, hooks, master_port=master_port, tag=world_tag, run_dir=run_dir)
        except DiagError as exc:
            append_failure_end(str(out), world_job.run_id, str(exc))
            raise
        done += rows_per_world[n]
        weight_done += weights[n]
        if capture is not None:
            tags.append(world_tag)
    if not job.quiet and not job.meta.get("trial"):   # a trial's blocks are not the spec's rows
        print(f"# {done} rows written to {out}", file=sys.stderr)
    return tags

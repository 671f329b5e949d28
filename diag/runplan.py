"""Running a plan on the one job, wherever its ranks come from: the one place that decides between in place and
a launch of diag's own (``diag reproduce``, ``diag sweep``, ``diag advise`` and ``diag.sweep()`` all call it).

- **in place**: under torchrun / srun / any env:// launcher (RANK set), this process is one rank of the job;
- **a lab** that is up (diag's namespaces): one ``torch.distributed.run`` per host, started inside its
  namespace with the host's link as GLOO_SOCKET_IFNAME, exactly as an operator starts one per node;
- **loopback**: one ``torch.distributed.run`` of K ranks on this machine.

Launching only starts K = max(N) ranks: every N of the plan runs on a subgroup of them (diag.inplace), and
every run writes the one run-directory layout (diag.runinfo).
"""

from __future__ import annotations

import os
import secrets
from dataclasses import replace
from pathlib import Path
from typing import Any

from diag.errors import DiagError
from diag.inplace.job import JobOptions
from diag.plan import Plan
from diag.records import Record


def in_place(iface: str | None = None) -> bool:
    """A launcher started this process as one rank of a job: torchrun or any env:// launcher (RANK set), or
    srun alone (diag.launchenv adopts the Slurm step's variables and exports RANK and the rest, once per
    process; ``iface``: --iface, where given). A launch whose parts disagree raises one line."""
    from diag import launchenv

    return launchenv.adopt(iface) is not None


def run_plan(options: JobOptions, *, lab: Any = None, master_addr: str = "127.0.0.1",
             master_port: int | None = None) -> int:
    """Run ``options.plan`` on the one job; results in the run directory ``options.out``. In place this
    process is one rank; else diag starts K ranks on ``lab`` (a lab that is up, ``diag.lab.load_lab``) or on
    loopback. Returns the exit status (1: steps failed, see run.json); a launch that fails raises DiagError
    with one line, the records it finished kept."""
    if in_place(options.iface):
        if lab is not None:
            raise DiagError("--lab starts diag's own ranks in the lab's namespaces: run it without torchrun/srun")
        from diag.inplace.job import run_in_place

        return run_in_place(options)
    from diag import launchenv
    from diag.transports.raw.wire import TOKEN_BYTES

    launchenv.refuse_batch_script(f"diag {options.command}")

    plan = Plan.from_json(options.plan)
    ranks = max(plan.world_sizes)
    options = replace(options, token=secrets.token_hex(TOKEN_BYTES))
    if lab is not None:
        if ranks > len(lab.hosts):
            raise DiagError(f"lab {lab.name!r} has {len(lab.hosts)} hosts, fewer than N={ranks}: "
                            f"run diag lab up --name {lab.name} --hosts {ranks}")
        hosts = [host_launch(h.name, 1, h.address, h.netns, h.iface, tuple(lab.exec_prefix(h)))
                 for h in lab.hosts[:ranks]]
        options = replace(options, mode="lab", lab=lab_meta(lab), iface=lab.hosts[0].iface)
    else:
        from diag.validate import interface

        interface(options.iface)
        hosts = [host_launch("local", ranks, master_addr, None, options.iface)]
        options = replace(options, mode="loopback")
    return _launch(options, hosts, master_port)


def lab_meta(lab: Any) -> dict[str, Any]:
    """run.json's ``lab``: the lab's own description (docs/lab.md), with ``hosts`` the count the report reads
    and every host's details (address, namespace, faults) under ``host_list``."""
    meta = lab.to_json()
    meta["host_list"] = meta.pop("hosts")
    meta["hosts"] = len(meta["host_list"])
    meta["addresses"] = [host["address"] for host in meta["host_list"]]
    return meta


def host_launch(name: str, nproc: int, address: str, netns: str | None, iface: str | None,
                exec_prefix: tuple[str, ...] = ()) -> Any:
    """One launcher's host: a lab host (named, in its namespace; ``exec_prefix``: how the lab starts a command
    there, its CPU cgroup included where a cpu fault starves it) or this machine."""
    from diag.launch import HostLaunch

    # OMP_NUM_THREADS: torchrun sets it to 1 anyway for several ranks a host, and says so at length.
    env = {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), **({"GLOO_SOCKET_IFNAME": iface} if iface else {})}
    if netns:
        # TORCH_CPP_LOG_LEVEL: c10d warns on every connection that the lab's addresses have no host names.
        env.update({"DIAG_NODE_NAME": name, "TORCH_CPP_LOG_LEVEL": os.environ.get("TORCH_CPP_LOG_LEVEL", "ERROR")})
    return HostLaunch(name, nproc, address, netns=netns, iface=iface, exec_prefix=exec_prefix, env=env)


def _launch(options: JobOptions, hosts: list[Any], master_port: int | None) -> int:
    """Start the job (one launcher per host) and wait for it. A run whose steps partly failed exits 1 (run.json
    lists them); any other failure is one line, and every run the ranks left open in the records is closed
    as failed. Rank 0's progress lines reach the terminal for reproduce and advise; a sweep's ranks keep
    their stderr in the logs (its table and its one-line errors are what a sweep prints)."""
    from diag.launch import close_open_runs, run_world
    from diag.runinfo import read_run_json

    root = Path(options.out)
    try:
        run_world(options, hosts, root / "logs", master_port=master_port, console=options.command != "sweep")
    except DiagError as exc:
        for path in [*sorted((root / "records").glob("*.jsonl")), *([options.records_out] if options.records_out
                                                                    else [])]:
            close_open_runs(path, options.run_id, str(exc))
        raise
    return 1 if (read_run_json(root) or {}).get("failures") else 0


def run_records(root: Path, step: str | None = None) -> list[Record]:
    """The rows a run wrote (every step's, or one step's), from its run directory: a run directory holds one
    run, so nothing needs telling apart (a sweep's --out may hold earlier runs too)."""
    from diag.records import load_records

    paths = [root / "records" / f"{step}.jsonl"] if step else sorted((root / "records").glob("*.jsonl"))
    return [r for path in paths if path.exists() for r in load_records(path).records]


def fresh_run_dir(preferred: Path, run_id: str) -> Path:
    """``preferred`` where it is free (absent or empty), else a sibling named after the run: a sweep appends to
    its --out, and every sweep gets a run directory of its own beside it."""
    if not preferred.exists() or (preferred.is_dir() and not any(preferred.iterdir())):
        return preferred
    return preferred.with_name(f"{preferred.name.removesuffix('.d')}-{run_id}.d")


__all__ = ["fresh_run_dir", "host_launch", "in_place", "lab_meta", "run_plan", "run_records"]

"""One rank of the control-plane tests (tests/test_control_plane.py): ``python -P control_plane_ranks.py
SCENARIO DIR`` with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set. Every rank prints one JSON line: what it
did and the one-line error it met (if any). Honest ranks run diag's own code; a hostile rank speaks the
wire by hand (torch's pickling object collectives, or diag's messages with crafted contents)."""

from __future__ import annotations

import json
import os
import resource
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch.distributed as dist

from diag import safefs
from diag.errors import DiagError
from diag.inplace.job import InPlaceJob, JobOptions, Run
from diag.inplace.node import NodeWork
from diag.inplace.topology import RankIdentity, build_topology
from diag.inplace.world import World
from diag.probe import GroupCoordinator
from diag.runinfo import RUN_SCHEMA, RunInfo


class Planted:
    """Unpickling this creates the marker file: what a pickle from another rank could do as root."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (self.marker, "w"))


def topology(world_size: int) -> Any:
    """One node per rank, named h<rank> (distinct addresses), as the job's topology would make them."""
    identities = [RankIdentity(rank=r, pid=1000 + r, hostname="host", address=f"10.9.0.{r + 1}", netns="net:[1]",
                               boot_id="b", name_hint=f"h{r}") for r in range(world_size)]
    return build_topology(identities, None)


def job_of(world: World, root: Path, rank: int) -> InPlaceJob:
    """The in-place job as it stands after its steps, where the run directory is not shared."""
    world.topology = topology(world.world_size)
    job = InPlaceJob(JobOptions(out=str(root)), world, world.topology, None, lambda text: None)   # type: ignore[arg-type]
    job.root = root
    job.shared = False
    if rank == 0:
        safefs.private_dir(root)
        for sub in ("records", "nodes"):
            safefs.private_dir(root / sub)
        job.run = Run(root, RunInfo(schema=RUN_SCHEMA))
        job.run.save()
    return job


def node_dir(job: InPlaceJob) -> Path:
    return job.root / "nodes" / job.node.name


def scenario_pickles(world: World, base: Path, rank: int) -> dict[str, Any]:
    """Rank 1 sends pickles through torch's object collectives; rank 0 receives with World's own calls."""
    out: dict[str, Any] = {}
    marker = str(base / f"unpickled-{rank}")
    for what in ("all_gather", "broadcast"):
        try:
            if rank == 1 and what == "all_gather":
                try:
                    dist.all_gather_object([None, None], Planted(marker + "-g"))
                except Exception as exc:   # torch's own unpickler chokes on rank 0's JSON: the wire is the same
                    out["all_gather_hostile"] = type(exc).__name__
            elif rank == 1:
                dist.broadcast_object_list([Planted(marker + "-b")], src=1)
            elif what == "all_gather":
                out["all_gather"] = world.all_gather({"ok": True}, "meeting the other ranks")
            else:
                out["broadcast"] = world.broadcast(None, "sharing the plan", src=1)
        except DiagError as exc:
            out[f"{what}_error"] = str(exc)
    return out


def scenario_ship(world: World, base: Path, rank: int) -> dict[str, Any]:
    """h1 offers what a hostile node would; h2 is an honest node whose directory holds planted entries."""
    from diag.inplace import transfer

    transfer.CHUNK_BYTES = 64 << 10
    transfer.SHIP_NODE_BYTES = 1 << 20
    job = job_of(world, base / f"run-{rank}", rank)
    if rank == 0:
        job._collect_nodes()
        return {"left_on_nodes": json.loads((job.root / "run.json").read_text()).get("left_on_nodes")}
    if rank == 1:
        offers = {"../../escape/authorized_keys": 5, str(base / "absolute-escape"): 5, "../h2/fingerprint.json": 5,
                  "analysis/ok.json": 2, "records/run.jsonl": 2, "analysis/big.json": 2 << 20, "analysis/..": 2}
        files = []
        for path, size in [*offers.items(), ("analysis/ok.json", 2)]:
            payload = base / f"payload-{size}"
            payload.write_bytes(b"{}" if size == 2 else b"x" * size)
            files.append(transfer.Outgoing(path, size, os.open(payload, os.O_RDONLY)))
        transfer.send_node_files(world, files, [], "collecting node h1's results")
        world.barrier("collecting the nodes' results")
        return {}
    directory = node_dir(job)
    for sub in ("analysis", "observe", "captures"):
        safefs.private_dir(directory / sub)
    (directory / "fingerprint.json").write_text('{"node": "h2"}')
    (directory / "analysis" / "steps.json").write_bytes(bytes(range(256)) * 1200)   # 300 kB: five chunks
    (directory / "analysis" / "leak.json").symlink_to(base / "secret")
    os.mkfifo(directory / "observe" / "planted.jsonl")
    (directory / "captures" / "steps.pcap").write_bytes(b"pcap")
    work = object.__new__(NodeWork)
    work.directory = directory
    files, skipped = work.files(keep_pcaps=False)
    transfer.send_node_files(world, files, skipped, "collecting node h2's results")
    world.barrier("collecting the nodes' results")
    return {}


def scenario_big(world: World, base: Path, rank: int) -> dict[str, Any]:
    """h1 sends one 96 MiB result; rank 0's peak memory must not grow with it (one chunk at a time)."""
    from diag.inplace import transfer

    job = job_of(world, base / f"run-{rank}", rank)
    if rank == 1:
        directory = node_dir(job)
        safefs.private_dir(directory / "analysis")
        with open(directory / "analysis" / "big.json", "wb") as handle:
            for _ in range(96):
                handle.write(os.urandom(1 << 20))
    world.barrier("written")
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if rank == 0:
        job._collect_nodes()
    else:
        work = object.__new__(NodeWork)
        work.directory = node_dir(job)
        files, skipped = work.files(keep_pcaps=False)
        transfer.send_node_files(world, files, skipped, "collecting node h1's results")
        world.barrier("collecting the nodes' results")
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    return {"grown_kib": grown_kib}


def scenario_records(world: World, base: Path, rank: int) -> dict[str, Any]:
    """Rank 0 names records that are not plain names; rank 1 (a node's leader) runs diag's own code."""
    out: dict[str, Any] = {}
    job = job_of(world, base / f"run-{rank}", rank)
    for shared in (True, False):
        job.shared = shared
        try:
            if rank == 0 and shared:
                world.broadcast(["../../escape/evil.jsonl"], "sharing the records")
            elif rank == 0:
                world.broadcast({"records": [["../../escape/evil.jsonl", 4]]}, "sharing the records")
                return out
            else:
                out[f"shared={shared}"] = job._records_for_analysis()
        except DiagError as exc:
            out[f"shared={shared}_error"] = str(exc)
    return out


def scenario_marker(world: World, base: Path, rank: int) -> dict[str, Any]:
    """prepare() as every rank of the job runs it (rank 1 is started where a FIFO sits at the marker)."""
    from diag.plan import resolve_plan

    world.topology = topology(world.world_size)
    plan = resolve_plan(True, world.world_size, None, "gloo", ())
    job = InPlaceJob(JobOptions(out=str(base / "run")), world, world.topology, plan, lambda text: None)
    job.prepare()
    return {"shared": job.shared}


SCENARIOS = {"marker": scenario_marker, "pickles": scenario_pickles, "ship": scenario_ship, "big": scenario_big, "records": scenario_records}


def main() -> None:
    """Runs the scenarios named (comma-separated) one after the other in the same processes (importing torch
    is most of a rank's start); each one's report under its name."""
    scenarios, base = sys.argv[1].split(","), Path(sys.argv[2])
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    world = World(GroupCoordinator())
    for scenario in scenarios:   # one line per scenario, as it ends: what came before a hang is kept
        try:
            report = SCENARIOS[scenario](world, base, world.rank)
        except DiagError as exc:
            report = {"error": str(exc)}
        print(json.dumps({"rank": world.rank, scenario: report}, default=repr), flush=True)
    os._exit(0)   # a hostile peer may have left a collective half done: no clean shutdown to wait for


if __name__ == "__main__":
    main()

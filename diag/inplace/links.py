"""The job's link reference, measured in place by its own ranks (diag.probe): the pairwise link matrix between
the nodes, the ring pattern of every N, and the single-stream and both-ways figures of node 0 -> node 1 that
every plot compares with (run.json ``link``, docs/inplace.md)."""

from __future__ import annotations

from typing import Any

from diag.errors import DiagError
from diag.lab.config import LabConfig
from diag.verdicts import CPU_LINK_REACHED

# The probe's own group waits at most this long for a node (a stuck tool or peer fails every rank at once).
PROBE_TIMEOUT_S = 60.0


def measure_links(job: Any) -> None:
    """Every rank calls it; rank 0 writes run.json ``link``. A probe that fails is a note, not the run's end:
    the steps measure the link again in their own way (raw TCP at every N)."""
    from diag.probe import GroupCoordinator, ProbeNode, measure_matrix, measure_ring_pattern

    topology = job.topology
    nodes = [ProbeNode(n.name, n.address or "127.0.0.1", n.leader) for n in topology.nodes]
    if len(nodes) < 2:
        job._note(["one node only: no link between hosts to measure (the ranks share a machine)"])
        return
    job.state.update(status="probing the links")
    job.say(f"[link] the pairwise link matrix between {len(nodes)} nodes, then the ring pattern of every N")
    coord = GroupCoordinator.gloo(PROBE_TIMEOUT_S)
    try:
        # Each phase of the matrix and each N's ring pattern runs this long (0.5 s of it warm-up): a K=4 matrix
        # is 3 rounds x 3 phases, K=8 7 x 3, then one incast phase per node (2 s or more); the ring patterns
        # add one phase per N.
        seconds = job.options.probe_seconds
        matrix = measure_matrix(coord, nodes, seconds=seconds, incast=job.plan.incast)
        rings = {}
        for n in job.plan.world_sizes:
            ring = topology.nodes_of(topology.members(n))
            if len(ring) == n:   # a ring with two ranks on one host is not a ring of hosts
                rings[str(n)] = measure_ring_pattern(coord, [nodes[topology.nodes.index(r)] for r in ring],
                                                     seconds=seconds).to_json()
    except DiagError as exc:
        job._note([f"the link probe failed: {exc}"])
        return
    if job.run is None:
        return
    first = matrix.edge(nodes[0].name, nodes[1].name)
    second = matrix.edge(nodes[1].name, nodes[0].name)
    from diag.runinfo import LinkInfo

    job.run.info.link = LinkInfo(single_stream_Bps=first.alone_Bps, bidir_Bps=[first.bidir_Bps, second.bidir_Bps],
                                 tool=matrix.tool, seconds=seconds, ring_pattern=rings, matrix=matrix.to_json())
    job.run.save()
    job.say(f"[link] {nodes[0].name} -> {nodes[1].name}: one stream {first.alone_Bps / 1e6:.1f} MB/s, both ways "
            f"{first.bidir_Bps / 1e6:.1f} + {second.bidir_Bps / 1e6:.1f} MB/s ({matrix.tool}); ring pattern, mean "
            "MB/s per edge: " + ", ".join(f"N={n} {r['mean_edge_Bps'] / 1e6:.1f}" for n, r in rings.items()))
    notes = list(matrix.notes)
    expected = lab_stream_bound_Bps(job.options.lab or {}, first.src, first.dst)
    if expected and first.alone_Bps < CPU_LINK_REACHED.value * expected:
        notes.append(f"one TCP stream reached {first.alone_Bps / 1e6:.1f} MB/s, below {CPU_LINK_REACHED.value:.0%} "
                     f"of the {expected / 1e6:.1f} MB/s the lab's link allows: the CPU (or other load) limits this "
                     "machine; lower --rate")
    limited = [n for n, r in rings.items() if r["mean_edge_Bps"] < CPU_LINK_REACHED.value * first.alone_Bps]
    if limited:
        notes.append(f"at N={','.join(limited)} the ring pattern stayed below {CPU_LINK_REACHED.value:.0%} of the single "
                     "stream: the hosts (their CPUs), not the link, are the limit there, and the report holds raw "
                     "TCP against the pattern at those N")
    job._note(notes)


def lab_stream_bound_Bps(lab: dict[str, Any], src: str, dst: str) -> float | None:
    """One TCP stream's goodput bound from src to dst on the lab (run.json's "lab"), as the lab computes it
    (LabConfig.expected_goodput_between: a host's fault may lower its own link); the lab's rate where the
    hosts are not listed. None outside the lab."""
    index = {host.get("name"): host.get("index") for host in lab.get("host_list", [])}
    if isinstance(lab.get("config"), dict) and isinstance(index.get(src), int) and isinstance(index.get(dst), int):
        return LabConfig.from_json(lab["config"]).expected_goodput_between(index[src], index[dst])
    return lab.get("expected_goodput_Bps")

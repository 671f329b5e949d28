"""Run the probe on its own under any env:// launcher (torchrun, srun ... torchrun): one rank per node or
more, every rank names its node and its address, rank 0 writes what was measured as JSON.

    torchrun --nnodes K --node-rank I --nproc-per-node 1 --rdzv-backend static --master-addr H0 \\
        --master-port 29500 -m diag.probe.driver --address MY_ADDRESS --out probe.json matrix ring

Steps, run in order: ``matrix`` (every pair, then every node's incast), ``matrix:pairs`` (the pairs only),
``incast`` or ``incast:ROUNDS`` (every node's incast only); ``ring`` (every node, in node order) or
``ring:h0,h2,h1``;
``flows:h0>h1,h2>h3`` (these flows at once); a step ending in ``@iperf3``, ``@socket`` or ``@auto`` uses
that tool instead of ``--tool``. The tests start it in each lab namespace by hand, exactly as
an operator starts one launcher per node; the in-place job calls the same functions from its own ranks.
Ranks with the same node name are one node; its lowest rank leads it.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from datetime import timedelta
from typing import Any

from diag import safefs
from diag.errors import DiagError
from diag.probe.coordinator import Coordinator, GroupCoordinator
from diag.probe.flows import TOOLS, ProbeNode, measure_flows
from diag.probe.matrix import INCAST_ROUNDS, measure_incast, measure_matrix
from diag.probe.ring import measure_ring_pattern

DEFAULT_TIMEOUT_S = 120.0    # the process group's: how long a rank waits for a peer that stopped answering


def discover_nodes(coord: Coordinator, name: str, address: str) -> list[ProbeNode]:
    """Every rank's (name, address) -> the nodes, by their leader's rank. Every rank calls it."""
    ranks = coord.all_gather_object([name, address])
    nodes: dict[str, ProbeNode] = {}
    for rank, said in enumerate(ranks):
        if not (isinstance(said, list) and len(said) == 2 and all(isinstance(s, str) and len(s) <= 255 for s in said)):
            raise DiagError(f"rank {rank} did not say its node's name and address; is every rank running the same diag?")
        node_name, node_address = said
        known = nodes.get(node_name)
        if known is None:
            nodes[node_name] = ProbeNode(node_name, node_address, rank)
        elif known.address != node_address:
            raise DiagError(f"ranks {known.leader_rank} and {rank} both call their node {node_name} but give "
                            f"addresses {known.address} and {node_address}: give each node its own name")
    return sorted(nodes.values(), key=lambda node: node.leader_rank)


def run_step(coord: Coordinator, nodes: list[ProbeNode], step: str, seconds: float, tool: str) -> dict[str, Any]:
    body, _, step_tool = step.partition("@")
    tool = step_tool or tool
    kind, _, spec = body.partition(":")
    by_name = {node.name: node for node in nodes}

    def named(name: str) -> ProbeNode:
        if name not in by_name:
            raise DiagError(f"step {step!r}: no node {name!r}; the nodes are {', '.join(by_name)}")
        return by_name[name]

    if kind == "matrix" and spec in ("", "pairs"):
        return {"step": step, "matrix": measure_matrix(coord, nodes, seconds, tool, incast=not spec).to_json()}
    if kind == "incast" and (not spec or spec.isdigit()):
        rounds = int(spec) if spec else INCAST_ROUNDS
        return {"step": step, "incast": [phase.to_json()
                                         for phase in measure_incast(coord, nodes, seconds, tool, rounds)]}
    if kind == "ring":
        ring = [named(name) for name in spec.split(",")] if spec else nodes
        return {"step": step, "ring_pattern": measure_ring_pattern(coord, ring, seconds, tool).to_json()}
    if kind == "flows" and spec:
        pairs = [tuple(part.split(">", 1)) for part in spec.split(",")]
        if any(len(pair) != 2 for pair in pairs):
            raise DiagError(f"step {step!r}: write flows as SRC>DST,SRC>DST")
        flows = [(named(src).name, named(dst).name) for src, dst in pairs]
        return {"step": step, "flows": [r.to_json() for r in measure_flows(coord, nodes, flows, seconds, tool)]}
    raise DiagError(f"unknown step {step!r}: use matrix, matrix:pairs, incast[:ROUNDS], ring, ring:A,B,C or "
                    "flows:A>B,C>D")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m diag.probe.driver", description=__doc__.split("\n\n")[0])
    parser.add_argument("steps", nargs="+", help="matrix[:pairs] | incast[:ROUNDS] | ring[:A,B,..] | flows:A>B,C>D, each optionally @TOOL")
    parser.add_argument("--address", required=True, help="this node's address on the job's interface")
    parser.add_argument("--name", default=os.environ.get("DIAG_NODE_NAME") or socket.gethostname(),
                        help="this node's name (default $DIAG_NODE_NAME, else the hostname)")
    parser.add_argument("--out", help="rank 0 writes the results here as JSON")
    parser.add_argument("--seconds", type=float, default=2.0, help="per flow set (whole seconds, default 2)")
    parser.add_argument("--tool", choices=TOOLS, default="auto")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S,
                        help="seconds a rank waits for a peer that stopped answering")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=timedelta(seconds=args.timeout))
    coord = GroupCoordinator()
    started = time.monotonic()
    results: list[dict[str, Any]] = []
    error = None
    nodes: list[ProbeNode] = []
    try:
        nodes = discover_nodes(coord, args.name, args.address)
        for step in args.steps:
            results.append({**run_step(coord, nodes, step, args.seconds, args.tool),
                            "elapsed_s": time.monotonic() - started})
    except DiagError as exc:
        error = str(exc)
    if coord.rank == 0 and args.out:
        document = {"nodes": [asdict(node) for node in nodes], "steps": results, "error": error,
                    "elapsed_s": time.monotonic() - started}
        safefs.write_file(args.out, json.dumps(document, indent=1))
    if error is not None:
        # Every rank saw the same error; none waits on a collective after it, so none needs the group.
        print(f"diag probe: {error}", file=sys.stderr)
        return 2
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    code = main()
    if code:
        # After a failed exchange the process group is never destroyed, and torch's gloo/TCPStore destructors
        # may abort at exit where a peer left first (SIGABRT instead of the exit status): the document is
        # written and the line said, so leave without them.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)

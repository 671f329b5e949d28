"""Builders for run directories of the in-place layout (docs/inplace.md): nodes/<node>/{fingerprint.json,
analysis/, observe/, tcpinfo/}, run.json with mode, topology and link.matrix. Numbers are a 4-host lab at
200 Mbit/s (iperf3 reads ~23.5 MB/s through its tbf, ~22.9 MB/s each way with both directions at once); a
host "stuck at 100 Mbit/s" reads ~11.7 MB/s."""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from report_helpers import MiB, ideal_time, make_record, timed, write_records, write_steps

from diag.records import Record

NODES = ("h0", "h1", "h2", "h3")
ADDRESS = {name: f"10.77.0.{i + 1}" for i, name in enumerate(NODES)}
LAB_Bps = 23.5e6            # 200 Mbit/s, one stream, through the lab's tbf
SLOW_Bps = 11.7e6           # a host at 100 Mbit/s
BIDIR_SHARE = 0.975         # each direction with the other running at once (ACKs share the link)
VOLUMES = (4 * MiB, 16 * MiB)
BOOT_ID = "6f1c2a9e-3b1d-4a8e-9c59-1d2a3b4c5d6e"   # the lab's namespaces share the machine's boot id


def endpoint(node: str, port: int) -> str:
    return f"{ADDRESS[node]}:{port}"


def topology(nodes: Sequence[str] = NODES) -> dict[str, Any]:
    return {"world_size": len(nodes), "iface": "eth0",
            "nodes": [{"name": n, "address": ADDRESS[n], "hostname": "box", "netns": f"net:[40265324{i:02d}]",
                       "boot_id": BOOT_ID, "ranks": [i], "leader": i} for i, n in enumerate(nodes)],
            "subgroups": {str(k): list(range(k)) for k in range(2, len(nodes) + 1)}, "shared_hosts": []}


def link_matrix(out_Bps: dict[str, float] | None = None, in_Bps: dict[str, float] | None = None,
                edges: dict[tuple[str, str], float] | None = None, nodes: Sequence[str] = NODES,
                seed: int = 1, retransmits: dict[tuple[str, str], tuple[int, int]] | None = None,
                bidir: dict[tuple[str, str], float] | None = None,
                incast: dict[tuple[str, str], int | None] | list[dict[tuple[str, str], int | None]] | None = None
                ) -> dict[str, Any]:
    """Every ordered pair: the lesser of the sender's and the receiver's rate (LAB_Bps unless given), an
    ``edges`` override per pair, and 1.5% measurement noise; with ``retransmits``, each pair's segments resent
    alone and both ways at once (absent pairs: none), and ``bidir`` its both-ways share of alone. With
    ``incast``, one incast phase per node and round (2 s, 1.5 s of it steady): every other node sends into it
    at a third of its rate, and (src, dst) resends the segments given (absent pairs: none) after the warm-up;
    10% of a sender's 1.5 s at LAB_Bps / 3 is ~811 segments. A dict is both rounds', a list one per round."""
    rng = random.Random(seed)
    out_Bps, in_Bps, edges = out_Bps or {}, in_Bps or {}, edges or {}
    rows = []
    for src in nodes:
        for dst in nodes:
            if src != dst:
                rate = edges.get((src, dst), min(out_Bps.get(src, LAB_Bps), in_Bps.get(dst, LAB_Bps)))
                noise = 1 + rng.uniform(-0.015, 0.015)
                row = {"src": src, "dst": dst, "alone_Bps": rate * noise,
                       "bidir_Bps": rate * (bidir or {}).get((src, dst), BIDIR_SHARE) * noise}
                if retransmits is not None:
                    row["alone_retransmits"], row["bidir_retransmits"] = retransmits.get((src, dst), (0, 0))
                rows.append(row)
    rounds = [[[nodes[0], nodes[3]], [nodes[1], nodes[2]]], [[nodes[0], nodes[1]], [nodes[2], nodes[3]]],
              [[nodes[0], nodes[2]], [nodes[1], nodes[3]]]] if len(nodes) == 4 else []
    by_round = [] if incast is None else incast if isinstance(incast, list) else [incast, incast]
    phases = [{"dst": dst, "round": number, "seconds": 2.0, "steady_s": 1.5,
               "flows": [{"src": src, "goodput_Bps": in_Bps.get(dst, LAB_Bps) / (len(nodes) - 1) * (1 + rng.uniform(-0.1, 0.1)),
                          "steady_retransmits": resent.get((src, dst), 0),
                          "retransmits": None if resent.get((src, dst), 0) is None else 40 + (resent.get((src, dst)) or 0)}
                         for src in nodes if src != dst]} for number, resent in enumerate(by_round, 1) for dst in nodes]
    return {"tool": "iperf3", "seconds": 2.0, "nodes": list(nodes), "rounds": rounds, "edges": rows, "notes": [],
            "incast": phases}


def fingerprint(node: str, **sysctls: str) -> dict[str, Any]:
    """A node's fingerprint in the shape of diag.envinfo (kernel, sysctls, interface, versions) plus what makes
    each node itself (address, netns, boot id, variables), ``sysctls`` overriding (tcp_rmem="4096 16384 65536")."""
    i = NODES.index(node)
    base = {"net.ipv4.tcp_rmem": "4096 131072 6291456", "net.ipv4.tcp_wmem": "4096 16384 4194304",
            "net.ipv4.tcp_congestion_control": "cubic", "net.ipv4.tcp_slow_start_after_idle": "1",
            "net.core.rmem_max": "212992", "net.core.wmem_max": "212992"}
    base.update({f"net.ipv4.{k}" if not k.startswith("net.") else k: v for k, v in sysctls.items()})
    return {"host": "box", "hostname": "box", "kernel": "6.8.0-45-generic", "python": "3.11.7", "cpu_count": 16,
            "cpu_model": "Intel(R) Xeon(R) Gold 6338", "torch": "2.13.0+cpu", "gloo": True, "diag": "0.9.0",
            "sysctl": base, "netns": f"net:[40265324{i:02d}]", "boot_id": BOOT_ID, "address": ADDRESS[node],
            "interface": {"name": "eth0", "mtu": 1500, "speed": None, "tx_queue_len": 1000, "driver": "veth",
                          "offloads": {"tcp-segmentation-offload": "off", "generic-receive-offload": "off"}},
            "variables": {"MASTER_ADDR": ADDRESS["h0"], "MASTER_PORT": "29500", "RANK": str(i),
                          "GLOO_SOCKET_IFNAME": "eth0", "DIAG_NODE_NAME": node},
            "capture": {"may_capture": True, "tcpdump": "/usr/bin/tcpdump"}}


def ring_records(rate_of_n: dict[int, float], backends: Iterable[str] = ("gloo", "raw"),
                 volumes: Sequence[int] = VOLUMES, seed: int = 0) -> list[Record]:
    """all_gather at equal per-device volume D for every N, link-bound at rate_of_n[N] (busbw ~ that rate):
    what a ring paced by its slowest edge gives."""
    out = []
    k = seed
    for backend in backends:
        for n, rate in sorted(rate_of_n.items()):
            for volume in volumes:
                k += 1
                size = volume // (n - 1)
                slowdown = 1.05 if backend == "gloo" else 1.0
                out.append(make_record(backend, "all_gather", n, size,
                                       timed(ideal_time("all_gather", n, size, rate, slowdown), seed=k),
                                       knobs={"conn": "split", "order": "recv-first"} if backend == "raw" else None,
                                       t_start_ns=1_000_000_000 + k * 10_000_000_000))
    return out


def write_inplace_run(root: Path, records: Iterable[Record], *, nodes: Sequence[str] = NODES,
                      matrix: dict[str, Any] | None = None, fingerprints: dict[str, dict[str, Any]] | None = None,
                      analyses: dict[str, dict[str, dict[str, Any]]] | None = None,
                      observe: dict[str, dict[str, list[dict[str, Any]]]] | None = None,
                      tcpinfo: dict[str, list[dict[str, Any]]] | None = None, mode: str = "lab",
                      meta: dict[str, Any] | None = None) -> Path:
    """A run directory as rank 0 of the in-place job writes it; per-node parts keyed by node name."""
    root.mkdir(parents=True, exist_ok=True)
    write_records(root / "records" / "survey.jsonl", records)
    tags = [tag for part in (analyses, observe) for per_node in (part or {}).values() for tag in per_node]
    if tags:
        write_steps(root / "records" / "steps.jsonl", tags)
    run_json = {"mode": mode, "topology": topology(nodes), "plan": {}, "notes": [], "failures": [],
                "lab": {"name": "t", "rate_bps": 200e6, "hosts": len(nodes), "addresses": [ADDRESS[n] for n in nodes]},
                "link": {"single_stream_Bps": LAB_Bps, "bidir_Bps": [LAB_Bps * BIDIR_SHARE] * 2, "tool": "iperf3",
                         **({"matrix": matrix} if matrix is not None else {})}}
    run_json.update(meta or {})
    (root / "run.json").write_text(json.dumps(run_json))
    fingerprints = {n: fingerprint(n) for n in nodes} if fingerprints is None else fingerprints
    for node in nodes:
        folder = root / "nodes" / node
        folder.mkdir(parents=True, exist_ok=True)
        if node in fingerprints:
            (folder / "fingerprint.json").write_text(json.dumps(fingerprints[node]))
        for tag, document in ((analyses or {}).get(node) or {}).items():
            (folder / "analysis").mkdir(exist_ok=True)
            (folder / "analysis" / f"{tag}.json").write_text(json.dumps(document))
        for tag, samples in ((observe or {}).get(node) or {}).items():
            (folder / "observe").mkdir(exist_ok=True)
            (folder / "observe" / f"{tag}.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
        if (tcpinfo or {}).get(node):
            (folder / "tcpinfo").mkdir(exist_ok=True)
            (folder / "tcpinfo" / f"tcpinfo-rank{NODES.index(node)}.jsonl").write_text(
                "".join(json.dumps(s) + "\n" for s in (tcpinfo or {})[node]))
    return root


def observer_series(local: str, remote: str, *, count: int = 8, busy_s: float = 2.0, rwnd_limited_s: float = 0.0,
                    sndbuf_limited_s: float = 0.0, cwnd: Sequence[float] | None = None, retrans: int = 0,
                    pid: int = 100) -> list[dict[str, Any]]:
    """An observer's ss samples of one socket (cumulative busy/limited seconds and total retransmits)."""
    cwnds = list(cwnd) if cwnd is not None else [40.0 + 2 * i for i in range(count)]
    return [{"kind": "tcp_info", "t_ns": 1_000_000_000 + i * 200_000_000, "pid": pid, "local": local,
             "remote": remote, "cwnd": cwnds[i % len(cwnds)], "rtt_us": 900.0, "send_q": 65536, "recv_q": 0,
             "delivery_rate_Bps": LAB_Bps, "busy_s": busy_s * i / (count - 1),
             "rwnd_limited_s": rwnd_limited_s * i / (count - 1), "sndbuf_limited_s": sndbuf_limited_s * i / (count - 1),
             "retrans": round(retrans * i / (count - 1))} for i in range(count)]


def nic_samples(rate_Bps: float, count: int = 8, iface: str = "eth0") -> list[dict[str, Any]]:
    return [{"kind": "nic", "t_ns": 1_000_000_000 + i * 200_000_000, "iface": iface,
             "tx_bytes": int(rate_Bps * 0.2 * i), "rx_bytes": int(rate_Bps * 0.2 * i)} for i in range(count)]


def rank_cpu(cores: float, count: int = 8, pid: int = 100) -> list[dict[str, Any]]:
    """One rank's threads at ``cores`` together: the main thread 60% of it, gloo's I/O thread 40%."""
    return [{"kind": "cpu_thread", "t_ns": 1_000_000_000 + i * 200_000_000, "pid": pid, "tid": pid + j,
             "name": name, "cpu_pct": round(100 * cores * share, 2)}
            for i in range(count) for j, (name, share) in enumerate((("python", 0.6), ("gloo-io", 0.4)))]


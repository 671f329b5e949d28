"""Evidence queries across the nodes of a run, shared by the per-host rules, the plots and the node table.

Every node's captures, TCP_INFO and CPU samples, each tied to the nodes at its ends (diag.report.topology's
lookups); the link matrix read as per-node capacities; the subgroup of each N as nodes; and the node
fingerprints compared key by key. A run of the earlier layout (one capture point, no nodes/) answers from that
capture point, its ends named through the lab's addresses where run.json has them.
"""

from __future__ import annotations

import itertools
import json
import re
import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from diag.analysisdoc import Direction
from diag.report.queries import (
    HostCpu,
    TcpInfoSeries,
    ThreadCpu,
    large_sizes,
    machines_of,
    series_of,
    threads_of,
)
from diag.report.rundir import CaptureSet, RunData
from diag.report.series import PAIRWISE_OPS, by_series, mean_busbw, series_label

# --- the wire, every node's captures ---


@dataclass(frozen=True)
class NodeFlow:
    """One direction of one connection as the wire saw it, with the nodes at its ends."""

    label: str                   # "ip:port->ip:port"
    src: str | None              # the sending node
    dst: str | None              # the receiving node
    capture: CaptureSet          # the capture that saw it (of the node at either end)
    direction: Direction

    @property
    def text(self) -> str:
        """'into h0 from h2' (an end the run cannot name stays its address)."""
        src, _, dst = self.label.partition("->")
        return f"into {self.dst or dst} from {self.src or src}"


def node_flows(run: RunData) -> list[NodeFlow]:
    """Every direction that carried packets in any node's capture. A connection both ends captured is counted
    once per capture tag, from its sender's own capture where there is one: a retransmission is the sender's
    act and its capture sees every one it sends, while a receiver's capture reads segments that reach it out
    of order (its own CPUs, a veth) as retransmissions of segments it did not see (the lab's receivers read
    2,775 where the sender resent 248); else from the capture that saw more packets."""
    return run.remember("node_flows", lambda: _node_flows(run))


def _node_flows(run: RunData) -> list[NodeFlow]:
    best: dict[tuple[str, str], NodeFlow] = {}
    for flow in flow_observations(run):
        key = (flow.capture.tag, flow.label)
        kept = best.get(key)
        rank = (flow.src is not None and flow.capture.node == flow.src, flow.direction.packets)
        if kept is None or rank > (kept.src is not None and kept.capture.node == kept.src, kept.direction.packets):
            best[key] = flow
    return sorted(best.values(), key=lambda f: (f.capture.tag, f.label))


def phase_idle(flow: NodeFlow) -> tuple[float, float, float]:
    """(idle seconds, longest gap, timed seconds) of a flow's direction inside its capture's record phases (the
    timed iterations), so time between iterations and steps is not counted as a cost."""
    src, _, dst = flow.label.partition("->")
    idle = longest = timed = 0.0
    for p in flow.capture.phases:
        for pc in p.connections:
            if {pc.a, pc.b} == {src, dst}:
                timed += (p.phase.t_end_ns - p.phase.t_start_ns) / 1e9
                d = pc.direction("a->b" if pc.a == src else "b->a")
                idle += d.idle_gaps.total_s
                longest = max(longest, d.idle_gaps.max_s)
    return idle, longest, timed


def flow_observations(run: RunData) -> list[NodeFlow]:
    """Every direction every node's capture saw (a connection both ends captured appears twice): what each
    capture point saw of it, e.g. whether the sender's own capture saw the segments it later resent."""
    return run.remember("flow_observations", lambda: _flow_observations(run))


def _flow_observations(run: RunData) -> list[NodeFlow]:
    lookup = run.lookup
    out = []
    for c in run.all_captures:
        for conn in c.connections:
            for label, d in conn.labelled_directions():
                if d.packets:
                    src, dst = lookup.direction(label)
                    out.append(NodeFlow(label, src, dst, c, d))
    return out


# --- TCP_INFO, every node's observers and side files ---


@dataclass(frozen=True)
class NodeSeries:
    """A TCP_INFO series with the node that sampled it and the nodes at its socket's ends: ``src`` is the
    socket's own node (its sends are what ``retrans``, ``sndbuf_limited`` and cwnd describe), ``dst`` its
    peer's (whose receive window ``rwnd_limited`` waits on)."""

    series: TcpInfoSeries
    node: str | None
    src: str | None
    dst: str | None

    @property
    def text(self) -> str:
        return f"{self.src or '?'} -> {self.dst or '?'} ({self.series.label})"


def node_tcp_info(run: RunData) -> list[NodeSeries]:
    return run.remember("node_tcp_info", lambda: _node_tcp_info(run))


def _node_tcp_info(run: RunData) -> list[NodeSeries]:
    lookup = run.lookup
    points: list[tuple[str | None, Iterable[CaptureSet], list[dict[str, Any]]]] = (
        [(name, node.captures.values(), node.tcpinfo) for name, node in run.nodes.items()] if run.nodes
        else [(None, run.captures.values(), run.tcpinfo)])
    out = []
    for node, captures, tcpinfo in points:
        for s in series_of(captures, tcpinfo):
            first = s.samples[0]
            if first.local or first.remote:
                src, dst = lookup.node_of(first.local), lookup.node_of(first.remote)
            else:
                src, dst = lookup.node_of_rank(first.rank), lookup.node_of_rank(first.peer)
            out.append(NodeSeries(s, node, src or node, dst))
    return out


# --- CPU and NIC, per node ---


@dataclass(frozen=True)
class NodeCpu:
    """One node's CPU samples: its machine (per capture), its threads, its ranks' CPU per instant, and what
    its NIC carried."""

    node: str | None
    machines: tuple[HostCpu, ...]
    threads: tuple[ThreadCpu, ...]
    ranks_cores: dict[str, tuple[float, ...]]    # capture tag -> per sampling instant, cores its ranks used
    nic_Bps: dict[str, float]                    # capture tag -> median rate of its busier NIC direction
    throttled: dict[str, tuple[float, float, int]] = field(default_factory=dict)
    # capture tag -> (quota in cores, share of the quota's enforcement periods that ran out, periods)


def node_cpu(run: RunData) -> list[NodeCpu]:
    """Per node (one entry, node None, for the earlier layout)."""
    points = ([(name, list(node.captures.values())) for name, node in run.nodes.items()] if run.nodes
              else [(None, list(run.captures.values()))])
    return [NodeCpu(node, tuple(machines_of(captures).values()), tuple(threads_of(captures)),
                    {c.tag: _ranks_cores(c) for c in captures if _ranks_cores(c)},
                    {c.tag: rate for c in captures if (rate := _nic_Bps(c)) is not None},
                    {c.tag: held for c in captures if (held := _throttled(c)) is not None})
            for node, captures in points]


def _throttled(capture: CaptureSet) -> tuple[float, float, int] | None:
    """Over the step, the CPU quota of the node's ranks and the share of its enforcement periods in which it
    ran out (the kernel's cumulative cpu.stat counters, first sample to last); None without a quota."""
    samples = sorted((s for s in capture.observe if s.get("kind") == "cpu_quota"
                      and isinstance(s.get("periods"), int) and isinstance(s.get("throttled_periods"), int)),
                     key=lambda s: s.get("t_ns", 0))
    if len(samples) < 2:
        return None
    periods = samples[-1]["periods"] - samples[0]["periods"]
    held = samples[-1]["throttled_periods"] - samples[0]["throttled_periods"]
    return (float(samples[-1].get("quota_cores") or 0.0), held / periods, periods) if periods > 0 else None


def _ranks_cores(capture: CaptureSet) -> tuple[float, ...]:
    """Per sampling instant, the cores the observed processes used together (their threads' % of a core / 100)."""
    per_instant: dict[int, float] = defaultdict(float)
    for s in capture.observe:
        if s.get("kind") == "cpu_thread" and isinstance(s.get("cpu_pct"), (int, float)):
            per_instant[int(s.get("t_ns", 0))] += float(s["cpu_pct"]) / 100.0
    return tuple(per_instant[t] for t in sorted(per_instant))


def _nic_Bps(capture: CaptureSet) -> float | None:
    """The median rate between consecutive NIC samples of the busiest interface (loopback aside), of its
    busier direction; None without two samples."""
    by_iface: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for s in capture.observe:
        if s.get("kind") == "nic" and s.get("iface") != "lo":
            by_iface[str(s.get("iface"))].append(s)
    rates: list[float] = []
    moved = -1
    for samples in by_iface.values():
        samples.sort(key=lambda s: s.get("t_ns", 0))
        steps = []
        for a, b in itertools.pairwise(samples):
            dt = (b.get("t_ns", 0) - a.get("t_ns", 0)) / 1e9
            if dt > 0:
                steps.append(max(b.get("tx_bytes", 0) - a.get("tx_bytes", 0),
                                 b.get("rx_bytes", 0) - a.get("rx_bytes", 0)) / dt)
        total = sum(max(samples[-1].get(k, 0) - samples[0].get(k, 0), 0) for k in ("tx_bytes", "rx_bytes"))
        if steps and total > moved:
            rates, moved = steps, total
    return statistics.median(rates) if rates else None


# --- the link matrix ---


@dataclass(frozen=True)
class NodeCapacity:
    """What a node sends and receives at best in the link matrix: the fastest of its edges out and in (an
    edge carries the lesser of its sender's and its receiver's rate, so the best edge is the node's own)."""

    node: str
    out_Bps: float | None
    in_Bps: float | None

    @property
    def rate_Bps(self) -> float | None:
        known = [v for v in (self.out_Bps, self.in_Bps) if v is not None]
        return min(known) if known else None


def capacities(alone: dict[tuple[str, str], float], names: Sequence[str]) -> dict[str, NodeCapacity]:
    out = {}
    for name in names:
        sent = [v for (s, _d), v in alone.items() if s == name]
        got = [v for (_s, d), v in alone.items() if d == name]
        out[name] = NodeCapacity(name, max(sent) if sent else None, max(got) if got else None)
    return out


def node_link_Bps(run: RunData, node: str | None) -> float | None:
    """A node's own link rate: its capacity in the link matrix, else the run's link rate."""
    matrix = run.link_matrix
    if node is not None and matrix is not None:
        rate = capacities(matrix.alone(), matrix.names()).get(node)
        if rate is not None and rate.rate_Bps:
            return rate.rate_Bps
    return run.link_Bps


# --- subgroups: which nodes each N runs on ---


def subgroup_nodes(run: RunData) -> dict[int, list[str]]:
    """N -> the nodes of its subgroup (run.json topology; distinct, in rank order)."""
    topology = run.topology
    if topology is None:
        return {}
    out = {}
    for key in topology.subgroups:
        if str(key).isdigit():
            ranks = topology.subgroup(int(key)) or []
            names = [run.lookup.node_of_rank(r) for r in ranks]
            out[int(key)] = list(dict.fromkeys(n for n in names if n is not None))
    return out


def best_large_busbw(run: RunData) -> dict[int, tuple[float, str]]:
    """N -> the best busbw any survey series reached at a large size (collectives, not pairwise ops), with
    its series label: what that N carried at best."""
    best: dict[int, tuple[float, str]] = {}
    for (_label, op), per_n in by_series(run.records).items():
        if op in PAIRWISE_OPS:
            continue
        for n, rows in per_n.items():
            for size in large_sizes(sorted(rows)):
                value = mean_busbw(rows[size])
                if value > best.get(n, (0.0, ""))[0]:
                    best[n] = (value, f"{series_label(rows[size])} {op}")
    return best


# --- node fingerprints compared ---

# Keys (dotted paths of the fingerprint) that differ between nodes by nature, never by configuration: names,
# addresses, namespace and boot ids, ranks, times, and what diag itself could or could not do there.
VOLATILE_PARTS = frozenset({"netns", "boot_id", "host", "hostname", "node", "name", "iface", "address", "addresses",
                            "pid", "rank", "ranks", "leader", "created_ns", "t_ns", "time_ns", "uptime_s",
                            "capture", "unreadable", "errors", "could_not"})
# Environment variables that name this node's place in the job, not its configuration.
VOLATILE_VARIABLE_SUFFIXES = ("ADDR", "PORT", "RANK", "IFNAME", "WORLD_SIZE", "NODE_NAME", "RUN_ID", "TOKEN")
VOLATILE_VARIABLE_PREFIXES = ("MASTER_", "TORCHELASTIC_", "DIAG_")
# What a key is about, for how much a difference weighs: TCP and the NIC first, then software versions.
NETWORK_FRAGMENTS = ("tcp_", "rmem", "wmem", "mtu", "offload", "speed", "duplex", "qdisc", "congestion",
                     "driver", "tx_queue_len", "somaxconn", "netdev")
SOFTWARE_FRAGMENTS = ("kernel", "torch", "gloo", "diag", "python", "nccl", "cuda", "platform")


def flatten(value: Any, prefix: str = "") -> dict[str, str]:
    """A fingerprint as dotted keys -> text (lists as JSON); a null leaf is left out (unknown is not different)."""
    if isinstance(value, dict):
        out: dict[str, str] = {}
        for k, v in value.items():
            out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    if value is None:
        return {}
    text = json.dumps(value) if isinstance(value, list) else " ".join(str(value).split())
    return {prefix: text}


# Parts of a configured value the kernel hands out, not the configuration: a qdisc's handle and parent (tbf 8017:
# on one node, tbf 8019: on the next, for the same rate and burst), its reference count. Two values that agree
# once these are blanked configure the node alike.
_KERNEL_IDENTIFIERS = (
    (re.compile(r"\b(?:handle |parent )?[0-9a-f]{1,4}:[0-9a-f]{0,4}(?=\s|$)"), ""),
    (re.compile(r"\brefcnt \d+"), ""),
)


def configured(key: str, value: str) -> str:
    """A value as it configures the node: for a qdisc (``tc qdisc show``), without the handles and counts the
    kernel assigns."""
    if "qdisc" not in key.lower():
        return value
    for pattern, blank in _KERNEL_IDENTIFIERS:
        value = pattern.sub(blank, value)
    return " ".join(value.split())


def volatile(key: str) -> bool:
    parts = key.split(".")
    if parts[0] in ("variables", "env", "environment") and len(parts) > 1:
        name = parts[-1]
        return name.endswith(VOLATILE_VARIABLE_SUFFIXES) or name.startswith(VOLATILE_VARIABLE_PREFIXES)
    return any(part in VOLATILE_PARTS for part in parts)


def display_key(key: str) -> str:
    """'sysctl.net.ipv4.tcp_rmem' -> 'net.ipv4.tcp_rmem' (a sysctl is known by its own name)."""
    return key.removeprefix("sysctl.").removeprefix("sysctls.")


def kind_of(key: str) -> str:
    low = key.lower()
    if any(f in low for f in NETWORK_FRAGMENTS):
        return "network"
    if any(f in low for f in SOFTWARE_FRAGMENTS):
        return "software"
    return "other"


@dataclass(frozen=True)
class Difference:
    """One fingerprint key whose value is not the same on every node that could read it."""

    key: str                                      # as displayed (sysctls by their own name)
    groups: tuple[tuple[str, tuple[str, ...]], ...]   # (value, nodes), the largest group first
    kind: str                                     # "network" | "software" | "other"

    @property
    def odd(self) -> tuple[str, ...]:
        """The nodes outside a strict majority; every node where no value holds one."""
        sizes = [len(nodes) for _value, nodes in self.groups]
        if len(sizes) > 1 and sizes[0] > sizes[1]:
            return tuple(n for _value, nodes in self.groups[1:] for n in nodes)
        return tuple(n for _value, nodes in self.groups for n in nodes)

    def value_of(self, node: str) -> str | None:
        return next((value for value, nodes in self.groups if node in nodes), None)

    @property
    def text(self) -> str:
        """"h2's net.ipv4.tcp_rmem (4096 16384 65536) differs from h0, h1, h3's (4096 131072 6291456)"."""
        (usual, common), *others = self.groups
        if len(common) > max(len(nodes) for _value, nodes in others):
            odd = "; ".join(f"{_names(nodes)}'s {self.key} ({value})" for value, nodes in others)
            return f"{odd} differs from {_names(common)}'s ({usual})"
        return f"{self.key} differs: " + "; ".join(f"{_names(nodes)} {value}" for value, nodes in self.groups)


def _names(nodes: Sequence[str]) -> str:
    return ", ".join(nodes)


def fingerprint_differences(run: RunData) -> list[Difference]:
    """The keys whose values differ between the nodes' fingerprints (volatile keys aside), network keys first."""
    return run.remember("fingerprint_differences", lambda: _differences(run.fingerprints()))


def _differences(fingerprints: dict[str, dict[str, Any]]) -> list[Difference]:
    flat = {node: flatten(doc) for node, doc in fingerprints.items()}
    keys = sorted({k for values in flat.values() for k in values if not volatile(k)})
    out = []
    for key in keys:
        # compared as they configure the node; shown as each node reported it (the first node's of a group)
        reported = {node: values[key] for node, values in flat.items() if key in values}
        seen = {node: configured(key, value) for node, value in reported.items()}
        if len(seen) < 2 or len(set(seen.values())) < 2:
            continue
        count = Counter(seen.values())
        order = list(fingerprints)
        groups = tuple((reported[next(n for n in order if seen.get(n) == value)],
                        tuple(n for n in order if seen.get(n) == value))
                       for value, _n in sorted(count.items(), key=lambda kv: (-kv[1], kv[0])))
        out.append(Difference(display_key(key), groups, kind_of(key)))
    rank = {"network": 0, "software": 1, "other": 2}
    return sorted(out, key=lambda d: rank[d.kind])


def differences_of(run: RunData, node: str) -> list[Difference]:
    """The differences where this node is among the odd ones."""
    return [d for d in fingerprint_differences(run) if node in d.odd]

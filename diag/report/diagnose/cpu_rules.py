"""The CPU rule: a thread pinned at a full core, or every core of the machine busy where raw TCP could not
fill the link either; with nodes, per node: a node whose CPU is saturated while its link idles is CPU-starved,
and is named."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from diag.report.diagnose.base import undecided
from diag.report.diagnose.findings import STRENGTHS, Evidence, Finding
from diag.report.nodes import NodeCpu, flatten, node_cpu, node_link_Bps
from diag.report.queries import (
    HostCpu,
    ThreadCpu,
    host_cpu,
    machine_link_reach,
    machines_of,
    raw_link_reach,
    threads_of,
)
from diag.report.rundir import CaptureSet, RunData
from diag.report.thresholds import (
    CPU_LINK_REACHED,
    CPU_MIN_SAMPLES,
    CPU_PINNED_PCT,
    CPU_PINNED_SHARE,
    CPU_SATURATED_PCT,
    CPU_STARVED_LINK_SHARE,
    QUOTA_THROTTLED_SHARE,
    used,
)
from diag.units import human_rate

# The fingerprint key (anywhere in it) that gives a node's CPU allowance in cores where a quota caps it below its
# CPU count (a cgroup's CFS quota): its ranks using all of it are saturated though the machine is not.
CPU_QUOTA_KEY = "cpu_quota_cores"


def saturated(hosts: dict[str, HostCpu]) -> list[tuple[HostCpu, float]]:
    """(samples, share of saturated samples) of the runs whose machine had every core busy, by tag."""
    out = []
    for machine in hosts.values():
        if len(machine.busy_pct) < CPU_MIN_SAMPLES.value:
            continue
        share = sum(1 for pct in machine.busy_pct if pct >= CPU_SATURATED_PCT.value) / len(machine.busy_pct)
        if share >= CPU_PINNED_SHARE.value:
            out.append((machine, share))
    return out


def pinned(threads: list[ThreadCpu]) -> list[tuple[ThreadCpu, float]]:
    """(thread, share of its samples at a full core) of the threads pinned there."""
    out = []
    for thread in threads:
        if len(thread.cpu_pct) >= CPU_MIN_SAMPLES.value:
            share = sum(1 for pct in thread.cpu_pct if pct >= CPU_PINNED_PCT.value) / len(thread.cpu_pct)
            if share >= CPU_PINNED_SHARE.value:
                out.append((thread, share))
    return out


def cpu_limited_world_sizes(run: RunData) -> set[int]:
    """The N at which the CPU rather than the link set the pace: every core busy, and raw TCP or the iperf3
    ring pattern at that N (if any) short of CPU_LINK_REACHED of the link. Rows at these N understate what the
    network does."""
    reach = machine_link_reach(run)
    limited = set()
    for machine, _share in saturated(host_cpu(run)):
        n = run.captures[machine.tag].world_size
        if n is not None and (reach.get(n) is None or reach[n] < CPU_LINK_REACHED.value):
            limited.add(n)
    return limited


def unjudged(run: RunData) -> list[Finding]:
    """cpu_bound's readings before they are judged against a measured loss."""
    return run.remember("cpu_bound", lambda: per_node(run) if run.nodes else one_point(run, run.captures))


def starved_nodes(run: RunData) -> set[str]:
    """The nodes cpu_bound finds CPU-starved (their CPU full while their link idled): a slow edge of theirs in
    the link matrix may be their CPU, not their link (the probe's tools ran on that CPU too)."""
    findings = unjudged(run)
    return {str(e.values["node"]) for f in findings if f.status == "fired" for e in f.evidence
            if e.values.get("kind") == "starved" and e.values.get("node")}


def one_point(run: RunData, captures: dict[str, CaptureSet], threads_too: bool = True,
              machine: str = "the machine") -> list[Finding]:
    """cpu_bound on one capture point's samples: ``machine`` names whose CPUs cpu_host counts."""
    name = "cpu_bound"
    limits = (CPU_PINNED_PCT, CPU_PINNED_SHARE, CPU_SATURATED_PCT)
    thresholds = used(*limits)
    threads = threads_of(captures.values()) if threads_too else []
    hosts = machines_of(captures.values())
    if not threads and not hosts:
        return undecided(name, "no per-thread CPU samples (observe/*.jsonl): cannot tell CPU-bound from "
                         "network-bound", *limits)
    hits: list[Evidence] = []
    carried: dict[int, float] = {}
    machine_reach = machine_link_reach(run)
    raw_reach = raw_link_reach(run)
    for busy, share in saturated(hosts):
        capture = captures[busy.tag]
        reach = machine_reach.get(capture.world_size) if capture.world_size is not None else None
        if reach is not None and reach >= CPU_LINK_REACHED.value:
            carried[capture.world_size] = reach  # busy, yet raw TCP (and iperf3's ring) fill the link at this N
            continue
        raw = raw_reach.get(capture.world_size) if capture.world_size is not None else None
        raw_text = (f"; raw TCP reached {raw:.0%} of the link at N={capture.world_size}" if raw is not None
                    else "; no raw-TCP rows at this N to tell whether the link could be filled")
        raw_text += ring_pattern_text(run, capture.world_size, raw)
        hits.append(Evidence(
            f"{capture.label}: the {busy.cpus} CPUs of {machine} were >= {CPU_SATURATED_PCT.value:.0f}% busy in "
            f"{share:.0%} of {len(busy.busy_pct)} samples (median {busy.median_pct:.0f}%){raw_text}",
            {"share": share, "median_pct": busy.median_pct, "world_size": capture.world_size,
             "cpus": busy.cpus, "raw_link_share": raw, "machine_link_share": reach, "kind": "host"},
            capture.source("observe"),
            "cpu_threads.png"))
    for thread, share in pinned(threads):
        capture = captures[thread.tag]
        hits.append(Evidence(
            f"{capture.label}: thread {thread.name} (pid {thread.pid}, tid {thread.tid}) at >= "
            f"{CPU_PINNED_PCT.value:.0f}% of a core in {share:.0%} of {len(thread.cpu_pct)} samples "
            f"(median {thread.median_pct:.0f}%)",
            {"share": share, "median_pct": thread.median_pct, "world_size": capture.world_size,
             "thread": thread.name}, capture.source("observe"), "cpu_threads.png"))
    busy_note = ""
    if carried:
        who = "raw TCP and iperf3's ring pattern" if run.ring_pattern_Bps else "raw TCP"
        low, high = f"{min(carried.values()):.0%}", f"{max(carried.values()):.0%}"
        busy_note = (f"the CPUs of {machine} were busy at N={','.join(str(n) for n in sorted(carried))}, yet {who} "
                     f"reached {low if low == high else f'{low}-{high}'} of the link there, so the "
                     f"CPU could carry the traffic")
    thresholds[CPU_LINK_REACHED.name] = CPU_LINK_REACHED.value
    if not hits:
        return [Finding(name, "clear", f"no thread stays near {CPU_PINNED_PCT.value:.0f}% of a core"
                        + (f" and the CPUs of {machine} are not saturated (< {CPU_SATURATED_PCT.value:.0f}% busy)"
                           if hosts and not carried else "")
                        + (f"; {busy_note}" if busy_note else "") + ": not CPU-bound", thresholds=thresholds)]
    cpus = run.info.cpu_count
    saturated_ns = sorted({e.values["world_size"] for e in hits if e.values.get("kind") == "host"} - {None})
    pinned_threads = [e for e in hits if e.values.get("kind") != "host"]
    parts = []
    if saturated_ns:
        parts.append(f"every CPU of {machine} was busy at N={','.join(str(n) for n in saturated_ns)} and raw TCP "
                     f"did not fill the link there either: at those N the CPU, not the link, sets the pace "
                     f"(compare those rows with care)")
    if pinned_threads:
        parts.append(f"{len(pinned_threads)} thread(s) pinned near 100% of a core: those runs are CPU-bound, not "
                     f"network-bound" + (f" ({cpus} CPUs)" if cpus else ""))
    if busy_note:
        parts.append(busy_note)
    statement = "; ".join(parts)
    return [Finding(name, "fired", statement, "strong" if max(e.values["share"] for e in hits) >= 0.8 else "moderate",
                    tuple(hits[:20]), thresholds)]


def ring_pattern_text(run: RunData, world_size: int | None, raw_reach: float | None) -> str:
    """How raw TCP compares with the machine's own limit at N (the iperf3 ring pattern), where measured."""
    pattern_Bps = run.ring_pattern_Bps.get(world_size) if world_size is not None else None
    if pattern_Bps is None or not run.link_Bps:
        return ""
    text = (f"; the machine's own limit there, iperf3 in the same ring pattern, carried "
            f"{pattern_Bps / run.link_Bps:.0%} of the link per edge")
    if raw_reach is not None:
        text += f" and raw TCP reached {raw_reach * run.link_Bps / pattern_Bps:.0%} of that limit"
    return text


@dataclass(frozen=True)
class Saturation:
    """One sign that a node's CPU is full: its machine, its ranks against their quota, or a pinned thread."""

    capture: CaptureSet
    text: str
    share: float           # share of the samples at saturation


def per_node(run: RunData) -> list[Finding]:
    """cpu_bound with nodes: each node's saturation judged against what its NIC carried meanwhile (a CPU that
    is full while the link idles starves the link); a machine several nodes share judged once (one_point)."""
    name = "cpu_bound"
    limits = (CPU_PINNED_PCT, CPU_PINNED_SHARE, CPU_SATURATED_PCT, CPU_MIN_SAMPLES, CPU_STARVED_LINK_SHARE,
              QUOTA_THROTTLED_SHARE)
    thresholds = used(*limits)
    points = node_cpu(run)
    if not any(p.machines or p.threads for p in points):
        return undecided(name, "no per-thread or machine CPU samples on any node (nodes/*/observe/*.jsonl): cannot "
                         "tell CPU-bound from network-bound", *limits)
    shared = shared_machines(run)
    hits: list[Evidence] = []
    kept_up: list[str] = []
    for p in points:
        link = node_link_Bps(run, p.node)
        for signal in _signals(run, p, p.node in shared):
            nic = p.nic_Bps.get(signal.capture.tag)
            share = nic / link if nic is not None and link else None
            if share is not None and share >= CPU_STARVED_LINK_SHARE.value:
                kept_up.append(f"{p.node} ({signal.text}; its NIC carried {share:.0%} of its link)")
                continue
            link_text = (f", while its NIC carried {share:.0%} of its link ({human_rate(nic or 0)} of "
                         f"{human_rate(link or 0)})" if share is not None else
                         "; its NIC was not sampled, so whether its link waited is unknown")
            where = signal.capture.label.removeprefix(f"{p.node}: ")
            hits.append(Evidence(f"{p.node}: {signal.text} in {where}{link_text}",
                                 {"node": p.node, "kind": "starved" if share is not None else "saturated",
                                  "share": signal.share, "world_size": signal.capture.world_size, "link_share": share},
                                 signal.capture.source("observe"), "cpu_threads.png"))
    parts, strengths = [], []
    starved = sorted({str(e.values["node"]) for e in hits if e.values["kind"] == "starved"})
    unknown = sorted({str(e.values["node"]) for e in hits if e.values["kind"] == "saturated"} - set(starved))
    if starved:
        parts.append(f"{', '.join(starved)}'s ranks are CPU-starved: the CPU was full while the link idled there "
                     f"(< {CPU_STARVED_LINK_SHARE.value:.0%} of its rate), so the link waits on the CPU")
        strengths.append("strong" if max(e.values["share"] for e in hits) >= 0.8 else "moderate")
    if unknown:
        parts.append(f"{', '.join(unknown)}'s CPU was full (its link use was not sampled)")
        strengths.append("weak")
    base = None
    if shared:
        first = next(n for n in run.nodes if n in shared)
        base = one_point(run, run.nodes[first].captures, threads_too=False,
                         machine=f"the machine {', '.join(shared[first])} share")[0]
        if base.status == "fired":
            parts.append(base.statement)
            strengths.append(base.strength)
            hits += base.evidence
    if kept_up:
        parts.append("busy but keeping its link up: " + "; ".join(kept_up))
    if not strengths:
        clear = "no node's CPU was full while its link idled" + (f"; {base.statement}" if base else "")
        return [Finding(name, "clear" if base is None or base.status != "undecided" else "undecided",
                        "; ".join([clear, *parts]), thresholds=thresholds)]
    strongest = min(strengths, key=STRENGTHS.index)
    return [Finding(name, "fired", "; ".join(parts), strongest, tuple(hits[:20]), thresholds)]


def shared_machines(run: RunData) -> dict[str, tuple[str, ...]]:
    """node -> the nodes on its machine, for machines that several nodes share (the same boot id in their
    fingerprints: the lab's namespaces, containers on one host). Their cpu_host samples are that machine's."""
    boots = {node: next((v for k, v in flatten(fp).items() if k.endswith("boot_id")), None)
             for node, fp in run.fingerprints().items()}
    count = Counter(b for b in boots.values() if b)
    return {node: tuple(n for n, b in boots.items() if b == boot) for node, boot in boots.items()
            if boot and count[boot] >= 2}


def _signals(run: RunData, point: NodeCpu, shared: bool) -> list[Saturation]:
    """The signs that this node's CPU was full: its own machine's samples (not where nodes share one), its
    ranks against a CPU quota its fingerprint records, and its pinned threads."""
    node = point.node or ""
    captures = run.nodes[node].captures if node in run.nodes else run.captures
    out = []
    if not shared:
        for busy, share in saturated(machines_of(captures.values())):
            out.append(Saturation(captures[busy.tag], f"its {busy.cpus} CPUs were >= {CPU_SATURATED_PCT.value:.0f}% "
                                  f"busy in {share:.0%} of {len(busy.busy_pct)} samples (median "
                                  f"{busy.median_pct:.0f}%)", share))
    quota = next((float(v) for k, v in flatten(run.fingerprints().get(node) or {}).items()
                  if k.endswith(CPU_QUOTA_KEY) and _number(v)), None)
    if quota:
        for tag, cores in point.ranks_cores.items():
            if len(cores) >= CPU_MIN_SAMPLES.value:
                share = sum(1 for c in cores if c >= CPU_SATURATED_PCT.value / 100 * quota) / len(cores)
                if share >= CPU_PINNED_SHARE.value:
                    out.append(Saturation(captures[tag], f"its ranks used >= {CPU_SATURATED_PCT.value:.0f}% of its "
                                          f"CPU quota ({quota:g} cores) in {share:.0%} of {len(cores)} samples", share))
    for tag, (cores, share, periods) in point.throttled.items():
        if share >= QUOTA_THROTTLED_SHARE.value:
            out.append(Saturation(captures[tag], f"its ranks' CPU quota ({cores:g} cores) ran out in {share:.0%} of "
                                  f"{periods} enforcement periods", share))
    for thread, share in pinned(threads_of(captures.values())):
        out.append(Saturation(captures[thread.tag], f"thread {thread.name} (pid {thread.pid}, tid {thread.tid}) at >= "
                              f"{CPU_PINNED_PCT.value:.0f}% of a core in {share:.0%} of {len(thread.cpu_pct)} samples",
                              share))
    return out


def _number(text: str) -> bool:
    try:
        return float(text) > 0
    except ValueError:
        return False

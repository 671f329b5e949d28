"""The CPU rule: a thread pinned at a full core, or every core of the machine busy where raw TCP could not
fill the link either."""

from __future__ import annotations

from diag.report.diagnose.base import undecided
from diag.report.diagnose.findings import Evidence, Finding
from diag.report.queries import HostCpu, host_cpu, machine_link_reach, raw_link_reach, thread_cpu
from diag.report.rundir import RunData
from diag.report.thresholds import (
    CPU_LINK_REACHED,
    CPU_MIN_SAMPLES,
    CPU_PINNED_PCT,
    CPU_PINNED_SHARE,
    CPU_SATURATED_PCT,
    used,
)


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


def cpu_bound(run: RunData) -> list[Finding]:
    """A thread near 100% of a core, or every core of the machine busy: the CPU, not the network, sets
    the pace."""
    name = "cpu_bound"
    limits = (CPU_PINNED_PCT, CPU_PINNED_SHARE, CPU_SATURATED_PCT)
    thresholds = used(*limits)
    threads = thread_cpu(run)
    hosts = host_cpu(run)
    if not threads and not hosts:
        return undecided(name, "no per-thread CPU samples (observe/*.jsonl): cannot tell CPU-bound from "
                         "network-bound", *limits)
    hits: list[Evidence] = []
    carried: dict[int, float] = {}
    machine_reach = machine_link_reach(run)
    raw_reach = raw_link_reach(run)
    for machine, share in saturated(hosts):
        capture = run.captures[machine.tag]
        reach = machine_reach.get(capture.world_size) if capture.world_size is not None else None
        if reach is not None and reach >= CPU_LINK_REACHED.value:
            carried[capture.world_size] = reach  # busy, yet raw TCP (and iperf3's ring) fill the link at this N
            continue
        raw = raw_reach.get(capture.world_size) if capture.world_size is not None else None
        raw_text = (f"; raw TCP reached {raw:.0%} of the link at N={capture.world_size}" if raw is not None
                    else "; no raw-TCP rows at this N to tell whether the link could be filled")
        raw_text += ring_pattern_text(run, capture.world_size, raw)
        hits.append(Evidence(
            f"{capture.label}: the machine's {machine.cpus} CPUs were >= {CPU_SATURATED_PCT.value:.0f}% busy in "
            f"{share:.0%} of {len(machine.busy_pct)} samples (median {machine.median_pct:.0f}%){raw_text}",
            {"share": share, "median_pct": machine.median_pct, "world_size": capture.world_size,
             "cpus": machine.cpus, "raw_link_share": raw, "machine_link_share": reach, "kind": "host"},
            f"observe/{machine.tag}.jsonl",
            "cpu_threads.png"))
    for thread in threads:
        if len(thread.cpu_pct) < CPU_MIN_SAMPLES.value:
            continue
        share = sum(1 for pct in thread.cpu_pct if pct >= CPU_PINNED_PCT.value) / len(thread.cpu_pct)
        if share >= CPU_PINNED_SHARE.value:
            capture = run.captures[thread.tag]
            hits.append(Evidence(
                f"{capture.label}: thread {thread.name} (pid {thread.pid}, tid {thread.tid}) at >= "
                f"{CPU_PINNED_PCT.value:.0f}% of a core in {share:.0%} of {len(thread.cpu_pct)} samples "
                f"(median {thread.median_pct:.0f}%)",
                {"share": share, "median_pct": thread.median_pct, "world_size": capture.world_size,
                 "thread": thread.name}, f"observe/{thread.tag}.jsonl", "cpu_threads.png"))
    busy_note = ""
    if carried:
        who = "raw TCP and iperf3's ring pattern" if run.ring_pattern_Bps else "raw TCP"
        low, high = f"{min(carried.values()):.0%}", f"{max(carried.values()):.0%}"
        busy_note = (f"the machine's CPUs were busy at N={','.join(str(n) for n in sorted(carried))}, yet {who} "
                     f"reached {low if low == high else f'{low}-{high}'} of the link there, so the "
                     f"CPU could carry the traffic")
    thresholds[CPU_LINK_REACHED.name] = CPU_LINK_REACHED.value
    if not hits:
        return [Finding(name, "clear", f"no thread stays near {CPU_PINNED_PCT.value:.0f}% of a core"
                        + (f" and the machine's CPUs are not saturated (< {CPU_SATURATED_PCT.value:.0f}% busy)"
                           if hosts and not carried else "")
                        + (f"; {busy_note}" if busy_note else "") + ": not CPU-bound", thresholds=thresholds)]
    cpus = run.info.cpu_count
    saturated_ns = sorted({e.values["world_size"] for e in hits if e.values.get("kind") == "host"} - {None})
    pinned = [e for e in hits if e.values.get("kind") != "host"]
    parts = []
    if saturated_ns:
        parts.append(f"every CPU of the machine was busy at N={','.join(str(n) for n in saturated_ns)} and raw TCP "
                     f"did not fill the link there either: at those N the CPU, not the link, sets the pace "
                     f"(compare those rows with care)")
    if pinned:
        parts.append(f"{len(pinned)} thread(s) pinned near 100% of a core: those runs are CPU-bound, not "
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

"""What `diag lab up` and `diag lab status` report: the lab's hosts, the qdiscs actually on each link, and
optional link measurements; and which labs exist (by the namespace naming rule of diag.lab.config)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from diag.lab.config import DEFAULT_NAME, lab_name_of
from diag.lab.topology import Lab


def lab_names_present() -> list[str]:
    """Labs with namespaces, cpu cgroups or state files on this machine (also those of a crashed `up`)."""
    import os

    from diag.lab.cgroups import find_cpu_controller, lab_cgroups
    from diag.lab.netns import list_netns
    from diag.lab.state import known_lab_names

    found = {name for ns in list_netns() if (name := lab_name_of(ns)) is not None}
    leftover = lab_cgroups(find_cpu_controller(), lambda cgroup: lab_name_of(cgroup) is not None)
    found |= {name for path in leftover if (name := lab_name_of(os.path.basename(path))) is not None}
    return sorted(found | set(known_lab_names()))


def status_report(lab: Lab, measure: bool = False, tool: str = "auto", between: tuple[str, str] = ("h0", "h1"),
                  seconds: float = 2.0, ring_sizes: Sequence[int] = ()) -> dict[str, Any]:
    """The lab, the qdiscs on every link, (measure) TCP goodput between two hosts with each tool, and (ring
    sizes) iperf3 in the ring's flow pattern at each of those host counts."""
    from diag.lab.measure import iperf3_available, measure_link, measure_ring_pattern
    from diag.lab.topology import host_settings

    report: dict[str, Any] = {"lab": lab.to_json(), "links": links(lab), "measurements": [], "ring_pattern": [],
                              "hosts": {host.name: host_settings(lab, host) for host in lab.hosts}}
    if measure:
        tools = {"auto": ["socket", *(["iperf3"] if iperf3_available() else [])],
                 "socket": ["socket"], "iperf3": ["iperf3"]}[tool]
        a, b = (lab.host(which) for which in between)
        for name in tools:
            result = measure_link(lab, a.index, b.index, seconds=seconds, tool=name)
            report["measurements"].append({"a": a.name, "b": b.name, **result.to_json()})
    for world_size in ring_sizes:
        report["ring_pattern"].append(measure_ring_pattern(lab, world_size, seconds=seconds).to_json())
    return report


def format_status(lab: Lab, report: dict[str, Any], tool: str = "auto") -> str:
    lines = [format_lab(lab, report["links"], report.get("hosts"))]
    lines += [format_measurement(lab, measured) for measured in report["measurements"]]
    lines += [format_ring_pattern(lab, pattern) for pattern in report.get("ring_pattern", [])]
    if report["measurements"] and "iperf3" not in [m["tool"] for m in report["measurements"]] and tool == "auto":
        lines.append("  (iperf3 not installed: measured with diag's own sockets only)")
    return "\n".join(lines)


def links(lab: Any) -> list[dict[str, Any]]:
    from diag.lab.shaping import read_qdiscs

    links = []
    for host in lab.hosts:
        links.append({
            "host": host.name,
            "tx": [q.to_json() for q in read_qdiscs(host.netns, host.iface)],
            "rx": [q.to_json() for q in read_qdiscs(lab.switch_netns, host.switch_port)],
        })
    return links


def format_lab(lab: Any, links: list[dict[str, Any]] | None = None,
               settings: dict[str, dict[str, Any]] | None = None) -> str:
    """The lab in a few lines: one per host, with its qdiscs (links) and, for a host with a fault, what it
    was asked to do differently and what it has now (settings: topology.host_settings per host name)."""
    from diag.units import human_bytes, human_rate, shaped_rate

    config = lab.config
    extras = [f"mtu {config.mtu}", f"burst {lab.burst_bytes} B", f"switch queue {human_bytes(lab.queue_limit_bytes)}",
              "offloads " + ("on" if config.offloads else "off")]
    if config.delay:
        extras.append(f"delay {config.delay}")
    if config.loss:
        extras.append(f"loss {config.loss}")
    lines = [f"lab {lab.name}: {len(lab.hosts)} hosts, {shaped_rate(lab.rate_bps)} full duplex per host "
             f"(TCP goodput at most {human_rate(lab.expected_goodput_Bps)} each way), {', '.join(extras)}"]
    by_host = {link["host"]: link for link in links or []}
    for host in lab.hosts:
        line = f"  {host.name:<4} {host.address + '/' + str(host.prefix_len):<15} {host.iface} in {host.netns}"
        link = by_host.get(host.name)
        if link is not None:
            line += f"   tx: {qdisc_text(link['tx'])}   rx: {qdisc_text(link['rx'])}"
        lines.append(line)
        fault = config.fault_for(host.index)
        if fault is not None:
            lines.append(f"       fault: {fault.describe()}" + fault_readback(settings.get(host.name) if settings
                                                                              else None))
    if config.scenario is not None:
        lines.append(f"  scenario {config.scenario.name}: imitates {config.scenario.imitates}")
    lines.append(f"  run a command on a host: diag lab exec{name_flag(lab.name)} h0 -- CMD ; "
                 f"remove: diag lab down{name_flag(lab.name)}")
    return "\n".join(lines)


def fault_readback(settings: dict[str, Any] | None) -> str:
    """'  (now: mtu 9000, net.ipv4.tcp_congestion_control reno, cpu 0.3 x 1 process, throttled 2.1 s)'."""
    if not settings:
        return ""
    parts = [f"mtu {settings['mtu']}"]
    parts += [f"{name.rsplit('.', 1)[1]} {value}" for name, value in settings["sysctls"].items()]
    if settings.get("cpu_cgroup"):
        cpus = settings.get("cpus")
        parts.append(f"cpu {cpus:g}" if cpus else "cpu unlimited")
        parts.append(f"{settings.get('cgroup_pids', 0)} processes in {settings['cpu_cgroup']}")
        if settings.get("throttled_s") is not None:
            parts.append(f"throttled {settings['throttled_s']:.1f} s")
    return "  (now: " + ", ".join(parts) + ")"


def qdisc_text(qdiscs: list[dict[str, Any]]) -> str:
    from diag.units import shaped_rate

    if not qdiscs:
        return "NONE (unshaped!)"
    parts = []
    for q in qdiscs:
        text = q["kind"]
        if q.get("rate_bps"):
            text += f" {shaped_rate(q['rate_bps'])} burst {q.get('burst_bytes')}"
            if q.get("limit_bytes"):
                text += f" limit {q['limit_bytes']}"
        if q.get("kind") == "netem":
            text += " " + " ".join(f"{k}={v}" for k, v in q["options"].items() if k in ("delay", "loss", "limit"))
        if q.get("drops"):
            text += f" drops {q['drops']}"
        parts.append(text)
    return " > ".join(parts)


def format_measurement(lab: Any, measured: dict[str, Any]) -> str:
    from diag.units import human_bits

    expected = lab.expected_goodput_between(measured["a"], measured["b"])   # a host's fault may lower it
    single = measured["single_stream_Bps"]
    forward, backward = measured["bidir_Bps"]
    return "\n".join([
        f"  measured with {measured['tool']} ({measured['seconds']:g} s each), TCP goodput:",
        f"    {measured['a']} -> {measured['b']} alone:  {human_bits(single * 8)} "
        f"({100 * single / expected:.1f}% of the {human_bits(expected * 8)} bound)",
        f"    both ways at once:  {measured['a']} -> {measured['b']} {human_bits(forward * 8)} "
        f"({100 * forward / expected:.1f}%), {measured['b']} -> {measured['a']} {human_bits(backward * 8)} "
        f"({100 * backward / expected:.1f}%)  (ACKs share each direction: ~3% less is expected)"])


def name_flag(name: str) -> str:
    return "" if name == DEFAULT_NAME else f" --name {name}"


def format_ring_pattern(lab: Any, pattern: dict[str, Any]) -> str:
    from diag.units import human_bits

    expected = lab.expected_goodput_Bps
    flows = ", ".join(f"{flow['sender']}->{flow['receiver']} {human_bits(flow['goodput_Bps'] * 8)}"
                      for flow in pattern["flows"])
    return (f"  ring of {pattern['world_size']} with {pattern['tool']} ({pattern['seconds']:g} s, every edge at "
            f"once): mean {human_bits(pattern['mean_edge_Bps'] * 8)} per edge "
            f"({100 * pattern['mean_edge_Bps'] / expected:.1f}% of the bound), slowest "
            f"{human_bits(pattern['min_edge_Bps'] * 8)}: {flows}")

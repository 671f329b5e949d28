"""tc shaping of one host link: tbf for the rate (optionally netem under it), and reading it back.

Each host link is shaped on both egresses: the host's own ``eth0`` (host TX, inside the host namespace)
and the switch port facing the host (host RX, inside the switch namespace). Egress is where Linux queues,
so two tbf qdiscs make one full-duplex NIC of the given rate, each direction with its own queue.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from diag.errors import DiagError
from diag.lab import netns as ns_tools
from diag.lab.config import ETH_WIRE_OVERHEAD_BYTES, LabConfig, parse_delay_s, parse_loss_pct

TBF_HANDLE = "1:"
NETEM_HANDLE = "10:"
NETEM_PROBE_IFACE = "diagprobe0"


def tbf_line(iface: str, config: LabConfig, host_side: bool = False) -> str:
    """One 'tc -batch' line: the rate limiter on iface's egress (host TX: a NIC's queue; switch port: the
    switch's buffer, where --queue-limit applies)."""
    limit = config.host_tx_queue_bytes if host_side else config.effective_queue_limit_bytes
    return (f"qdisc replace dev {iface} root handle {TBF_HANDLE} tbf rate {int(config.rate_bps)}bit "
            f"burst {config.effective_burst_bytes} limit {limit} "
            f"overhead {ETH_WIRE_OVERHEAD_BYTES}")


def netem_line(iface: str, config: LabConfig) -> str | None:
    """netem under the host-TX tbf: --delay is the one-way delay between two hosts, --loss per path."""
    if config.delay is None and config.loss is None:
        return None
    parts = [f"qdisc add dev {iface} parent {TBF_HANDLE}1 handle {NETEM_HANDLE} netem"]
    delay_s = parse_delay_s(config.delay) if config.delay is not None else 0.0
    if config.delay is not None:
        parts.append(f"delay {delay_s * 1e6:.0f}us")
    if config.loss is not None:
        parts.append(f"loss {parse_loss_pct(config.loss)}%")
    # netem counts packets: hold a full queue plus everything in flight during the delay.
    in_flight = config.rate_bps / 8 * delay_s + config.effective_queue_limit_bytes
    parts.append(f"limit {max(1000, int(in_flight / config.frame_bytes) * 2)}")
    return " ".join(parts)


def kernel_has_netem(probe_netns: str) -> bool:
    """Try netem on a scratch veth inside probe_netns (the only reliable check: modules may autoload)."""
    ns_tools.ip_batch(probe_netns, [f"link add {NETEM_PROBE_IFACE} type veth peer name diagprobe1"])
    try:
        proc = ns_tools.run(["tc", "-n", probe_netns, "qdisc", "add", "dev", NETEM_PROBE_IFACE, "root",
                             "netem", "delay", "1ms"], check=False)
        return proc.returncode == 0
    finally:
        ns_tools.run(["ip", "-n", probe_netns, "link", "del", NETEM_PROBE_IFACE], check=False)


def require_netem(config: LabConfig, probe_netns: str) -> None:
    if config.delay is None and config.loss is None:
        return
    if not kernel_has_netem(probe_netns):
        asked = " and ".join(flag for flag, value in (("--delay", config.delay), ("--loss", config.loss)) if value)
        raise DiagError(
            f"{asked} needs the netem qdisc, which this kernel lacks (try: modprobe sch_netem); "
            f"what works here: --rate and --queue-limit BYTES (tbf tail drops), so drop {asked} "
            "or use a kernel with netem"
        )


def offload_argv(iface: str) -> list[str]:
    """ethtool arguments that make the veth carry MTU-sized frames, as a real wire does."""
    return ["ethtool", "-K", iface, "tso", "off", "gso", "off", "gro", "off"]


@dataclass(frozen=True)
class QdiscInfo:
    """One qdisc as tc reports it (tc -j -s qdisc)."""

    netns: str
    iface: str
    kind: str
    handle: str
    parent: str
    rate_bps: float | None
    burst_bytes: int | None
    overhead_bytes: int | None
    options: dict[str, Any]
    sent_bytes: int | None
    drops: int | None
    backlog_bytes: int | None

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def read_qdiscs(netns: str, iface: str) -> list[QdiscInfo]:
    proc = ns_tools.run(["tc", "-n", netns, "-j", "-s", "qdisc", "show", "dev", iface], check=False)
    if proc.returncode != 0:
        return []
    return parse_qdiscs(netns, iface, proc.stdout)


def parse_qdiscs(netns: str, iface: str, tc_json: str) -> list[QdiscInfo]:
    """Parse `tc -j -s qdisc show` output. tc reports tbf's rate in bytes per second."""
    try:
        entries = json.loads(tc_json or "[]")
    except ValueError:
        return []
    qdiscs = []
    for entry in entries:
        options = entry.get("options") or {}
        rate = options.get("rate")
        qdiscs.append(QdiscInfo(
            netns=netns,
            iface=iface,
            kind=str(entry.get("kind", "?")),
            handle=str(entry.get("handle", "")),
            parent="root" if entry.get("root") else str(entry.get("parent", "")),
            rate_bps=float(rate) * 8 if isinstance(rate, (int, float)) else None,
            burst_bytes=options.get("burst"),
            overhead_bytes=options.get("overhead"),
            options=options,
            sent_bytes=entry.get("bytes"),
            drops=entry.get("drops"),
            backlog_bytes=entry.get("backlog"),
        ))
    return qdiscs

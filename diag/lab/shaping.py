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
from diag.lab.config import ETH_WIRE_OVERHEAD_BYTES, HostShape, LabConfig, parse_delay_s, parse_loss_pct

TBF_HANDLE = "1:"
NETEM_HANDLE = "10:"
NETEM_PROBE_IFACE = "diagprobe0"


def tbf_line(iface: str, shape: HostShape, host_side: bool = False) -> str:
    """One 'tc -batch' line: the rate limiter on iface's egress of one host's link (host TX: its NIC's
    queue; switch port: the switch's buffer toward it, where --queue-limit and rx-queue apply)."""
    limit = shape.tx_queue_bytes if host_side else shape.rx_queue_bytes
    return (f"qdisc replace dev {iface} root handle {TBF_HANDLE} tbf rate {int(shape.rate_bps)}bit "
            f"burst {shape.burst_bytes} limit {limit} "
            f"overhead {ETH_WIRE_OVERHEAD_BYTES}")


def limit_tolerance_bytes(limit_bytes: int, rate_bps: float) -> float:
    """How far a tbf limit read back may lie from the one asked: tc reports it as a latency in whole
    microseconds (and rounds the burst to its clock ticks), so ~2 us of the rate plus a little."""
    return 0.01 * limit_bytes + 2e-6 * rate_bps / 8 + 256


def netem_line(iface: str, config: LabConfig, shape: HostShape | None = None) -> str | None:
    """netem under the host-TX tbf: --delay is the one-way delay between two hosts, --loss per path.
    shape: the host's own link (its rate and queue size netem's packet limit), else the lab's."""
    if config.delay is None and config.loss is None:
        return None
    parts = [f"qdisc add dev {iface} parent {TBF_HANDLE}1 handle {NETEM_HANDLE} netem"]
    delay_s = parse_delay_s(config.delay) if config.delay is not None else 0.0
    if config.delay is not None:
        parts.append(f"delay {delay_s * 1e6:.0f}us")
    if config.loss is not None:
        parts.append(f"loss {parse_loss_pct(config.loss)}%")
    # netem counts packets: hold a full queue plus everything in flight during the delay.
    rate_bps = shape.rate_bps if shape else config.rate_bps
    queue = shape.rx_queue_bytes if shape else config.effective_queue_limit_bytes
    frame = shape.frame_bytes if shape else config.frame_bytes
    in_flight = rate_bps / 8 * delay_s + queue
    parts.append(f"limit {max(1000, int(in_flight / frame) * 2)}")
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

    @property
    def limit_bytes(self) -> int | None:
        """tbf's queue limit. tc prints it as "limit" only when the queue's latency would be negative (limit
        below the burst); otherwise as "lat", the time a full queue takes to drain: limit = lat x rate +
        burst (tc's tbf_print, in reverse; lat in microseconds)."""
        if self.kind != "tbf":
            return None
        if isinstance(self.options.get("limit"), int):
            return int(self.options["limit"])
        lat_us, burst = self.options.get("lat"), self.burst_bytes
        if not isinstance(lat_us, (int, float)) or self.rate_bps is None or burst is None:
            return None
        return round(lat_us * 1e-6 * self.rate_bps / 8 + burst)

    def to_json(self) -> dict[str, Any]:
        return {**self.__dict__, "limit_bytes": self.limit_bytes}


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

"""What a lab is asked to be (LabConfig) and the shaping numbers derived from it.

Pure code: no root, no subprocesses, so every rule here is tested without namespaces.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from diag.errors import DiagError
from diag.lab.faults import (
    HostFault,
    ScenarioLabel,
    expand_all,
    load_scenario,
    merge_faults,
    override_faults,
    parse_fault,
)
from diag.units import parse_rate_bps

MAX_HOSTS = 64                  # every host is a namespace + veth pair; 64 already outruns 2-core sweeps
MIN_MTU, MAX_MTU = 576, 9000    # IPv4 minimum datagram .. jumbo frames
RATE_RANGE_BPS = (1e5, 100e9)   # 100kbit .. 100gbit: what tbf shapes faithfully
# A lab name: 1..MAX_NAME_LEN of a-z, 0-9, _ (starting with a letter or digit). Short, so its namespace and
# interface names stay unambiguous. Always checked with fullmatch: "$" in a pattern also matches before a
# final newline, and "zzq\n" would split an `ip -batch` line. The namespace rule below reuses this pattern,
# so every namespace a lab could create is one whose lab name `lab down --all` accepts, and no other.
MAX_NAME_LEN = 12
NAME_PATTERN = rf"[a-z0-9][a-z0-9_]{{0,{MAX_NAME_LEN - 1}}}"
NAME_RE = re.compile(NAME_PATTERN)

ETH_HEADER_BYTES = 14           # what tbf counts per frame besides the IP packet (veth skb->len)
# Preamble 7 + SFD 1 + inter-frame gap 12 + FCS 4: bytes a real Ethernet wire spends per frame that a veth
# never sees. tbf's "overhead" adds them per packet, so "--rate 1gbit" means the goodput of a 1GbE port.
ETH_WIRE_OVERHEAD_BYTES = 24
TCP_IP_HEADER_BYTES = 20 + 20 + 12   # IPv4 + TCP + the timestamp option Linux sends by default

# tbf bucket: the smallest that still sustains the rate on a loaded 2-core VM. Measured here at 200mbit:
# 4000 B (2.6 frames) reached 97% of the TCP goodput bound, 8000 B and more 99.9%. A bucket of
# BURST_TIME_S of line rate, at least BURST_MIN_FRAMES frames, keeps small transfers close to real wire
# time (a transfer smaller than the bucket leaves at veth speed; see docs/lab.md).
BURST_MIN_FRAMES = 8
BURST_TIME_S = 100e-6
# Per-direction queue when --queue-limit is not given: QUEUE_TIME_S of line rate, at least
# QUEUE_MIN_BYTES -- the order of a switch port buffer; TCP fills it before it tail-drops.
QUEUE_TIME_S = 5e-3
QUEUE_MIN_BYTES = 64 * 1024
# The host's own transmit queue (host TX tbf) holds a NIC's default txqueuelen of frames. On a real host
# TCP is throttled by its own qdisc and driver (TCP small queues, BQL) before that queue overflows, so
# the sender almost never drops its own packets; a switch-sized queue there made the sender tail-drop
# thousands of its own segments a second (iperf3 --bidir at 200mbit: ~3600 retransmissions in 3 s with
# 122 KiB, none with 1 MB) -- losses no real NIC shows. --queue-limit sets the switch port (host RX).
HOST_TX_QUEUE_FRAMES = 1000

SUBNET_PREFIX = "10.77.0."      # host i is SUBNET_PREFIX + (i + 1), /24, inside the lab's namespaces only
SUBNET_BITS = 24


def check_lab_name(name: object) -> str:
    """``name`` if it is a valid lab name, else DiagError with the rule."""
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise DiagError(f"bad lab name {name!r}: use 1-{MAX_NAME_LEN} of a-z, 0-9, _ (starting with a letter or "
                        "digit)")
    return name


@dataclass(frozen=True)
class LabConfig:
    """A lab as asked for. ``rate`` is a tc-style string ("1gbit") or bits per second."""

    name: str = "diag"
    hosts: int = 2
    rate: str | float = "1gbit"
    queue_limit_bytes: int | None = None
    delay: str | None = None            # netem one-way delay between any two hosts, e.g. "100us"
    loss: str | None = None             # netem loss per packet and path, e.g. "0.1%"
    mtu: int = 1500
    burst_bytes: int | None = None      # None: see burst_for()
    offloads: bool = False              # False: TSO/GSO/GRO off, so the wire carries MTU-sized frames
    faults: tuple[HostFault, ...] = ()  # per-host differences (diag/lab/faults.py), one per host, host order
    scenario: ScenarioLabel | None = None   # the scenario file the faults came from, if any

    def validated(self) -> LabConfig:
        """Check every field; raise DiagError with one line that says what to fix."""
        check_lab_name(self.name)
        if isinstance(self.hosts, bool) or not isinstance(self.hosts, int):
            raise DiagError(f"--hosts must be a whole number, got {self.hosts!r}")
        if not 2 <= self.hosts <= MAX_HOSTS:
            raise DiagError(f"--hosts must be between 2 and {MAX_HOSTS}, got {self.hosts}")
        rate_bps = self.rate_bps
        if not RATE_RANGE_BPS[0] <= rate_bps <= RATE_RANGE_BPS[1]:
            raise DiagError(f"--rate {self.rate!r} is outside 100kbit..100gbit")
        if not MIN_MTU <= int(self.mtu) <= MAX_MTU:
            raise DiagError(f"--mtu must be between {MIN_MTU} and {MAX_MTU}, got {self.mtu}")
        if self.queue_limit_bytes is not None and self.queue_limit_bytes < 2 * self.frame_bytes:
            raise DiagError(f"--queue-limit {self.queue_limit_bytes} is below two frames ({2 * self.frame_bytes} bytes)")
        if self.burst_bytes is not None and self.burst_bytes < self.frame_bytes:
            raise DiagError(f"--burst {self.burst_bytes} is below one frame ({self.frame_bytes} bytes)")
        if self.delay is not None:
            parse_delay_s(self.delay)
        if self.loss is not None:
            parse_loss_pct(self.loss)
        self._validate_faults()
        return self

    def _validate_faults(self) -> None:
        """The rules a fault needs the lab for: its host exists, its rate/MTU are in range, its queues hold
        two of its frames and its frames fit an explicit --burst."""
        seen: set[str] = set()
        for fault in self.faults:
            where = f"fault {fault.host}"
            if fault.host in seen:
                raise DiagError(f"{where}: the host has two fault entries; merge them into one")
            seen.add(fault.host)
            if fault.index >= self.hosts:
                raise DiagError(f"{where}: the lab has hosts h0..h{self.hosts - 1} (--hosts {self.hosts}); "
                                f"add hosts or fault one of those")
            if not fault.asked():
                raise DiagError(f"{where}: says nothing; give at least one KEY=VALUE")
            shape = self.host_shape(fault.index)
            if not RATE_RANGE_BPS[0] <= shape.rate_bps <= RATE_RANGE_BPS[1]:
                raise DiagError(f"{where}: rate {fault.rate} makes {shape.rate_bps:.0f} bit/s, outside "
                                "100kbit..100gbit")
            if not MIN_MTU <= shape.mtu <= MAX_MTU:
                raise DiagError(f"{where}: mtu must be between {MIN_MTU} and {MAX_MTU}, got {shape.mtu}")
            for key, queue in (("rx-queue", fault.rx_queue_bytes), ("tx-queue", fault.tx_queue_bytes)):
                if queue is not None and queue < 2 * shape.frame_bytes:
                    raise DiagError(f"{where}: {key} {queue} is below two of its frames ({2 * shape.frame_bytes} "
                                    "bytes)")
            if self.burst_bytes is not None and self.burst_bytes < shape.frame_bytes:
                raise DiagError(f"{where}: --burst {self.burst_bytes} is below one of its frames "
                                f"({shape.frame_bytes} bytes at mtu {shape.mtu})")

    def with_faults(self, fault_args: Sequence[str] = (), scenario: str | None = None,
                    flag: str = "--fault", scenario_flag: str = "--scenario") -> LabConfig:
        """This config with the faults of a scenario (a file or a built-in name) and of repeated
        ``HOST:KEY=VALUE[,KEY=VALUE]`` arguments, validated. A key an argument sets overrides the scenario's;
        a key given twice among the arguments is an error. What ``diag lab up --fault/--scenario`` and
        ``diag reproduce --lab-fault`` call (flag and scenario_flag name the caller's options in errors)."""
        label, base = self.scenario, self.faults
        if scenario is not None:
            loaded = load_scenario(scenario, scenario_flag)
            label, base = loaded.label, override_faults(self.faults, loaded.faults)
        given = merge_faults((parse_fault(text, flag) for text in fault_args), flag)
        faults = expand_all(override_faults(base, given), self.hosts)
        return replace(self, faults=faults, scenario=label).validated()

    def fault_for(self, index: int) -> HostFault | None:
        return next((fault for fault in self.faults if fault.index == index), None)

    def expected_goodput_between(self, a: int, b: int) -> float:
        """One TCP stream's payload rate between hosts a and b (indices): the slower of their two links, at
        the smaller MTU (the MSS both SYNs agree on); expected_goodput_Bps where neither has a fault."""
        slower = min((self.host_shape(a), self.host_shape(b)), key=lambda shape: shape.rate_bps)
        mtu = min(self.host_shape(a).mtu, self.host_shape(b).mtu)
        return replace(self, rate=slower.rate_bps, mtu=mtu, faults=()).expected_goodput_Bps

    def host_shape(self, index: int) -> HostShape:
        """Host `index`'s link as built: the lab's numbers, with its fault's rate, MTU and queues."""
        fault = self.fault_for(index)
        own = self
        if fault is not None:
            rate: str | float = self.rate
            if isinstance(fault.rate, str) and fault.rate.strip().endswith("%"):
                rate = self.rate_bps * float(fault.rate.strip()[:-1]) / 100
            elif fault.rate is not None:
                rate = fault.rate
            own = replace(self, rate=rate, mtu=fault.mtu if fault.mtu is not None else self.mtu,
                          queue_limit_bytes=(fault.rx_queue_bytes if fault.rx_queue_bytes is not None
                                             else self.queue_limit_bytes), faults=())
        tx_queue = fault.tx_queue_bytes if fault is not None and fault.tx_queue_bytes is not None else None
        return HostShape(rate_bps=own.rate_bps, mtu=int(own.mtu), frame_bytes=own.frame_bytes,
                         burst_bytes=own.effective_burst_bytes, rx_queue_bytes=own.effective_queue_limit_bytes,
                         tx_queue_bytes=tx_queue if tx_queue is not None else own.host_tx_queue_bytes,
                         expected_goodput_Bps=own.expected_goodput_Bps)

    @property
    def rate_bps(self) -> float:
        if isinstance(self.rate, bool):
            raise DiagError(f"bad rate {self.rate!r}: use e.g. 100mbit, 1gbit")
        if isinstance(self.rate, (int, float)):
            if self.rate <= 0:
                raise DiagError(f"rate {self.rate!r} must be positive")
            return float(self.rate)
        return parse_rate_bps(self.rate)

    @property
    def frame_bytes(self) -> int:
        """Largest frame as tbf counts it: IP MTU + Ethernet header + the wire overhead we add."""
        return int(self.mtu) + ETH_HEADER_BYTES + ETH_WIRE_OVERHEAD_BYTES

    @property
    def effective_burst_bytes(self) -> int:
        if self.burst_bytes is not None:
            return int(self.burst_bytes)
        return burst_for(self.rate_bps, self.frame_bytes)

    @property
    def effective_queue_limit_bytes(self) -> int:
        if self.queue_limit_bytes is not None:
            return int(self.queue_limit_bytes)
        return max(QUEUE_MIN_BYTES, int(self.rate_bps / 8 * QUEUE_TIME_S))

    @property
    def host_tx_queue_bytes(self) -> int:
        return max(self.effective_queue_limit_bytes, HOST_TX_QUEUE_FRAMES * self.frame_bytes)

    @property
    def expected_goodput_Bps(self) -> float:
        """TCP payload rate one direction can carry at this rate and MTU (what a perfect sender reaches)."""
        payload = int(self.mtu) - TCP_IP_HEADER_BYTES
        return self.rate_bps / 8 * payload / self.frame_bytes

    def shape_key(self) -> tuple[Any, ...]:
        """What the built lab depends on: "1gbit" and 1e9 are the same lab."""
        return (self.name, self.hosts, self.rate_bps, self.effective_queue_limit_bytes, self.delay, self.loss,
                int(self.mtu), self.effective_burst_bytes, self.offloads,
                tuple(fault.shape_key() for fault in self.faults))

    def to_json(self) -> dict[str, Any]:
        plain = asdict(replace(self, faults=(), scenario=None))
        return {**plain, "faults": [fault.to_json() for fault in self.faults],
                "scenario": self.scenario.to_json() if self.scenario is not None else None}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LabConfig:
        known = {key: data[key] for key in cls.__dataclass_fields__ if key in data}
        known["faults"] = tuple(HostFault.from_json(fault) for fault in known.get("faults") or ())
        label = known.get("scenario")
        known["scenario"] = ScenarioLabel(**label) if isinstance(label, dict) else None
        return cls(**known)


@dataclass(frozen=True)
class HostShape:
    """One host's link as built (both tbfs, the MTU), from the lab's settings and the host's fault."""

    rate_bps: float
    mtu: int
    frame_bytes: int
    burst_bytes: int
    rx_queue_bytes: int             # its switch port's tbf limit: what it receives
    tx_queue_bytes: int             # its own eth0 tbf limit: what it sends
    expected_goodput_Bps: float     # one TCP stream's payload rate at this rate and MTU

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def burst_for(rate_bps: float, frame_bytes: int) -> int:
    return max(BURST_MIN_FRAMES * frame_bytes, int(rate_bps / 8 * BURST_TIME_S))


_DELAY_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(us|usec|ms|msec|s|sec)?\s*$")
_DELAY_UNITS = {None: 1e-6, "us": 1e-6, "usec": 1e-6, "ms": 1e-3, "msec": 1e-3, "s": 1.0, "sec": 1.0}


def parse_delay_s(text: str) -> float:
    """'100us' -> 1e-4 (a bare number is microseconds, as in tc)."""
    match = _DELAY_RE.match(str(text))
    if not match:
        raise DiagError(f"bad --delay {text!r}: use a time, e.g. 100us, 2ms")
    seconds = float(match.group(1)) * _DELAY_UNITS[match.group(2)]
    if seconds > 10:
        raise DiagError(f"--delay {text!r} is over 10 s")
    return seconds


def parse_loss_pct(text: str) -> float:
    """'0.1%' -> 0.1 (percent of packets)."""
    match = re.match(r"^\s*(\d+(?:\.\d+)?)\s*%?\s*$", str(text))
    if not match or float(match.group(1)) > 100:
        raise DiagError(f"bad --loss {text!r}: use a percentage between 0 and 100, e.g. 0.1%")
    return float(match.group(1))


def host_address(index: int) -> str:
    return f"{SUBNET_PREFIX}{index + 1}"


# The lab naming rule, in one place: lab NAME owns namespaces diag-NAME-sw (the switch) and diag-NAME-h<i>.
DEFAULT_NAME = "diag"
_NETNS_RE = re.compile(rf"diag-({NAME_PATTERN})-(?:sw|h\d+)")


def lab_name_of(netns: str) -> str | None:
    """The lab a namespace belongs to, or None for a namespace that is not a diag lab's."""
    match = _NETNS_RE.fullmatch(netns)
    return match.group(1) if match else None


def namespace_prefix(lab_name: str) -> str:
    return f"diag-{lab_name}-"


def host_netns(lab_name: str, index: int) -> str:
    return f"{namespace_prefix(lab_name)}h{index}"


def switch_netns(lab_name: str) -> str:
    return f"{namespace_prefix(lab_name)}sw"


def owns_netns(lab_name: str, netns: str) -> bool:
    """True for exactly this lab's namespaces: 'diag-a-h0' belongs to lab 'a', never to lab 'a_b'."""
    return lab_name_of(netns) == lab_name

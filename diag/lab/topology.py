"""Bring a lab up, find it again, tear it down.

Layout (nothing is created in the caller's namespace, so labs never clash with the machine or each other):

    diag-NAME-sw:  br0 (bridge) + ports h0..hN-1   -- tbf on each port's egress = host i's RX
    diag-NAME-hI:  lo + eth0 10.77.0.(I+1)/24       -- tbf on eth0's egress      = host i's TX

Each veth pair is created directly with one end in the switch namespace and the other in the host's,
so deleting the switch namespace alone destroys every link (and its qdiscs) of the lab.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from types import FrameType
from typing import Any

from diag.errors import DiagError
from diag.lab import netns as ns_tools
from diag.lab import shaping, state
from diag.lab.config import (
    SUBNET_BITS,
    LabConfig,
    check_lab_name,
    host_address,
    host_netns,
    owns_netns,
    switch_netns,
)

HOST_IFACE = "eth0"
BRIDGE = "br0"


@dataclass(frozen=True)
class LabHost:
    """One "machine" of the lab: a network namespace with one NIC."""

    name: str            # "h0"
    netns: str           # "diag-NAME-h0"
    address: str         # "10.77.0.1"
    iface: str           # "eth0" (inside netns)
    index: int = 0
    switch_port: str = ""   # the veth end in the switch namespace ("h0")
    prefix_len: int = SUBNET_BITS

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class Lab:
    """A lab that is up. Built only by bring_up/load_lab, from the state file."""

    name: str
    rate_bps: float
    hosts: list[LabHost]
    config: LabConfig
    switch_netns: str
    burst_bytes: int
    queue_limit_bytes: int
    created_ns: int = 0

    def exec_prefix(self, host: LabHost | int | str) -> list[str]:
        """argv prefix that runs a command on host: ["ip", "netns", "exec", netns]."""
        return ["ip", "netns", "exec", self.host(host).netns]

    def host(self, which: LabHost | int | str) -> LabHost:
        """A host by LabHost, index, name ("h1"), bare number ("1") or address."""
        if isinstance(which, LabHost):
            return which
        for host in self.hosts:
            if which in (host.index, host.name, host.address, host.netns) or str(which) == str(host.index):
                return host
        names = ", ".join(host.name for host in self.hosts)
        raise DiagError(f"lab {self.name} has no host {which!r}; its hosts are {names}")

    def host_env(self, host: LabHost | int | str) -> dict[str, str]:
        """Environment a rank on host needs so gloo/tensorpipe bind the lab NIC, not loopback."""
        chosen = self.host(host)
        return {"GLOO_SOCKET_IFNAME": chosen.iface, "TP_SOCKET_IFNAME": chosen.iface,
                "NCCL_SOCKET_IFNAME": chosen.iface, "MASTER_ADDR": self.hosts[0].address}

    @property
    def expected_goodput_Bps(self) -> float:
        return self.config.expected_goodput_Bps

    def to_json(self) -> dict[str, Any]:
        """The "lab" object of run.json: everything a report needs to describe the network."""
        return {
            "name": self.name,
            "rate_bps": self.rate_bps,
            "burst_bytes": self.burst_bytes,
            "queue_limit_bytes": self.queue_limit_bytes,
            "host_tx_queue_bytes": self.config.host_tx_queue_bytes,
            "mtu": self.config.mtu,
            "delay": self.config.delay,
            "loss": self.config.loss,
            "offloads": self.config.offloads,
            "expected_goodput_Bps": self.expected_goodput_Bps,
            "switch_netns": self.switch_netns,
            "hosts": [host.to_json() for host in self.hosts],
            "created_ns": self.created_ns,
            "config": self.config.to_json(),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Lab:
        return cls(
            name=data["name"],
            rate_bps=float(data["rate_bps"]),
            hosts=[LabHost(**host) for host in data["hosts"]],
            config=LabConfig.from_json(data["config"]),
            switch_netns=data["switch_netns"],
            burst_bytes=int(data["burst_bytes"]),
            queue_limit_bytes=int(data["queue_limit_bytes"]),
            created_ns=int(data.get("created_ns", 0)),
        )


def plan_lab(config: LabConfig) -> Lab:
    """The lab config describes, before anything exists (pure)."""
    hosts = [
        LabHost(name=f"h{i}", netns=host_netns(config.name, i), address=host_address(i), iface=HOST_IFACE,
                index=i, switch_port=f"h{i}")
        for i in range(config.hosts)
    ]
    return Lab(name=config.name, rate_bps=config.rate_bps, hosts=hosts, config=config,
               switch_netns=switch_netns(config.name), burst_bytes=config.effective_burst_bytes,
               queue_limit_bytes=config.effective_queue_limit_bytes, created_ns=time.time_ns())


def bring_up(config: LabConfig) -> Lab:
    """Create the lab, or return it unchanged if it is already up with the same config (idempotent).

    Leftovers of an interrupted or killed `up` are removed first. Any failure or Ctrl-C while building
    rolls back everything built so far.
    """
    config = config.validated()
    ns_tools.require_tools("ip", "tc", *([] if config.offloads else ["ethtool"]))
    ns_tools.require_privilege("diag lab up")
    with state.lab_lock(config.name):
        existing = _load_complete(config.name)
        if existing is not None:
            if existing.config.shape_key() == config.shape_key():
                return existing
            raise DiagError(
                f"lab {config.name} is already up with other settings ({describe(existing.config)}); "
                f"run: diag lab down --name {config.name}, or pick another --name"
            )
        if state.read_state(config.name) is not None or _present_netns(config.name):
            _remove_lab(config.name)     # leftovers of a crashed/killed up
        lab = plan_lab(config)
        # Written before the first namespace exists: a SIGKILL from here on still leaves `down` a map.
        state.write_state(config.name, {"status": "creating", "pid": os.getpid(), "lab": lab.to_json()})
        try:
            _build(lab)
            _verify_shaping(lab)
            made = [lab.switch_netns, *(host.netns for host in lab.hosts)]
            state.write_state(config.name, {"status": "up", "pid": os.getpid(), "lab": lab.to_json(),
                                            "netns_ids": _netns_ids(made)})
        except BaseException:
            with _signals_deferred():
                _remove_lab(config.name)
            raise
        return lab


def tear_down(name: str) -> None:
    """Remove every namespace, link and qdisc of lab `name` and its state; a no-op if there is none."""
    remove_lab(name)


def remove_lab(name: str) -> list[str]:
    """tear_down, returning the namespaces it deleted."""
    _check_name(name)
    ns_tools.require_tools("ip")
    if not _present_netns(name) and state.read_state(name) is None and state.state_path(name) is None:
        return []
    ns_tools.require_privilege("diag lab down")
    with state.lab_lock(name), _signals_deferred():
        return _remove_lab(name)


def load_lab(name: str) -> Lab:
    """The lab `name` as it is up now; DiagError with the command to run if it is not."""
    _check_name(name)
    saved = state.read_state(name)
    if saved is None or saved.get("status") != "up":
        raise DiagError(f"no lab named {name} is up; run: diag lab up --name {name} --hosts N --rate R"
                        if name != "diag" else "no lab named diag is up; run: diag lab up --hosts N --rate R")
    lab = Lab.from_json(saved["lab"])
    missing = [ns for ns in [lab.switch_netns, *(h.netns for h in lab.hosts)] if not ns_tools.netns_exists(ns)]
    if missing:
        raise DiagError(f"lab {name} is broken (namespace {missing[0]} is gone); "
                        f"run: diag lab down --name {name}, then diag lab up again")
    return lab


@contextlib.contextmanager
def lab_session(config: LabConfig) -> Iterator[Lab]:
    """Bring the lab up, yield it, and always tear it down (exceptions, Ctrl-C, SIGTERM included).

    The session owns the lab: a lab of the same name that was up before is torn down at the end too.
    """
    with _sigterm_as_keyboard_interrupt():
        lab = bring_up(config)
        try:
            yield lab
        finally:
            tear_down(config.name)


def describe(config: LabConfig) -> str:
    parts = [f"{config.hosts} hosts", f"rate {config.rate}", f"mtu {config.mtu}"]
    if config.queue_limit_bytes is not None:
        parts.append(f"queue-limit {config.queue_limit_bytes}")
    if config.delay:
        parts.append(f"delay {config.delay}")
    if config.loss:
        parts.append(f"loss {config.loss}")
    return ", ".join(parts)


# --- internals -------------------------------------------------------------------------------------------

def _check_name(name: str) -> None:
    check_lab_name(name)


def _present_netns(name: str) -> list[str]:
    return [ns for ns in ns_tools.list_netns() if owns_netns(name, ns)]


def _load_complete(name: str) -> Lab | None:
    saved = state.read_state(name)
    if saved is None or saved.get("status") != "up":
        return None
    try:
        lab = Lab.from_json(saved["lab"])
    except (KeyError, TypeError, ValueError):
        return None
    needed = [lab.switch_netns, *(host.netns for host in lab.hosts)]
    return lab if all(ns_tools.netns_exists(ns) for ns in needed) else None


def _netns_ids(names: list[str]) -> dict[str, list[int]]:
    """Namespace -> [device, inode] of its /run/netns entry: tells this lab's namespace from a later one
    of the same name (after a reboot, or one someone else made)."""
    ids = {}
    for netns in names:
        with contextlib.suppress(OSError):
            info = os.stat(os.path.join(ns_tools.NETNS_DIR, netns))
            ids[netns] = [info.st_dev, info.st_ino]
    return ids


def _remove_lab(name: str) -> list[str]:
    """Delete this lab's namespaces (and so their links, qdiscs and processes); then the state file.

    Only namespaces named as this lab's are ever touched, whatever a state file lists; and where the state
    recorded a namespace's identity when the lab was built, one with another identity is left alone.
    """
    saved = state.read_state(name) or {}
    listed: list[str] = []
    with contextlib.suppress(AttributeError, KeyError, TypeError, ValueError):
        described = saved["lab"]
        listed = [str(described["switch_netns"]), *(str(host["netns"]) for host in described["hosts"])]
    foreign = sorted(ns for ns in listed if not owns_netns(name, ns))
    if foreign:
        print(f"diag lab: warning: the state of lab {name} names namespaces that are not its own "
              f"({', '.join(foreign[:3])}); they were left alone", file=sys.stderr)
    recorded = saved.get("netns_ids") if isinstance(saved.get("netns_ids"), dict) else {}
    # The switch first: its deletion destroys every veth pair, so hosts lose their links at once.
    candidates = sorted({ns for ns in listed if owns_netns(name, ns)} | set(_present_netns(name)),
                        key=lambda ns: (not ns.endswith("-sw"), ns))
    removed = []
    for netns in candidates:
        if not ns_tools.netns_exists(netns):
            continue
        if netns in recorded and _netns_ids([netns]).get(netns) != recorded[netns]:
            print(f"diag lab: warning: namespace {netns} is not the one lab {name} made (recreated since); "
                  "left alone", file=sys.stderr)
            continue
        ns_tools.delete_netns(netns)
        removed.append(netns)
    state.remove_state(name)
    return removed


def _build(lab: Lab) -> None:
    config = lab.config
    all_netns = [lab.switch_netns, *(host.netns for host in lab.hosts)]
    ns_tools.ip_batch(None, [f"netns add {netns}" for netns in all_netns])
    shaping.require_netem(config, lab.switch_netns)

    mtu = int(config.mtu)
    switch_lines = [f"link add {BRIDGE} type bridge", f"link set {BRIDGE} addrgenmode none"]
    for host in lab.hosts:
        # addrgenmode none: no IPv6 link-local address, so no DAD/router solicitations on the wire.
        switch_lines += [
            f"link add {host.switch_port} mtu {mtu} type veth peer name {host.iface} mtu {mtu} netns {host.netns}",
            f"link set {host.switch_port} addrgenmode none",
            f"link set {host.switch_port} master {BRIDGE}",
            f"link set {host.switch_port} up",
        ]
    switch_lines.append(f"link set {BRIDGE} up")
    ns_tools.ip_batch(lab.switch_netns, switch_lines)
    for host in lab.hosts:
        ns_tools.ip_batch(host.netns, [
            "link set lo up",
            f"link set {host.iface} addrgenmode none",
            f"addr add {host.address}/{host.prefix_len} dev {host.iface}",
            f"link set {host.iface} up",
        ])

    if not config.offloads:
        for netns, iface in [(h.netns, h.iface) for h in lab.hosts] + [(lab.switch_netns, h.switch_port)
                                                                       for h in lab.hosts]:
            _run_in_netns(netns, shaping.offload_argv(iface))

    for host in lab.hosts:
        lines = [shaping.tbf_line(host.iface, config, host_side=True)]
        netem = shaping.netem_line(host.iface, config)
        if netem:
            lines.append(netem)
        ns_tools.tc_batch(host.netns, lines)
    ns_tools.tc_batch(lab.switch_netns, [shaping.tbf_line(host.switch_port, config) for host in lab.hosts])


def _run_in_netns(netns: str, argv: list[str]) -> None:
    """Run a short command inside netns: forked from a thread that joined it (cheaper than ip netns exec)."""
    ns_tools.call_in_netns(netns, lambda: ns_tools.run(argv), timeout_s=ns_tools.COMMAND_TIMEOUT_S + 5)


def _verify_shaping(lab: Lab) -> None:
    """Never hand out an unshaped link: read every tbf back and compare its rate."""
    links = [(h.netns, h.iface) for h in lab.hosts] + [(lab.switch_netns, h.switch_port) for h in lab.hosts]
    for netns, iface in links:
        tbfs = [q for q in shaping.read_qdiscs(netns, iface) if q.kind == "tbf" and q.parent == "root"]
        if not tbfs or tbfs[0].rate_bps is None or abs(tbfs[0].rate_bps - lab.rate_bps) > 0.01 * lab.rate_bps:
            got = f"{tbfs[0].rate_bps:.0f} bit/s" if tbfs and tbfs[0].rate_bps else "no tbf"
            raise DiagError(f"shaping of {iface} in {netns} did not take ({got}, asked {lab.rate_bps:.0f} bit/s)")


@contextlib.contextmanager
def _signals_deferred() -> Iterator[None]:
    """Let a cleanup finish: Ctrl-C/SIGTERM during it are held and re-raised afterwards (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []

    def hold(signum: int, _frame: FrameType | None) -> None:
        pending.append(signum)

    previous = {sig: signal.signal(sig, hold) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if pending:
            raise KeyboardInterrupt


@contextlib.contextmanager
def _sigterm_as_keyboard_interrupt() -> Iterator[None]:
    """SIGTERM would end Python without running finally blocks; turn it into KeyboardInterrupt meanwhile."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(_signum: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


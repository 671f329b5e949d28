"""Bring a lab up, find it again, tear it down.

Layout (nothing is created in the caller's namespace, so labs never clash with the machine or each other):

    diag-NAME-sw:  br0 (bridge) + ports h0..hN-1   -- tbf on each port's egress = host i's RX
    diag-NAME-hI:  lo + eth0 10.77.0.(I+1)/24       -- tbf on eth0's egress      = host i's TX

Each veth pair is created directly with one end in the switch namespace and the other in the host's,
so deleting the switch namespace alone destroys every link (and its qdiscs) of the lab.

A host may differ from the rest (LabConfig.faults, diag/lab/faults.py): its own rate and queues (its two
tbfs), MTU (its eth0 and its switch port), TCP sysctls (its namespace) and CPU quota (a cgroup named as its
namespace, which everything started through ``Lab.exec_prefix`` joins; diag/lab/cgroups.py).
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
from diag.lab import cgroups, shaping, state
from diag.lab import netns as ns_tools
from diag.lab.config import (
    SUBNET_BITS,
    HostShape,
    LabConfig,
    check_lab_name,
    host_address,
    host_netns,
    owns_netns,
    switch_netns,
)
from diag.lab.faults import KEY_NAMES, SYSCTLS

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
    cpu_cgroup: str | None = None   # the cgroup whatever runs on this host joins (a cpu= fault), else None

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LabHost:
        return cls(**{key: data[key] for key in cls.__dataclass_fields__ if key in data})


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
        """argv prefix that runs a command on host: ["ip", "netns", "exec", netns]; on a host with a cpu=
        fault, a shell that first joins the host's cgroup comes before it, and one that shows the cgroup
        hierarchy inside the namespace after it (diag/lab/cgroups.py)."""
        chosen = self.host(host)
        if not chosen.cpu_cgroup:
            return ["ip", "netns", "exec", chosen.netns]
        return [*cgroups.join_prefix(chosen.cpu_cgroup), "ip", "netns", "exec", chosen.netns,
                *cgroups.view_prefix(chosen.cpu_cgroup)]

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

    def host_shape(self, host: LabHost | int | str) -> HostShape:
        """The host's own link: the lab's rate, MTU and queues, or its fault's."""
        return self.config.host_shape(self.host(host).index)

    def expected_goodput_between(self, a: LabHost | int | str, b: LabHost | int | str) -> float:
        """One TCP stream's payload rate from a to b: the slower of the two links, at the smaller MTU (the
        MSS both SYNs agree on); the lab's expected_goodput_Bps where neither host has a fault."""
        return self.config.expected_goodput_between(self.host(a).index, self.host(b).index)

    def to_json(self) -> dict[str, Any]:
        """The "lab" object of run.json: everything a report needs to describe the network.

        Each host carries its "fault" (what it was asked to do differently, in the --fault keys; None for a
        host like the rest) and its "link" (rate, MTU, burst and queues as built)."""
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
            "hosts": [{**host.to_json(), "fault": self._fault_json(host),
                       "link": self.config.host_shape(host.index).to_json()} for host in self.hosts],
            "faulty_hosts": [fault.host for fault in self.config.faults],
            "scenario": self.config.scenario.to_json() if self.config.scenario is not None else None,
            "created_ns": self.created_ns,
            "config": self.config.to_json(),
        }

    def _fault_json(self, host: LabHost) -> dict[str, Any] | None:
        fault = self.config.fault_for(host.index)
        if fault is None:
            return None
        return {KEY_NAMES[name]: list(value) if isinstance(value, tuple) else value
                for name, value in fault.asked().items()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Lab:
        return cls(
            name=data["name"],
            rate_bps=float(data["rate_bps"]),
            hosts=[LabHost.from_json(host) for host in data["hosts"]],
            config=LabConfig.from_json(data["config"]),
            switch_netns=data["switch_netns"],
            burst_bytes=int(data["burst_bytes"]),
            queue_limit_bytes=int(data["queue_limit_bytes"]),
            created_ns=int(data.get("created_ns", 0)),
        )


def plan_lab(config: LabConfig, cpu_controller: cgroups.CpuController | None = None) -> Lab:
    """The lab config describes, before anything exists (pure). A host with a cpu= fault gets its cgroup
    under cpu_controller (which bring_up finds; required then)."""
    def cgroup_of(index: int) -> str | None:
        fault = config.fault_for(index)
        if fault is None or fault.cpu is None:
            return None
        if cpu_controller is None:
            raise DiagError(f"fault {fault.host}: cpu= needs a cgroup cpu controller")
        return cgroups.cgroup_path(cpu_controller, host_netns(config.name, index))

    hosts = [
        LabHost(name=f"h{i}", netns=host_netns(config.name, i), address=host_address(i), iface=HOST_IFACE,
                index=i, switch_port=f"h{i}", cpu_cgroup=cgroup_of(i))
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
    cpu_hosts = [fault.host for fault in config.faults if fault.cpu is not None]
    controller = cgroups.require_cpu_controller(cpu_hosts) if cpu_hosts else None
    _check_faults_fit_machine(config)
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
        lab = plan_lab(config, controller)
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
    if (not _present_netns(name) and not _present_cgroups(name) and state.read_state(name) is None
            and state.state_path(name) is None):
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
    parts += [f"fault {fault.host}:{fault.describe()}" for fault in config.faults]
    return ", ".join(parts)


# --- internals -------------------------------------------------------------------------------------------

def _check_name(name: str) -> None:
    check_lab_name(name)


def _present_netns(name: str) -> list[str]:
    return [ns for ns in ns_tools.list_netns() if owns_netns(name, ns)]


def _present_cgroups(name: str) -> list[str]:
    """This lab's cpu cgroups that exist now (named as its host namespaces)."""
    return cgroups.lab_cgroups(cgroups.find_cpu_controller(), lambda cgroup: owns_netns(name, cgroup))


def _check_faults_fit_machine(config: LabConfig) -> None:
    """What only this machine can say: the congestion control exists, the CPU share is below its CPUs."""
    available = _congestion_control("available")
    # A namespace other than the machine's own may only pick an algorithm the machine allows for everyone
    # (the kernel answers EPERM otherwise): the allowed list is a machine setting, so diag does not change it.
    allowed = _congestion_control("allowed")
    for fault in config.faults:
        cc = fault.congestion_control
        if cc is not None and available is not None and cc not in available:
            raise DiagError(f"fault {fault.host}: cc={cc} is not available in this kernel (available: "
                            f"{' '.join(available)}); try: modprobe tcp_{cc}, or pick one of those")
        if cc is not None and allowed is not None and cc not in allowed:
            raise DiagError(f"fault {fault.host}: cc={cc} is available but not allowed outside the machine's own "
                            f"namespace (net.ipv4.tcp_allowed_congestion_control = {' '.join(allowed)}); allow it "
                            f"as root: sysctl -w net.ipv4.tcp_allowed_congestion_control=\"{' '.join(allowed)} {cc}\", "
                            "or pick one of those")
        cpus = os.cpu_count() or 1
        if fault.cpu is not None and fault.cpu >= cpus:
            raise DiagError(f"fault {fault.host}: cpu={fault.cpu:g} is not below this machine's {cpus} CPUs, so "
                            "it would starve nothing; give a share such as 0.3")


def _congestion_control(which: str) -> list[str] | None:
    """The kernel's "available" or "allowed" TCP congestion control algorithms (None: unreadable)."""
    try:
        with open(f"/proc/sys/net/ipv4/tcp_{which}_congestion_control", encoding="ascii") as handle:
            return handle.read().split()
    except OSError:
        return None


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
    listed_cgroups: list[str] = []
    with contextlib.suppress(AttributeError, KeyError, TypeError, ValueError):
        listed_cgroups = [str(host["cpu_cgroup"]) for host in saved["lab"]["hosts"] if host.get("cpu_cgroup")]
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
    # After the namespaces (and so the processes in them) are gone: only a cgroup named by the lab rule under
    # the cpu controller's mount is ever removed, whatever the state file lists.
    controller = cgroups.find_cpu_controller()
    for cgroup in sorted(set(listed_cgroups) | set(_present_cgroups(name))):
        if controller is None or os.path.dirname(cgroup) != controller.root or not owns_netns(
                name, os.path.basename(cgroup)):
            print(f"diag lab: warning: the state of lab {name} names cgroup {cgroup}, which is not its own; "
                  "left alone", file=sys.stderr)
            continue
        cgroups.remove(cgroup)
    state.remove_state(name)
    return removed


def _build(lab: Lab) -> None:
    config = lab.config
    all_netns = [lab.switch_netns, *(host.netns for host in lab.hosts)]
    ns_tools.ip_batch(None, [f"netns add {netns}" for netns in all_netns])
    shaping.require_netem(config, lab.switch_netns)

    switch_lines = [f"link add {BRIDGE} type bridge", f"link set {BRIDGE} addrgenmode none"]
    for host in lab.hosts:
        # Each host's link (both veth ends) has its host's MTU. The bridge forwards a frame only if it fits
        # the egress port's MTU and drops it silently otherwise, as a switch does: TCP is unaffected (each
        # side's SYN announces its MSS), larger datagrams into a smaller-MTU host vanish (docs/lab.md).
        mtu = lab.host_shape(host).mtu
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
        shape = lab.host_shape(host)
        lines = [shaping.tbf_line(host.iface, shape, host_side=True)]
        netem = shaping.netem_line(host.iface, config, shape)
        if netem:
            lines.append(netem)
        ns_tools.tc_batch(host.netns, lines)
    ns_tools.tc_batch(lab.switch_netns, [shaping.tbf_line(host.switch_port, lab.host_shape(host))
                                         for host in lab.hosts])
    for fault in config.faults:
        host = lab.host(fault.index)
        if fault.sysctls():
            ns_tools.write_sysctls(host.netns, fault.sysctls())
        if fault.cpu is not None and host.cpu_cgroup is not None:
            cgroups.create(host.cpu_cgroup, fault.cpu)


def _run_in_netns(netns: str, argv: list[str]) -> None:
    """Run a short command inside netns: forked from a thread that joined it (cheaper than ip netns exec)."""
    ns_tools.call_in_netns(netns, lambda: ns_tools.run(argv), timeout_s=ns_tools.COMMAND_TIMEOUT_S + 5)


def _verify_shaping(lab: Lab) -> None:
    """Never hand out an unshaped link: read every tbf back and compare its rate with its host's own rate;
    then every fault: queue limits, MTUs, sysctls and CPU quotas, read back from where they live."""
    for host in lab.hosts:
        shape = lab.host_shape(host)
        for netns, iface, limit in ((host.netns, host.iface, shape.tx_queue_bytes),
                                    (lab.switch_netns, host.switch_port, shape.rx_queue_bytes)):
            tbfs = [q for q in shaping.read_qdiscs(netns, iface) if q.kind == "tbf" and q.parent == "root"]
            rate = tbfs[0].rate_bps if tbfs else None
            if rate is None or abs(rate - shape.rate_bps) > 0.01 * shape.rate_bps:
                got = f"{rate:.0f} bit/s" if rate else "no tbf"
                raise DiagError(f"shaping of {iface} in {netns} did not take ({got}, asked {shape.rate_bps:.0f} "
                                "bit/s)")
            if lab.config.fault_for(host.index) is not None:
                got_limit = tbfs[0].limit_bytes
                if got_limit is None or abs(got_limit - limit) > shaping.limit_tolerance_bytes(limit, rate):
                    raise DiagError(f"the queue of {iface} in {netns} did not take ({got_limit} bytes, asked "
                                    f"{limit})")
    for fault in lab.config.faults:
        _verify_fault(lab, lab.host(fault.index))


def _verify_fault(lab: Lab, host: LabHost) -> None:
    fault = lab.config.fault_for(host.index)
    assert fault is not None
    where = f"fault {host.name}"
    if fault.mtu is not None:
        for netns, iface in ((host.netns, host.iface), (lab.switch_netns, host.switch_port)):
            got = ns_tools.link_mtu(netns, iface)
            if got != fault.mtu:
                raise DiagError(f"{where}: the MTU of {iface} in {netns} is {got}, not {fault.mtu}")
    asked = fault.sysctls()
    if asked:
        got_values = ns_tools.read_sysctls(host.netns, list(asked))
        for name, value in asked.items():
            if got_values[name] != value:
                raise DiagError(f"{where}: {name} reads {got_values[name]!r} in {host.netns}, not {value!r}")
    if fault.cpu is not None:
        got_cpus = cgroups.read_cpus(host.cpu_cgroup) if host.cpu_cgroup else None
        if got_cpus is None or abs(got_cpus - fault.cpu) > 0.01 * fault.cpu + 1e-3:
            raise DiagError(f"{where}: the CPU quota of {host.cpu_cgroup} reads {got_cpus}, not {fault.cpu:g}")


def host_settings(lab: Lab, host: LabHost) -> dict[str, Any]:
    """What a host really has now: its link's MTU, its TCP sysctls and its cgroup's quota (lab status)."""
    sysctls = ns_tools.read_sysctls(host.netns, list(SYSCTLS.values()))
    settings: dict[str, Any] = {"mtu": ns_tools.link_mtu(host.netns, host.iface), "sysctls": sysctls,
                                "cpu_cgroup": host.cpu_cgroup}
    if host.cpu_cgroup:
        settings.update(cpus=cgroups.read_cpus(host.cpu_cgroup), cgroup_pids=len(cgroups.member_pids(host.cpu_cgroup)),
                        throttled_s=cgroups.throttled_s(host.cpu_cgroup))
    return settings


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


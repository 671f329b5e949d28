"""A set of flows between the job's nodes, run at once by the nodes' own leader ranks; the goodput of each,
measured at its receiver after the warm-up (diag/goodput.py).

Every rank of the job calls :func:`measure_flows` with the same arguments; only each node's leader rank
opens sockets or starts iperf3, the others take part in the coordination calls. One run is three exchanges
through the coordinator, each a single all_gather of what every leader did:

1. open: each receiver opens a listener (diag's streams) or a one-off iperf3 server on a free port of its
   address, and says which port (or what failed);
2. connect: each sender connects (diag's streams) and each receiver accepts; for iperf3 it is only the
   start line, every server listening;
3. run: the flows run for ``seconds`` at once; each receiver says its goodput, each sender how many
   segments it resent, each side what failed.

Every local step is bounded (GRACE_S beyond ``seconds``), so every leader reaches the next exchange even
when its tool or its peer is stuck, and every rank then raises the same one line naming the node and the
pair. A peer that never reaches an exchange (dead, or stuck outside the probe) is bounded by the
coordinator's own timeout, named by the phase and its pairs. Listeners, sockets and iperf3 processes are
closed and reaped on every path, and iperf3 dies with its rank (diag.lifeline) even if the rank is killed
(on a lab host measured from outside, ProbeNode.exec_prefix, with the lab).
"""

from __future__ import annotations

import ipaddress
import math
import re
import socket
import subprocess
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from diag import goodput
from diag.errors import DiagError
from diag.lifeline import CHILD_CWD, UNPRIVILEGED_USER, child_env, tool_command
from diag.probe.coordinator import Coordinator, first_sentence

TOOLS = ("auto", "iperf3", "socket")
TOOL_LABELS = {"iperf3": "iperf3", "socket": "diag-socket"}   # as run.json's link.*.tool records them
# What the run step reports of a flow: its receiver the goodput, its sender the segments it resent over the
# whole flow and after the warm-up (the two halves of one flow's report, merged by the exchange).
GOODPUT, RESENT, STEADY_RESENT = "goodput_Bps", "retransmits", "steady_retransmits"
MIN_SECONDS, MAX_SECONDS = 1, 60
SERVER_START_ATTEMPTS = 3       # a free port can be taken between our check and iperf3's bind
POLL_S = 0.02


@dataclass(frozen=True)
class ProbeNode:
    """A host of the job: its name, its address on the job's interface, and the rank that acts for it;
    exec_prefix: what starts a tool on it where that is not the rank's own process (the lab measured from
    outside: `ip netns exec` and the host's cgroup, Lab.exec_prefix)."""

    name: str
    address: str
    leader_rank: int
    exec_prefix: tuple[str, ...] = ()


@dataclass(frozen=True)
class Flow:
    """One TCP flow, named by its nodes."""

    src: str
    dst: str

    def __str__(self) -> str:
        return f"{self.src} -> {self.dst}"


@dataclass(frozen=True)
class FlowResult:
    """A flow's goodput (TCP payload bytes/s) at its receiver, after the warm-up, and the segments its
    sender resent (its kernel's count; None where it could not be read): over the whole flow, and over the
    ``steady_s`` seconds after the warm-up, the window of the goodput (slow start's overshoot left out)."""

    src: str
    dst: str
    goodput_Bps: float
    tool: str            # "iperf3" or "diag-socket"
    seconds: float
    retransmits: int | None = None
    steady_retransmits: int | None = None
    steady_s: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {"src": self.src, "dst": self.dst, "goodput_Bps": self.goodput_Bps, "tool": self.tool,
                "seconds": self.seconds, "retransmits": self.retransmits,
                "steady_retransmits": self.steady_retransmits, "steady_s": self.steady_s}


@dataclass(frozen=True)
class ToolChoice:
    """The tool every leader uses, and the nodes that lack iperf3 (why the choice fell back)."""

    tool: str                         # "iperf3" or "socket"
    without_iperf3: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        return TOOL_LABELS[self.tool]

    @property
    def note(self) -> str | None:
        if self.tool == "socket" and self.without_iperf3:
            return (f"iperf3 is missing on {', '.join(self.without_iperf3)}: measured with diag's own single "
                    "TCP stream per flow")
        return None


def measure_flows(coord: Coordinator, nodes: Sequence[ProbeNode], flows: Sequence[Flow | tuple[str, str]],
                  seconds: float = 2.0, tool: str = "auto") -> list[FlowResult]:
    """Run ``flows`` at once for ``seconds``; their goodputs, in order. Every rank calls it alike.

    ``tool``: "iperf3", "socket" (diag's own single stream per flow), or "auto": iperf3 where every node
    has it, else the sockets (decided with one all_gather).
    """
    check_nodes(nodes, coord.world_size)
    wanted = check_flows(nodes, flows)
    whole = check_seconds(seconds)
    choice = choose_tool(coord, nodes, tool)
    return run_flows(coord, nodes, wanted, whole, choice.tool, "flows")


def check_nodes(nodes: Sequence[ProbeNode], world_size: int) -> None:
    names = [node.name for node in nodes]
    leaders = [node.leader_rank for node in nodes]
    if len(set(names)) != len(names) or not all(names):
        raise DiagError(f"probe nodes need distinct, non-empty names, got {names}")
    if len(set(leaders)) != len(leaders) or not all(0 <= rank < world_size for rank in leaders):
        raise DiagError(f"probe nodes need distinct leader ranks in 0..{world_size - 1}, got {leaders}")
    for node in nodes:
        try:
            ipaddress.ip_address(node.address)
        except ValueError:
            raise DiagError(f"probe node {node.name}: {node.address!r} is not an IP address") from None


def check_flows(nodes: Sequence[ProbeNode], flows: Sequence[Flow | tuple[str, str]]) -> list[Flow]:
    known = {node.name for node in nodes}
    checked = [flow if isinstance(flow, Flow) else Flow(*flow) for flow in flows]
    for flow in checked:
        if flow.src not in known or flow.dst not in known or flow.src == flow.dst:
            raise DiagError(f"probe flow {flow} must join two different nodes of {sorted(known)}")
    if not checked:
        raise DiagError("the probe needs at least one flow")
    return checked


def check_seconds(seconds: float) -> int:
    """Whole seconds (iperf3's -t takes no fractions; both tools run the same time)."""
    if not (isinstance(seconds, (int, float)) and float(seconds).is_integer() and MIN_SECONDS <= seconds <= MAX_SECONDS):
        raise DiagError(f"probe time must be a whole number of seconds in {MIN_SECONDS}..{MAX_SECONDS}, got {seconds!r}")
    return int(seconds)


def choose_tool(coord: Coordinator, nodes: Sequence[ProbeNode], tool: str) -> ToolChoice:
    """One all_gather of "has iperf3" from every rank; the leaders' answers decide. Every rank calls it."""
    if tool not in TOOLS:
        raise DiagError(f"unknown probe tool {tool!r}: use {', '.join(TOOLS)}")
    has_iperf3 = _collective(coord.all_gather_object, goodput.iperf3_available(), "choosing the tool", nodes)
    without = tuple(node.name for node in nodes if not has_iperf3[node.leader_rank])
    if tool == "socket":
        return ToolChoice("socket")
    if tool == "iperf3" and without:
        raise DiagError(f"iperf3 is not installed on {', '.join(without)}; install it there (apt-get install "
                        "iperf3) or use diag's own streams (tool socket, or auto)")
    return ToolChoice("socket" if without else "iperf3", without)


def run_flows(coord: Coordinator, nodes: Sequence[ProbeNode], flows: Sequence[Flow], seconds: int, tool: str,
              context: str) -> list[FlowResult]:
    """The three exchanges (see the module's docstring) with checked arguments and a chosen tool.

    ``context`` names the measurement in errors ("matrix round 2, phase both").
    """
    by_name = {node.name: node for node in nodes}
    me = next((node for node in nodes if node.leader_rank == coord.rank), None)
    side: _Side = _SocketSide(me, by_name, flows, seconds) if tool == "socket" else \
        _Iperf3Side(me, by_name, flows, seconds)
    exchange = _Exchange(coord, nodes, flows, context, me)
    try:
        ports = exchange.step("opening listeners", side.open)
        ports = {index: _port(ports.get(index), flow) for index, flow in enumerate(flows)}
        exchange.step("connecting", lambda: side.connect(ports))
        measured = exchange.step("measuring", lambda: side.run(ports))
    finally:
        side.close()
    missing = [str(flow) for index, flow in enumerate(flows) if not _rate(measured.get(index, {}).get(GOODPUT))]
    if missing:   # a leader that reported nothing for its flow: never expected, but never a silent zero
        raise DiagError(f"probe {context}: no goodput reported for {', '.join(missing)}")
    steady_s = seconds - (goodput.stream_warmup_s(seconds) if tool == "socket" else goodput.iperf3_warmup_s(seconds))
    return [FlowResult(flow.src, flow.dst, float(measured[index][GOODPUT]), TOOL_LABELS[tool], float(seconds),
                       _count(measured[index].get(RESENT)), _count(measured[index].get(STEADY_RESENT)), steady_s)
            for index, flow in enumerate(flows)]


def _rate(value: Any) -> bool:
    """A goodput a leader reported: a finite, non-negative float (JSON keeps 1.0 a float)."""
    return isinstance(value, float) and math.isfinite(value) and value >= 0


def _count(value: Any) -> int | None:
    """A segment count a leader reported, or None where it is not one (it could not read it)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _port(value: Any, flow: Flow) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and 0 < value < 65536:
        return value
    raise DiagError(f"probe {flow}: the receiver's leader gave {str(value)[:40]!r} as its port, not a TCP port")



@dataclass(frozen=True)
class _Failed:
    """What went wrong with one flow, on one node (travels through the coordinator)."""

    node: str
    message: str


class _Exchange:
    """Runs one local step on this rank, then one all_gather of every leader's {flow index: value | _Failed};
    raises on every rank alike when any flow failed.

    A leader's report travels as JSON (the coordinator pickles nothing): ``{"values": [[index, value], ...],
    "failed": [[index, node, message], ...]}``, every index a flow of this exchange and every value a number,
    a boolean, None, a short string or a flat object of those; anything else is one line naming the rank."""

    def __init__(self, coord: Coordinator, nodes: Sequence[ProbeNode], flows: Sequence[Flow], context: str,
                 me: ProbeNode | None) -> None:
        self.coord, self.nodes, self.flows, self.context, self.me = coord, nodes, flows, context, me

    def step(self, what: str, local: Callable[[], dict[int, Any]]) -> dict[int, Any]:
        try:
            mine = local()
        except Exception as exc:  # this rank must still reach the all_gather, else all wait
            node = self.me.name if self.me else f"rank {self.coord.rank}"
            mine = {index: _Failed(node, _one_line(exc, self.nodes)) for index, flow in enumerate(self.flows)
                    if self.me and self.me.name in (flow.src, flow.dst)}
        report = {"values": [[index, value] for index, value in mine.items() if not isinstance(value, _Failed)],
                  "failed": [[index, value.node, value.message] for index, value in mine.items()
                             if isinstance(value, _Failed)]}
        gathered = _collective(self.coord.all_gather_object, report, f"{self.context}, {what}", self.nodes,
                               flows=self.flows)
        merged: dict[int, Any] = {}
        failures: dict[int, list[_Failed]] = {}
        for rank, message in enumerate(gathered):
            values, failed = self._parse(rank, message, what)
            for index, failure in failed:
                failures.setdefault(index, []).append(failure)
            for index, value in values:
                if isinstance(value, dict) and isinstance(merged.get(index), dict):
                    merged[index] = {**merged[index], **value}   # a flow's two halves (run: GOODPUT; RESENT...)
                else:
                    merged.setdefault(index, value)
        if failures:
            first = min(failures)
            said = "; ".join(f"{failure.node}: {failure.message}" for failure in failures[first])
            more = f" (and {len(failures) - 1} more flow(s))" if len(failures) > 1 else ""
            raise DiagError(f"probe {self.context}, {what}, {self.flows[first]}: {said}{more}")
        return merged

    def _parse(self, rank: int, message: Any, what: str) -> tuple[list[tuple[int, Any]], list[tuple[int, _Failed]]]:
        """One rank's report, checked: every index one of the flows, every value a plain scalar or a flat
        object of them, every failure (index, node, message) with short strings."""
        def bad(why: str) -> DiagError:
            return DiagError(f"probe {self.context}, {what}: rank {rank} sent a report diag cannot use ({why}); "
                             "is every rank running the same diag?")

        def index_of(value: Any) -> int:
            if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < len(self.flows):
                return value
            raise bad(f"flow index {str(value)[:20]!r}")

        if not isinstance(message, dict) or not isinstance(message.get("values"), list) \
                or not isinstance(message.get("failed"), list):
            raise bad("not a report")
        values = []
        for entry in message["values"]:
            if not (isinstance(entry, list) and len(entry) == 2 and _plain(entry[1])):
                raise bad("a value that is not a number, a short string or a flat object of them")
            values.append((index_of(entry[0]), entry[1]))
        failed = []
        for entry in message["failed"]:
            if not (isinstance(entry, list) and len(entry) == 3 and all(isinstance(e, str) for e in entry[1:])):
                raise bad("a failure that is not (index, node, message)")
            failed.append((index_of(entry[0]), _Failed(entry[1][:MAX_REPORT_TEXT], entry[2][:MAX_REPORT_TEXT])))
        return values, failed


MAX_REPORT_TEXT = 400     # a node's name or its one-line failure, as another node reports it


def _plain(value: Any, depth: int = 0) -> bool:
    if value is None or isinstance(value, (bool, int, float)):
        return True
    if isinstance(value, str):
        return len(value) <= MAX_REPORT_TEXT
    if isinstance(value, dict) and depth == 0:
        return all(isinstance(k, str) and _plain(v, 1) for k, v in value.items())
    return False


def _collective(call: Callable[[Any], list[Any]], obj: Any, what: str, nodes: Sequence[ProbeNode], *,
                flows: Sequence[Flow] = ()) -> list[Any]:
    """A coordinator call whose failure (a dead peer, the group's timeout) becomes one line naming the
    flows under way (else the nodes): the peer torch names is only the nearest one that gave up."""
    try:
        return call(obj)
    except DiagError:
        raise
    except Exception as exc:  # torch raises RuntimeError subclasses, sockets OSError
        who = ", ".join(map(str, flows)) or ", ".join(node.name for node in nodes)
        raise DiagError(f"probe {what} ({who}): a peer did not answer in time or left the job "
                        f"({_one_line(exc, nodes)})") from exc


_ADDRESS = re.compile(r"\[([0-9a-fA-F.:]+)\]")


def _one_line(exc: BaseException, nodes: Sequence[ProbeNode] = ()) -> str:
    """The exception's first sentence, without torch's source position, with the node of any address
    it names ("Connection closed by peer [10.77.0.4]:32930" -> "... (h3)")."""
    text = first_sentence(exc)
    addresses = [node.address for node in nodes]
    owner = {node.address: node.name for node in nodes if addresses.count(node.address) == 1}
    named = [owner[address] for address in _ADDRESS.findall(text) if address in owner]
    return f"{type(exc).__name__}: {text}" + (f" ({', '.join(named)})" if named else "")


class _Side(ABC):
    """What one rank does for the flows of its node (nothing when it leads no node), one method per
    exchange; each returns {flow index: value | _Failed} for the flows it took part in."""

    def __init__(self, me: ProbeNode | None, nodes: dict[str, ProbeNode], flows: Sequence[Flow], seconds: int) -> None:
        self.me, self.nodes, self.seconds = me, nodes, seconds
        self.node_name = me.name if me else ""
        self.address = me.address if me else ""      # used only where this rank leads a node of the flows
        self.tool_prefix = me.exec_prefix if me else ()
        self.receiving = [index for index, flow in enumerate(flows) if me and flow.dst == me.name]
        self.sending = [index for index, flow in enumerate(flows) if me and flow.src == me.name]
        self.flows = flows

    @abstractmethod
    def open(self) -> dict[int, Any]: ...

    @abstractmethod
    def connect(self, ports: dict[int, Any]) -> dict[int, Any]: ...

    @abstractmethod
    def run(self, ports: dict[int, Any]) -> dict[int, Any]: ...

    @abstractmethod
    def close(self) -> None: ...


class _SocketSide(_Side):
    """diag's own single TCP stream per flow (goodput from the kernel's tcpi_bytes_received slope)."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.listeners: dict[int, socket.socket] = {}
        self.outgoing: dict[int, socket.socket] = {}
        self.incoming: dict[int, socket.socket] = {}

    def open(self) -> dict[int, Any]:
        for index in self.receiving:
            listener = socket.socket(_family(self.address), socket.SOCK_STREAM)
            self.listeners[index] = listener
            goodput.big_buffers(listener)   # inherited by the accepted socket, before the handshake
            listener.bind((self.address, 0))
            listener.listen()
            listener.settimeout(goodput.GRACE_S)
        return {index: listener.getsockname()[1] for index, listener in self.listeners.items()}

    def connect(self, ports: dict[int, Any]) -> dict[int, Any]:
        for index in self.sending:
            peer = self.nodes[self.flows[index].dst]
            client = socket.socket(_family(peer.address), socket.SOCK_STREAM)
            self.outgoing[index] = client
            goodput.big_buffers(client)
            client.settimeout(goodput.GRACE_S)
            client.bind((self.address, 0))   # the node's address on the job's interface, as its traffic leaves
            client.connect((peer.address, ports[index]))
        for index in self.receiving:
            self.incoming[index] = self._accept(index)
        return {index: True for index in (*self.sending, *self.receiving)}

    def _accept(self, index: int) -> socket.socket:
        """The flow's connection: from its sender's address (anything else that connects is turned away)."""
        sender = self.nodes[self.flows[index].src].address
        deadline = time.monotonic() + goodput.GRACE_S
        while time.monotonic() < deadline:
            conn, peer = self.listeners[index].accept()
            if ipaddress.ip_address(peer[0]) == ipaddress.ip_address(sender):
                return conn
            conn.close()
        raise TimeoutError(f"no connection from {sender} in {goodput.GRACE_S:.0f} s")

    def run(self, ports: dict[int, Any]) -> dict[int, Any]:
        if not self.sending and not self.receiving:
            return {}
        receiving = sorted(self.incoming)
        at_warmup: dict[int, int | None] = {}

        def read_counters() -> None:
            at_warmup.update({index: goodput.retransmitted(sock) for index, sock in self.outgoing.items()})

        rates = goodput.run_streams([self.outgoing[index] for index in sorted(self.outgoing)],
                                    [self.incoming[index] for index in receiving], self.seconds,
                                    read_counters if self.outgoing else None)
        report: dict[int, Any] = {}
        for index, sock in self.outgoing.items():
            total, before = goodput.retransmitted(sock), at_warmup.get(index)
            steady = total - before if total is not None and before is not None else None
            report[index] = {RESENT: total, STEADY_RESENT: steady}
        for index, rate in zip(receiving, rates, strict=True):
            report[index] = {**report.get(index, {}), GOODPUT: float(rate)}
        return report

    def close(self) -> None:
        for sock in (*self.listeners.values(), *self.outgoing.values(), *self.incoming.values()):
            sock.close()


class _Iperf3Side(_Side):
    """A one-off iperf3 server per received flow, a client per sent flow; receiver-side intervals."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.servers: dict[int, subprocess.Popen[str]] = {}
        self.clients: dict[int, subprocess.Popen[str]] = {}

    def open(self) -> dict[int, Any]:
        ports = {}
        for index in self.receiving:
            self.servers[index], ports[index] = self._start_server(self.address)
        return ports

    def _start_server(self, address: str) -> tuple[subprocess.Popen[str], int]:
        said = "no output"
        for _attempt in range(SERVER_START_ATTEMPTS):
            port = _free_port(address)
            proc = _spawn(self.tool_prefix, goodput.iperf3_server_argv(address, port), user=UNPRIVILEGED_USER)
            deadline = time.monotonic() + goodput.GRACE_S
            while time.monotonic() < deadline and proc.poll() is None:
                if goodput.listening_on(port):
                    return proc, port
                time.sleep(POLL_S)
            if proc.poll() is None:
                goodput.reap([proc])
                raise TimeoutError(f"iperf3 server on {address}:{port} did not listen in {goodput.GRACE_S:.0f} s")
            said = goodput.iperf3_error(*proc.communicate())
        raise RuntimeError(f"iperf3 server on {address} did not start: {said}")

    def connect(self, ports: dict[int, Any]) -> dict[int, Any]:
        return {}   # every server listens: this exchange is the start line

    def run(self, ports: dict[int, Any]) -> dict[int, Any]:
        for index in self.sending:
            peer = self.nodes[self.flows[index].dst]
            self.clients[index] = _spawn(self.tool_prefix,
                                         goodput.iperf3_client_argv(peer.address, ports[index], self.seconds))
        limit_s = self.seconds + 2 * goodput.GRACE_S
        deadline = time.monotonic() + limit_s
        node = self.node_name
        warmup_s = goodput.iperf3_warmup_s(self.seconds)
        results: dict[int, Any] = {}
        for index, proc in self.clients.items():
            output = goodput.finish(proc, deadline)
            if output is None:
                results[index] = _Failed(node, f"iperf3 client did not finish in {limit_s:.0f} s (killed)")
            elif proc.returncode != 0:
                results[index] = _Failed(node, f"iperf3 client failed: {goodput.iperf3_error(*output)}")
            else:
                results[index] = {RESENT: goodput.iperf3_sender_retransmits(output[0]),
                                  STEADY_RESENT: goodput.iperf3_sender_steady_retransmits(output[0], warmup_s)}
        for index, proc in self.servers.items():
            output = goodput.finish(proc, deadline)
            if output is None:
                results[index] = _Failed(node, f"iperf3 server had no finished test in {limit_s:.0f} s (killed)")
                continue
            rate = goodput.iperf3_receiver_rate(output[0], warmup_s)
            if rate is None:
                results[index] = _Failed(node, f"iperf3 server failed: {goodput.iperf3_error(*output)}")
            elif not isinstance(results.get(index), _Failed):   # a flow to itself has both halves here
                results[index] = {**results.get(index, {}), GOODPUT: rate}
        return results

    def close(self) -> None:
        goodput.reap([*self.clients.values(), *self.servers.values()])


def _family(address: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ipaddress.ip_address(address).version == 6 else socket.AF_INET


def _free_port(address: str) -> int:
    with socket.socket(_family(address), socket.SOCK_STREAM) as probe:
        probe.bind((address, 0))
        return int(probe.getsockname()[1])


def _spawn(prefix: Sequence[str], argv: list[str], user: str | None = None) -> subprocess.Popen[str]:
    """A tool that dies with this rank (diag.lifeline: the parent-death signal), even if the rank is killed; or,
    on a node with an exec prefix (a lab host measured from outside), started through it as `diag lab exec`
    starts a command: the lab ends whatever runs on its hosts when it is torn down. As ``user`` where given
    (iperf3's servers serve whoever connects first: they hold no privilege)."""
    command = [*prefix, *(tool_command(argv, user=user) if user else argv)] if prefix else tool_command(argv, user=user)
    return subprocess.Popen(command,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=CHILD_CWD,
                            env=child_env())

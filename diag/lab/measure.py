"""Measure what a lab link carries: one TCP stream, then both directions at once (one socket each way);
and what the machine carries in a collective's own flow pattern (a ring: host i -> host (i+1) % N, every
edge at once), driven by iperf3.

diag's own socket code is the default for the link (no external tool; sockets are opened inside the host
namespaces from this process, see netns.call_in_netns). iperf3 is used when asked and installed. The ring
pattern is iperf3 only: it is the reference for "what this machine can push through N flows at once", and
one Python process driving N flows would measure Python, not the machine. Every step is bounded in time.

How a flow's goodput is measured (warm-up, receiver-side rate, the kernel's byte counter) lives in
diag/goodput.py, shared with the in-place probe (diag/probe/), which runs the same flows from the job's
own ranks instead of from outside the namespaces.
"""

from __future__ import annotations

import json
import socket
import subprocess
import time
from dataclasses import dataclass

from diag import goodput
from diag.errors import DiagError
from diag.goodput import EdgeFlow, RingPatternMeasurement, iperf3_available
from diag.lab import netns as ns_tools
from diag.lab.topology import Lab, LabHost
from diag.lifeline import CHILD_CWD, UNPRIVILEGED_USER, child_env, tool_command

IPERF3_PORT = 5201              # inside the lab's private namespaces, so it clashes with nothing

__all__ = ["EdgeFlow", "LinkMeasurement", "RingPatternMeasurement", "iperf3_available", "measure_link",
           "measure_ring_pattern"]


@dataclass(frozen=True)
class LinkMeasurement:
    """Goodput (TCP payload bytes/s) between two lab hosts."""

    single_stream_Bps: float            # a -> b alone
    bidir_Bps: tuple[float, float]      # (a -> b, b -> a) at the same time
    tool: str                           # "diag-socket" or "iperf3"
    seconds: float = 0.0

    def to_json(self) -> dict[str, object]:
        return {"single_stream_Bps": self.single_stream_Bps, "bidir_Bps": list(self.bidir_Bps),
                "tool": self.tool, "seconds": self.seconds}


def measure_link(lab: Lab, a: int = 0, b: int = 1, seconds: float = 2.0, tool: str = "socket") -> LinkMeasurement:
    """Single-stream a->b, then a->b and b->a together, `seconds` each."""
    host_a, host_b = lab.host(a), lab.host(b)
    if host_a == host_b:
        raise DiagError("measure between two different hosts, e.g. h0 and h1")
    if not 0.2 <= seconds <= 60:
        raise DiagError(f"measurement time {seconds} s is outside 0.2..60 s")
    if tool == "iperf3":
        return _measure_iperf3(lab, host_a, host_b, seconds)
    if tool != "socket":
        raise DiagError(f"unknown measurement tool {tool!r}: use socket or iperf3")
    (single,) = _run_streams([(host_a, host_b)], seconds)
    forward, backward = _run_streams([(host_a, host_b), (host_b, host_a)], seconds)
    return LinkMeasurement(single_stream_Bps=single, bidir_Bps=(forward, backward), tool="diag-socket",
                           seconds=seconds)


def measure_flows(lab: Lab, pairs: list[tuple[LabHost | int | str, LabHost | int | str]],
                  seconds: float = 2.0) -> list[float]:
    """Goodput of one TCP connection per (sender, receiver) pair, all at once (e.g. incast: two senders into
    one host), with diag's own sockets; in the order of pairs."""
    if not 0.2 <= seconds <= 60:
        raise DiagError(f"measurement time {seconds} s is outside 0.2..60 s")
    resolved = [(lab.host(sender), lab.host(receiver)) for sender, receiver in pairs]
    if not resolved or any(sender == receiver for sender, receiver in resolved):
        raise DiagError("measure between pairs of two different hosts, e.g. (h0, h1)")
    return _run_streams(resolved, seconds)


def measure_ring_pattern(lab: Lab, world_size: int, seconds: float = 3.0) -> RingPatternMeasurement:
    """One iperf3 flow per ring edge of hosts h0..h(N-1), all edges at once, `seconds` each.

    Each receiving host runs its own one-off iperf3 server (-1) that reports receiver-side intervals as JSON;
    the goodput of an edge is taken from those intervals after the warm-up, so slow start and the clients'
    staggered start (each is a separate `ip netns exec`) stay out of the figure.
    """
    if not 2 <= world_size <= len(lab.hosts):
        raise DiagError(f"a ring of {world_size} hosts needs 2..{len(lab.hosts)} (the lab has {len(lab.hosts)} hosts)")
    if not 1.0 <= seconds <= 60:
        raise DiagError(f"ring pattern time {seconds} s is outside 1..60 s")
    if not iperf3_available():
        raise DiagError("iperf3 is not installed; the ring pattern needs it (apt-get install iperf3)")
    hosts = [lab.host(index) for index in range(world_size)]
    edges = [(hosts[index], hosts[(index + 1) % world_size]) for index in range(world_size)]
    servers: list[subprocess.Popen[str]] = []
    clients: list[subprocess.Popen[str]] = []
    try:
        for _sender, receiver in edges:
            servers.append(subprocess.Popen(
                [*lab.exec_prefix(receiver), *tool_command(goodput.iperf3_server_argv(receiver.address, IPERF3_PORT),
                                                            user=UNPRIVILEGED_USER)],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env(), cwd=CHILD_CWD))
        for _sender, receiver in edges:
            _wait_listening(receiver, IPERF3_PORT)
        for sender, receiver in edges:
            clients.append(subprocess.Popen(
                [*lab.exec_prefix(sender), *goodput.iperf3_client_argv(receiver.address, IPERF3_PORT, int(seconds))],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        deadline = time.monotonic() + seconds + 2 * goodput.GRACE_S
        outputs = []
        for proc in clients + servers:
            output = goodput.finish(proc, deadline)
            if output is None:
                raise DiagError(f"iperf3 ring pattern did not finish in time ({' '.join(map(str, proc.args))})")
            outputs.append(output)
    finally:
        goodput.reap(clients + servers)
    client_outputs, server_outputs = outputs[:world_size], outputs[world_size:]
    warmup_s = goodput.iperf3_warmup_s(seconds)
    flows = []
    for (sender, receiver), client_out, server_out in zip(edges, client_outputs, server_outputs, strict=True):
        rate = goodput.iperf3_receiver_rate(server_out[0], warmup_s)
        if rate is None:
            raise DiagError(f"iperf3 {sender.name} -> {receiver.name} failed: "
                            f"{goodput.iperf3_error(client_out[0], server_out[0], client_out[1], server_out[1])}")
        flows.append(EdgeFlow(sender.name, receiver.name, rate))
    return RingPatternMeasurement(world_size=world_size, flows=tuple(flows), tool="iperf3", seconds=seconds)


def _run_streams(pairs: list[tuple[LabHost, LabHost]], seconds: float) -> list[float]:
    """One TCP connection per (sender, receiver) pair, all at once; goodput of each."""
    listeners: list[socket.socket] = []
    senders: list[socket.socket] = []
    accepted: list[socket.socket] = []
    try:
        for sender, receiver in pairs:
            listener = ns_tools.call_in_netns(receiver.netns, lambda r=receiver: socket.create_server((r.address, 0)))
            goodput.big_buffers(listener)
            listener.settimeout(goodput.GRACE_S)
            listeners.append(listener)
            client = ns_tools.call_in_netns(sender.netns, lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            client.settimeout(goodput.GRACE_S)
            goodput.big_buffers(client)
            senders.append(client)
            client.connect(listener.getsockname())
            conn, _ = listener.accept()
            accepted.append(conn)
        try:
            return goodput.run_streams(senders, accepted, seconds)
        except goodput.StreamError as exc:
            raise DiagError(f"link measurement failed: {exc}; is the lab up?") from exc
    finally:
        for sock in listeners + senders + accepted:
            sock.close()


def _measure_iperf3(lab: Lab, host_a: LabHost, host_b: LabHost, seconds: float) -> LinkMeasurement:
    if not iperf3_available():
        raise DiagError("iperf3 is not installed; use the built-in measurement (--tool socket) or apt-get install iperf3")
    server = subprocess.Popen([*lab.exec_prefix(host_b), *tool_command(
        ["iperf3", "-s", "-p", str(IPERF3_PORT), "-B", host_b.address], user=UNPRIVILEGED_USER)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=child_env(), cwd=CHILD_CWD)
    try:
        _wait_listening(host_b, IPERF3_PORT)
        single = _iperf3_client(lab, host_a, host_b, seconds, bidir=False)
        both = _iperf3_client(lab, host_a, host_b, seconds, bidir=True)
    finally:
        server.terminate()
        try:
            server.wait(5)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(5)
    return LinkMeasurement(single_stream_Bps=single["sum_received"]["bits_per_second"] / 8,
                           bidir_Bps=(both["sum_received"]["bits_per_second"] / 8,
                                      both["sum_received_bidir_reverse"]["bits_per_second"] / 8),
                           tool="iperf3", seconds=seconds)


def _wait_listening(server: LabHost, port: int) -> None:
    """Poll the server namespace's listening sockets (a probe connection would count as a test to iperf3)."""
    deadline = time.monotonic() + goodput.GRACE_S
    while time.monotonic() < deadline:
        if ns_tools.call_in_netns(server.netns, lambda: goodput.listening_on(port)):
            return
        time.sleep(0.05)
    raise DiagError(f"iperf3 server on {server.address}:{port} did not start in {goodput.GRACE_S:.0f} s")


def _iperf3_client(lab: Lab, host_a: LabHost, host_b: LabHost, seconds: float, bidir: bool) -> dict:
    argv = [*lab.exec_prefix(host_a), "iperf3", "-c", host_b.address, "-p", str(IPERF3_PORT),
            "-t", f"{seconds:g}", "-J"] + (["--bidir"] if bidir else [])
    limit_s = seconds + 2 * goodput.GRACE_S
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=limit_s, check=False)
    except subprocess.TimeoutExpired as exc:
        raise DiagError(f"iperf3 did not finish in {limit_s:.0f} s") from exc
    try:
        end = json.loads(proc.stdout)["end"]
    except (ValueError, KeyError) as exc:
        raise DiagError(f"iperf3 failed: {(proc.stderr or proc.stdout).strip()[:200]}") from exc
    if bidir and "sum_received_bidir_reverse" not in end:
        raise DiagError("this iperf3 has no --bidir (needs 3.7+); use the built-in measurement (--tool socket)")
    return end

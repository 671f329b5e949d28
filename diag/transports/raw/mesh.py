"""The connection mesh: rendezvous through a torch Store, listen on one address, connect, authenticate.

For every rank pair the higher rank connects and the lower rank accepts. ``--conn shared`` opens
``streams`` sockets per pair that carry both directions; ``--conn split`` opens ``streams`` sockets per
direction, each carrying bulk data one way only (its reverse direction sees only ACKs and, with
``--handshake notify``, the receiver's ready notices). ``--notice own-conn`` adds one socket per pair
that carries only the ready notices.

The accepting side multiplexes the listener and every half-open connection in one poll loop with
per-connection deadlines, so a stray client that sends half a HELLO cannot stall the real ranks. The
listener is closed once the mesh is complete: later strays are refused by the kernel.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hmac
import logging
import os
import select
import socket
import struct
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from diag.errors import DiagError
from diag.transports.raw import wire

if TYPE_CHECKING:
    from diag.transports.raw.knobs import RawKnobs

log = logging.getLogger("diag.raw")

HANDSHAKE_TIMEOUT_S = 5.0      # how long one accepted client may take to send its HELLO
MAX_PENDING_HANDSHAKES = 128   # more half-open clients than this are closed at once
SIOCGIFADDR = 0x8915


@dataclass(eq=False)
class Conn:
    """One TCP socket to ``peer``. ``role`` says which directions carry data (wire.ROLE_*)."""

    sock: socket.socket
    peer: int
    role: int
    stream: int
    label: str
    sends: bool              # this rank sends data on it
    receives: bool           # this rank receives data on it
    fd: int = field(init=False)

    def __post_init__(self) -> None:
        self.fd = self.sock.fileno()


def interface_address(name: str) -> str:
    """IPv4 address of a network interface (SIOCGIFADDR), for --iface / GLOO_SOCKET_IFNAME."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            packed = fcntl.ioctl(probe.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
        except OSError as exc:
            raise DiagError(f"interface {name!r} has no IPv4 address ({exc.strerror}); "
                            "check --iface / GLOO_SOCKET_IFNAME with `ip addr`") from None
    return socket.inet_ntoa(packed[20:24])


def choose_address(iface: str | None) -> str:
    """--iface, else GLOO_SOCKET_IFNAME (as gloo), else the local address that routes to MASTER_ADDR."""
    name = iface or os.environ.get("GLOO_SOCKET_IFNAME")
    if name:
        return interface_address(name.split(",")[0])
    master = os.environ.get("MASTER_ADDR", "127.0.0.1")
    try:
        target = socket.gethostbyname(master)
    except OSError:
        raise DiagError(f"cannot resolve MASTER_ADDR {master!r}; set it to an address or use --iface") from None
    if target.startswith("127."):
        return target
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((target, 9))  # UDP connect sends nothing; it only asks the routing table
        return probe.getsockname()[0]


def apply_socket_options(sock: socket.socket, knobs: RawKnobs) -> None:
    if knobs.sockbuf is not None:
        # Before connect/listen, so the window scale negotiated in the SYN fits the buffer.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, knobs.sockbuf)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, knobs.sockbuf)


def conn_plan(rank: int, peer: int, knobs: RawKnobs) -> list[tuple[int, int]]:
    """(role, stream) of every socket between rank and peer, in a fixed order both sides agree on."""
    roles = [wire.ROLE_SHARED] if knobs.conn == "shared" else [wire.ROLE_UP, wire.ROLE_DOWN]
    plan = [(role, stream) for role in roles for stream in range(knobs.streams)]
    if knobs.handshake == "notify" and knobs.notice == "own-conn":
        plan.append((wire.ROLE_NOTICE, 0))
    return plan


def make_conn(sock: socket.socket, rank: int, peer: int, role: int, stream: int, knobs: RawKnobs) -> Conn:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1 if knobs.nodelay else 0)
    sock.setblocking(False)
    if role == wire.ROLE_SHARED:
        sends = receives = True
    elif role == wire.ROLE_NOTICE:
        sends = receives = False
    else:
        # "up" carries data from the lower rank to the higher one.
        sends = (role == wire.ROLE_UP) == (rank < peer)
        receives = not sends
    name = wire.ROLE_NAMES[role] if role in (wire.ROLE_SHARED, wire.ROLE_NOTICE) else ("send" if sends else "recv")
    return Conn(sock=sock, peer=peer, role=role, stream=stream, sends=sends, receives=receives,
                label=f"r{rank}-r{peer}.{name}.s{stream}")


def _remaining(deadline: float, what: str) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise DiagError(f"timed out while {what}; are all ranks started with the same MASTER_ADDR/PORT "
                        "and able to reach each other? (raise --timeout if the cluster is slow to start)")
    return left


def listen(address: str, knobs: RawKnobs) -> socket.socket:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    apply_socket_options(listener, knobs)
    try:
        listener.bind((address, 0))
    except OSError as exc:
        listener.close()
        raise DiagError(f"cannot listen on {address}: {exc.strerror}; pick another --iface") from None
    listener.listen(256)
    return listener


def connect_to(rank: int, peer: int, address: tuple[str, int], token: bytes, role: int, stream: int,
               knobs: RawKnobs, deadline: float) -> Conn:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        apply_socket_options(sock, knobs)
        while True:
            sock.settimeout(min(_remaining(deadline, f"connecting to rank {peer} at {address[0]}:{address[1]}"),
                                HANDSHAKE_TIMEOUT_S))
            try:
                sock.connect(address)
                break
            except (ConnectionRefusedError, TimeoutError):
                sock.close()
                time.sleep(0.05)
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                apply_socket_options(sock, knobs)
        sock.sendall(wire.pack_hello(token, rank, role, stream))
        reply = bytearray(wire.ACK.size)
        view = memoryview(reply)
        got = 0
        while got < len(reply):
            sock.settimeout(_remaining(deadline, f"waiting for rank {peer} to accept the connection"))
            n = sock.recv_into(view[got:])
            if n == 0:
                raise DiagError(f"rank {peer} refused the connection handshake (token or settings differ; "
                                "see its log)")
            got += n
        magic, acceptor = wire.ACK.unpack(reply)
        if magic != wire.ACK_MAGIC or acceptor != peer:
            raise DiagError(f"{address[0]}:{address[1]} is not rank {peer} of this run (bad handshake reply)")
        return make_conn(sock, rank, peer, role, stream, knobs)
    except BaseException:
        sock.close()
        raise


@dataclass(eq=False)
class _Pending:
    sock: socket.socket
    origin: str
    deadline: float
    buffer: bytearray = field(default_factory=lambda: bytearray(wire.HELLO.size))
    filled: int = 0


def accept_all(listener: socket.socket, rank: int, world_size: int, token: bytes, knobs: RawKnobs,
               deadline: float) -> list[Conn]:
    """Accept every connection the higher ranks owe us; close and log everything else."""
    expected = {(peer, role, stream) for peer in range(rank + 1, world_size)
                for role, stream in conn_plan(rank, peer, knobs)}
    accepted: list[Conn] = []
    pending: dict[int, _Pending] = {}
    listener.setblocking(False)
    poller = select.poll()
    poller.register(listener.fileno(), select.POLLIN)

    def drop(fd: int, reason: str) -> None:
        entry = pending.pop(fd)
        poller.unregister(fd)
        log.warning("raw transport rank %d: closed connection from %s: %s", rank, entry.origin, reason)
        entry.sock.close()

    try:
        while expected:
            now = time.monotonic()
            for fd in [fd for fd, entry in pending.items() if entry.deadline <= now]:
                drop(fd, "incomplete handshake (timed out)")
            wait = _remaining(deadline, f"waiting for ranks {sorted({p for p, _, _ in expected})} to connect")
            if pending:
                wait = min(wait, max(0.0, min(entry.deadline for entry in pending.values()) - now))
            for fd, _event in poller.poll(int(wait * 1000) + 1):
                if fd == listener.fileno():
                    _accept_new(listener, pending, poller, rank)
                    continue
                entry = pending.get(fd)
                if entry is None:
                    continue
                try:
                    n = entry.sock.recv_into(memoryview(entry.buffer)[entry.filled:])
                except BlockingIOError:
                    continue
                except OSError as exc:
                    drop(fd, exc.strerror or "socket error")
                    continue
                if n == 0:
                    drop(fd, f"closed after {entry.filled} handshake bytes")
                    continue
                entry.filled += n
                if entry.filled >= 4 and bytes(entry.buffer[:4]) != wire.HELLO_MAGIC:
                    drop(fd, "not a diag raw-transport client (bad magic)")
                    continue
                if entry.filled < len(entry.buffer):
                    continue
                try:
                    hello = wire.parse_hello(entry.buffer)
                except ValueError as exc:
                    drop(fd, str(exc))
                    continue
                if not hmac.compare_digest(hello.token, token):
                    drop(fd, f"wrong run token (claimed rank {hello.rank})")
                    continue
                key = (hello.rank, hello.role, hello.stream)
                if key not in expected:
                    drop(fd, f"unexpected or duplicate connection (rank {hello.rank}, role {hello.role}, "
                             f"stream {hello.stream})")
                    continue
                entry = pending.pop(fd)
                poller.unregister(fd)
                entry.sock.setblocking(True)
                entry.sock.settimeout(HANDSHAKE_TIMEOUT_S)
                try:
                    entry.sock.sendall(wire.ACK.pack(wire.ACK_MAGIC, rank))
                except OSError as exc:
                    log.warning("raw transport rank %d: rank %d left during the handshake: %s",
                                rank, hello.rank, exc)
                    entry.sock.close()
                    continue
                expected.discard(key)
                accepted.append(make_conn(entry.sock, rank, hello.rank, hello.role, hello.stream, knobs))
    except BaseException:
        for conn in accepted:
            conn.sock.close()
        raise
    finally:
        for entry in pending.values():
            log.warning("raw transport rank %d: closed connection from %s: incomplete handshake "
                        "(%d bytes) when the mesh was complete", rank, entry.origin, entry.filled)
            entry.sock.close()
    return accepted


def _accept_new(listener: socket.socket, pending: dict[int, _Pending], poller: select.poll, rank: int) -> None:
    while True:
        try:
            sock, origin = listener.accept()
        except BlockingIOError:
            return
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ECONNABORTED):
                log.warning("raw transport rank %d: accept failed: %s", rank, exc)
                return
            raise
        where = f"{origin[0]}:{origin[1]}"
        if len(pending) >= MAX_PENDING_HANDSHAKES:
            log.warning("raw transport rank %d: closed connection from %s: too many half-open clients",
                        rank, where)
            sock.close()
            continue
        sock.setblocking(False)
        pending[sock.fileno()] = _Pending(sock=sock, origin=where,
                                          deadline=time.monotonic() + HANDSHAKE_TIMEOUT_S)
        poller.register(sock.fileno(), select.POLLIN)


def close_all(conns: list[Conn]) -> None:
    for conn in conns:
        with contextlib.suppress(OSError):
            conn.sock.close()

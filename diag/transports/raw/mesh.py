"""The connection mesh: rendezvous through a torch Store, listen on one address, connect, authenticate.

For every rank pair the higher rank connects and the lower rank accepts. ``--conn shared`` opens
``streams`` sockets per pair that carry both directions; ``--conn split`` opens ``streams`` sockets per
direction, each carrying bulk data one way only (its reverse direction sees only ACKs and, with
``--handshake notify``, the receiver's ready notices). ``--notice own-conn`` adds one socket per pair
that carries only the ready notices.

The accepting side multiplexes the listener and every half-open connection in one poll loop with
per-connection deadlines, so a stray client that sends half a HELLO cannot stall the real ranks. When more
than MAX_PENDING_HANDSHAKES clients are half-open, the oldest one is closed to make room: a real rank
completes its handshake within a round trip, so only a crowd arriving faster than that can push it out,
and then it connects again. A connecting rank whose connection was closed or reset before the handshake
completed tries again until the deadline. The listener is closed once the mesh is complete: later strays
are refused by the kernel.

Both ends prove the run token with HMACs over both sides' nonces and the connection's two ends as each sees
them (wire.py); the token itself never crosses the network, and a relay between two ranks fails. Where the token comes from decides whom it keeps out (docs/raw-tcp.md, "Trust model"): runs
whose ranks diag starts itself (--nproc, --lab) read it from their 0600 job file, so no other local user
can take a rank's place; in place (the user's torchrun) rank 0 publishes it in the job's TCPStore, so
whoever can reach MASTER_ADDR:MASTER_PORT is trusted, as torch.distributed itself trusts them.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
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

HANDSHAKE_TIMEOUT_S = 5.0      # how long one accepted client may take to complete its handshake
MAX_PENDING_HANDSHAKES = 128   # beyond this many half-open clients, the oldest is closed for a newcomer
ACCEPT_BATCH = 16              # clients accepted per poll round, between which half-open ones are read
LISTEN_BACKLOG = 4096          # completed connections the kernel queues before accept (capped by somaxconn)
RETRY_PAUSE_S = 0.05           # between two connection attempts to a peer
LOGGED_DROPS = 20              # closed strays logged one by one; after that, one line per hundred
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
    listener.listen(LISTEN_BACKLOG)
    return listener


class _Retry(Exception):
    """This attempt to reach a peer failed in a way a crowded or restarting listener explains."""


def connect_to(rank: int, peer: int, address: tuple[str, int], token: bytes, role: int, stream: int,
               knobs: RawKnobs, deadline: float) -> Conn:
    """Connect to ``peer`` and hand it our HELLO; tries again until the deadline when the connection is
    refused, reset or closed before the peer's reply (a listener crowded by strays closes newcomers' peers
    to make room, see accept_all)."""
    where = f"rank {peer} at {address[0]}:{address[1]}"
    attempts = 0
    last = "no attempt"
    while True:
        if time.monotonic() >= deadline:
            raise DiagError(f"could not connect to {where} in {attempts} attempt(s) (last: {last}); is that rank "
                            "running with the same MASTER_ADDR/PORT and raw transport settings, and reachable? "
                            "(raise --timeout if the cluster is slow to start)")
        attempts += 1
        try:
            return _attempt(rank, peer, address, token, role, stream, knobs, deadline, where)
        except _Retry as exc:
            last = str(exc)
            log.info("raw transport rank %d: %s; trying again", rank, last)
            time.sleep(min(RETRY_PAUSE_S, max(0.0, deadline - time.monotonic())))


def _attempt(rank: int, peer: int, address: tuple[str, int], token: bytes, role: int, stream: int,
             knobs: RawKnobs, deadline: float, where: str) -> Conn:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        apply_socket_options(sock, knobs)
        sock.settimeout(max(0.001, min(deadline - time.monotonic(), HANDSHAKE_TIMEOUT_S)))
        hello = wire.pack_hello(rank, role, stream)
        try:
            sock.connect(address)
            sock.sendall(hello)
        except (ConnectionError, TimeoutError) as exc:  # refused, reset, broken pipe, SYN unanswered
            raise _Retry(f"connecting to {where}: {exc.strerror or type(exc).__name__}") from None
        ack = _read_reply(sock, wire.ACK.size, deadline, where)
        conn = wire.connector_view(sock)
        try:
            wire.check_ack(token, hello, ack, peer, conn)
        except ValueError as exc:
            # Whoever answers there is not this run's rank (a stray listener, a rewritten store address): it
            # never learns anything it could use, and this rank does not talk to it.
            raise DiagError(f"{address[0]}:{address[1]} is not rank {peer} of this run: {exc}") from None
        try:
            sock.sendall(wire.pack_proof(token, hello, ack, conn))
        except (ConnectionError, TimeoutError) as exc:
            raise _Retry(f"{where} closed the connection during the handshake "
                         f"({exc.strerror or type(exc).__name__})") from None
        ready = _read_reply(sock, wire.READY.size, deadline, where)
        if wire.READY.unpack(ready)[0] != wire.READY_MAGIC:
            raise DiagError(f"{address[0]}:{address[1]} is not rank {peer} of this run (bad handshake reply)")
        return make_conn(sock, rank, peer, role, stream, knobs)
    except BaseException:
        sock.close()
        raise


def _read_reply(sock: socket.socket, size: int, deadline: float, where: str) -> bytearray:
    """Exactly ``size`` handshake bytes from the acceptor; _Retry if it closes or resets first."""
    reply = bytearray(size)
    view = memoryview(reply)
    got = 0
    while got < size:
        sock.settimeout(max(0.001, deadline - time.monotonic()))
        try:
            n = sock.recv_into(view[got:])
        except TimeoutError:
            raise DiagError(f"timed out waiting for {where} to accept the connection; is it running the same "
                            "run? (raise --timeout if the cluster is slow to start)") from None
        except ConnectionError as exc:
            raise _Retry(f"{where} reset the connection before its handshake reply "
                         f"({exc.strerror or type(exc).__name__})") from None
        if n == 0:
            # A crowded listener closes half-open clients to make room; a wrong token or settings close it too
            # (then every retry fails the same way until the deadline, which names the peer).
            raise _Retry(f"{where} closed the connection before its handshake reply (crowded listener, or "
                         "a different run token/settings: see that rank's log)")
        got += n
    return reply


@dataclass(eq=False)
class _Pending:
    """A half-open client: its HELLO being read, or (hello set) its PROOF after our ACK went out."""

    sock: socket.socket
    origin: str
    accepted_at: float
    deadline: float
    buffer: bytearray = field(default_factory=lambda: bytearray(wire.HELLO.size))
    filled: int = 0
    hello: bytes = b""
    ack: bytes = b""
    claim: tuple[int, int, int] = (-1, -1, -1)   # (rank, role, stream) its HELLO claimed
    conn: bytes = b""                            # the connection as this side sees it (wire.acceptor_view)


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
    dropped = 0

    def drop(fd: int, reason: str) -> None:
        nonlocal dropped
        entry = pending.pop(fd)
        poller.unregister(fd)
        dropped += 1
        # A crowd of strays would flood the log: the first few are named, then one line per hundred.
        if dropped <= LOGGED_DROPS or dropped % 100 == 0:
            log.warning("raw transport rank %d: closed connection from %s: %s%s", rank, entry.origin, reason,
                        f" ({dropped} closed so far)" if dropped > LOGGED_DROPS else "")
        entry.sock.close()

    def reply(fd: int, entry: _Pending, message: bytes) -> bool:
        """Send a handshake message whole (a fresh socket's buffer always holds it), or drop the client."""
        try:
            sent = entry.sock.send(message)
        except OSError as exc:
            drop(fd, f"left during the handshake ({exc.strerror or type(exc).__name__})")
            return False
        if sent != len(message):
            drop(fd, "its receive window would not take a handshake reply")
            return False
        return True

    def on_hello(fd: int, entry: _Pending) -> None:
        try:
            hello = wire.parse_hello(entry.buffer)
        except ValueError as exc:
            drop(fd, str(exc))
            return
        entry.claim = (hello.rank, hello.role, hello.stream)
        if entry.claim not in expected:
            drop(fd, f"unexpected or duplicate connection (rank {hello.rank}, role {hello.role}, "
                     f"stream {hello.stream})")
            return
        entry.hello = bytes(entry.buffer)
        entry.ack = wire.pack_ack(token, entry.hello, rank, entry.conn)
        entry.buffer, entry.filled = bytearray(wire.PROOF.size), 0
        reply(fd, entry, entry.ack)

    def on_proof(fd: int, entry: _Pending) -> None:
        claimed_rank = entry.claim[0]
        if not wire.check_proof(token, entry.hello, entry.ack, entry.buffer, entry.conn):
            drop(fd, f"wrong run token, or a connection relayed by something between the ranks (claimed rank "
                     f"{claimed_rank})")
            return
        if entry.claim not in expected:   # another client proved the same connection first
            drop(fd, f"duplicate connection (rank {claimed_rank}, role {entry.claim[1]}, stream {entry.claim[2]})")
            return
        if not reply(fd, entry, wire.READY.pack(wire.READY_MAGIC)):
            return
        pending.pop(fd)
        poller.unregister(fd)
        expected.discard(entry.claim)
        accepted.append(make_conn(entry.sock, rank, claimed_rank, entry.claim[1], entry.claim[2], knobs))

    def service(fd: int) -> None:
        """Read what a half-open client sent; answer its HELLO, accept it once its PROOF is right."""
        entry = pending.get(fd)
        if entry is None:
            return
        try:
            n = entry.sock.recv_into(memoryview(entry.buffer)[entry.filled:])
        except BlockingIOError:
            return
        except OSError as exc:
            drop(fd, exc.strerror or "socket error")
            return
        if n == 0:
            drop(fd, f"closed after {entry.filled} {'PROOF' if entry.hello else 'HELLO'} bytes")
            return
        entry.filled += n
        if not entry.hello and entry.filled >= 4 and bytes(entry.buffer[:4]) != wire.HELLO_MAGIC:
            drop(fd, "not a diag raw-transport client (bad magic)")
            return
        if entry.filled < len(entry.buffer):
            return
        if entry.hello:
            on_proof(fd, entry)
        else:
            on_hello(fd, entry)

    def accept_new() -> None:
        # A bounded batch per poll round: a real rank's PROOF, one round trip after its HELLO, is read before
        # a backlog of strays accepted behind it could push it out.
        for _ in range(ACCEPT_BATCH):
            if not expected:
                return
            try:
                sock, origin = listener.accept()
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ECONNABORTED):
                    log.warning("raw transport rank %d: accept failed: %s", rank, exc)
                    return
                raise
            if len(pending) >= MAX_PENDING_HANDSHAKES:
                # Make room by closing the oldest half-open client rather than refusing the newcomer, who may
                # be a real rank. A real rank completes its handshake within a round trip of connecting, so it
                # is never the oldest unless MAX_PENDING_HANDSHAKES clients arrived in that time. (Closing by
                # fewest bytes received could be gamed: strays that send 28 of HELLO's 29 bytes outranked a
                # real rank whose HELLO was a little late.)
                oldest = min(pending, key=lambda k: pending[k].accepted_at)
                drop(oldest, f"{MAX_PENDING_HANDSHAKES} half-open clients; this one the oldest")
            sock.setblocking(False)
            fd = sock.fileno()
            now = time.monotonic()
            pending[fd] = _Pending(sock=sock, origin=f"{origin[0]}:{origin[1]}", accepted_at=now,
                                   deadline=now + HANDSHAKE_TIMEOUT_S,
                                   conn=wire.connection(origin, sock.getsockname()))
            poller.register(fd, select.POLLIN)
            service(fd)  # a real rank's HELLO is usually there already: answered before any eviction

    try:
        while expected:
            now = time.monotonic()
            for fd in [fd for fd, entry in pending.items() if entry.deadline <= now]:
                drop(fd, "incomplete handshake (timed out)")
            wait = _remaining(deadline, f"waiting for ranks {sorted({p for p, _, _ in expected})} to connect")
            if pending:
                wait = min(wait, max(0.0, min(entry.deadline for entry in pending.values()) - now))
            events = poller.poll(int(wait * 1000) + 1)
            # Half-open clients first, then new ones: a PROOF that arrived is never behind a batch of strays.
            for fd, _event in events:
                if fd != listener.fileno():
                    service(fd)
            if any(fd == listener.fileno() for fd, _event in events):
                accept_new()
    except BaseException:
        for conn in accepted:
            conn.sock.close()
        raise
    finally:
        for entry in list(pending.values())[:LOGGED_DROPS]:
            log.warning("raw transport rank %d: closed connection from %s: incomplete handshake "
                        "(%d bytes) when the mesh was complete", rank, entry.origin, entry.filled)
        if len(pending) > LOGGED_DROPS:
            log.warning("raw transport rank %d: closed %d more half-open connections when the mesh was complete",
                        rank, len(pending) - LOGGED_DROPS)
        for entry in pending.values():
            entry.sock.close()
    return accepted


# How long close_all waits, over all connections, for the peers to finish with them.
CLOSE_LINGER_S = 2.0


def close_all(conns: list[Conn], linger_s: float = CLOSE_LINGER_S) -> None:
    """Close gracefully: FIN after everything queued, then read to the peer's FIN before closing.

    A socket closed while bytes it never read wait in its receive buffer sends RST, not FIN, and an RST
    can overtake the data this side still has in flight, so a peer finishing its last operation (a
    barrier) would lose bytes it was owed: seen as "closed its connection in the middle of an operation"
    on a loaded host. Bytes read here are the peers' leftovers (a notice for an operation that will not
    come); a peer that neither finishes nor dies costs at most linger_s."""
    for conn in conns:
        with contextlib.suppress(OSError):
            conn.sock.shutdown(socket.SHUT_WR)
    deadline = time.monotonic() + linger_s
    for conn in conns:
        with contextlib.suppress(OSError):
            while (remaining := deadline - time.monotonic()) > 0:
                conn.sock.settimeout(remaining)
                if not conn.sock.recv(1 << 16):
                    break
        with contextlib.suppress(OSError):
            conn.sock.close()

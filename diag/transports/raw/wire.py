"""Wire format of the raw transport: the connection handshake and the message header.

Every connection opens with a four-message handshake in which both ends prove they hold the run's token
without ever sending it, on this very connection:

    HELLO  connector -> acceptor   magic, version, nonce_c (16 random bytes), connector rank, role, stream
    ACK    acceptor -> connector   magic, acceptor rank, nonce_a,
                                   HMAC-SHA256(token, "ack" | HELLO | rank | nonce_a | CONN)
    PROOF  connector -> acceptor   HMAC-SHA256(token, "proof" | HELLO | ACK | CONN)
    READY  acceptor -> connector   magic: the connection is this run's (the connector may use it)

CONN is the connection as each side sees it, never sent: the connector's address and port, then the
acceptor's (``connector_view``: the connector's own socket name and its peer; ``acceptor_view``: its peer
and its own socket name). Each MAC covers both sides' fresh nonces, so an ACK or PROOF recorded from one
connection proves nothing on another (replay), and one made without the token fails
``hmac.compare_digest``. And each covers CONN, so a relay without the token placed between two ranks (for
whoever can rewrite ``addr/<rank>`` in the store) fails too: it holds two connections, rank 1 -> relay and
relay -> rank 0, whose ends differ, and the MACs it passes on were made over the other connection. (The
price: the ranks must reach each other directly, as gloo's do; a NAT between them fails the same way.) A
connector that receives an ACK that does not prove the token on its connection gives up on that address
(it is not this run's rank); an acceptor closes and logs a client whose PROOF fails. Before PROOF the
acceptor keeps nothing of a client but fixed HELLO- and PROOF-sized scratch buffers.

After the handshake a stream carries messages: a 48-byte header, then ``length`` payload bytes for DATA.
48 bytes is the size of gloo's preamble (six 64-bit fields, gloo/transport/tcp/pair.h), so a notice of
the gloo model is the same segment on the wire as gloo's. With ``--handshake notify`` the receiver of a
chunk sends RECV_READY when it posts the receive and the sender SEND_READY when it posts the send, as
gloo's pair does (no payload either). Every header is checked against what the receiver expects (type,
sequence number, exact length) before one payload byte is read, so a confused or hostile peer can never
write past a posted buffer.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import socket
import struct
from dataclasses import dataclass
from typing import Any

from diag.errors import DiagError

# Version history: 2: 48-byte header with a stream index, SEND_READY, notice connections; 3: the token is
# proven by HMACs over both sides' nonces (HELLO, ACK, PROOF, READY), never sent; 4: the HMACs also cover the
# connection's two ends as each side sees them (a relay without the token fails).
PROTOCOL_VERSION = 4
HELLO_MAGIC = b"DGRW"
ACK_MAGIC = b"DGOK"
READY_MAGIC = b"DGGO"
TOKEN_BYTES = 16
NONCE_BYTES = 16
MAC_BYTES = 32   # HMAC-SHA256

# magic, version, connector's nonce, connector rank, role, stream index
HELLO = struct.Struct("<4sH16sIBH")
# magic, acceptor rank, acceptor's nonce, MAC
ACK = struct.Struct("<4sI16s32s")
PROOF = struct.Struct("<32s")
READY = struct.Struct("<4s")

# Logical connection roles. "up"/"down" are the two directions of a split pair: "up" carries data from
# the lower rank to the higher rank, "down" the other way. "shared" carries both, as gloo's pair does.
ROLE_SHARED = 0
ROLE_UP = 1
ROLE_DOWN = 2
# "notice" (--notice own-conn) carries only the ready notices of a pair, both ways, never data.
ROLE_NOTICE = 3
ROLE_NAMES = {ROLE_SHARED: "shared", ROLE_UP: "up", ROLE_DOWN: "down", ROLE_NOTICE: "notice"}

MSG_MAGIC = 0xD1A6
MSG_DATA = 1
MSG_RECV_READY = 2    # gloo's NOTIFY_RECV_READY: "I posted the receive for your next send"
MSG_SEND_READY = 3    # gloo's NOTIFY_SEND_READY: "I posted a send"; data follows once RECV_READY arrived
MSG_ABORT = 4         # "I stopped the operation named in this header" (its reason code in ``length``)
MSG_REFUSE = 5        # point-to-point: "your RECV_READY does not fit my send" (my send's size in ``length``)
MSG_KINDS = (MSG_DATA, MSG_RECV_READY, MSG_SEND_READY, MSG_ABORT, MSG_REFUSE)
# magic, type, stream index, sequence number (mod 2**32), payload length, then in what was gloo's padding:
# ``tag`` (point-to-point: the user's tag; collectives: the operation's number) and ``total`` (the bytes
# per rank of the whole operation or message, so that ranks called with different sizes are told so
# exactly, not only by one piece that does not fit); 16 bytes of padding keep gloo's 48-byte preamble size.
HEADER = struct.Struct("<HBBIQqQ16x")
HEADER_BYTES = HEADER.size
ABORT_MISMATCH = 1    # the ranks called different operations or sizes
ABORT_FAILED = 2      # the operation failed on the sender (timeout, a peer's error)


@dataclass(frozen=True)
class Hello:
    nonce: bytes
    rank: int
    role: int
    stream: int


def pack_hello(rank: int, role: int, stream: int, nonce: bytes | None = None) -> bytes:
    """A HELLO with a fresh random nonce (or ``nonce``, for tests)."""
    return HELLO.pack(HELLO_MAGIC, PROTOCOL_VERSION, nonce or secrets.token_bytes(NONCE_BYTES), rank, role, stream)


def _mac(token: bytes, label: bytes, *parts: bytes) -> bytes:
    return hmac.new(token, b"diag-raw " + label + b"\0" + b"\0".join(parts), hashlib.sha256).digest()


def connection(connector: tuple[Any, ...], acceptor: tuple[Any, ...]) -> bytes:
    """CONN: the connector's address and port, then the acceptor's (as socket names give them)."""
    return f"{connector[0]}:{int(connector[1])}>{acceptor[0]}:{int(acceptor[1])}".encode()


def connector_view(sock: socket.socket) -> bytes:
    """CONN as the connecting rank sees its socket: itself, then the address it connected to."""
    return connection(sock.getsockname(), sock.getpeername())


def acceptor_view(sock: socket.socket) -> bytes:
    """CONN as the accepting rank sees an accepted socket: the client, then itself."""
    return connection(sock.getpeername(), sock.getsockname())


def pack_ack(token: bytes, hello: bytes, rank: int, conn: bytes, nonce: bytes | None = None) -> bytes:
    """The acceptor's reply to ``hello`` (its raw bytes) on the connection ``conn`` (its view): its rank, a
    fresh nonce, and a MAC over both nonces and the connection."""
    nonce = nonce or secrets.token_bytes(NONCE_BYTES)
    return ACK.pack(ACK_MAGIC, rank, nonce, _mac(token, b"ack", hello, struct.pack("<I", rank), nonce, conn))


def check_ack(token: bytes, hello: bytes, ack: bytes | bytearray, peer: int, conn: bytes) -> None:
    """Raise ValueError unless ``ack`` is rank ``peer``'s answer to ``hello`` made with ``token`` on the
    connection the connector sees as ``conn``."""
    magic, rank, nonce, mac = ACK.unpack(ack)
    if magic != ACK_MAGIC:
        raise ValueError("not a diag raw-transport rank (bad handshake reply)")
    if rank != peer:
        raise ValueError(f"it answers as rank {rank}, not {peer}")
    if not hmac.compare_digest(mac, _mac(token, b"ack", hello, struct.pack("<I", rank), nonce, conn)):
        raise ValueError("its handshake reply does not prove this run's token on this connection (a different "
                         "token, or something between the ranks: a relay, a NAT)")


def pack_proof(token: bytes, hello: bytes, ack: bytes | bytearray, conn: bytes) -> bytes:
    return PROOF.pack(_mac(token, b"proof", hello, bytes(ack), conn))


def check_proof(token: bytes, hello: bytes, ack: bytes, proof: bytes | bytearray, conn: bytes) -> bool:
    (mac,) = PROOF.unpack(proof)
    return hmac.compare_digest(mac, _mac(token, b"proof", hello, ack, conn))


def parse_hello(data: bytes | bytearray | memoryview) -> Hello:
    """Raise ValueError with the reason on anything that is not a HELLO of this protocol version."""
    magic, version, nonce, rank, role, stream = HELLO.unpack(data)
    if magic != HELLO_MAGIC:
        raise ValueError("not a diag raw-transport client (bad magic)")
    if version != PROTOCOL_VERSION:
        raise ValueError(f"protocol version {version}, expected {PROTOCOL_VERSION}")
    if role not in ROLE_NAMES:
        raise ValueError(f"unknown connection role {role}")
    return Hello(nonce=nonce, rank=rank, role=role, stream=stream)


def pack_header(into: bytearray, kind: int, seq: int, length: int, stream: int = 0, tag: int = 0,
                total: int = 0) -> None:
    HEADER.pack_into(into, 0, MSG_MAGIC, kind, stream, seq & 0xFFFFFFFF, length, tag, total)


def header_tag_total(data: bytearray) -> tuple[int, int]:
    """-> (tag, total) of a header already checked by parse_header."""
    return HEADER.unpack(data)[5:7]


def parse_header(data: bytearray, peer: int) -> tuple[int, int, int, int]:
    """-> (kind, stream, seq, length); a malformed header is a protocol error naming the peer."""
    magic, kind, stream, seq, length, _tag, _total = HEADER.unpack(data)
    if magic != MSG_MAGIC or kind not in MSG_KINDS:
        raise DiagError(f"rank {peer} sent a malformed message header (magic {magic:#x}, type {kind}); "
                        "are all ranks running the same diag version?")
    return kind, stream, seq, length

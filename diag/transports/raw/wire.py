"""Wire format of the raw transport: the connection handshake and the message header.

Every connection opens with HELLO (connector -> acceptor) and ACK (acceptor -> connector). HELLO carries a
per-run token taken from the rendezvous store, the connector's rank and which logical connection this
socket is; anything that is not a well-formed HELLO with the right token is closed and logged, and its
bytes only ever land in a fixed HELLO-sized scratch buffer.

After the handshake a stream carries messages: a 48-byte header, then ``length`` payload bytes for DATA.
48 bytes is the size of gloo's preamble (six 64-bit fields, gloo/transport/tcp/pair.h), so a notice of
the gloo model is the same segment on the wire as gloo's. With ``--handshake notify`` the receiver of a
chunk sends RECV_READY when it posts the receive and the sender SEND_READY when it posts the send, as
gloo's pair does (no payload either). Every header is checked against what the receiver expects (type,
sequence number, exact length) before one payload byte is read, so a confused or hostile peer can never
write past a posted buffer.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from diag.errors import DiagError

PROTOCOL_VERSION = 2   # 2: 48-byte header with a stream index, SEND_READY, notice connections
HELLO_MAGIC = b"DGRW"
ACK_MAGIC = b"DGOK"
TOKEN_BYTES = 16

# magic, version, token, connector rank, role, stream index
HELLO = struct.Struct("<4sH16sIBH")
ACK = struct.Struct("<4sI")

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
MSG_KINDS = (MSG_DATA, MSG_RECV_READY, MSG_SEND_READY)
# magic, type, stream index, sequence number (mod 2**32), payload length, padding to gloo's 48 bytes
HEADER = struct.Struct("<HBBIQ32x")
HEADER_BYTES = HEADER.size


@dataclass(frozen=True)
class Hello:
    token: bytes
    rank: int
    role: int
    stream: int


def pack_hello(token: bytes, rank: int, role: int, stream: int) -> bytes:
    return HELLO.pack(HELLO_MAGIC, PROTOCOL_VERSION, token, rank, role, stream)


def parse_hello(data: bytes | bytearray | memoryview) -> Hello:
    """Raise ValueError with the reason on anything that is not a HELLO of this protocol version."""
    magic, version, token, rank, role, stream = HELLO.unpack(data)
    if magic != HELLO_MAGIC:
        raise ValueError("not a diag raw-transport client (bad magic)")
    if version != PROTOCOL_VERSION:
        raise ValueError(f"protocol version {version}, expected {PROTOCOL_VERSION}")
    if role not in ROLE_NAMES:
        raise ValueError(f"unknown connection role {role}")
    return Hello(token=token, rank=rank, role=role, stream=stream)


def pack_header(into: bytearray, kind: int, seq: int, length: int, stream: int = 0) -> None:
    HEADER.pack_into(into, 0, MSG_MAGIC, kind, stream, seq & 0xFFFFFFFF, length)


def parse_header(data: bytearray, peer: int) -> tuple[int, int, int, int]:
    """-> (kind, stream, seq, length); a malformed header is a protocol error naming the peer."""
    magic, kind, stream, seq, length = HEADER.unpack(data)
    if magic != MSG_MAGIC or kind not in MSG_KINDS:
        raise DiagError(f"rank {peer} sent a malformed message header (magic {magic:#x}, type {kind}); "
                        "are all ranks running the same diag version?")
    return kind, stream, seq, length

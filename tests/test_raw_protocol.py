"""The gloo pair-protocol model (--handshake notify) on real sockets: wire order and data per knob.

The wire-order tests run one rank's engine against a peer played by the test over loopback TCP, so the
test sees every message in the order it left the rank: whether a RECV_READY posted while the rank's own
data is queued reaches the peer behind that data (gloo's in-band notice) or not (each knob that removes
the cause). Sockets get small buffers so a 1 MiB chunk cannot hide in the kernel.
"""

from __future__ import annotations

import itertools
import socket
import threading
from typing import Any

import pytest

from diag.transports.raw import schedules, wire
from diag.transports.raw.engine import Engine, Link
from diag.transports.raw.mesh import Conn
from tests.raw_helpers import assert_all_ok, check_all_gather, make_transport, run_ranks

BLOCK = 2 << 20             # per-rank block: 2 chunks of 1 MiB
CHUNK = BLOCK // 2
SMALL_BUFFER = 64 * 1024    # SO_SNDBUF / SO_RCVBUF of both ends
WAIT_S = 10.0
NAMES = {wire.MSG_DATA: "DATA", wire.MSG_RECV_READY: "RR", wire.MSG_SEND_READY: "SR"}


def _tcp_pair() -> tuple[socket.socket, socket.socket]:
    """(rank side, peer side) of one loopback TCP connection with small buffers."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    client = socket.socket()
    for sock in (listener, client):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SMALL_BUFFER)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SMALL_BUFFER)
    client.connect(listener.getsockname())
    server, _ = listener.accept()
    listener.close()
    for sock in (client, server):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    server.settimeout(WAIT_S)
    client.setblocking(False)
    return client, server


class Peer:
    """Rank 1, played by hand: reads and writes whole messages on its sockets."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.header = bytearray(wire.HEADER_BYTES)

    def read(self) -> tuple[str, int, int]:
        """-> (kind name, seq, length); a DATA payload is read and dropped."""
        self._read_exactly(memoryview(self.header))
        kind, _stream, seq, length = wire.parse_header(self.header, 0)
        if kind == wire.MSG_DATA:
            self._read_exactly(memoryview(bytearray(length)))
        return NAMES[kind], seq, length

    def write(self, kind: int, seq: int, payload: bytes = b"", length: int | None = None) -> None:
        header = bytearray(wire.HEADER_BYTES)
        # DATA names the whole block its piece belongs to (the receiver checks it, as every size)
        wire.pack_header(header, kind, seq, len(payload) if length is None else length,
                         total=BLOCK if kind == wire.MSG_DATA else 0)
        self.sock.sendall(bytes(header) + payload)

    def _read_exactly(self, view: memoryview) -> None:
        got = 0
        while got < len(view):
            n = self.sock.recv_into(view[got:])
            assert n, "the rank closed the connection"
            got += n


def _start_rank(conn_mode: str, notice: str, send_first: bool) -> tuple[dict[str, Any], dict[str, Peer]]:
    """Rank 0's engine running a 2-rank gloo ring all_gather in a thread; -> (state, peer ends by role)."""
    peers: dict[str, Peer] = {}
    routes: dict[tuple[int, int, bool], Link] = {}
    notice_links: dict[int, Link] = {}
    sockets: list[socket.socket] = []

    def connect(role: int, name: str, sends: bool, receives: bool) -> Link:
        mine, theirs = _tcp_pair()
        sockets.extend((mine, theirs))
        peers[name] = Peer(theirs)
        return Link(Conn(sock=mine, peer=1, role=role, stream=0, label=f"r0-r1.{name}", sends=sends,
                         receives=receives))

    if conn_mode == "shared":
        shared = connect(wire.ROLE_SHARED, "shared", True, True)
        routes[(1, 0, True)] = routes[(1, 0, False)] = shared
    else:
        routes[(1, 0, True)] = connect(wire.ROLE_UP, "send", True, False)
        routes[(1, 0, False)] = connect(wire.ROLE_DOWN, "recv", False, True)
    if notice == "own-conn":
        notice_links[1] = connect(wire.ROLE_NOTICE, "notice", False, False)
    engine = Engine(routes, notify=True, send_first=send_first, alternate=False, sockbuf=None,
                    notice_links=notice_links)
    out = bytearray(2 * BLOCK)
    out[:BLOCK] = bytes(range(256)) * (BLOCK // 256)          # rank 0's own block, in place
    state: dict[str, Any] = {"out": out, "sockets": sockets, "error": None}

    def run() -> None:
        stages = schedules.all_gather("ring", memoryview(out), 0, 2, chunks=2, streams=1,
                                      send_first=send_first, gloo_waits=True)
        try:
            engine.run(stages, "all_gather", WAIT_S)
        except BaseException as exc:   # the test thread asserts on it
            state["error"] = exc

    state["thread"] = threading.Thread(target=run, daemon=True)
    state["start"] = state["thread"].start
    return state, peers


def _finish(state: dict[str, Any], data_peer: Peer, notice_peer: Peer) -> None:
    """Play rank 1's side of both chunks and check that rank 0 ends with rank 1's block."""
    theirs = bytes(reversed(range(256))) * (BLOCK // 256)
    for seq in (0, 1):
        notice_peer.write(wire.MSG_SEND_READY, seq, length=CHUNK)
    for seq in (0, 1):
        data_peer.write(wire.MSG_DATA, seq, theirs[seq * CHUNK:(seq + 1) * CHUNK])
    state["thread"].join(WAIT_S)
    assert not state["thread"].is_alive(), "the rank did not finish"
    assert state["error"] is None, state["error"]
    assert bytes(state["out"][BLOCK:]) == theirs
    for sock in state["sockets"]:
        sock.close()


def _early_peer_ready(notice_peer: Peer) -> None:
    """Rank 1 started first: both its RECV_READYs are on the wire before rank 0 posts anything."""
    for seq in (0, 1):
        notice_peer.write(wire.MSG_RECV_READY, seq, length=CHUNK)


def test_in_band_notice_waits_behind_own_data_when_the_peer_was_ready_first() -> None:
    state, peers = _start_rank("shared", "in-band", send_first=True)
    _early_peer_ready(peers["shared"])
    state["start"]()
    order = [peers["shared"].read() for _ in range(6)]
    # gloo: send(c0) finds the peer's RECV_READY, so SEND_READY and the data go at once; recv(c0)'s
    # RECV_READY is queued behind that MiB of data, and the peer cannot send before it arrives.
    assert order == [("SR", 0, CHUNK), ("DATA", 0, CHUNK), ("RR", 0, CHUNK),
                     ("SR", 1, CHUNK), ("DATA", 1, CHUNK), ("RR", 1, CHUNK)]
    _finish(state, peers["shared"], peers["shared"])


def test_send_announces_itself_and_waits_for_the_receivers_notice() -> None:
    state, peers = _start_rank("shared", "in-band", send_first=True)
    state["start"]()
    # No RECV_READY from the peer yet: every send only announces itself, no data moves.
    assert [peers["shared"].read() for _ in range(4)] == [("SR", 0, CHUNK), ("RR", 0, CHUNK),
                                                          ("SR", 1, CHUNK), ("RR", 1, CHUNK)]
    peers["shared"].sock.settimeout(0.3)
    with pytest.raises(TimeoutError):
        peers["shared"].read()
    peers["shared"].sock.settimeout(WAIT_S)
    _early_peer_ready(peers["shared"])
    assert [peers["shared"].read() for _ in range(2)] == [("DATA", 0, CHUNK), ("DATA", 1, CHUNK)]
    _finish(state, peers["shared"], peers["shared"])


def test_recv_posted_first_puts_the_notice_ahead_of_the_data() -> None:
    state, peers = _start_rank("shared", "in-band", send_first=False)
    _early_peer_ready(peers["shared"])
    state["start"]()
    order = [peers["shared"].read() for _ in range(6)]
    assert order[0] == ("RR", 0, CHUNK)
    assert order[1:3] == [("SR", 0, CHUNK), ("DATA", 0, CHUNK)]
    _finish(state, peers["shared"], peers["shared"])


@pytest.mark.parametrize("conn_mode,notice,notice_end", [("shared", "own-conn", "notice"),
                                                         ("split", "in-band", "recv")])
def test_a_notice_off_the_data_stream_overtakes_the_data(conn_mode: str, notice: str, notice_end: str) -> None:
    state, peers = _start_rank(conn_mode, notice, send_first=True)
    data_end = "shared" if conn_mode == "shared" else "send"
    _early_peer_ready(peers[notice_end] if notice == "own-conn" else peers[data_end])
    state["start"]()
    # Nothing has been read from the data socket, and its 1 MiB chunk cannot fit in the small buffers,
    # yet both RECV_READYs are readable on the other socket.
    notices = [peers[notice_end].read() for _ in range(4 if notice == "own-conn" else 2)]
    assert [n for n in notices if n[0] == "RR"] == [("RR", 0, CHUNK), ("RR", 1, CHUNK)]
    assert state["thread"].is_alive()
    order = [peers[data_end].read() for _ in range(2 if notice == "own-conn" else 4)]
    assert [n for n in order if n[0] == "DATA"] == [("DATA", 0, CHUNK), ("DATA", 1, CHUNK)]
    # Rank 1's data comes on the socket rank 0 receives on, its SEND_READYs where its notices go.
    incoming = peers["shared"] if conn_mode == "shared" else peers["recv"]
    _finish(state, incoming, peers["notice"] if notice == "own-conn" else incoming)


# Every combination of the model's knobs moves the right bytes, on real ranks (N=2 and 3).
MODEL_KNOBS = [{"emulate": "gloo", "conn": conn, "notice": notice, "order": order, "skew_us": skew}
               for conn, notice, order, skew in itertools.product(("shared", "split"), ("in-band", "own-conn"),
                                                                  ("send-first", "recv-first"), (0, 300))]
MODEL_KNOBS += [{"emulate": "gloo", "conn": "shared", "notice": "own-conn", "order": "send-first", "skew_us": 0,
                 **extra} for extra in ({"streams": 2}, {"io": "alternate"}, {"streams": 2, "algo": "pairwise"})]


def _model_body(rank: int, world_size: int) -> list[Any]:
    failures = []
    for knobs in MODEL_KNOBS:
        transport = make_transport(rank, world_size, knobs)
        try:
            for nbytes in (1, 3000, 300001):
                wrong = check_all_gather(transport, rank, world_size, nbytes)
                if wrong:
                    failures.append((knobs, nbytes, wrong))
            assert transport.knobs()["connections_per_peer"] == (
                (1 if knobs["conn"] == "shared" else 2) * knobs.get("streams", 1) + (knobs["notice"] == "own-conn"))
            transport.barrier()
        finally:
            transport.close()
    return failures


@pytest.mark.parametrize("world_size", [2, 3])
def test_every_model_knob_combination_moves_the_right_bytes(world_size: int) -> None:
    assert assert_all_ok(run_ranks(_model_body, world_size, timeout_s=180)) == [[]] * world_size

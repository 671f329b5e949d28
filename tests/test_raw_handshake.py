"""The raw transport's handshake and notices on real sockets: both ends prove the run token, nothing replays,
strays cannot push a real rank out, and a peer cannot grow a rank's memory with RECV_READY notices.

The acceptor is mesh.accept_all (rank 0 of 2) in a thread; the other end is mesh.connect_to or a client
played by hand with wire's helpers, so each test sends exactly the bytes an attacker could.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from typing import Any

import pytest

from diag.errors import DiagError
from diag.transports.raw import mesh, schedules, wire
from diag.transports.raw.engine import RECV, Engine, Link
from diag.transports.raw.knobs import resolve_knobs
from tests.raw_helpers import LogCollector

TOKEN = bytes(range(16))
WRONG = bytes(16)
KNOBS = resolve_knobs("ring", "recv-first", {"conn": "shared"})
WAIT_S = 10.0


@pytest.fixture
def raw_log() -> Any:
    collect = LogCollector()
    logger = logging.getLogger("diag.raw")
    logger.addHandler(collect)
    yield collect.messages
    logger.removeHandler(collect)


def start_acceptor(token: bytes = TOKEN) -> tuple[tuple[str, int], dict[str, Any], threading.Thread]:
    """Rank 0's accept_all in a thread, owed one connection by rank 1; -> (address, result, thread)."""
    listener = mesh.listen("127.0.0.1", KNOBS)
    address = listener.getsockname()
    result: dict[str, Any] = {}

    def run() -> None:
        try:
            result["conns"] = mesh.accept_all(listener, 0, 2, token, KNOBS, time.monotonic() + WAIT_S)
        except BaseException as exc:  # the test asserts on it
            result["error"] = exc
        finally:
            listener.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return address, result, thread


def read_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            return data
        data += chunk
    return data


def hand_handshake(address: tuple[str, int], token: bytes) -> tuple[socket.socket, bytes, bytes, bytes, bytes]:
    """Rank 1 by hand: HELLO, read ACK, PROOF (made with ``token``); -> (socket, hello, ack, proof, reply)."""
    sock = socket.create_connection(address, timeout=WAIT_S)
    hello = wire.pack_hello(1, wire.ROLE_SHARED, 0)
    sock.sendall(hello)
    ack = read_exactly(sock, wire.ACK.size)
    proof = wire.pack_proof(token, hello, ack, wire.connector_view(sock))
    sock.sendall(proof)
    return sock, hello, ack, proof, read_exactly(sock, wire.READY.size)


def finish(result: dict[str, Any], thread: threading.Thread) -> list[mesh.Conn]:
    thread.join(WAIT_S + 5)
    assert not thread.is_alive(), "accept_all did not return"
    assert "error" not in result, result.get("error")
    return result["conns"]


def test_a_peer_with_the_wrong_token_is_rejected_both_ways(raw_log: list[str]) -> None:
    address, result, thread = start_acceptor()
    # As a connector: the acceptor's ACK does not verify under the wrong token, so it gives up at once.
    with pytest.raises(DiagError, match="does not prove this run's token"):
        mesh.connect_to(1, 0, address, WRONG, wire.ROLE_SHARED, 0, KNOBS, time.monotonic() + WAIT_S)
    # As a client that ignores the ACK and sends a PROOF made without the token: closed, never admitted.
    sock, *_, reply = hand_handshake(address, WRONG)
    assert reply == b""
    sock.close()
    # The real rank still gets in, and the connection carries bytes.
    conn = mesh.connect_to(1, 0, address, TOKEN, wire.ROLE_SHARED, 0, KNOBS, time.monotonic() + WAIT_S)
    accepted = finish(result, thread)
    assert [(c.peer, c.role) for c in accepted] == [(1, wire.ROLE_SHARED)]
    conn.sock.setblocking(True)
    conn.sock.sendall(b"ping")
    accepted[0].sock.setblocking(True)
    assert read_exactly(accepted[0].sock, 4) == b"ping"
    for sock in (conn.sock, accepted[0].sock):
        sock.close()
    assert any("wrong run token, or a connection relayed by something between the ranks (claimed rank 1)" in m
               for m in raw_log)


def test_a_replayed_proof_is_refused(raw_log: list[str]) -> None:
    """A PROOF recorded from a genuine handshake proves nothing on another connection (fresh nonce_a)."""
    address, result, thread = start_acceptor()
    sock, hello, recorded_ack, proof, reply = hand_handshake(address, TOKEN)
    assert reply == wire.READY_MAGIC
    sock.close()
    for conn in finish(result, thread):
        conn.sock.close()
    # Against a fresh acceptor (same token), the same recorded HELLO and PROOF fail on the new challenge.
    address, result, thread = start_acceptor()
    replayer = socket.create_connection(address, timeout=WAIT_S)
    replayer.sendall(hello)
    new_ack = read_exactly(replayer, wire.ACK.size)
    assert len(new_ack) == wire.ACK.size and new_ack != recorded_ack
    replayer.sendall(proof)
    assert read_exactly(replayer, wire.READY.size) == b""
    replayer.close()
    conn = mesh.connect_to(1, 0, address, TOKEN, wire.ROLE_SHARED, 0, KNOBS, time.monotonic() + WAIT_S)
    for accepted_conn in finish(result, thread):
        accepted_conn.sock.close()
    conn.sock.close()
    assert any("wrong run token" in m for m in raw_log)


def fake_acceptor(answer) -> tuple[tuple[str, int], dict[str, Any], threading.Thread]:
    """A listener that is not rank 0: it reads the HELLO and replies ``answer(hello, conn)`` (``conn``: the
    connection as an acceptor sees it); records what came next."""
    listener = socket.create_server(("127.0.0.1", 0))
    seen: dict[str, Any] = {}

    def run() -> None:
        sock, _ = listener.accept()
        sock.settimeout(WAIT_S)
        hello = read_exactly(sock, wire.HELLO.size)
        sock.sendall(answer(hello, wire.acceptor_view(sock)))
        seen["after"] = sock.recv(1024)   # a connector that refused the ACK sends no PROOF: b""
        sock.close()
        listener.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return listener.getsockname(), seen, thread


def test_a_forged_or_replayed_ack_fails() -> None:
    # A genuine ACK, recorded from rank 0's answer to another HELLO.
    address, result, thread = start_acceptor()
    sock, _hello, recorded_ack, _proof, reply = hand_handshake(address, TOKEN)
    assert reply == wire.READY_MAGIC
    for conn in finish(result, thread):
        conn.sock.close()
    sock.close()
    answers = {
        "replayed": lambda hello, conn: recorded_ack,
        "forged": lambda hello, conn: wire.pack_ack(WRONG, hello, 0, conn),
        "other rank": lambda hello, conn: wire.pack_ack(TOKEN, hello, 3, conn),
        "old protocol": lambda hello, conn: b"DGOK" + bytes(4) + bytes(wire.ACK.size - 8),
        "another connection": lambda hello, conn: wire.pack_ack(TOKEN, hello, 0, b"10.0.0.2:4000>10.0.0.1:5000"),
    }
    for name, answer in answers.items():
        address, seen, thread = fake_acceptor(answer)
        with pytest.raises(DiagError, match="is not rank 0 of this run"):
            mesh.connect_to(1, 0, address, TOKEN, wire.ROLE_SHARED, 0, KNOBS, time.monotonic() + WAIT_S)
        thread.join(WAIT_S)
        assert seen["after"] == b"", name   # it never got a PROOF to learn from


def start_relay(upstream: tuple[str, int]) -> tuple[tuple[str, int], dict[str, Any], threading.Thread]:
    """A relay without the token, where a rewritten ``addr/0`` in the store points rank 1: it accepts one
    client, connects to rank 0 and passes every byte on both ways, recording what it saw."""
    listener = socket.create_server(("127.0.0.1", 0))
    seen: dict[str, Any] = {"down": b"", "up": b""}

    def pump(src: socket.socket, dst: socket.socket, key: str) -> None:
        try:
            while chunk := src.recv(65536):
                seen[key] += chunk
                dst.sendall(chunk)
        except OSError:
            pass
        for sock in (src, dst):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def run() -> None:
        client, _ = listener.accept()
        listener.close()
        server = socket.create_connection(upstream, timeout=WAIT_S)
        back = threading.Thread(target=pump, args=(server, client, "down"), daemon=True)
        back.start()
        pump(client, server, "up")
        back.join(WAIT_S)
        client.close()
        server.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return listener.getsockname(), seen, thread


def test_a_relay_without_the_token_cannot_join_two_ranks(raw_log: list[str]) -> None:
    """Rank 1 connects to a relay that passes everything on to rank 0 and back. Without the connection in the
    handshake's MACs both ranks took it for their peer (the relay then read and could alter every byte):
    now rank 1 refuses rank 0's reply, sends no PROOF, and rank 0 admits nothing; the real rank, connecting
    directly, still gets in."""
    address, result, thread = start_acceptor()
    relay, seen, relay_thread = start_relay(address)
    with pytest.raises(DiagError, match=r"is not rank 0 of this run: .*not prove this run's token on this connection"):
        mesh.connect_to(1, 0, relay, TOKEN, wire.ROLE_SHARED, 0, KNOBS, time.monotonic() + WAIT_S)
    relay_thread.join(WAIT_S)
    assert len(seen["up"]) == wire.HELLO.size, "rank 1 sent more than its HELLO through the relay"
    assert result == {}, "rank 0 finished its mesh with the relayed connection"
    conn = mesh.connect_to(1, 0, address, TOKEN, wire.ROLE_SHARED, 0, KNOBS, time.monotonic() + WAIT_S)
    accepted = finish(result, thread)
    assert [c.peer for c in accepted] == [1]
    assert accepted[0].sock.getpeername() == conn.sock.getsockname()
    for sock in (conn.sock, accepted[0].sock):
        sock.close()


def test_a_relay_that_plays_rank_1_with_its_recorded_proof_is_refused(raw_log: list[str]) -> None:
    """The acceptor's side alone: a PROOF made with the token, but over another connection (what a relay
    would pass on from rank 1), is refused and logged; rank 0 admits nothing."""
    address, result, thread = start_acceptor()
    sock = socket.create_connection(address, timeout=WAIT_S)
    hello = wire.pack_hello(1, wire.ROLE_SHARED, 0)
    sock.sendall(hello)
    ack = read_exactly(sock, wire.ACK.size)
    local, remote = sock.getsockname(), sock.getpeername()
    elsewhere = wire.connection((local[0], local[1] + 1), remote)   # rank 1's own connection, to the relay
    sock.sendall(wire.pack_proof(TOKEN, hello, ack, elsewhere))
    assert read_exactly(sock, wire.READY.size) == b""
    sock.close()
    conn = mesh.connect_to(1, 0, address, TOKEN, wire.ROLE_SHARED, 0, KNOBS, time.monotonic() + WAIT_S)
    for accepted in finish(result, thread):
        accepted.sock.close()
    conn.sock.close()
    assert any("a connection relayed by something between the ranks (claimed rank 1)" in m for m in raw_log)


def test_a_late_rank_survives_a_crowd_of_partial_hellos(raw_log: list[str]) -> None:
    """200 strays that send 28 of HELLO's 29 bytes; the real rank connects in the middle of them and sends
    its HELLO 50 ms late. Evicting by bytes received closed the rank; evicting the oldest closes strays."""
    address, result, thread = start_acceptor()
    partial = wire.pack_hello(1, wire.ROLE_SHARED, 0)[:-1]
    strays: list[socket.socket] = []

    def open_strays(count: int) -> None:
        for _ in range(count):
            stray = socket.create_connection(address, timeout=WAIT_S)
            stray.sendall(partial)
            strays.append(stray)

    open_strays(150)                # more than MAX_PENDING_HANDSHAKES: the acceptor is already evicting
    time.sleep(0.2)
    rank = socket.create_connection(address, timeout=WAIT_S)
    started = time.monotonic()
    open_strays(50)                 # while the rank is silent
    time.sleep(max(0.0, 0.05 - (time.monotonic() - started)))
    hello = wire.pack_hello(1, wire.ROLE_SHARED, 0)
    rank.sendall(hello)
    ack = read_exactly(rank, wire.ACK.size)
    assert len(ack) == wire.ACK.size, "the real rank was closed before its handshake reply"
    wire.check_ack(TOKEN, hello, ack, 0, wire.connector_view(rank))
    rank.sendall(wire.pack_proof(TOKEN, hello, ack, wire.connector_view(rank)))
    assert read_exactly(rank, wire.READY.size) == wire.READY_MAGIC
    accepted = finish(result, thread)
    assert [c.peer for c in accepted] == [1]
    for sock in (rank, *strays, *(c.sock for c in accepted)):
        sock.close()
    assert any("the oldest" in m for m in raw_log)


def _engine_against_a_peer(early_credits: int) -> tuple[Engine, socket.socket, socket.socket]:
    listener = socket.create_server(("127.0.0.1", 0))
    mine = socket.create_connection(listener.getsockname())
    theirs, _ = listener.accept()
    listener.close()
    mine.setblocking(False)
    theirs.settimeout(WAIT_S)
    link = Link(mesh.Conn(sock=mine, peer=1, role=wire.ROLE_SHARED, stream=0, label="r0-r1.shared", sends=True,
                          receives=True))
    engine = Engine({(1, 0, True): link, (1, 0, False): link}, notify=True, send_first=False, alternate=False,
                    sockbuf=None, early_credits=early_credits)
    return engine, mine, theirs


def _notice(kind: int, seq: int, length: int) -> bytes:
    header = bytearray(wire.HEADER_BYTES)
    # a DATA header names the whole message it belongs to (here always one piece)
    wire.pack_header(header, kind, seq, length, total=length if kind == wire.MSG_DATA else 0)
    return bytes(header)


def _receive_one(engine: Engine, nbytes: int) -> dict[str, Any]:
    """Rank 0 receives ``nbytes`` from rank 1 in a thread (it posts the receive, then reads what comes)."""
    state: dict[str, Any] = {"out": bytearray(nbytes)}

    def run() -> None:
        try:
            engine.run([schedules.transfer_ops(RECV, 1, memoryview(state["out"]), 1, 1)], "recv", WAIT_S)
        except BaseException as exc:
            state["error"] = exc

    state["thread"] = threading.Thread(target=run, daemon=True)
    state["thread"].start()
    return state


def test_recv_ready_notices_beyond_the_posted_receives_are_refused() -> None:
    engine, mine, theirs = _engine_against_a_peer(early_credits=4)
    state = _receive_one(engine, 1000)
    # A peer one operation ahead may send that operation's notices early (up to early_credits), but no more.
    theirs.sendall(b"".join(_notice(wire.MSG_RECV_READY, seq, 1000) for seq in range(1000)))
    state["thread"].join(WAIT_S)
    assert not state["thread"].is_alive()
    assert isinstance(state.get("error"), DiagError) and "more RECV_READY notices" in str(state["error"])
    assert len(engine.channels[(1, 0)].credits) == 4
    mine.close()
    theirs.close()


def test_early_recv_ready_notices_within_the_bound_are_kept() -> None:
    engine, mine, theirs = _engine_against_a_peer(early_credits=4)
    state = _receive_one(engine, 1000)
    theirs.sendall(b"".join(_notice(wire.MSG_RECV_READY, seq, 1000) for seq in range(4))
                   + _notice(wire.MSG_SEND_READY, 0, 1000))
    kind, _stream, _seq, length = wire.parse_header(bytearray(read_exactly(theirs, wire.HEADER_BYTES)), 0)
    assert (kind, length) == (wire.MSG_RECV_READY, 1000)   # data goes only once the receive is posted
    theirs.sendall(_notice(wire.MSG_DATA, 0, 1000) + bytes(range(250)) * 4)
    state["thread"].join(WAIT_S)
    assert "error" not in state, state.get("error")
    assert bytes(state["out"]) == bytes(range(250)) * 4
    assert len(engine.channels[(1, 0)].credits) == 4
    mine.close()
    theirs.close()


def _token_body(rank: int, world_size: int, token: bytes | None) -> dict[str, Any]:
    from diag.spec import SweepSpec
    from diag.transports.raw import create_transport
    from diag.transports.raw.transport import rendezvous_store
    from tests.raw_helpers import check_all_gather

    store = rendezvous_store(rank, world_size, 30)
    transport = create_transport(SweepSpec(backend="raw"), rank, world_size, 30, store=store, token=token)
    try:
        wrong = check_all_gather(transport, rank, world_size, 4096)
        published = store.check(["diag_raw/1/token"])
        transport.barrier()   # nobody leaves (rank 0 hosts the store) before all have looked
        return {"wrong": wrong, "published": published}
    finally:
        transport.close()


@pytest.mark.parametrize("token", [bytes(range(16)), None])
def test_a_token_given_to_the_ranks_never_enters_the_store(token: bytes | None) -> None:
    """--nproc/--lab ranks get the token from their job file: nothing in the TCPStore (which any local user can
    reach) names it. In place (no token given), rank 0 publishes one there: the documented trust model."""
    from tests.raw_helpers import assert_all_ok, run_ranks

    results = assert_all_ok(run_ranks(_token_body, 3, token))
    assert [r["wrong"] for r in results] == [0, 0, 0]
    assert {r["published"] for r in results} == {token is None}


@pytest.mark.parametrize("backend", ["raw", "diag_tcp"])
def test_ranks_diag_starts_get_their_token_in_the_job_file(tmp_path: Any, backend: str) -> None:
    """A --nproc sweep's job file carries the token (0600); the records never do (diag_tcp's ranks hold it in
    $DIAG_TCP_TOKEN, which must not be recorded with the other DIAG_TCP_* knobs)."""
    import json
    import os
    import stat
    import subprocess
    import sys

    out, run_dir = tmp_path / "r.jsonl", tmp_path / "r.d"
    proc = subprocess.run([sys.executable, "-m", "diag", "sweep", "--nproc", "2", "--backend", backend, "--sizes",
                           "1K", "--iters", "1", "--warmup", "0", "--quiet", "--out", str(out), "--run-dir",
                           str(run_dir)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    job_path = run_dir / "logs" / "job-n2.json"
    assert stat.S_IMODE(os.stat(job_path).st_mode) == 0o600
    token = json.loads(job_path.read_text())["token"]
    assert len(bytes.fromhex(token)) == wire.TOKEN_BYTES
    assert token not in out.read_text() and "DIAG_TCP_TOKEN" not in out.read_text()

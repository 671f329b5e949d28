"""Raw transport safety: strays cannot touch a run, a dead or stuck peer ends it within the timeout."""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import struct
import threading
import time
from datetime import timedelta
from typing import Any

import pytest

from diag.transports.raw import wire
from tests.common import free_port
from tests.raw_helpers import LogCollector, assert_all_ok, check_all_gather, make_transport, run_ranks


def _late_rank_body(rank: int, world_size: int) -> dict[str, Any]:
    collect = LogCollector()
    logging.getLogger("diag.raw").addHandler(collect)
    from diag.transports.raw.transport import rendezvous_store

    store = rendezvous_store(rank, world_size, 30)
    if rank == world_size - 1:
        # Keep rank 0's listener open (the mesh incomplete) until the strays have knocked.
        store.wait(["test/strays_sent"])
    transport = make_transport(rank, world_size, {"conn": "shared", "handshake": "notify", "chunks": 2},
                               store=store)
    try:
        wrong = check_all_gather(transport, rank, world_size, 100_003, iterations=3)
        return {"wrong": wrong, "log": collect.messages}
    finally:
        transport.close()


def _send_strays(port: int, results: dict[str, Any]) -> None:
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=30))
    host, listen_port = bytes(store.get("diag_raw/1/addr/0")).decode().rsplit(":", 1)
    target = (host, int(listen_port))
    # A well-formed HELLO and, sent blind, a PROOF made without the token: answered with the acceptor's
    # challenge (ACK), then closed without the READY that would admit it.
    forged = wire.pack_hello(1, wire.ROLE_SHARED, 0) + bytes(wire.PROOF.size)
    garbage = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + os.urandom(200)
    half = forged[: wire.HELLO.size // 2]
    claims_rank0 = wire.pack_hello(0, wire.ROLE_SHARED, 0)
    clients = []
    for payload in (forged, garbage, half, claims_rank0, b"", struct.pack("<I", 0xFFFFFFFF) * 100):
        client = socket.create_connection(target, timeout=5)
        if payload:
            client.sendall(payload)
        clients.append(client)
    time.sleep(0.5)   # let the rank read what arrived before the mesh completes
    store.set("test/strays_sent", "1")
    # the forged clients must be closed by the rank, never admitted (READY)
    answers = []
    for client in clients:
        client.settimeout(10)
        try:
            answers.append(client.recv(64))
        except (ConnectionResetError, TimeoutError):
            answers.append(b"")
        client.close()
    results["answers"] = answers


def test_stray_clients_change_nothing_and_are_logged() -> None:
    port = free_port()
    stray_results: dict[str, Any] = {}
    strays = threading.Thread(target=_send_strays, args=(port, stray_results))
    strays.start()
    try:
        outcome = run_ranks(_late_rank_body, 2, port=port, timeout_s=60)
    finally:
        strays.join(timeout=30)
    results = assert_all_ok(outcome)
    assert [result["wrong"] for result in results] == [0, 0]
    answers = stray_results["answers"]
    assert answers[0][:4] == wire.ACK_MAGIC and wire.READY_MAGIC not in answers[0]   # challenged, not admitted
    assert answers[1:] == [b""] * 5                       # nobody else got a handshake reply
    log = "\n".join(results[0]["log"])
    assert "wrong run token" in log
    assert "bad magic" in log
    assert "incomplete handshake" in log


def _dies_body(rank: int, world_size: int, how: str) -> dict[str, Any]:
    import torch

    from diag.errors import DiagError

    transport = make_transport(rank, world_size, {}, timeout_s=4.0)
    out = torch.empty(world_size * (4 << 20), dtype=torch.uint8)
    inp = torch.ones(4 << 20, dtype=torch.uint8)
    transport.all_gather(out, inp)
    if rank == world_size - 1:
        if how == "exit":
            os._exit(17)          # killed: the kernel closes its sockets
        time.sleep(8)             # stuck: sockets stay open, nothing moves
        return {}
    started = time.monotonic()
    try:
        for _ in range(100):
            transport.all_gather(out, inp)
    except DiagError as exc:
        return {"error": str(exc), "elapsed_s": time.monotonic() - started}
    finally:
        transport.close()
    return {"error": None}


@pytest.mark.slow
@pytest.mark.parametrize("how", ["exit", pytest.param("stuck", marks=pytest.mark.waits)])
def test_a_dead_or_stuck_peer_ends_the_run_within_the_timeout(how: str) -> None:
    outcome = run_ranks(_dies_body, 3, how, timeout_s=40)
    for rank in (0, 1):
        status, result = outcome[rank]
        assert status == "ok", result
        assert result["error"] is not None
        assert "\n" not in result["error"]
        assert result["elapsed_s"] < 4.0 + 2.0
        assert "rank" in result["error"]
    # rank 0 receives from rank 2 in the ring: its error names the culprit
    assert "rank 2" in outcome[0][1]["error"] or "rank(s) 2" in outcome[0][1]["error"]


def _mismatch_body(rank: int, world_size: int) -> str | None:
    from diag.errors import DiagError

    try:
        make_transport(rank, world_size, {"conn": "shared" if rank == 0 else "split"}, timeout_s=30).close()
    except DiagError as exc:
        return str(exc)
    return None


@pytest.mark.parametrize("world_size", [2, 3])
def test_ranks_with_different_knobs_refuse_to_run(world_size: int) -> None:
    # rank 0 (which hosts the store) differs from all others: every rank must still refuse with the
    # mismatch, none may see the store vanish because rank 0 left first
    results = assert_all_ok(run_ranks(_mismatch_body, world_size))
    assert all(result is not None and "same raw transport settings" in result for result in results), results


def _closed_listener_body(rank: int, world_size: int) -> bool:
    transport = make_transport(rank, world_size, {})
    try:
        host, port = transport._addresses[rank].rsplit(":", 1)
        try:
            socket.create_connection((host, int(port)), timeout=2).close()
            return False
        except ConnectionRefusedError:
            return True
    finally:
        transport.barrier()
        transport.close()


def test_listener_is_closed_once_the_mesh_is_up() -> None:
    assert assert_all_ok(run_ranks(_closed_listener_body, 2)) == [True, True]


def test_bad_knobs_are_one_line_errors() -> None:
    from diag.errors import DiagError
    from diag.transports.raw import resolve_knobs

    for knobs, fragment in (({"conn": "both"}, "--conn"), ({"chunks": 0}, "--chunks"),
                            ({"nodelay": "maybe"}, "--nodelay"), ({"colour": 1}, "unknown raw transport knob"),
                            ({"emulate": "nccl"}, "--emulate"), ({"notice": "own-conn"}, "--handshake notify"),
                            ({"handshake": "notify", "notice": "udp"}, "--notice"), ({"skew_us": -1}, "--skew-us")):
        with pytest.raises(DiagError, match=fragment):
            resolve_knobs("ring", "recv-first", knobs)
    # --emulate gloo replaces the sweep's algo and order, and a knob given with it switches that one piece
    gloo = resolve_knobs("pairwise", "recv-first", {"emulate": "gloo"})
    assert (gloo.algo, gloo.conn, gloo.handshake, gloo.chunks, gloo.order, gloo.notice, gloo.skew_us) == (
        "ring", "shared", "notify", 2, "send-first", "in-band", 0)
    assert gloo.chunks_for(16 << 20) == 2
    for knob, value in (("conn", "split"), ("order", "recv-first"), ("notice", "own-conn"), ("skew_us", 1500)):
        switched = resolve_knobs("ring", "recv-first", {"emulate": "gloo", knob: value})
        assert switched == dataclasses.replace(gloo, **{knob: value})
    with pytest.raises(DiagError, match="--chunk-bytes"):
        resolve_knobs("ring", "recv-first", {"chunk_bytes": 100})


def test_default_chunking_cuts_blocks_into_pieces_of_chunk_bytes() -> None:
    from diag.transports.raw import resolve_knobs
    from diag.transports.raw.knobs import DEFAULT_CHUNK_BYTES, MAX_CHUNKS

    default = resolve_knobs("ring", "recv-first", {})
    assert default.chunks is None
    assert default.chunks_for(0) == default.chunks_for(1) == 1
    assert default.chunks_for(DEFAULT_CHUNK_BYTES) == 1
    assert default.chunks_for(16 << 20) == 16
    assert default.chunks_for((16 << 20) + 1) == 17
    assert resolve_knobs("ring", "recv-first", {"streams": 2}).chunks_for(16 << 20) == 8   # 16 parts in all
    assert resolve_knobs("ring", "recv-first", {"chunk_bytes": 4096}).chunks_for(1 << 30) == MAX_CHUNKS
    assert resolve_knobs("ring", "recv-first", {"chunks": 3}).chunks_for(16 << 20) == 3

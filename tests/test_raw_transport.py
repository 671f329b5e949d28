"""Raw transport correctness: every algorithm x knob combination moves the right bytes (real sockets)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from tests.raw_helpers import assert_all_ok, check_all_gather, make_transport, run_ranks

SPREAD = True   # its tests share no fixture: each goes to whichever worker is free (tests/conftest.py)

SMALL_SIZES = (1, 1000, 65537)

# Full coverage of the mechanism knobs that change the protocol, crossed with each other...
PROTOCOL_MATRIX = [
    {"algo": algo, "conn": conn, "handshake": handshake, "io": io, "order": order}
    for algo, conn, handshake, io, order in itertools.product(
        ("ring", "pairwise", "direct"), ("shared", "split"), ("none", "notify"), ("duplex", "alternate"),
        ("recv-first", "send-first"))
]
# ...and the knobs that change sizes and socket options, one at a time and with the notify protocol.
OPTION_MATRIX = [
    {"chunks": 2}, {"chunks": 5, "handshake": "notify", "conn": "shared"}, {"streams": 3},
    {"streams": 2, "chunks": 2, "conn": "shared", "handshake": "notify", "algo": "pairwise"},
    {"sockbuf": 8192}, {"sockbuf": 16384, "io": "alternate", "handshake": "notify"},
    {"nodelay": False}, {"nodelay": False, "conn": "shared", "handshake": "notify", "chunks": 2},
    {"emulate": "gloo"}, {"emulate": "gloo", "order": "recv-first"},
    # the default (no --chunks) cuts blocks into chunk_bytes pieces that the ring forwards one by one
    {"chunk_bytes": 4096}, {"chunk_bytes": 4096, "streams": 2, "conn": "shared", "handshake": "notify",
                            "order": "send-first"},
]
REPRESENTATIVE = [
    {},
    {"emulate": "gloo"},
    {"algo": "pairwise", "streams": 2},
    {"algo": "direct", "handshake": "notify", "io": "alternate"},
    {"algo": "ring", "conn": "shared", "handshake": "notify", "order": "send-first", "chunks": 3},
    {"algo": "ring", "conn": "split", "io": "alternate", "chunks": 2, "streams": 2},
    {"algo": "ring", "chunk_bytes": 8192},
]


def _matrix_body(rank: int, world_size: int, combos: list[dict[str, Any]], sizes: tuple[int, ...]) -> list[Any]:
    failures = []
    for knobs in combos:
        transport = make_transport(rank, world_size, knobs)
        try:
            for nbytes in sizes:
                wrong = check_all_gather(transport, rank, world_size, nbytes)
                if wrong:
                    failures.append((knobs, nbytes, wrong))
            transport.barrier()
        finally:
            transport.close()
    return failures


@pytest.mark.parametrize("world_size", [2, 3])
def test_every_protocol_combination_moves_the_right_bytes(world_size: int) -> None:
    results = assert_all_ok(run_ranks(_matrix_body, world_size, PROTOCOL_MATRIX, SMALL_SIZES, timeout_s=240))
    assert results == [[]] * world_size


@pytest.mark.parametrize("world_size", [2, 3])
def test_size_and_socket_options_move_the_right_bytes(world_size: int) -> None:
    results = assert_all_ok(run_ranks(_matrix_body, world_size, OPTION_MATRIX, SMALL_SIZES, timeout_s=120))
    assert results == [[]] * world_size


@pytest.mark.parametrize("world_size", [4, 5])
def test_representative_combinations_at_larger_world_sizes(world_size: int) -> None:
    results = assert_all_ok(run_ranks(_matrix_body, world_size, REPRESENTATIVE, (1, 70001), timeout_s=180))
    assert results == [[]] * world_size


@pytest.mark.slow
def test_odd_large_size_12589824_bytes() -> None:
    combos = [{}, {"emulate": "gloo"}, {"algo": "pairwise", "io": "alternate"}]
    results = assert_all_ok(run_ranks(_matrix_body, 2, combos, (12589824,), timeout_s=180))
    assert results == [[]] * 2


def _dtypes_body(rank: int, world_size: int) -> dict[str, int]:
    import torch

    transport = make_transport(rank, world_size, {"chunks": 3})
    try:
        return {str(dtype): check_all_gather(transport, rank, world_size, 4099 * 8, dtype=dtype)
                for dtype in (torch.float32, torch.bfloat16, torch.int64, torch.float64)}
    finally:
        transport.close()


def test_all_gather_works_on_the_bytes_of_any_dtype() -> None:
    for result in assert_all_ok(run_ranks(_dtypes_body, 3)):
        assert set(result.values()) == {0}, result


def _other_ops_body(rank: int, world_size: int, knobs: dict[str, Any]) -> dict[str, Any]:
    import torch

    transport = make_transport(rank, world_size, knobs)
    out: dict[str, Any] = {}
    try:
        # send/recv in a ring, then exchange with a neighbour
        right, left = (rank + 1) % world_size, (rank - 1) % world_size
        payload = torch.arange(1000, dtype=torch.int32) + rank
        got = torch.zeros(1000, dtype=torch.int32)
        if rank % 2 == 0:
            transport.send(payload, right)
            transport.recv(got, left)
        else:
            transport.recv(got, left)
            transport.send(payload, right)
        out["recv_ok"] = bool(torch.equal(got, torch.arange(1000, dtype=torch.int32) + left))
        peer = rank ^ 1
        if peer < world_size:
            mine = torch.full((333,), float(rank))
            theirs = torch.empty(333)
            transport.exchange(mine, theirs, peer, "send-first" if rank % 2 else "recv-first")
            out["exchange_ok"] = bool(torch.all(theirs == float(peer)))
        value = torch.arange(10, dtype=torch.float64) if rank == 1 else torch.zeros(10, dtype=torch.float64)
        transport.broadcast(value, 1)
        out["broadcast_ok"] = bool(torch.equal(value, torch.arange(10, dtype=torch.float64)))
        summed = torch.arange(7, dtype=torch.int64) * (rank + 1)
        transport.all_reduce(summed)
        factor = world_size * (world_size + 1) // 2
        out["all_reduce_ok"] = bool(torch.equal(summed, torch.arange(7, dtype=torch.int64) * factor))
        scattered = torch.empty(4)
        transport.reduce_scatter(scattered, torch.arange(4.0 * world_size) + rank)
        expected = (torch.arange(4.0) + 4 * rank) * world_size + sum(range(world_size))
        out["reduce_scatter_ok"] = bool(torch.equal(scattered, expected))
        swapped = torch.empty(2 * world_size)
        transport.all_to_all(swapped, torch.arange(2.0 * world_size) + 100 * rank)
        expected = torch.tensor([100.0 * src + 2 * rank + k for src in range(world_size) for k in range(2)])
        out["all_to_all_ok"] = bool(torch.equal(swapped, expected))
        for _ in range(3):
            transport.barrier()
    finally:
        transport.close()
    return out


@pytest.mark.parametrize("knobs", [{}, {"emulate": "gloo"}, {"conn": "split", "handshake": "notify",
                                                              "io": "alternate", "streams": 2}])
def test_point_to_point_and_reductions(knobs: dict[str, Any]) -> None:
    for result in assert_all_ok(run_ranks(_other_ops_body, 3, knobs)):
        assert result and all(result.values()), result


def _tcpinfo_body(rank: int, world_size: int, directory: str) -> dict[str, Any]:
    import time

    import torch

    transport = make_transport(rank, world_size, {"tcpinfo_dir": directory, "tcpinfo_interval_s": 0.05})
    try:
        out = torch.empty(world_size * (1 << 20), dtype=torch.uint8)
        inp = torch.ones(1 << 20, dtype=torch.uint8)
        for index in range(3):
            transport.on_iteration("begin", index)
            transport.all_gather(out, inp)
            transport.on_iteration("end", index)
        time.sleep(0.15)
        return {"extra": transport.row_extra(), "knobs": transport.knobs(), "hosts": transport.hosts(),
                "after_reset": transport.row_extra()}
    finally:
        transport.close()


def test_tcp_info_summaries_and_side_files(tmp_path: Path) -> None:
    results = assert_all_ok(run_ranks(_tcpinfo_body, 2, str(tmp_path)))
    for rank, result in enumerate(results):
        summary = result["extra"]["tcp_info"]
        assert len(summary) == 2                      # split: one send and one receive socket to the peer
        sending = next(value for label, value in summary.items() if ".send." in label)
        assert sending["bytes_acked"] >= 2 * (1 << 20)   # the last bytes may still be unacked
        assert sending["rtt_us_median"] is not None and sending["cwnd_last"] > 0
        assert sending["samples"] == 6
        assert result["after_reset"] == {}
        assert result["hosts"] == ["127.0.0.1", "127.0.0.1"]
        assert result["knobs"]["algo"] == "ring" and result["knobs"]["conn"] == "split"
        lines = [json.loads(line) for line in (tmp_path / f"tcpinfo-rank{rank}.jsonl").read_text().splitlines()]
        phases = {line["phase"] for line in lines}
        assert {"begin", "end", "interval"} <= phases
        first = next(line for line in lines if line["phase"] == "end")
        for key in ("kind", "t_ns", "rank", "peer", "conn", "direction", "size_bytes", "iteration", "cwnd",
                    "rtt_us", "rttvar_us", "retrans", "total_retrans", "bytes_acked", "bytes_received",
                    "delivery_rate_Bps", "busy_s", "rwnd_limited_s", "sndbuf_limited_s"):
            assert key in first, key
        assert first["kind"] == "tcp_info" and first["rank"] == rank and first["size_bytes"] == 1 << 20

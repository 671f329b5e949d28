"""A crowd of silent, garbage and partial-HELLO connections at the raw transport's listeners during rendezvous changes no
result and fails no run (real sockets, real ranks; the 500 + 500 figure is docs/benchmarks.md's command)."""

from __future__ import annotations

from bench.listener_crowd import run_once


def test_crowd_of_strays_during_rendezvous() -> None:
    # 200 silent + 200 garbage + 200 partial-HELLO (28 of 29 bytes) clients per accepting rank: more than
    # MAX_PENDING_HANDSHAKES half-open at once
    result = run_once(world_size=3, silent=200, garbage=200, size=256 << 10, iters=3, timeout_s=60, partial=200)
    assert result["crowd_error"] is None, result
    assert result["crowd"]["opened"] == 2 * 600, result   # every stray got in before the last rank connected
    assert result["ok"], result["errors"]
    assert result["wrong_bytes"] == 0

"""How an op's algorithm moves bytes: steps, bytes per step, bytes through each link (Hockney/LogGP terms).

A model's time is built from three counts per (N, S), S the per-rank input in bytes (records' size_bytes):

  L(N)    latency steps: messages that follow one another (each pays the per-step latency alpha once)
  m(N,S)  bytes one step moves over one connection (the message TCP has to bring up to rate)
  V(N,S)  bytes through the busiest link over the whole op (what the per-byte cost beta multiplies)

  ring all_gather        L = N-1     m = S      V = (N-1) S   each step passes one rank's block on
  ring all_reduce        L = 2(N-1)  m = S/N    V = 2(N-1)/N S   reduce-scatter then all-gather, blocks of S/N
  send_recv / exchange   L = 1       m = S      V = S          pairs (0,1), (2,3), ...: N does not enter
  ping_pong              L = 2       m = S      V = 2 S        there and back
  direct all_gather      L = 1       m = S      V = (N-1) S   every block at once, N-1 flows through one NIC

V follows nccl-tests' bus bandwidth (total_bytes x bus factor: busbw is the rate of each link), except where
the transport's algorithm moves more: diag's raw all_reduce gathers every block and reduces locally (a
correctness reference, diag/transports/raw/transport.py), so it moves (N-1) S per rank like all_gather.
Every structure here has V >= L m, which is what keeps every model built on it positive (diag/model/fitting.py).

Which algorithm a transport runs: torch's gloo runs a ring for all_gather (gloo/allgather.cc) and all_reduce
(gloo/allreduce.cc, ring by default), pairs for point-to-point; diag's raw transport runs its --algo (ring,
pairwise: N-1 stages one after another, direct: all at once). An op or algorithm not in the table has no
model (said so, never guessed).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Structure:
    """One algorithm's counts, as functions of (N, S) arrays, and how a reader writes them."""

    algorithm: str
    steps: Callable[[np.ndarray], np.ndarray]
    step_bytes: Callable[[np.ndarray, np.ndarray], np.ndarray]
    link_bytes: Callable[[np.ndarray, np.ndarray], np.ndarray]
    text: tuple[str, str, str]           # L, m, V as formulas
    pairwise: bool = False               # N does not enter (pairs of ranks)

    def counts(self, n: np.ndarray, s: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        n = np.asarray(n, dtype=float)
        s = np.asarray(s, dtype=float)
        steps = np.broadcast_to(self.steps(n), np.broadcast(n, s).shape).astype(float)
        return steps, np.asarray(self.step_bytes(n, s), dtype=float), np.asarray(self.link_bytes(n, s), dtype=float)

    def to_json(self) -> dict[str, str]:
        return {"algorithm": self.algorithm, "steps": self.text[0], "step_bytes": self.text[1],
                "link_bytes": self.text[2]}


RING_ALL_GATHER = Structure("ring", lambda n: n - 1, lambda n, s: s + 0 * n, lambda n, s: (n - 1) * s,
                            ("N-1", "S", "(N-1)*S"))
PAIRWISE_ALL_GATHER = Structure("pairwise", lambda n: n - 1, lambda n, s: s + 0 * n, lambda n, s: (n - 1) * s,
                                ("N-1", "S", "(N-1)*S"))
DIRECT_ALL_GATHER = Structure("direct", lambda n: 1 + 0 * n, lambda n, s: s + 0 * n, lambda n, s: (n - 1) * s,
                              ("1", "S", "(N-1)*S"))
RING_ALL_REDUCE = Structure("ring", lambda n: 2 * (n - 1), lambda n, s: s / n, lambda n, s: 2 * (n - 1) * s / n,
                            ("2(N-1)", "S/N", "2(N-1)/N*S"))
# diag's raw all_reduce: all_gather of every block, then a local reduction (the all_gather's structure)
GATHER_ALL_REDUCE = {algo: Structure(f"{s.algorithm} gather, then reduce", s.steps, s.step_bytes, s.link_bytes, s.text)
                     for algo, s in (("ring", RING_ALL_GATHER), ("pairwise", PAIRWISE_ALL_GATHER),
                                     ("direct", DIRECT_ALL_GATHER))}
PAIR = Structure("pair", lambda n: 1 + 0 * n, lambda n, s: s + 0 * n, lambda n, s: s + 0 * n, ("1", "S", "S"),
                 pairwise=True)
PING_PONG = Structure("pair, there and back", lambda n: 2 + 0 * n, lambda n, s: s + 0 * n, lambda n, s: 2 * s + 0 * n,
                      ("2", "S", "2*S"), pairwise=True)

_POINT_TO_POINT = {"send_recv": PAIR, "exchange": PAIR, "ping_pong": PING_PONG}
# torch backends (algo "default"): gloo's own algorithms
_TORCH = {"all_gather": RING_ALL_GATHER, "all_reduce": RING_ALL_REDUCE, "all_gather_p2p": DIRECT_ALL_GATHER,
          **_POINT_TO_POINT}
# diag's raw transport, and the same behind torch's API (diag_tcp: its algo is a knob, ring by default)
RAW_BACKENDS = ("raw", "diag_tcp")
_RAW_ALL_GATHER = {"ring": RING_ALL_GATHER, "pairwise": PAIRWISE_ALL_GATHER, "direct": DIRECT_ALL_GATHER}


def structure_of(backend: str, algo: str, op: str) -> Structure | None:
    """The algorithm (backend, algo) runs for ``op``; None where diag knows no structure for it."""
    if op in _POINT_TO_POINT:
        return _POINT_TO_POINT[op]
    if backend in RAW_BACKENDS:
        algo = "ring" if algo == "default" else algo
        if op == "all_gather":
            return _RAW_ALL_GATHER.get(algo)
        if op == "all_reduce":
            return GATHER_ALL_REDUCE.get(algo)
        return None
    return _TORCH.get(op)


def modelled_ops() -> tuple[str, ...]:
    return tuple(sorted(_TORCH))

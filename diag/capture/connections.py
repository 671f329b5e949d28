"""Connections numbered as tshark's tcp.stream numbers them: by first appearance of their endpoint pair, chunk
by chunk, and each packet's direction (0 when sent by the connection's first sender)."""

from __future__ import annotations

from typing import Any

import numpy as np


class ConnectionIds:
    """Endpoint pairs -> connection index in order of first appearance (tshark's tcp.stream)."""

    def __init__(self) -> None:
        self.cap = 0
        self.lookup = np.zeros(0, dtype=np.int32)  # low * cap + high -> connection, -1 unknown
        self.pairs: dict[int, int] = {}  # low << 32 | high -> connection
        self.conn_a: list[int] = []
        self.conn_b: list[int] = []
        self._conn_a_arr = np.zeros(0, dtype=np.int32)  # conn_a as an array, rebuilt when connections came

    def _grow(self, nendpoints: int) -> None:
        cap = max(16, self.cap, 1 << (max(nendpoints, 1) - 1).bit_length())  # powers of two, at least 16
        if cap > 2048:  # a dense table would be too large: the dict path alone
            self.cap = -1
            return
        if cap != self.cap:
            self.lookup = np.full(cap * cap, -1, dtype=np.int32)
            for key, c in self.pairs.items():
                self.lookup[(key >> 32) * cap + (key & 0xFFFFFFFF)] = c
            self.cap = cap

    def ids(self, src: np.ndarray, dst: np.ndarray, nendpoints: int, assign: bool) -> np.ndarray:
        if self.cap != -1 and nendpoints > self.cap:
            self._grow(nendpoints)
        low, high = np.minimum(src, dst), np.maximum(src, dst)
        if self.cap == -1:
            key = low.astype(np.int64) << 32 | high
            uniq, first, inverse = np.unique(key, return_index=True, return_inverse=True)
            known = np.array([self.pairs.get(k, -1) for k in uniq.tolist()], dtype=np.int32)
            missing = np.flatnonzero(known < 0)
            if missing.size:
                if not assign:
                    raise AssertionError("a connection appeared in a later pass")
                for m in missing[np.argsort(first[missing], kind="stable")].tolist():
                    k = int(uniq[m])
                    known[m] = self._add(k >> 32, k & 0xFFFFFFFF, src[first[m]], dst[first[m]])
            return known[inverse.ravel()]
        key = low * np.int32(self.cap) + high
        conn = self.lookup[key]
        if conn.size and int(conn.min()) < 0:
            if not assign:
                raise AssertionError("a connection appeared in a later pass")
            rows = np.flatnonzero(conn < 0)
            keys, first = np.unique(key[rows], return_index=True)
            for k, row in sorted(zip(keys.tolist(), rows[first].tolist(), strict=True), key=lambda kr: kr[1]):
                self.lookup[k] = self._add(k // self.cap, k % self.cap, src[row], dst[row])
            conn = self.lookup[key]
        return conn

    def _add(self, low: int, high: int, first_src: Any, first_dst: Any) -> int:
        c = len(self.conn_a)
        self.pairs[int(low) << 32 | int(high)] = c
        self.conn_a.append(int(first_src))
        self.conn_b.append(int(first_dst))
        return c

    def direction(self, conn: np.ndarray, src: np.ndarray) -> np.ndarray:
        if len(self.conn_a) == 1:
            return (src != self.conn_a[0]).astype(np.int8)
        if self._conn_a_arr.size != len(self.conn_a):  # once per chunk at most, not once per new connection
            self._conn_a_arr = np.array(self.conn_a, dtype=np.int32)
        return (src != self._conn_a_arr[conn]).astype(np.int8)

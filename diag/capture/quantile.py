"""STAND-IN (replaced by the quantile branch): keeps every value."""
from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np


class OrderStats:
    def __init__(self, dtype: type = np.int64) -> None:
        self.dtype = dtype
        self.parts: list[np.ndarray] = []
        self.n = 0
        self.collected: list[np.ndarray] = []

    def add(self, values: np.ndarray) -> None:
        self.parts.append(np.asarray(values, dtype=self.dtype).copy())
        self.n += int(values.size)

    def want(self, ranks: Iterable[int]) -> None:
        pass

    def collect(self, values: np.ndarray) -> None:
        self.collected.append(np.asarray(values, dtype=self.dtype).copy())

    def _all(self) -> np.ndarray:
        a = np.concatenate(self.parts) if self.parts else np.zeros(0, self.dtype)
        if self.collected:
            b = np.concatenate(self.collected)
            assert np.array_equal(np.sort(a), np.sort(b)), "pass 2 saw other values"
        return a

    def value(self, rank: int) -> Any:
        return np.partition(self._all(), rank)[rank]


def median_ranks(n: int) -> list[int]:
    return [(n - 1) // 2, n // 2]


def percentile_ranks(n: int, q: float) -> list[int]:
    return list(range(n))


def np_median(stats: OrderStats, transform: Callable[[Any], Any] | None = None) -> float:
    a = stats._all()
    return float(np.median(transform(a) if transform else a))


def np_percentile(stats: OrderStats, q: float, transform: Callable[[Any], Any] | None = None) -> float:
    a = stats._all()
    return float(np.percentile(transform(a) if transform else a, q))

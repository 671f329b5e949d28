"""Summary statistics of raw samples, with warnings in plain sentences (as pyperf does)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

# A spread above this fraction of the median makes a row's time unstable (pyperf warns at 10%).
UNSTABLE_SPREAD = 0.10


@dataclass(frozen=True)
class Summary:
    n: int
    median: float
    mean: float
    min: float
    max: float
    p95: float
    stdev: float

    @property
    def relative_stdev(self) -> float:
        return self.stdev / self.median if self.median > 0 else math.inf


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), on pre-sorted values."""
    if not sorted_values:
        return math.nan
    pos = (len(sorted_values) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def summarize(values: Sequence[float]) -> Summary:
    data = sorted(float(v) for v in values)
    if not data:
        nan = math.nan
        return Summary(0, nan, nan, nan, nan, nan, nan)
    n = len(data)
    mean = sum(data) / n
    stdev = math.sqrt(sum((v - mean) ** 2 for v in data) / (n - 1)) if n > 1 else 0.0
    return Summary(n, percentile(data, 50), mean, data[0], data[-1], percentile(data, 95), stdev)


def warnings_for(values: Sequence[float]) -> list[str]:
    """Plain-sentence warnings about a set of timing samples."""
    s = summarize(values)
    out = []
    if s.n < 3:
        out.append(f"only {s.n} samples: use more --iters for a stable median")
    elif s.relative_stdev > UNSTABLE_SPREAD:
        out.append(f"the standard deviation is {s.relative_stdev:.0%} of the median: the result is unstable")
    if s.n >= 3 and s.max > 3 * s.median:
        out.append(f"the slowest iteration took {s.max / s.median:.1f}x the median (outlier)")
    return out

"""Summary statistics of raw samples, with warnings in plain sentences (as pyperf does)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

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


# --- experiments: samples in blocks, bootstrap intervals, two modes -----------------------------------------
#
# A timed arm of an experiment is a list of blocks (one block = the iterations one launch or one round of an
# interleaved trial ran back to back). The variance lives at both levels (a block's connections can land in a
# slow mode as a whole; iterations inside it are bimodal too), so intervals come from a two-level bootstrap:
# resample blocks, then iterations within each (Kalibera & Jones, "Rigorous benchmarking in reasonable time").
# Arms that ran interleaved in the same rounds are resampled by round together, so drift in background load
# that hit one round hits both arms of the resample alike. The statistic is the mean time per iteration: for
# a mixture of a fast and a slow mode the mean is what a user's loop pays, where the median flips between
# the modes with the share of slow samples.

CONFIDENCE = 0.95
BOOTSTRAP_RESAMPLES = 2000
# Two modes are told apart when the gap between their means is at least this fraction of the fast mode
# and each holds at least MODE_MIN_SHARE of the samples (and 2 of them).
MODE_GAP = 0.15
MODE_MIN_SHARE = 0.1


@dataclass(frozen=True)
class Interval:
    """A point estimate and its bootstrap confidence interval."""

    point: float
    low: float
    high: float

    def to_json(self) -> dict[str, float]:
        return {"point": self.point, "low": self.low, "high": self.high}

    def text(self, fmt: str = ".2f") -> str:
        return f"{self.point:{fmt}} [{self.low:{fmt}}, {self.high:{fmt}}]"


@dataclass(frozen=True)
class Arm:
    """One arm's timed samples: blocks of per-iteration times (s), keyed by the round they ran in."""

    name: str
    blocks: tuple[tuple[float, ...], ...]
    rounds: tuple[str, ...]          # one key per block; arms sharing keys were interleaved round by round

    @classmethod
    def of(cls, name: str, blocks: Sequence[Sequence[float]], rounds: Sequence[str] | None = None) -> Arm:
        kept = [(tuple(float(t) for t in b), str(k)) for b, k in
                zip(blocks, rounds if rounds is not None else [f"{name}/{i}" for i in range(len(blocks))],
                    strict=True) if len(b)]
        return cls(name, tuple(b for b, _ in kept), tuple(k for _, k in kept))

    @property
    def samples(self) -> list[float]:
        return [t for block in self.blocks for t in block]

    @property
    def count(self) -> int:
        return sum(len(b) for b in self.blocks)

    @property
    def mean_s(self) -> float:
        values = self.samples
        return sum(values) / len(values) if values else math.nan


def bootstrap_means(arms: Sequence[Arm], resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0) -> dict[str, Any]:
    """name -> array of ``resamples`` bootstrap mean times. Arms whose blocks share round keys are
    resampled by round together (paired); an arm with keys of its own is resampled on its own."""
    import numpy as np

    rng = np.random.default_rng(seed)
    out: dict[str, Any] = {}
    groups: dict[tuple[str, ...], list[Arm]] = {}
    for arm in arms:
        if not arm.blocks:
            raise ValueError(f"arm {arm.name!r} has no samples")
        groups.setdefault(tuple(sorted(set(arm.rounds))), []).append(arm)
    for keys, members in groups.items():
        picks = rng.integers(0, len(keys), size=(resamples, len(keys)))   # rounds, shared by the group
        index = {k: i for i, k in enumerate(keys)}
        for arm in members:
            by_round: dict[int, list[np.ndarray]] = {}
            for block, key in zip(arm.blocks, arm.rounds, strict=True):
                by_round.setdefault(index[key], []).append(np.asarray(block))
            total = np.zeros(resamples)
            count = np.zeros(resamples)
            for slot in range(len(keys)):
                chosen = picks[:, slot]
                for r, blocks in by_round.items():
                    rows = chosen == r
                    hits = int(rows.sum())
                    if not hits:
                        continue
                    for block in blocks:
                        draws = block[rng.integers(0, block.size, size=(hits, block.size))]
                        total[rows] += draws.sum(axis=1)
                        count[rows] += block.size
            # a resample that drew only rounds this arm lacks (unbalanced arms) falls back to the arm's mean
            empty = count == 0
            total[empty], count[empty] = arm.mean_s, 1
            out[arm.name] = total / count
    return out


def interval(point: float, resampled: Any, confidence: float = CONFIDENCE) -> Interval:
    """Percentile interval of a bootstrap distribution around the point estimate of the full sample."""
    import numpy as np

    values = np.asarray(resampled, dtype=float)
    values = values[np.isfinite(values)]
    if values.size == 0:
        return Interval(point, math.nan, math.nan)
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(values, [tail, 100 - tail])
    return Interval(float(point), float(low), float(high))


def mann_whitney_p(a: Sequence[float], b: Sequence[float]) -> float | None:
    """Two-sided Mann-Whitney U p-value (rank-based: fits bimodal samples); None with < 2 a side."""
    if len(a) < 2 or len(b) < 2:
        return None
    from scipy import stats

    if len(set(a) | set(b)) == 1:
        return 1.0
    return float(stats.mannwhitneyu(list(a), list(b), alternative="two-sided").pvalue)


@dataclass(frozen=True)
class Modes:
    """A fast and a slow mode of a sample, where it has two (else ``bimodal`` False and one mode)."""

    bimodal: bool
    fast_s: float
    slow_s: float
    slow_fraction: float

    def text(self) -> str:
        if not self.bimodal:
            return "one mode"
        return (f"two modes: fast {self.fast_s * 1e3:.0f} ms, slow {self.slow_s * 1e3:.0f} ms, "
                f"slow in {self.slow_fraction:.0%} of iterations")

    def to_json(self) -> dict[str, Any]:
        return {"bimodal": self.bimodal, "fast_s": self.fast_s, "slow_s": self.slow_s,
                "slow_fraction": self.slow_fraction}


def modes(values: Sequence[float]) -> Modes:
    """Split a sample at the cut that best separates two groups (1-D two-means, exact over all cuts)."""
    data = sorted(float(v) for v in values)
    n = len(data)
    if n == 0:
        return Modes(False, math.nan, math.nan, 0.0)
    mean = sum(data) / n
    if n < 4:
        return Modes(False, mean, mean, 0.0)
    prefix = [0.0]
    for v in data:
        prefix.append(prefix[-1] + v)
    best, cut = -1.0, 0
    for k in range(1, n):
        left, right = prefix[k] / k, (prefix[n] - prefix[k]) / (n - k)
        between = k * (n - k) * (right - left) ** 2
        if between > best:
            best, cut = between, k
    fast, slow = prefix[cut] / cut, (prefix[n] - prefix[cut]) / (n - cut)
    least = max(2, math.ceil(MODE_MIN_SHARE * n))
    if slow - fast >= MODE_GAP * fast and min(cut, n - cut) >= least:
        return Modes(True, fast, slow, (n - cut) / n)
    return Modes(False, mean, mean, 0.0)

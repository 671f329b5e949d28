"""Row-by-row comparison of two sets of records, with a two-sample significance test (as pyperf's
compare_to): before/after on the same transport, or backend-vs-backend on the same op, N and size.

The test is Welch's two-sample t-test on the raw per-iteration times (``times_s``), which does not assume
equal variances; a difference counts when it is both significant (p < ALPHA) and at least THRESHOLD
relative, so a real but negligible change is reported as such.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from diag.errors import DiagError
from diag.records import Record
from diag.units import human_bytes, human_rate, human_time

# p-value below which a difference is called significant (pyperf uses a 95% t-test too).
ALPHA = 0.05
# Smallest relative change in time worth calling a change at all.
THRESHOLD = 0.05


@dataclass(frozen=True)
class TTest:
    p_value: float | None        # None: cannot test (fewer than 2 samples on a side)
    statistic: float | None
    reason: str = ""


def welch_test(a: Sequence[float], b: Sequence[float]) -> TTest:
    """Welch's t-test on two sample sets; degenerate cases answered without scipy's warnings."""
    if len(a) < 2 or len(b) < 2:
        return TTest(None, None, f"cannot test: {min(len(a), len(b))} sample(s) on one side (need 2)")
    try:
        from scipy import stats
    except ImportError:  # pragma: no cover - scipy is a dependency
        raise DiagError("compare needs scipy for its significance test: pip install scipy") from None
    mean_a, mean_b = sum(a) / len(a), sum(b) / len(b)
    var_a = sum((v - mean_a) ** 2 for v in a)
    var_b = sum((v - mean_b) ** 2 for v in b)
    if var_a == 0 and var_b == 0:
        # No spread at all: any difference is exact, none is no difference.
        return TTest(0.0 if mean_a != mean_b else 1.0, math.inf if mean_a != mean_b else 0.0,
                     "no spread in either sample")
    result = stats.ttest_ind(list(a), list(b), equal_var=False)
    return TTest(float(result.pvalue), float(result.statistic))


@dataclass(frozen=True)
class RowComparison:
    op: str
    world_size: int
    size_bytes: int
    a_transport: str
    b_transport: str
    a_time_s: float
    b_time_s: float
    time_ratio: float            # B / A: > 1 means B is slower
    busbw_ratio: float           # B / A: > 1 means B moves more
    a_busbw_Bps: float
    b_busbw_Bps: float
    a_n: int
    b_n: int
    p_value: float | None
    significant: bool
    verdict: str                 # "slower" | "faster" | "same" | "untested"
    sentence: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _verdict(ratio: float, test: TTest, alpha: float, threshold: float) -> tuple[str, bool]:
    if test.p_value is None:
        return "untested", False
    significant = test.p_value < alpha and abs(ratio - 1.0) >= threshold
    if not significant:
        return "same", False
    return ("slower" if ratio > 1 else "faster"), True


def compare_rows(a: Record, b: Record, alpha: float = ALPHA, threshold: float = THRESHOLD) -> RowComparison:
    ratio = b.time_s / a.time_s if a.time_s > 0 else math.inf
    bus_ratio = b.busbw_Bps / a.busbw_Bps if a.busbw_Bps > 0 else math.inf
    test = welch_test(a.times_s or [a.time_s], b.times_s or [b.time_s])
    verdict, significant = _verdict(ratio, test, alpha, threshold)
    where = f"{a.op} N={a.world_size} {human_bytes(a.size_bytes)}"
    who = a.transport if a.transport == b.transport else f"{b.transport} vs {a.transport}"
    times = f"{human_time(a.time_s)} -> {human_time(b.time_s)}"
    if verdict == "untested":
        tail = f"{test.reason}; ratio {ratio:.2f}x"
    elif verdict == "same":
        why = (f"p={test.p_value:.2g}" if test.p_value >= alpha
               else f"p={test.p_value:.2g} but below the {threshold:.0%} threshold")
        tail = f"not significantly different ({why}), ratio {ratio:.2f}x"
    elif verdict == "slower":
        tail = f"{ratio:.2f}x slower, significant (p={test.p_value:.2g})"
    else:
        tail = f"{1 / ratio:.2f}x faster, significant (p={test.p_value:.2g})"
    sentence = f"{who} {where}: {times} ({human_rate(a.busbw_Bps)} -> {human_rate(b.busbw_Bps)} busbw): {tail}"
    return RowComparison(a.op, a.world_size, a.size_bytes, a.transport, b.transport, a.time_s, b.time_s, ratio,
                         bus_ratio, a.busbw_Bps, b.busbw_Bps, len(a.times_s), len(b.times_s), test.p_value,
                         significant, verdict, sentence)


def _filter(records: Sequence[Record], transport: str | None) -> list[Record]:
    if transport is None:
        return list(records)
    return [r for r in records if r.transport == transport or r.backend == transport]


@dataclass
class Comparison:
    rows: list[RowComparison]
    only_a: list[tuple[Any, ...]]
    only_b: list[tuple[Any, ...]]
    across: bool

    def to_json(self) -> dict[str, Any]:
        counts = defaultdict(int)
        for row in self.rows:
            counts[row.verdict] += 1
        return {"schema": 1, "across_backends": self.across, "rows": [r.to_json() for r in self.rows],
                "only_in_a": [list(k) for k in self.only_a], "only_in_b": [list(k) for k in self.only_b],
                "summary": dict(counts)}


def compare(a_records: Sequence[Record], b_records: Sequence[Record], *, across: bool = False,
            a_transport: str | None = None, b_transport: str | None = None,
            alpha: float = ALPHA, threshold: float = THRESHOLD) -> Comparison:
    """Match rows by backend/algo/op/world_size/size (or, ``across``, by op/world_size/size)."""
    a_records = _filter(a_records, a_transport)
    b_records = _filter(b_records, b_transport)
    if across:
        def key(r: Record) -> tuple[Any, ...]:
            return (r.op, r.world_size, r.size_bytes)
    else:
        def key(r: Record) -> tuple[Any, ...]:
            return r.key

    def index(records: Sequence[Record], side: str, flag: str) -> dict[tuple[Any, ...], Record]:
        out: dict[tuple[Any, ...], Record] = {}
        for r in records:
            k = key(r)
            if k in out and across and out[k].transport != r.transport:
                kinds = sorted({x.transport for x in records})
                raise DiagError(f"{side} holds several transports ({', '.join(kinds)}) for {r.op} N={r.world_size} "
                                f"{human_bytes(r.size_bytes)}: choose one with {flag}")
            out[k] = r  # a repeated row (same key, appended run): the later one wins
        return out

    a_index = index(a_records, "A", "--a-transport")
    b_index = index(b_records, "B", "--b-transport")
    common = sorted(set(a_index) & set(b_index), key=lambda k: tuple(str(x) if isinstance(x, str) else x for x in k))
    rows = [compare_rows(a_index[k], b_index[k], alpha, threshold) for k in common]
    return Comparison(rows, sorted(set(a_index) - set(b_index)), sorted(set(b_index) - set(a_index)), across)


def render_text(result: Comparison) -> str:
    if not result.rows:
        return "no rows in common: nothing to compare (check the transports, ops, world sizes and sizes)"
    lines = [row.sentence for row in result.rows]
    counts = result.to_json()["summary"]
    lines.append("")
    lines.append(f"{len(result.rows)} rows compared: {counts.get('slower', 0)} significantly slower in B, "
                 f"{counts.get('faster', 0)} significantly faster, {counts.get('same', 0)} not significantly "
                 f"different, {counts.get('untested', 0)} untested")
    if result.only_a or result.only_b:
        lines.append(f"{len(result.only_a)} rows only in A, {len(result.only_b)} only in B (not compared)")
    return "\n".join(lines)

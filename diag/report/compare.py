"""Row-by-row comparison of two sets of records (as pyperf's compare_to): before/after on the same series, or
backend-vs-backend on the same op, N and size, held to the one standard of evidence every "A is faster than
B" in diag meets (docs/methodology.md, "Experiments").

Rows match on their series identity (diag.records: transport + mechanism knobs), op, world size and per-rank
size, so the raw-TCP reference, gloo's protocol model and a half-duplex ring are never compared with each
other. A row's samples come in **blocks**: each launch that measured it (a records file written by several
runs, e.g. ``diag sweep --out F`` run again) and each round of an interleaved trial's arm is one block.
Iterations of one launch share their connections, their placement and their background load, so they are not
independent samples: a difference is decided on blocks, never on iterations.

The statistic is the mean time per iteration (what a loop pays; the experiments' statistic); the interval is
the two-level bootstrap (resample blocks, then iterations within each; diag.stats) of the ratio of mean times
B/A at confidence 1 - alpha. A row is slower (faster) when that interval lies above (below) 1 and the ratio
is at least THRESHOLD from 1; the same when the whole interval lies within THRESHOLD of 1; undecided
otherwise; untested with fewer than MIN_ROUNDS blocks on a side. Welch's t-test on the iterations is shown
beside it for reference and decides nothing.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from diag.errors import DiagError
from diag.records import Record
from diag.stats import Arm, bootstrap_means, interval
from diag.units import human_bytes, human_rate, human_time
from diag.verdicts import MIN_ROUNDS

# 1 - the confidence of the ratio's bootstrap interval (a 95% interval, as pyperf's 95% test).
ALPHA = 0.05
# Smallest relative change in time worth calling a change at all.
THRESHOLD = 0.05
VERDICTS = ("slower", "faster", "same", "undecided", "untested")
SURVEY = "survey"


@dataclass(frozen=True)
class TTest:
    p_value: float | None        # None: cannot test (fewer than 2 samples on a side)
    statistic: float | None
    reason: str = ""


def welch_test(a: Sequence[float], b: Sequence[float]) -> TTest:
    """Welch's t-test on two sample sets; degenerate cases answered without scipy's warnings. compare shows it
    beside its verdict; it decides nothing (iterations of one launch are not independent samples)."""
    if len(a) < 2 or len(b) < 2:
        return TTest(None, None, f"cannot test: {min(len(a), len(b))} sample(s) on one side (need 2)")
    try:
        from scipy import stats
    except ImportError:  # pragma: no cover - scipy is a dependency
        raise DiagError("compare needs scipy for Welch's t-test: pip install scipy") from None
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
    a_transport: str             # the series of A's row (transport + mechanism knobs)
    b_transport: str
    a_time_s: float              # mean time per iteration over every block of the row
    b_time_s: float
    time_ratio: float            # B / A mean time: > 1 means B is slower
    busbw_ratio: float           # B / A: > 1 means B moves more
    a_busbw_Bps: float           # busbw of the mean time
    b_busbw_Bps: float
    a_n: int                     # iterations
    b_n: int
    p_value: float | None        # Welch's t-test on the iterations: shown, never decides
    significant: bool            # the interval decided a change of at least the threshold
    verdict: str                 # VERDICTS
    sentence: str
    a_blocks: int = 1            # launches (or trial rounds) of A's row
    b_blocks: int = 1
    ratio_low: float = math.nan  # the bootstrap interval of time_ratio, over blocks
    ratio_high: float = math.nan
    origin: str = SURVEY         # "survey" (rows of launches) or "trial <name>" (an interleaved trial's arm)
    reason: str = ""             # why untested or undecided

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _blocks(rows: Record | Sequence[Record]) -> list[Record]:
    return [rows] if isinstance(rows, Record) else list(rows)


def _mean_busbw(rows: Sequence[Record], mean_s: float) -> float:
    """busbw of the mean time: busbw x time is a row's constant (bytes x bus factor)."""
    first = rows[0]
    return first.busbw_Bps * first.time_s / mean_s if mean_s > 0 else 0.0


def compare_rows(a: Record | Sequence[Record], b: Record | Sequence[Record], alpha: float = ALPHA,
                 threshold: float = THRESHOLD, origin: str = SURVEY, seed: int = 0) -> RowComparison:
    """One row of A against the same row of B: ``a`` and ``b`` are its blocks (one record per launch or trial
    round; a single record is one launch)."""
    rows_a, rows_b = _blocks(a), _blocks(b)
    arm_a = Arm.of("A", [r.times_s or [r.time_s] for r in rows_a])
    arm_b = Arm.of("B", [r.times_s or [r.time_s] for r in rows_b])
    first = rows_a[0]
    mean_a, mean_b = arm_a.mean_s, arm_b.mean_s
    ratio = mean_b / mean_a if mean_a > 0 else math.inf
    busbw_a, busbw_b = _mean_busbw(rows_a, mean_a), _mean_busbw(rows_b, mean_b)
    bus_ratio = busbw_b / busbw_a if busbw_a > 0 else math.inf
    welch = welch_test(arm_a.samples, arm_b.samples)
    blocks_a, blocks_b = len(arm_a.blocks), len(arm_b.blocks)
    low = high = math.nan
    if min(blocks_a, blocks_b) < MIN_ROUNDS.value:
        verdict = "untested"
        reason = (f"{min(blocks_a, blocks_b)} launch(es) on a side, fewer than {MIN_ROUNDS.value}: iterations of one "
                  "launch are not independent samples (run each side again into the same file, or as an "
                  "interleaved trial)")
    else:
        boot = bootstrap_means([arm_a, arm_b], seed=seed)
        within = interval(ratio, boot["B"] / boot["A"], 1 - alpha)
        low, high = within.low, within.high
        if (low > 1 or high < 1) and abs(ratio - 1) >= threshold:
            verdict, reason = ("slower" if ratio > 1 else "faster"), ""
        elif low >= 1 - threshold and high <= 1 + threshold:
            verdict, reason = "same", f"the interval lies within {threshold:.0%} of 1"
        elif low <= 1 <= high:
            verdict, reason = "undecided", "the interval holds 1 but also a change of the threshold or more"
        else:
            verdict, reason = "undecided", f"a change, but under the {threshold:.0%} threshold at its point"
    where = f"{first.op} N={first.world_size} {human_bytes(first.size_bytes)}"
    series_a, series_b = first.series, rows_b[0].series
    who = series_a if series_a == series_b else f"{series_b} vs {series_a}"
    if origin != SURVEY:
        who += f" ({origin})"
    times = f"mean {human_time(mean_a)} -> {human_time(mean_b)}"
    blocks = (f"{blocks_a} vs {blocks_b} {'rounds' if origin != SURVEY else 'launches'}")
    shown = f"Welch p={welch.p_value:.2g} on iterations, not used" if welch.p_value is not None else "no Welch test"
    if verdict == "untested":
        tail = f"untested: {reason}; ratio {ratio:.2f}x ({shown})"
    else:
        span = f"{ratio:.2f}x [{low:.2f}, {high:.2f}] over {blocks}"
        if verdict == "slower":
            tail = f"{span}: slower"
        elif verdict == "faster":
            tail = f"{1 / ratio:.2f}x faster (time ratio {span})"
        else:
            tail = f"time ratio {span}: {verdict} ({reason})"
        tail += f"; {shown}"
    sentence = (f"{who} {where}: {times} ({human_rate(busbw_a)} -> {human_rate(busbw_b)} busbw of the mean "
                f"time): {tail}")
    return RowComparison(first.op, first.world_size, first.size_bytes, series_a, series_b, mean_a, mean_b, ratio,
                         bus_ratio, busbw_a, busbw_b, arm_a.count, arm_b.count, welch.p_value,
                         verdict in ("slower", "faster"), verdict, sentence, blocks_a, blocks_b, low, high, origin,
                         reason)


def _filter(records: Sequence[Record], transport: str | None) -> list[Record]:
    """A series label picks that series; a transport (raw:ring) or backend (gloo) every series of it."""
    if transport is None:
        return list(records)
    if any(r.series == transport for r in records):
        return [r for r in records if r.series == transport]
    return [r for r in records if r.transport == transport or r.backend == transport]


def origin_of(record: Record) -> str:
    return f"trial {record.block.get('trial', '?')}" if record.block else SURVEY


@dataclass
class Comparison:
    rows: list[RowComparison]
    only_a: list[tuple[Any, ...]]
    only_b: list[tuple[Any, ...]]
    across: bool

    def to_json(self) -> dict[str, Any]:
        counts: dict[str, int] = defaultdict(int)
        for row in self.rows:
            counts[row.verdict] += 1
        return {"schema": 2, "across_backends": self.across, "rows": [r.to_json() for r in self.rows],
                "only_in_a": [list(k) for k in self.only_a], "only_in_b": [list(k) for k in self.only_b],
                "summary": dict(counts)}

    @property
    def tested(self) -> list[RowComparison]:
        """The rows a verdict could be taken on (enough blocks a side)."""
        return [r for r in self.rows if r.verdict != "untested"]


def compare(a_records: Sequence[Record], b_records: Sequence[Record], *, across: bool = False,
            a_transport: str | None = None, b_transport: str | None = None,
            alpha: float = ALPHA, threshold: float = THRESHOLD) -> Comparison:
    """Match rows by series/op/world_size/size (or, ``across``, by op/world_size/size) and by origin (survey
    rows, or one trial's arm); every record of a row is one of its blocks."""
    a_records = _filter(a_records, a_transport)
    b_records = _filter(b_records, b_transport)
    if across:
        def key(r: Record) -> tuple[Any, ...]:
            return (r.op, r.world_size, r.size_bytes, origin_of(r))
    else:
        def key(r: Record) -> tuple[Any, ...]:
            return (*r.key, origin_of(r))

    def index(records: Sequence[Record], side: str, flag: str) -> dict[tuple[Any, ...], list[Record]]:
        out: dict[tuple[Any, ...], list[Record]] = defaultdict(list)
        for r in records:
            k = key(r)
            if across and out[k] and out[k][0].series != r.series:
                kinds = sorted({x.series for x in records if key(x) == k})
                raise DiagError(f"{side} holds several series ({', '.join(kinds)}) for {r.op} N={r.world_size} "
                                f"{human_bytes(r.size_bytes)}: choose one with {flag}")
            out[k].append(r)
        return dict(out)

    a_index = index(a_records, "A", "--a-transport")
    b_index = index(b_records, "B", "--b-transport")
    common = sorted(set(a_index) & set(b_index), key=lambda k: tuple(str(x) if isinstance(x, str) else x for x in k))
    rows = [compare_rows(a_index[k], b_index[k], alpha, threshold, origin=k[-1]) for k in common]
    return Comparison(rows, sorted(set(a_index) - set(b_index)), sorted(set(b_index) - set(a_index)), across)


NO_ROWS = ("no rows in common: nothing to compare (rows match on series, op, world size and per-rank size; "
           "check the series of each side, or use --across with --a-transport/--b-transport)")


def render_text(result: Comparison) -> str:
    if not result.rows:
        return NO_ROWS
    lines = [row.sentence for row in result.rows]
    counts = result.to_json()["summary"]
    lines.append("")
    lines.append(f"{len(result.rows)} rows compared: {counts.get('slower', 0)} slower in B, "
                 f"{counts.get('faster', 0)} faster, {counts.get('same', 0)} the same, "
                 f"{counts.get('undecided', 0)} undecided, {counts.get('untested', 0)} untested (fewer than "
                 f"{MIN_ROUNDS.value} launches or rounds on a side); decided on launches and trial rounds, never "
                 "on iterations")
    if result.only_a or result.only_b:
        lines.append(f"{len(result.only_a)} rows only in A, {len(result.only_b)} only in B (not compared)")
    return "\n".join(lines)

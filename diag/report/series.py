"""Group records into series: one line on a plot, one subject of a rule.

A series is a transport plus the mechanism knobs that change how bytes move (raw ``conn``, ``order``,
``emulate``, ...), so raw rows with ``--conn shared`` and ``--conn split`` are never averaged together.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from diag.records import Record
from diag.transports.raw.knobs import RawKnobs

# Knobs that change the mechanism (raw transport, issues 4 and 10) and so split rows into separate series.
MECHANISM_KNOBS = ("emulate", "conn", "order", "handshake", "notice", "skew_us", "io", "chunks", "nodelay",
                   "streams")
# Values the raw transport uses when a knob is not given, read from their one source (RawKnobs): a raw
# row shows only what differs from them, so labels stay short. "order" is always shown (exchange).
# chunks None: blocks travel as chunk_bytes messages (1 MiB); an explicit --chunks K is shown.
RAW_DEFAULTS: dict[str, Any] = {name: getattr(RawKnobs(), name)
                                for name in ("conn", "handshake", "notice", "skew_us", "io", "chunks", "nodelay",
                                             "streams")}
# Ops where every rank talks to one peer only, so the world size does not change the pattern.
PAIRWISE_OPS = frozenset({"exchange", "send_recv"})


def knob(record: Record, name: str) -> Any:
    """A knob from the row's knobs, else its extra (the harness may keep the exchange order there).
    A raw row that does not name a knob ran with the raw transport's default."""
    if name in record.knobs:
        return record.knobs[name]
    if name in record.extra:
        return record.extra[name]
    return RAW_DEFAULTS.get(name) if record.backend == "raw" else None


def series_label(record: Record, without: Iterable[str] = ()) -> str:
    skip = set(without)
    parts = [f"{k}={knob(record, k)}" for k in MECHANISM_KNOBS
             if k not in skip and knob(record, k) not in (None, "")
             and not (record.backend == "raw" and RAW_DEFAULTS.get(k, object()) == knob(record, k))]
    return record.transport + (f" [{', '.join(parts)}]" if parts else "")


def by_series(records: Iterable[Record]) -> dict[tuple[str, str], dict[int, dict[int, Record]]]:
    """(series label, op) -> world_size -> size_bytes -> record (a repeated row: the later one wins)."""
    out: dict[tuple[str, str], dict[int, dict[int, Record]]] = defaultdict(lambda: defaultdict(dict))
    for r in records:
        out[(series_label(r), r.op)][r.world_size][r.size_bytes] = r
    return out


def busbw_samples(record: Record) -> list[float]:
    """Per-iteration busbw: busbw scales as 1/time, so each sample is busbw * median / t."""
    return [record.busbw_Bps * record.time_s / t for t in record.times_s if t > 0]

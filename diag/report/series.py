"""Group records into series: one line on a plot, one subject of a rule.

A series is a transport plus the mechanism knobs that change how bytes move (raw ``conn``, ``order``,
``emulate``, ...), so raw rows with ``--conn shared`` and ``--conn split`` are never averaged together.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from diag.collectives import PAIRWISE_OPS
from diag.records import Record
from diag.transports.raw.knobs import RawKnobs

# RawKnobs fields that are settings, not mechanisms (where bytes go, buffers, sampling): they never split
# a series. "algo" is already in the transport label.
_SETTINGS = frozenset({"algo", "chunk_bytes", "sockbuf", "iface", "tcpinfo_interval_s", "tcpinfo_dir"})
# Knobs that change the mechanism and so split rows into separate series: these first (the order labels
# have always had), then any other RawKnobs field, so a knob added to the raw transport splits series
# and shows in labels without a change here.
_LABEL_ORDER = ("emulate", "conn", "order", "handshake", "notice", "skew_us", "io", "chunks", "nodelay", "streams")
MECHANISM_KNOBS: tuple[str, ...] = (*_LABEL_ORDER, *(
    f.name for f in dataclasses.fields(RawKnobs) if f.name not in _SETTINGS and f.name not in _LABEL_ORDER))
# Values the raw transport uses when a knob is not given (RawKnobs' defaults, the one source): a raw row
# shows only what differs from them, so labels stay short. "order" is always shown (exchange), so it has
# no default here. chunks None: blocks travel as chunk_bytes messages; an explicit --chunks K is shown.
RAW_DEFAULTS: dict[str, Any] = {f.name: getattr(RawKnobs(), f.name) for f in dataclasses.fields(RawKnobs)
                                if f.name in MECHANISM_KNOBS and f.name != "order"}

__all__ = ["MECHANISM_KNOBS", "PAIRWISE_OPS", "RAW_DEFAULTS", "busbw_samples", "by_series", "knob",
           "series_label"]


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

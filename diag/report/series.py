"""Group records into series: one line on a plot, one subject of a rule.

A series is a transport plus the mechanism knobs that change how bytes move (raw ``conn``, ``order``,
``emulate``, ...), so raw rows with ``--conn shared`` and ``--conn split`` are never averaged together. The
identity itself (``series_label``, ``Record.series``) is defined once beside the record format
(diag.records), so compare, the model, ``to_pandas()`` and the CSVs key rows by the same label as the report.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from diag.collectives import PAIRWISE_OPS
from diag.records import MECHANISM_KNOBS, RAW_DEFAULTS, Record, knob, series_label

__all__ = ["MECHANISM_KNOBS", "PAIRWISE_OPS", "RAW_DEFAULTS", "busbw_samples", "by_series", "knob", "mean_algbw",
           "mean_busbw", "mean_time", "series_label", "series_words"]

# The one statistic the report shows of a row: its mean time per iteration (what a loop of the op pays, and the
# statistic every experiment decides on; nccl-tests prints the average time too), and the algbw and busbw of
# that mean time. The records keep the median's too (time_s, busbw_Bps: the record format's contract); the
# verdict card, the tables, the plots and the rules all quote the mean's, and say so.
STATISTIC = "mean"


def by_series(records: Iterable[Record]) -> dict[tuple[str, str], dict[int, dict[int, Record]]]:
    """(series label, op) -> world_size -> size_bytes -> record (a repeated row: the later one wins)."""
    out: dict[tuple[str, str], dict[int, dict[int, Record]]] = defaultdict(lambda: defaultdict(dict))
    for r in records:
        out[(series_label(r), r.op)][r.world_size][r.size_bytes] = r
    return out


def mean_time(record: Record) -> float:
    """Mean time per timed iteration (the record's mean_s; its median where a row has no samples)."""
    values = [t for t in record.times_s if t > 0]
    return sum(values) / len(values) if values else record.time_s


def mean_busbw(record: Record) -> float:
    """busbw of the mean time: busbw x time is a row's constant (bytes x the op's bus factor)."""
    mean = mean_time(record)
    return record.busbw_Bps * record.time_s / mean if mean > 0 else 0.0


def mean_algbw(record: Record) -> float:
    mean = mean_time(record)
    return record.algbw_Bps * record.time_s / mean if mean > 0 else 0.0


def busbw_samples(record: Record) -> list[float]:
    """Per-iteration busbw: busbw scales as 1/time, so each sample is busbw * median / t."""
    return [record.busbw_Bps * record.time_s / t for t in record.times_s if t > 0]


# A series in words for a legend (the knob string, series_label, stays the key: in a table beside the plot).
_TRANSPORT_WORDS = {"torch:gloo": "gloo (torch.distributed)", "torch:nccl": "nccl (torch.distributed)",
                    "diag_tcp": "diag_tcp backend (torch.distributed)", "raw:ring": "raw TCP ring",
                    "raw:direct": "raw TCP, every pair at once", "raw:pairwise": "raw TCP, pairwise"}
_KNOB_WORDS: dict[str, dict[str, str]] = {
    "emulate": {"gloo": "gloo's protocol"},
    "conn": {"shared": "one connection per pair", "split": "a connection per direction"},
    "order": {"send-first": "sends first", "recv-first": "receives posted first", "alternate": "directions in turn"},
    "handshake": {"notify": "ready notices", "none": "no handshake"},
    "notice": {"own-socket": "notices on their own socket", "in-band": "notices in-band"},
    "io": {"alternate": "one direction at a time", "duplex": "both directions at once"},
    "nodelay": {"False": "Nagle on", "True": "Nagle off"},
}


def series_words(label: str) -> str:
    """'raw:ring [emulate=gloo, conn=shared, order=send-first]' -> "raw TCP ring: gloo's protocol, one connection
    per pair, sends first": a legend people read. Unknown transports and knobs stay as they are."""
    head, _, rest = label.partition(" ")
    transport = head if head in _TRANSPORT_WORDS else ""
    if not transport:
        return label
    inside, after = "", rest
    if rest.startswith("["):
        inside, _, after = rest[1:].partition("]")
    knobs = []
    for part in inside.split(", ") if inside else []:
        name, _, value = part.partition("=")
        if name == "chunks":
            knobs.append(f"{value} chunks per block")
        elif name == "streams":
            knobs.append(f"{value} streams per peer")
        elif name == "skew_us":
            knobs.append(f"ranks start {value} us apart")
        else:
            knobs.append(_KNOB_WORDS.get(name, {}).get(value, part))
    words = _TRANSPORT_WORDS[transport] + (": " + ", ".join(knobs) if knobs else "")
    return words + ((" " if not knobs else "; ") + after.strip() if after.strip() else "")

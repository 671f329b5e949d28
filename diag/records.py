"""The one record format: JSON Lines, one event per line, flushed as it happens.

Schema history (bump SCHEMA_VERSION for any change a reader must know about):
  1 - first version: start / record / end events; base units in field names (_s, _Bps, _bytes, _ns).
  2 - records may carry ``block``: the trial, arm, round and position of one block of an interleaved trial,
      with the CPU it saw (diag/trial.py); a trial's spec is in its start event's meta.trial, its stop
      reasons and decisions in its end event's ``trial``. Version 1 files read as before (no blocks).
      A block may be a program's run (diag trial: backend "command", algo the arm, extra.program).

A file may hold several runs (one per world size, or one per launch appended to the same --out): each
run is a ``start`` event, its ``record`` events and, unless it died, an ``end`` event, linked by run_id.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from diag import safefs
from diag.errors import DiagError
from diag.transports.raw.knobs import RawKnobs

SCHEMA_VERSION = 2
SUPPORTED_SCHEMAS = frozenset({1, 2})
EVENTS = frozenset({"start", "record", "end"})


@dataclass(frozen=True)
class Record:
    """One row of a sweep: one (transport, collective, world size, size)."""

    backend: str                 # "gloo", "nccl", "raw"
    algo: str                    # "default" for torch backends; "ring", "pairwise", "direct" for raw
    op: str                      # "all_gather", "send_recv", "exchange", ...
    world_size: int
    size_bytes: int              # per-rank input bytes
    total_bytes: int             # nccl-tests "size" for this op (what algbw divides)
    volume_bytes: int            # per-device volume D = (N-1) x per-rank bytes, as users plot it
    dtype: str
    count: int                   # elements per rank input
    iters: int
    warmup: int
    times_s: list[float]         # per timed iteration, max over ranks
    time_s: float                # median of times_s
    min_s: float
    max_s: float
    mean_s: float
    p95_s: float
    stdev_s: float
    algbw_Bps: float             # total_bytes / time_s
    busbw_Bps: float             # algbw x the op's bus factor (nccl-tests PERFORMANCE.md)
    nwrong: int                  # wrong elements over all timed iterations and ranks
    t_start_ns: int              # wall clock (time.time_ns) of the first timed iteration's start
    t_end_ns: int                # wall clock of the last timed iteration's end
    rank0_times_s: list[float] = field(default_factory=list)
    rank_times_s: list[list[float]] = field(default_factory=list)   # [rank][iteration]
    iter_windows_ns: list[list[int]] = field(default_factory=list)  # [iteration] -> [start, end], wall clock
    warmup_times_s: list[float] = field(default_factory=list)       # kept, flagged, never summarized
    gap_s: float = 0.0
    knobs: dict[str, Any] = field(default_factory=dict)             # transport settings in force
    hosts: list[str] = field(default_factory=list)                  # rank -> host/address
    extra: dict[str, Any] = field(default_factory=dict)             # e.g. TCP_INFO summaries
    run_id: str = ""
    warnings: list[str] = field(default_factory=list)
    block: dict[str, Any] = field(default_factory=dict)             # one block of an interleaved trial

    @property
    def transport(self) -> str:
        return transport_label(self.backend, self.algo)

    @property
    def series(self) -> str:
        """The series identity (series_label): transport + the mechanism knobs that change how bytes move."""
        return series_label(self)

    @property
    def key(self) -> tuple[str, str, int, int]:
        """What identifies a row across files and inside one (compare, the report's tables): its series, op,
        world size and per-rank size. Two rows with one key are two launches of the same measurement."""
        return (self.series, self.op, self.world_size, self.size_bytes)

    def to_event(self) -> dict[str, Any]:
        return {"event": "record", "schema": SCHEMA_VERSION, **dataclasses.asdict(self)}

    @classmethod
    def from_event(cls, event: dict[str, Any]) -> Record:
        names = {f.name for f in dataclasses.fields(cls)}
        missing = [f.name for f in dataclasses.fields(cls)
                   if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
                   and f.name not in event]
        if missing:
            raise DiagError(f"record is missing fields {missing}: the file is not a diag record file")
        return cls(**{k: v for k, v in event.items() if k in names})


def transport_label(backend: str, algo: str = "default") -> str:
    """The one spelling of a transport in tables, plots and findings: ``torch:<backend>``, ``raw:<algo>``, or
    ``command:<arm>`` for a program run as an arm of a trial (diag.external: its algo is the arm's name)."""
    if backend in ("raw", "command"):
        return f"{backend}:{algo}"
    return f"torch:{backend}"


# --- the series identity ---------------------------------------------------------------------------------
#
# A series is a transport plus the mechanism knobs that change how bytes move (raw ``conn``, ``order``,
# ``emulate``, ...): the key of rows everywhere (report, compare, model, to_pandas' and the CSVs' ``series``
# column), so the raw-TCP reference, gloo's protocol model (--emulate gloo) and a half-duplex ring (--io
# alternate) are never pooled. Settings (where bytes go, buffer sizes, sampling) and measured values (the
# socket buffers the kernel granted, the TCP_INFO directory) are never part of it: they differ between two
# launches of one configuration.

# RawKnobs fields that are settings, not mechanisms: they never split a series. "algo" is in the transport.
SERIES_SETTINGS = frozenset({"algo", "chunk_bytes", "sockbuf", "iface", "tcpinfo_interval_s", "tcpinfo_dir"})
# The mechanism knobs, in label order: these first (the order labels have always had), then any other
# RawKnobs field, so a knob added to the raw transport splits series without a change here.
_LABEL_ORDER = ("emulate", "conn", "order", "handshake", "notice", "skew_us", "io", "chunks", "nodelay", "streams")
MECHANISM_KNOBS: tuple[str, ...] = (*_LABEL_ORDER, *(
    f.name for f in dataclasses.fields(RawKnobs) if f.name not in SERIES_SETTINGS and f.name not in _LABEL_ORDER))
# Values the raw transport uses when a knob is not given (RawKnobs' defaults, the one source): a raw row shows
# only what differs from them, so labels stay short. "order" is always shown (exchange), so it has no default
# here. chunks None: blocks travel as chunk_bytes messages; an explicit --chunks K is shown.
RAW_DEFAULTS: dict[str, Any] = {f.name: getattr(RawKnobs(), f.name) for f in dataclasses.fields(RawKnobs)
                                if f.name in MECHANISM_KNOBS and f.name != "order"}


def knob(record: Record, name: str) -> Any:
    """A knob from the row's knobs, else its extra (the harness may keep the exchange order there). A raw row
    that does not name a knob ran with the raw transport's default."""
    if name in record.knobs:
        return record.knobs[name]
    if name in record.extra:
        return record.extra[name]
    return RAW_DEFAULTS.get(name) if record.backend == "raw" else None


def series_label(record: Record, without: Any = ()) -> str:
    """'raw:ring [emulate=gloo, order=recv-first]': the series identity of a row (``without``: knobs left out,
    for pairing rows that differ in exactly those)."""
    skip = set(without)
    parts = [f"{k}={knob(record, k)}" for k in MECHANISM_KNOBS
             if k not in skip and knob(record, k) not in (None, "")
             and not (record.backend == "raw" and RAW_DEFAULTS.get(k, object()) == knob(record, k))]
    return record.transport + (f" [{', '.join(parts)}]" if parts else "")


@dataclass
class RecordFile:
    """Everything in one records file: runs' start/end events and all rows, in file order."""

    path: Path
    starts: list[dict[str, Any]]
    records: list[Record]
    ends: list[dict[str, Any]]
    torn_lines: int = 0          # events cut short by a killed writer, skipped

    @property
    def complete(self) -> bool:
        """Every run that started also ended without error."""
        ended = {e.get("run_id") for e in self.ends if e.get("status") == "ok"}
        return all(s.get("run_id") in ended for s in self.starts)

    def to_pandas(self, samples: bool = False) -> Any:
        """A pandas DataFrame: one row per record (run_id, transport, CSV_FIELDS with ``series`` the key a
        groupby wants, and knobs: every setting in force, measured ones included), or with
        ``samples`` one row per timed iteration (SAMPLE_FIELDS, long format). pandas is optional."""
        return records_frame(self.records, samples, source=str(self.path))


# Every line the writer produces starts with this, because it puts "event" first and writes compact JSON.
# A line that starts so but does not parse is a torn event (its writer was killed mid-line): it is skipped
# and counted, wherever it is, since a later writer fences it off and appends after it.
EVENT_PREFIX = b'{"event":'


@dataclass
class _LoadStats:
    torn_lines: int = 0


def iter_events(path: str | os.PathLike[str], stats: _LoadStats | None = None) -> Iterator[dict[str, Any]]:
    """Yield events, checking the schema. Torn lines (killed writers) are skipped, not fatal."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        raise DiagError(f"no records file at {p}") from None
    except IsADirectoryError:
        raise DiagError(f"{p} is a directory; give a records file (.jsonl) written by diag sweep") from None
    except OSError as exc:
        raise DiagError(f"cannot read records file {p}: {exc.strerror}") from None
    lines = data.split(b"\n")
    for number, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            event = json.loads(raw)
        except (ValueError, RecursionError):  # not JSON, not UTF-8, absurdly nested
            # A torn line may be shorter than the prefix: the writer died sooner.
            if raw.startswith(EVENT_PREFIX) or EVENT_PREFIX.startswith(raw):
                if stats is not None:
                    stats.torn_lines += 1
                continue
            raise DiagError(f"{p}:{number}: not JSON; is this a diag records file?") from None
        if not isinstance(event, dict) or event.get("event") not in EVENTS:
            raise DiagError(f"{p}:{number}: not a diag event (needs 'event': start|record|end)")
        schema = event.get("schema")
        if schema not in SUPPORTED_SCHEMAS:
            raise DiagError(
                f"{p}:{number}: schema {schema!r} is not supported by this diag "
                f"(supports {sorted(SUPPORTED_SCHEMAS)}); upgrade diag to read it"
            )
        yield event


def load_records(path: str | os.PathLike[str]) -> RecordFile:
    starts: list[dict[str, Any]] = []
    records: list[Record] = []
    ends: list[dict[str, Any]] = []
    stats = _LoadStats()
    for event in iter_events(path, stats):
        kind = event["event"]
        if kind == "start":
            starts.append(event)
        elif kind == "end":
            ends.append(event)
        else:
            try:
                records.append(Record.from_event(event))
            except DiagError as exc:    # say which file, and which row of it
                raise DiagError(f"{path}: row {len(records) + 1}: {exc}") from None
    return RecordFile(Path(path), starts, records, ends, torn_lines=stats.torn_lines)


class RecordWriter:
    """Appends events and flushes each one to disk at once, so a killed sweep keeps every finished row.
    ``mirror``: a second records file that gets every event too (a sweep's --out, beside its run directory's
    records): the same lines, written the same way, so either file alone holds the run."""

    def __init__(self, path: str | os.PathLike[str], mirror: str | os.PathLike[str] | None = None) -> None:
        self.path = Path(path)
        self._fds: list[int] = []
        for target in (self.path, *((Path(mirror),) if mirror is not None else ())):
            if target.is_dir():
                self.close()
                raise DiagError(f"{target} is a directory; give a records file path such as runs/sweep.jsonl")
            # O_NOFOLLOW, and an existing file must be a regular one of ours (diag.safefs): root never appends
            # through a planted symlink or hard link.
            fd = safefs.open_append(safefs.make_parent(target), read=True)
            self._fds.append(fd)
            _fence_torn_tail(fd)

    def write(self, event: dict[str, Any]) -> None:
        event = {"event": event["event"], "schema": SCHEMA_VERSION, **event}
        line = (json.dumps(event, separators=(",", ":"), default=_json_default) + "\n").encode()
        for fd in self._fds:
            # One write() of the whole line on an O_APPEND descriptor: a reader or another appender never sees
            # half of it interleaved with something else (a kill can still cut it short; the loader copes).
            view = memoryview(line)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            os.fsync(fd)

    def start(self, run_id: str, **fields: Any) -> None:
        self.write({"event": "start", "run_id": run_id, **fields})

    def record(self, record: Record) -> None:
        self.write(record.to_event())

    def end(self, run_id: str, status: str, **fields: Any) -> None:
        self.write({"event": "end", "run_id": run_id, "status": status, **fields})

    def close(self) -> None:
        for fd in self._fds:
            os.close(fd)
        self._fds = []

    def __enter__(self) -> RecordWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _fence_torn_tail(fd: int) -> None:
    """A writer killed mid-line left no newline: end that line first, so the next event is not glued onto it
    (which would make one unreadable line of the torn event and this one). The torn line itself is kept as
    it is and skipped by the loader."""
    size = os.fstat(fd).st_size
    if size == 0:
        return
    last = os.pread(fd, 1, size - 1)
    if last and last != b"\n":
        os.write(fd, b"\n")


def _json_default(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "item"):  # numpy / torch scalars
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"cannot serialize {type(value).__name__}")


# The columns of `diag sweep --csv`: a record's identity (its series first: series_label) and its timing summary,
# in base units.
CSV_FIELDS = ("series", "backend", "algo", "op", "world_size", "size_bytes", "total_bytes", "volume_bytes", "dtype",
              "iters", "time_s", "min_s", "max_s", "p95_s", "stdev_s", "algbw_Bps", "busbw_Bps", "nwrong")


# The columns of `diag sweep --samples-csv` and of to_pandas(samples=True): one row per timed iteration (its
# time is the max over ranks, as the record's times_s), long format for pandas and R.
SAMPLE_FIELDS = ("run_id", "series", "backend", "algo", "transport", "op", "world_size", "size_bytes", "total_bytes",
                 "volume_bytes", "dtype", "knobs", "iteration", "time_s", "algbw_Bps", "busbw_Bps", "row_nwrong")
ROW_FIELDS = ("run_id", "transport", *CSV_FIELDS, "knobs")


def _knobs_text(record: Record) -> str:
    return json.dumps(record.knobs, sort_keys=True, separators=(",", ":"), default=str)


def sample_rows(records: list[Record]) -> Iterator[tuple[Any, ...]]:
    """SAMPLE_FIELDS tuples: every timed iteration of every record."""
    for r in records:
        factor = r.busbw_Bps / r.algbw_Bps if r.algbw_Bps > 0 else 0.0
        knobs = _knobs_text(r)
        series = r.series
        for i, t in enumerate(r.times_s):
            algbw = r.total_bytes / t if t > 0 else 0.0
            yield (r.run_id, series, r.backend, r.algo, r.transport, r.op, r.world_size, r.size_bytes, r.total_bytes,
                   r.volume_bytes, r.dtype, knobs, i, t, algbw, algbw * factor, r.nwrong)


def record_rows(records: list[Record]) -> Iterator[tuple[Any, ...]]:
    """ROW_FIELDS tuples: one per record."""
    for r in records:
        yield (r.run_id, r.transport, *(getattr(r, name) for name in CSV_FIELDS), _knobs_text(r))


def require_pandas() -> Any:
    try:
        import pandas
    except ImportError:
        raise ImportError("to_pandas() needs pandas, which is not installed: pip install pandas") from None
    return pandas


def records_frame(records: list[Record], samples: bool = False, source: str | None = None) -> Any:
    """Records (or their samples) as a pandas DataFrame; ``source`` adds a column naming the file."""
    pandas = require_pandas()
    fields, rows = (SAMPLE_FIELDS, sample_rows(records)) if samples else (ROW_FIELDS, record_rows(records))
    frame = pandas.DataFrame.from_records(list(rows), columns=list(fields))
    if source is not None:
        frame.insert(0, "source", source)
    return frame


def export_samples_csv(records: list[Record], csv_path: str | os.PathLike[str]) -> int:
    """The long-format samples CSV (SAMPLE_FIELDS); returns the rows written."""
    import csv
    import io

    text = io.StringIO(newline="")
    writer = csv.writer(text)
    writer.writerow(SAMPLE_FIELDS)
    count = 0
    for row in sample_rows(records):
        writer.writerow(row)
        count += 1
    safefs.write_file(safefs.make_parent(csv_path), text.getvalue())
    return count


def export_csv(records_path: str | os.PathLike[str], csv_path: str | os.PathLike[str]) -> None:
    """Every record of a records file as one CSV row (CSV_FIELDS)."""
    write_csv(load_records(records_path).records, csv_path)


def write_csv(rows: list[Record], csv_path: str | os.PathLike[str]) -> None:
    """These records as CSV rows (CSV_FIELDS)."""
    import csv
    import io

    text = io.StringIO(newline="")
    writer = csv.writer(text)
    writer.writerow(CSV_FIELDS)
    for record in rows:
        writer.writerow([getattr(record, name) for name in CSV_FIELDS])
    safefs.write_file(safefs.make_parent(csv_path), text.getvalue())

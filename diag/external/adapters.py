"""How a program's output becomes timed samples: a small adapter per output format (pure functions, no torch).

An adapter reads what one rank of one block printed (its stdout, or the file the command wrote to
``{output}``) and returns the rows it found, each with the program's own size and time. Built in:

* ``gloo-benchmark``: the table of gloo's ``benchmark`` tool (gloo/benchmark/runner.cc, ``printHeader`` /
  ``printDistribution``): ``size (B)`` (per rank: elements x element size), ``elements``, ``min``, ``p50``,
  ``p99``, ``max`` (us, or ns with ``--nanos``), ``bandwidth (GB/s)``, ``iterations``. Only rank 0 prints.
  The block's time is the row's p50: the table has no mean but its bandwidth column, whose three decimals of
  GiB/s are too coarse at a few MB/s (0.020 is 1.5% wide). With ``verify=true`` (its default) the wrong
  elements are its "Mismatch at index" lines (0 when none), else unchecked.
* ``nccl-tests``: nccl-tests' text table (src/util.cu, ``writeResultHeader`` / ``writeBenchmarkLineBody``):
  ``size`` (B, the op's total: nccl-tests' convention), ``count``, ``type``, ``redop``, ``root``, then
  ``time`` (us, the mean over the iterations), ``algbw``, ``busbw``, ``#wrong`` for out-of-place and again for
  in-place (with ``-R``/per-iteration timing, more columns: read from the header line).
* ``nccl-tests-json``: the JSON file nccl-tests writes with ``-J FILE`` (src/util.cu, version 3):
  ``results[].size``, ``.out_of_place.time`` (us), ``.nwrong``, and where per-iteration timing was on,
  ``.out_of_place_per_iter.times_us`` (every iteration: those become the samples).
* ``regex:PATTERN``: every match is one sample; named groups ``time_s`` / ``time_ms`` / ``time_us`` /
  ``time_ns`` (one of them), optionally ``bytes`` (per rank) or ``total_bytes`` to tell sizes apart.
* ``json:PATH[@UNIT]``: every JSON document the program printed (the whole output, or one per line); PATH is
  dotted keys with ``[*]`` over a list (``results[*].seconds``); UNIT s, ms, us or ns, else from the last
  key's suffix (``_s``, ``_ms``, ``_us``, ``_ns``; plain ``seconds``/``time_s``: seconds).

Option: ``nccl-tests:in-place`` and ``nccl-tests-json:in-place`` read the in-place columns.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from diag.errors import DiagError

UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}


@dataclass(frozen=True)
class ProgramRow:
    """One row a program printed: its size in its own convention and its time(s) per iteration."""

    times_s: tuple[float, ...]          # per iteration where the program printed them, else one statistic
    statistic: str                      # "p50", "mean" or "samples": what times_s holds
    size_bytes: int | None = None       # per rank (gloo's benchmark), None where the program says nothing
    total_bytes: int | None = None      # the op's total (nccl-tests' size)
    nwrong: int | None = None           # wrong elements the program counted, None: not checked
    fields: dict[str, Any] = field(default_factory=dict)   # the row as printed, for the records

    def to_json(self) -> dict[str, Any]:
        return {"times_s": list(self.times_s), "statistic": self.statistic, "size_bytes": self.size_bytes,
                "total_bytes": self.total_bytes, "nwrong": self.nwrong, "fields": self.fields}


@dataclass(frozen=True)
class Adapter:
    """A named parser: ``parse(text)`` -> rows; ``reads`` says what it wants ("stdout" or the ``{output}``
    file, where the command wrote one)."""

    name: str
    parse: Callable[[str], list[ProgramRow]]
    reads: str = "stdout"
    description: str = ""


def _number(text: str) -> float:
    return float(text)


# --- gloo's benchmark ---------------------------------------------------------------------------------------

_GLOO_HEADER = re.compile(r"size\s*\(B\)\s+elements\s+min\s*\((us|ns)\)")


def parse_gloo_benchmark(text: str) -> list[ProgramRow]:
    rows: list[ProgramRow] = []
    unit = None
    errors = 0
    # verify=true (its default): the first run of every size is checked (runner.cc) and each wrong element is
    # one "Mismatch at index" line; without it nothing is checked
    verified = re.search(r"\bverify=(true|false)\b", text)
    for line in text.splitlines():
        header = _GLOO_HEADER.search(line)
        if header:
            unit = UNITS[header.group(1)]
            continue
        if "Mismatch at index" in line:
            errors += 1
        if unit is None:
            continue
        cells = line.split()
        if len(cells) != 8:
            continue
        try:
            size, elements, low, p50, p99, high = (int(float(c)) for c in cells[:6])
            bandwidth, iterations = float(cells[6]), int(cells[7])
        except ValueError:
            continue
        rows.append(ProgramRow(
            times_s=(p50 * unit,), statistic="p50", size_bytes=size,
            fields={"size_B": size, "elements": elements, "min_s": low * unit, "p50_s": p50 * unit,
                    "p99_s": p99 * unit, "max_s": high * unit, "bandwidth_GiBps": bandwidth,
                    "iterations": iterations}))
    if verified is not None and verified.group(1) == "true":
        rows = [ProgramRow(r.times_s, r.statistic, r.size_bytes, r.total_bytes, errors, r.fields) for r in rows]
    return rows


# --- nccl-tests ---------------------------------------------------------------------------------------------

def _nccl_table(text: str, place: str) -> list[ProgramRow]:
    names: list[str] | None = None
    rows: list[ProgramRow] = []
    for line in text.splitlines():
        if line.startswith("#"):
            cells = line[1:].split()
            if cells[:5] == ["size", "count", "type", "redop", "root"]:
                names = cells
            continue
        if names is None:
            continue
        cells = line.split()
        if len(cells) < len(names) - (1 if names[-1] == "timestamp" else 0) or not cells[0].isdigit():
            continue   # not a result row (or one whose out-of-place body nccl-tests left blank)
        times = [i for i, n in enumerate(names) if n in ("time", "cputime")]
        if len(times) < (2 if place == "in_place" else 1):
            continue
        start = times[0] if place == "out_of_place" else times[1]
        try:
            time_us = _number(cells[start])
            wrong = cells[start + 3]
            row = ProgramRow(times_s=(time_us * 1e-6,), statistic="mean", total_bytes=int(cells[0]),
                             nwrong=None if wrong == "N/A" else int(float(wrong)),
                             fields={"size_B": int(cells[0]), "count": int(cells[1]), "type": cells[2],
                                     "time_us": time_us, "algbw_GBps": _number(cells[start + 1]),
                                     "busbw_GBps": _number(cells[start + 2]), "place": place})
        except (ValueError, IndexError):
            continue
        rows.append(row)
    return rows


def _nccl_json(text: str, place: str) -> list[ProgramRow]:
    try:
        document = json.loads(text)
    except ValueError:
        return []
    rows: list[ProgramRow] = []
    for result in document.get("results") or [] if isinstance(document, dict) else []:
        body = result.get(place) if isinstance(result, dict) else None
        if not isinstance(body, dict):
            continue
        time_us = body.get("time", body.get("cpu_time"))
        if not isinstance(time_us, (int, float)):
            continue
        per_iter = result.get(f"{place}_per_iter") or {}
        samples = [float(t) * 1e-6 for t in per_iter.get("times_us") or [] if isinstance(t, (int, float))]
        nwrong = body.get("nwrong")
        rows.append(ProgramRow(
            times_s=tuple(samples) if samples else (float(time_us) * 1e-6,),
            statistic="samples" if samples else "mean", total_bytes=int(result["size"]),
            nwrong=int(nwrong) if isinstance(nwrong, (int, float)) else None,
            fields={"size_B": int(result["size"]), "count": result.get("count"), "type": result.get("type"),
                    "time_us": float(time_us), "algbw_GBps": body.get("alg_bw"), "busbw_GBps": body.get("bus_bw"),
                    "place": place}))
    return rows


# --- regex and JSON paths -----------------------------------------------------------------------------------

def regex_adapter(pattern: str) -> Callable[[str], list[ProgramRow]]:
    try:
        compiled = re.compile(pattern, re.MULTILINE)
    except re.error as exc:
        raise DiagError(f"--adapter regex:{pattern}: not a regular expression ({exc})") from None
    units = [u for u in UNITS if f"time_{u}" in compiled.groupindex]
    if len(units) != 1:
        raise DiagError(f"--adapter regex:{pattern}: name exactly one group time_s, time_ms, time_us or time_ns, "
                        r"e.g. regex:'took (?P<time_ms>[0-9.]+) ms'")
    unit = units[0]

    def parse(text: str) -> list[ProgramRow]:
        by_size: dict[tuple[str, int | None], list[float]] = {}
        for match in compiled.finditer(text):
            try:
                value = float(match.group(f"time_{unit}")) * UNITS[unit]
            except (TypeError, ValueError):
                continue
            kind = next((k for k in ("bytes", "total_bytes") if k in compiled.groupindex and match.group(k)), "")
            size = int(float(match.group(kind))) if kind else None
            by_size.setdefault((kind, size), []).append(value)
        return [ProgramRow(tuple(times), "samples", size if kind == "bytes" else None,
                           size if kind == "total_bytes" else None)
                for (kind, size), times in by_size.items()]

    return parse


_PATH = re.compile(r"^[A-Za-z_][\w-]*(\[\*\])?(\.[A-Za-z_][\w-]*(\[\*\])?)*$")


def _walk(value: Any, keys: list[str]) -> Iterator[Any]:
    if not keys:
        if isinstance(value, list):
            yield from value
        else:
            yield value
        return
    key, rest = keys[0], keys[1:]
    every = key.endswith("[*]")
    name = key[:-3] if every else key
    if not isinstance(value, dict) or name not in value:
        return
    inner = value[name]
    if every:
        for item in inner if isinstance(inner, list) else []:
            yield from _walk(item, rest)
    else:
        yield from _walk(inner, rest)


def _documents(text: str) -> Iterator[Any]:
    """The whole output as one JSON document, else each line that is one."""
    try:
        yield json.loads(text)
        return
    except ValueError:
        pass
    for line in text.splitlines():
        line = line.strip()
        if line.startswith(("{", "[")):
            try:
                yield json.loads(line)
            except ValueError:
                continue


def json_adapter(spec: str) -> Callable[[str], list[ProgramRow]]:
    path, _, unit = spec.partition("@")
    if not _PATH.match(path):
        raise DiagError(f"--adapter json:{spec}: give a dotted path, e.g. json:results[*].time_us or json:seconds@s")
    keys = path.split(".")
    if not unit:
        last = keys[-1].removesuffix("[*]")
        unit = next((u for u in ("ms", "us", "ns") if last.endswith(f"_{u}")), "")
        if not unit and (last.endswith("_s") or last in ("seconds", "time_s", "secs")):
            unit = "s"
    if unit not in UNITS:
        raise DiagError(f"--adapter json:{spec}: say the unit, e.g. json:{path}@ms (s, ms, us or ns), or name a key "
                        "ending in _s, _ms, _us or _ns")

    def parse(text: str) -> list[ProgramRow]:
        times = [float(v) * UNITS[unit] for doc in _documents(text) for v in _walk(doc, keys)
                 if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v))]
        return [ProgramRow(tuple(times), "samples")] if times else []

    return parse


BUILT_IN: dict[str, Adapter] = {
    "gloo-benchmark": Adapter("gloo-benchmark", parse_gloo_benchmark, description="gloo's benchmark table (p50)"),
    "nccl-tests": Adapter("nccl-tests", lambda text: _nccl_table(text, "out_of_place"),
                          description="nccl-tests' table, out-of-place time (us, mean)"),
    "nccl-tests:in-place": Adapter("nccl-tests:in-place", lambda text: _nccl_table(text, "in_place"),
                                   description="nccl-tests' table, in-place time"),
    "nccl-tests-json": Adapter("nccl-tests-json", lambda text: _nccl_json(text, "out_of_place"), reads="output",
                               description="nccl-tests -J {output}: out-of-place, per iteration where timed so"),
    "nccl-tests-json:in-place": Adapter("nccl-tests-json:in-place", lambda text: _nccl_json(text, "in_place"),
                                        reads="output", description="nccl-tests -J {output}: in-place"),
}
ADAPTER_HELP = ("gloo-benchmark, nccl-tests[:in-place], nccl-tests-json[:in-place] (reads -J {output}), "
                "regex:PATTERN (a group time_s|time_ms|time_us|time_ns), json:PATH[@UNIT]")


def adapter(spec: str) -> Adapter:
    """The adapter a ``--adapter`` value names; DiagError with the choices otherwise."""
    if spec in BUILT_IN:
        return BUILT_IN[spec]
    kind, _, rest = spec.partition(":")
    if kind == "regex" and rest:
        return Adapter(spec, regex_adapter(rest), description="regex")
    if kind == "json" and rest:
        return Adapter(spec, json_adapter(rest), description="JSON path")
    raise DiagError(f"--adapter {spec!r}: choose one of {ADAPTER_HELP}")


__all__ = ["ADAPTER_HELP", "BUILT_IN", "UNITS", "Adapter", "ProgramRow", "adapter", "json_adapter",
           "parse_gloo_benchmark", "regex_adapter"]

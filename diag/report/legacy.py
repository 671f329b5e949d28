"""Run directories written by earlier releases, read into today's RunData (the writing side exists once:
diag.runinfo's layout). Two layouts had one capture point at the directory's top instead of nodes/<node>/:

- **a sweep's <out>.d** (``diag sweep --capture --observe`` before every command wrote a run directory): logs/,
  captures/<tag>.pcap with <tag>.pcap.capture.json, observe/<tag>.jsonl and the raw transport's tcpinfo/ at
  its top; the records beside it in <out>.jsonl, where each world size's start event names the directory
  (``meta.run_dir``) and its capture's tag (``meta.capture_tag``). The capture of a world size is known by
  that tag, never by reading N out of a file name. Its pcaps were never analysed: ``diag analyze
  OUT.d/captures/TAG.pcap --records OUT.jsonl --json`` into OUT.d/analysis/TAG.json adds the wire evidence.
- **a reproduce run directory of the lab's one capture point**: records/, run.json, captures/, analysis/,
  observe/ and tcpinfo/ at its top (rank 0's host link).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from diag.errors import DiagError
from diag.records import RecordFile, load_records, transport_label
from diag.runinfo import read_run_json

CAPTURE_POINT = ("captures", "analysis", "observe", "tcpinfo")


def is_legacy(root: Path) -> bool:
    """A directory of one of the earlier layouts: no nodes/, a capture point at its top."""
    return not (root / "nodes").is_dir() and any((root / folder).is_dir() for folder in CAPTURE_POINT)


def sweep_records(root: Path) -> Path | None:
    """The records file of a sweep's <out>.d: <out>.jsonl beside it."""
    beside = root.with_name(root.name.removesuffix(".d") + ".jsonl")
    return beside if root.name.endswith(".d") and beside.is_file() else None


def load_legacy_dir(root: Path) -> Any:
    from diag.report.rundir import CaptureMeta, assemble, load_capture_point

    record_paths = sorted((root / "records").glob("*.jsonl"))
    record_files = [load_records(p) for p in record_paths]
    if not record_files:
        beside = sweep_records(root)
        if beside is None:
            raise DiagError(f"{root} has no records: neither records/*.jsonl nor, for a sweep's run directory "
                            f"<out>.d, the <out>.jsonl beside it")
        record_files = [_runs_of(load_records(beside), root)]
    captures, tcpinfo = load_capture_point(root, "", None)
    # Each world size's start event says which capture it wrote: N and the transport come from the records.
    for start in (s for f in record_files for s in f.starts):
        tag = (start.get("meta") or {}).get("capture_tag")
        if tag in captures and isinstance(start.get("world_size"), int):
            spec = start.get("spec") or {}
            meta = captures[tag].meta or CaptureMeta()
            captures[tag].meta = replace(
                meta, world_size=meta.world_size or start["world_size"],
                transport=meta.transport or transport_label(spec.get("backend", "?"), spec.get("algo", "default")))
    return assemble(root, record_files, read_run_json(root), captures, tcpinfo, {})


def _runs_of(records: RecordFile, root: Path) -> RecordFile:
    """The runs of an appended records file whose start names this directory (all, where none does: a moved
    directory)."""
    here = str(root.resolve())
    mine = {s.get("run_id") for s in records.starts if (s.get("meta") or {}).get("run_dir") == here}
    if not mine:
        return records
    return RecordFile(records.path, [s for s in records.starts if s.get("run_id") in mine],
                      [r for r in records.records if r.run_id in mine],
                      [e for e in records.ends if e.get("run_id") in mine], records.torn_lines)


__all__ = ["is_legacy", "load_legacy_dir", "sweep_records"]

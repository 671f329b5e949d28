"""Run directories written by earlier releases, read into today's RunData by diag.report.rundir (the writing
side exists once: diag.runinfo's layout). This module finds their records. Two layouts had one capture point at the directory's top instead of nodes/<node>/:

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

from pathlib import Path

from diag.errors import DiagError
from diag.records import RecordFile, load_records

CAPTURE_POINT = ("captures", "analysis", "observe", "tcpinfo")


def is_legacy(root: Path) -> bool:
    """A directory of one of the earlier layouts: no nodes/, a capture point at its top."""
    return not (root / "nodes").is_dir() and any((root / folder).is_dir() for folder in CAPTURE_POINT)


def sweep_records(root: Path) -> Path | None:
    """The records file of a sweep's <out>.d: <out>.jsonl beside it."""
    beside = root.with_name(root.name.removesuffix(".d") + ".jsonl")
    return beside if root.name.endswith(".d") and beside.is_file() else None


def legacy_records(root: Path) -> list[RecordFile]:
    """The records of a directory of an earlier layout: its records/, or the <out>.jsonl beside a sweep's
    <out>.d (its runs only)."""
    record_files = [load_records(p) for p in sorted((root / "records").glob("*.jsonl"))]
    if record_files:
        return record_files
    beside = sweep_records(root)
    if beside is None:
        raise DiagError(f"{root} has no records: neither records/*.jsonl nor, for a sweep's run directory "
                        f"<out>.d, the <out>.jsonl beside it")
    return [_runs_of(load_records(beside), root)]


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


__all__ = ["is_legacy", "legacy_records", "sweep_records"]

"""Findings and their evidence: the typed, versioned findings.json document, and the one text summary every
command that prints findings uses.

Schema history (``FINDINGS_SCHEMA``, the ``schema`` key of findings.json):
  1: run_dir, missing_inputs, findings (rule, status, statement, strength, evidence [text, values, source,
     plot, phase], thresholds). A file without a ``schema`` key is read as 1.
  2: each finding has ``explains``: the share of the backend's N=2 loss it accounts for, in words ("none"
     where it is an observation or unrelated; version 1 files read with "").
  3: status "observed": objective information (retransmissions the raw reference shows too, idle gaps, a zero
     window, how the nodes differ, how the wire looks) that accounts for none of a measured loss. It has
     evidence and no strength, is no alarm (never red, never gated by ``diagnose --fail-on``), and becomes a
     finding ("fired") only where it accounts for part of a measured loss. Versions 1 and 2 read as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from diag.typedjson import from_json, read_json_object, to_json

FINDINGS_SCHEMA = 3
STATUSES = ("fired", "observed", "undecided", "clear")
STRENGTHS = ("strong", "moderate", "weak")
# Print order: what fired first, then what was observed, then what could not be decided, then what was
# checked clear.
STATUS_ORDER = {"fired": 0, "observed": 1, "undecided": 2, "clear": 3}


@dataclass(frozen=True)
class Evidence:
    text: str                                    # one sentence with the numbers
    values: dict[str, Any] = field(default_factory=dict)
    source: str = ""                             # file the numbers came from
    plot: str | None = None                      # report PNG that shows it
    phase: dict[str, Any] | None = None          # sweep phase (capture window) it belongs to


@dataclass(frozen=True)
class Finding:
    rule: str
    status: str                                  # fired | observed | undecided | clear
    statement: str
    strength: str = ""                           # strong | moderate | weak (fired only; an observation has none)
    evidence: tuple[Evidence, ...] = ()
    thresholds: dict[str, float] = field(default_factory=dict)
    explains: str = ""                           # share of the backend's N=2 loss it accounts for, or "none ..."

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"bad status {self.status!r}")
        if self.status == "fired" and (not self.evidence or self.strength not in STRENGTHS):
            raise ValueError(f"rule {self.rule}: a finding needs evidence and a strength")
        if self.status == "observed" and (not self.evidence or self.strength):
            raise ValueError(f"rule {self.rule}: an observation needs evidence and has no strength")

    def to_json(self) -> dict[str, Any]:
        return to_json(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Finding:
        return from_json(cls, data)


@dataclass(frozen=True)
class FindingsDocument:
    """findings.json: the findings of one diagnosis and what the run lacked."""

    findings: list[Finding]
    run_dir: str | None = None
    missing_inputs: list[str] = field(default_factory=list)
    schema: int = FINDINGS_SCHEMA

    def to_json(self) -> dict[str, Any]:
        return {"schema": self.schema, "run_dir": self.run_dir, "missing_inputs": list(self.missing_inputs),
                "findings": [f.to_json() for f in self.findings]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> FindingsDocument:
        schema = data.get("schema", 1)
        if not isinstance(schema, int) or schema > FINDINGS_SCHEMA:
            raise ValueError(f"findings schema {schema!r} is newer than this diag reads ({FINDINGS_SCHEMA}): "
                             "upgrade diag")
        return cls([Finding.from_json(f) for f in data.get("findings") or []], data.get("run_dir"),
                   list(data.get("missing_inputs") or []), schema)


def load_findings(path: Path) -> FindingsDocument:
    return FindingsDocument.from_json(read_json_object(path))


def format_threshold(value: float) -> str:
    return str(value) if isinstance(value, int) else f"{value:g}"


def ordered(findings: Sequence[Finding]) -> list[Finding]:
    """Fired (strong, then moderate, then weak), then observed, undecided, clear; rule order kept within each."""
    return sorted(findings, key=lambda f: (STATUS_ORDER[f.status],
                                           STRENGTHS.index(f.strength) if f.status == "fired"
                                           and f.strength in STRENGTHS else 0))


def fired(findings: Sequence[Finding]) -> list[Finding]:
    """The fired findings, strongest first."""
    return [f for f in ordered(findings) if f.status == "fired"]


def observed(findings: Sequence[Finding]) -> list[Finding]:
    return [f for f in findings if f.status == "observed"]


def summary_lines(findings: Sequence[Finding]) -> list[str]:
    """The short summary every command prints: one line per fired finding, one line naming the observations,
    then the count of each status."""
    hits = fired(findings)
    lines = [f"finding ({f.strength}) {f.rule}: {f.statement}" for f in hits] or ["no rule fired"]
    seen = observed(findings)
    if seen:
        lines.append(f"observations (no alarm: they account for none of a measured loss): "
                     f"{', '.join(dict.fromkeys(f.rule for f in seen))}")
    undecided = sum(f.status == "undecided" for f in findings)
    clear = sum(f.status == "clear" for f in findings)
    lines.append(f"{len(hits)} findings, {len(seen)} observations, {undecided} rules could not decide, "
                 f"{clear} checked clear")
    return lines


def render_text(findings: Sequence[Finding]) -> str:
    """Every finding with up to five pieces of evidence and the thresholds it used (diag diagnose)."""
    lines: list[str] = []
    for f in ordered(findings):
        tag = {"fired": f"FINDING ({f.strength})", "observed": "OBSERVED", "undecided": "CANNOT DECIDE",
               "clear": "ok"}[f.status]
        lines.append(f"[{tag}] {f.rule}: {f.statement}")
        if f.explains and f.status != "clear":
            lines.append(f"      share of the N=2 loss: {f.explains}")
        for e in f.evidence[:5]:
            where = e.source + (f", plot {e.plot}" if e.plot else "")
            lines.append(f"    - {e.text} [{where}]")
        if len(f.evidence) > 5:
            lines.append(f"    - ... {len(f.evidence) - 5} more in findings.json")
        if f.thresholds and f.status != "clear":
            lines.append("      thresholds: " + ", ".join(f"{k}={format_threshold(v)}" for k, v in f.thresholds.items()))
    return "\n".join(lines)

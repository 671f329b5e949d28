"""run.json, the description of a run directory: one typed definition, written by the job (rank 0, after every
change) and read by the report. Its nested documents keep their own schemas: ``topology`` is the job's
topology (diag/inplace/topology.py writes it, diag/report/topology.py reads it), ``link.matrix`` the link
matrix (diag/probe/matrix.py), ``plan`` the plan (diag/plan.py), ``lab`` the lab's own description
(docs/lab.md) with the host count the report reads.

Every run directory has the same layout (docs/inplace.md, "The run directory"):

    run.json                       this document
    records/<step>.jsonl           the records of each step (a sweep also appends them to its --out)
    advise/advise.json             the measured workarounds, where the plan had an advise step
    nodes/<node>/                  fingerprint.json, captures/, analysis/, observe/, tcpinfo/ of each node
    logs/                          diag's own launch: the launchers' logs and the ranks' state files
    report/                        diag reproduce's report (diag report writes one anywhere)

Schema history (bump RUN_SCHEMA for any change a reader must know about):
  (none) - diag reproduce's run.json before it had a version: mode, cpu_count, quick, plan, lab, topology,
      link, notes, failures, argv, trial_seed, step_seconds, elapsed_s.
  2 - ``schema``; ``command`` (reproduce, sweep, advise or trial: every command writes a run directory) and
      ``records_out`` (the records file a sweep appends to beside its run directory).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from diag import safefs
from diag.typedjson import from_json, to_json

RUN_SCHEMA = 2
RUN_NAME = "run.json"


@dataclass
class LabInfo:
    """The lab the run ran on (diag's lab mode): its own description, with ``hosts`` the count of its hosts
    and ``addresses`` theirs in order; the rest (rate, faults, every host's details) stays in ``extra``."""

    name: str | None = None
    rate_bps: float | None = None
    hosts: int | None = None
    addresses: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class LinkInfo:
    """The link probe's result (diag/inplace/links.py): the first pair's one-stream goodput alone and both
    ways, the tool, the ring pattern per N (str(N) -> its flows and mean edge goodput) and the link matrix."""

    single_stream_Bps: float | None = None
    bidir_Bps: list[float] = field(default_factory=list)
    tool: str | None = None
    seconds: float | None = None
    ring_pattern: dict[str, Any] = field(default_factory=dict)
    matrix: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class RunInfo:
    schema: int | None = None
    command: str | None = None            # "reproduce" | "sweep" | "advise" | "trial" (None: before the schema)
    created_ns: int | None = None
    mode: str | None = None               # "in-place" | "lab" | "loopback"
    cpu_count: int | None = None
    quick: bool | None = None             # diag reproduce --quick
    plan: dict[str, Any] = field(default_factory=dict)
    lab: LabInfo | None = None
    topology: dict[str, Any] | None = None
    link: LinkInfo | None = None
    notes: list[str] = field(default_factory=list)
    failures: list[dict[str, Any]] = field(default_factory=list)
    argv: list[str] = field(default_factory=list)
    trial_seed: int | None = None
    step_seconds: dict[str, float] = field(default_factory=dict)
    elapsed_s: float | None = None
    records_out: str | None = None        # diag sweep's --out (appended to), beside the run directory
    launch: dict[str, Any] | None = None  # how rank 0 was started (diag.launchenv.LaunchEnv: torchrun, srun, ...)
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return to_json(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunInfo:
        return from_json(cls, data)

    def save(self, root: Path) -> None:
        """A new file renamed over the old (diag.safefs): readers never see half of it."""
        safefs.write_file(root / RUN_NAME, json.dumps(self.to_json(), indent=1, default=str))


def transport_name(backend: str, algo: str, knobs: dict[str, Any]) -> str:
    """A transport as file names and step titles spell it: gloo, raw-ring, raw-ring-emulate-gloo."""
    name = backend if backend != "raw" else f"raw-{algo}"
    return f"{name}-emulate-{knobs['emulate']}" if knobs.get("emulate") else name


def step_tag(step: str, backend: str, algo: str, knobs: dict[str, Any], ops: list[str] | tuple[str, ...],
             world_size: int) -> str:
    """The tag of one (step, N)'s files on every node (captures/<tag>.pcap, analysis/<tag>.json,
    observe/<tag>.jsonl): <step>--<transport>-<ops>-n<N>. Each (step, N)'s start event names it too (meta
    ``tag``)."""
    return f"{step}--{transport_name(backend, algo, knobs)}-{'-'.join(ops)}-n{world_size}"


def read_run_json(root: Path) -> dict[str, Any] | None:
    """The run directory's run.json as a JSON object; None where there is none or it is not one."""
    try:
        with (root / RUN_NAME).open(encoding="utf-8") as handle:
            value = json.load(handle)
    except (OSError, json.JSONDecodeError):
        return None
    return value if isinstance(value, dict) else None


__all__ = ["RUN_NAME", "RUN_SCHEMA", "LabInfo", "LinkInfo", "RunInfo", "read_run_json", "step_tag", "transport_name"]

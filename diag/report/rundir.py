"""Read a run directory (or plain record files) into one object: everything report/diagnose need, from files.

A run directory has one layout, whatever command wrote it (diag.runinfo): records/, run.json, nodes/<node>/.
Directories of earlier releases (one capture point at the top, or a sweep's <out>.d with its records beside
it) are read by diag.report.legacy into the same RunData. Every part of a run directory is optional except
records: a run that never captured, or a plain records file from ``diag sweep``, still loads, and
``RunData.missing`` says in plain sentences what is absent so the report and the rules can say what they
could not check.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

from diag.analysisdoc import Analysis, Connection, Host, Phase
from diag.errors import DiagError
from diag.records import Record, RecordFile, load_records, transport_label
from diag.report.topology import LinkMatrix, NodeLookup, Topology
from diag.runinfo import LabInfo, LinkInfo, RunInfo, read_run_json, step_tag
from diag.typedjson import from_json
from diag.verdicts import CPU_LINK_REACHED

T = TypeVar("T")


@dataclass(frozen=True)
class CaptureMeta:
    """captures/<tag>.capture.json as the capture tool writes it (the fields the report reads); a reader of an
    earlier layout fills ``world_size`` and ``transport`` from the records' start events."""

    kernel_dropped: int | None = None
    world_size: int | None = None
    transport: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class CaptureSet:
    """One capture: its metadata (capture.json), its analysis (analyze --json) and observer samples."""

    tag: str
    meta: CaptureMeta | None = None
    analysis: Analysis | None = None
    observe: list[dict[str, Any]] = field(default_factory=list)
    node: str | None = None        # the node that took it (None: the earlier layout's one capture point)
    where: str = ""                # its folder's prefix in the run directory: "" or "nodes/<node>/"

    def source(self, kind: str) -> str:
        """The file of this capture a finding cites: kind "analysis", "observe" or "captures"."""
        suffix = {"analysis": ".json", "observe": ".jsonl", "captures": ".capture.json"}[kind]
        return f"{self.where}{kind}/{self.tag}{suffix}"

    @property
    def world_size(self) -> int | None:
        """N of the capture: its metadata's, its analysis's, else the phases (records) it covers."""
        if self.meta is not None and isinstance(self.meta.world_size, int):
            return self.meta.world_size
        if self.analysis is not None and isinstance(self.analysis.world_size, int):
            return self.analysis.world_size
        # Phases that carried packets first: an analysis given a whole records file lists every phase.
        busy = Counter(p.phase.world_size for p in self.phases if p.connections)
        busy.pop(None, None)
        if busy:
            return busy.most_common(1)[0][0]
        phase_sizes = Counter(p.phase.world_size for p in self.phases)
        phase_sizes.pop(None, None)
        return phase_sizes.most_common(1)[0][0] if phase_sizes else None

    @property
    def transport(self) -> str | None:
        """torch:gloo / raw:ring: its metadata's, its analysis's, else the phases it covers (most common one)."""
        if self.meta is not None and isinstance(self.meta.transport, str):
            return self.meta.transport
        if self.analysis is not None and isinstance(self.analysis.transport, str):
            return self.analysis.transport
        kinds: Counter[str] = Counter()
        for p in self.phases:
            if p.connections and p.phase.backend:
                kinds[transport_label(p.phase.backend, p.phase.algo or "default")] += 1
        return kinds.most_common(1)[0][0] if kinds else None

    @property
    def phases(self) -> list[Phase]:
        return list(self.analysis.phases) if self.analysis else []

    @property
    def connections(self) -> list[Connection]:
        return list(self.analysis.connections) if self.analysis else []

    @property
    def hosts(self) -> list[Host]:
        return list(self.analysis.hosts) if self.analysis else []

    @property
    def kernel_dropped(self) -> int | None:
        if self.analysis is not None and isinstance(self.analysis.capture.kernel_dropped, int):
            return self.analysis.capture.kernel_dropped
        value = self.meta.kernel_dropped if self.meta is not None else None
        return value if isinstance(value, int) else None

    @property
    def flagged(self) -> bool:
        """The analyzer flagged the capture (kernel drops, truncated records)."""
        return bool(self.analysis is not None and self.analysis.capture.flagged)

    @property
    def label(self) -> str:
        parts = [self.transport or "?", f"N={self.world_size}" if self.world_size else "N=?"]
        return f"{self.node + ': ' if self.node else ''}{self.tag} ({', '.join(parts)})"


@dataclass
class NodeData:
    """One node's folder of the run directory (nodes/<node>/): its fingerprint, captures and TCP_INFO files."""

    name: str
    where: str                                   # "nodes/<node>/"
    fingerprint: dict[str, Any] | None = None    # fingerprint.json (diag.envinfo.node_fingerprint)
    captures: dict[str, CaptureSet] = field(default_factory=dict)
    tcpinfo: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class RunData:
    root: Path | None
    record_files: list[RecordFile]
    meta: dict[str, Any]
    captures: dict[str, CaptureSet]
    tcpinfo: list[dict[str, Any]]
    missing: list[str]
    # advise.json of the run's measured workarounds (diag advise, RUN_DIR/advise), None where none ran
    advise: dict[str, Any] | None = None
    # nodes/<node>/ of the run directory, in the job's order; empty for an earlier release's layout (one
    # capture point: captures/, analysis/, observe/ at the top, diag.report.legacy). ``captures`` and
    # ``tcpinfo`` are rank 0's node's (or that one capture point's), what every one-capture-point rule reads.
    nodes: dict[str, NodeData] = field(default_factory=dict)
    # Answers of the evidence queries (diag.report.queries), computed once per run for rules and plots.
    memo: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def remember(self, name: str, compute: Callable[[], T]) -> T:
        if name not in self.memo:
            self.memo[name] = compute()
        return self.memo[name]  # type: ignore[no-any-return]

    @property
    def records(self) -> list[Record]:
        """The survey rows: one per (transport, knobs, op, N, size) and launch. Blocks of interleaved trials
        are not rows of a series (a trial holds many short blocks per arm): ``trials`` reads those. The model's
        profile (``profile_records``) is not part of the survey either."""
        profile = self._profile_runs
        return [r for f in self.record_files for r in f.records if not r.block and (f.path, r.run_id) not in profile]

    @property
    def profile_records(self) -> list[Record]:
        """The rows of the model's profile (diag reproduce --profile): sizes a simulator asks about, sampled under
        a time budget, for the model (``model_records``), not for the diagnosis's rules."""
        profile = self._profile_runs
        return [r for f in self.record_files for r in f.records if not r.block and (f.path, r.run_id) in profile]

    @property
    def model_records(self) -> list[Record]:
        """What the model is fitted on: the survey and the profile."""
        return self.records + self.profile_records

    @property
    def _profile_runs(self) -> frozenset[tuple[Path, str]]:
        """(records file, run id) of every profile run: a run id names one N of the job, every step at that N
        shares it, so the file (one per step) is part of the key."""
        return self.remember("profile_runs", lambda: frozenset(
            (f.path, s.get("run_id")) for f in self.record_files for s in f.starts
            if (s.get("meta") or {}).get("profile")))

    @property
    def all_records(self) -> list[Record]:
        """Every row of every records file: the survey rows and the trials' blocks (diag compare reads both)."""
        return [r for f in self.record_files for r in f.records]

    @property
    def trials(self) -> list[tuple[Any, list[Record], dict[str, Any]]]:
        """(TrialSpec, its block records, its end event's summary or {}) for every trial launch in the run."""
        def collect() -> list[tuple[Any, list[Record], dict[str, Any]]]:
            from diag.trialspec import TrialSpec

            out = []
            for f in self.record_files:
                for start in f.starts:
                    trial = (start.get("meta") or {}).get("trial")
                    if not trial:
                        continue
                    run_id = start.get("run_id")
                    blocks = [r for r in f.records if r.block and r.run_id == run_id]
                    end = next((e.get("trial") or {} for e in f.ends if e.get("run_id") == run_id), {})
                    out.append((TrialSpec.from_json(trial), blocks, end))
            return out
        return self.remember("trials", collect)

    def to_pandas(self, samples: bool = False) -> Any:
        """Every record of the run as a pandas DataFrame (one row per record, or with ``samples`` one row per
        timed iteration), with a ``source`` column naming the records file. pandas is optional."""
        from diag.records import records_frame, require_pandas

        pandas = require_pandas()
        frames = [records_frame(f.records, samples, source=self.relative(f.path)) for f in self.record_files]
        return pandas.concat(frames, ignore_index=True) if frames else records_frame([], samples)

    def duplicate_rows(self) -> list[str]:
        """Rows that more than one record claims (same series, op, N and size), in plain sentences: plots and
        tables keep one of them (the later), so the user should know."""
        from diag.report.series import series_label

        seen: dict[tuple[str, str, int, int], list[str]] = {}
        profile = self._profile_runs   # the profile may measure a survey row's size again, for the model
        for f in self.record_files:
            for r in f.records:
                if (f.path, r.run_id) in profile or r.block:   # the model's profile; a trial's blocks
                    continue
                seen.setdefault((series_label(r), r.op, r.world_size, r.size_bytes), []).append(self.relative(f.path))
        from diag.units import human_bytes

        return [f"{label} {op} N={n} {human_bytes(size)} per rank is in {len(files)} records "
                f"({', '.join(sorted(set(files)))}): the later one is shown"
                for (label, op, n, size), files in seen.items() if len(files) > 1]

    def source_of(self, record: Record) -> str:
        for f in self.record_files:
            if any(r is record for r in f.records):
                return self.relative(f.path)
        return "?"

    def relative(self, path: Path) -> str:
        if self.root is not None:
            try:
                return str(path.relative_to(self.root))
            except ValueError:
                pass
        return str(path)

    @property
    def env(self) -> dict[str, Any]:
        """The environment fingerprint of the first run that has one (start event "env")."""
        for f in self.record_files:
            for start in f.starts:
                if isinstance(start.get("env"), dict) and start["env"]:
                    return start["env"]
        return {}

    @property
    def info(self) -> RunInfo:
        """run.json, typed (an empty RunInfo where there is none)."""
        return self.remember("run_info", lambda: RunInfo.from_json(self.meta))

    @property
    def link_Bps(self) -> float | None:
        """The measured single-stream link rate in bytes/s; else the lab's shaped rate; else None."""
        measured = self.info.link.single_stream_Bps if self.info.link else None
        if isinstance(measured, (int, float)) and measured > 0:
            return float(measured)
        rate = self.info.lab.rate_bps if self.info.lab else None
        if isinstance(rate, (int, float)) and rate > 0:
            return float(rate) / 8.0
        return None

    @property
    def ring_pattern_Bps(self) -> dict[int, float]:
        """Per N: the mean edge goodput of N iperf3 flows h(i) -> h((i+1) % N) at once (run.json
        link.ring_pattern): what this machine itself carries in a ring of N, CPU included."""
        pattern = self.info.link.ring_pattern if self.info.link else {}
        out: dict[int, float] = {}
        if isinstance(pattern, dict):
            for n, measured in pattern.items():
                value = measured.get("mean_edge_Bps") if isinstance(measured, dict) else None
                if str(n).isdigit() and isinstance(value, (int, float)) and value > 0:
                    out[int(n)] = float(value)
        return out

    def link_reference_Bps(self, world_size: int) -> float | None:
        """What one ring edge can carry at N: the iperf3 ring pattern where the machine (its CPU) held it below
        CPU_LINK_REACHED of the single-stream link, else the link rate (link_Bps)."""
        link = self.link_Bps
        pattern = self.ring_pattern_Bps.get(world_size)
        if pattern is not None and (link is None or pattern < CPU_LINK_REACHED.value * link):
            return pattern
        return link

    @property
    def link_source(self) -> str:
        measured = self.info.link.single_stream_Bps if self.info.link else None
        if isinstance(measured, (int, float)) and measured > 0:
            return "measured single stream (run.json link.single_stream_Bps)"
        if self.info.lab and self.info.lab.rate_bps:
            return "lab shaped rate (run.json lab.rate_bps)"
        return "none"

    @property
    def observe_samples(self) -> list[dict[str, Any]]:
        return [s for c in self.captures.values() for s in c.observe]

    @property
    def topology(self) -> Topology | None:
        """run.json ``topology``, typed by its own schema (diag.report.topology)."""
        document = self.info.topology
        return self.remember("topology", lambda: from_json(Topology, document)) if document else None

    @property
    def link_matrix(self) -> LinkMatrix | None:
        """run.json ``link.matrix``, typed by its own schema (diag.report.topology)."""
        document = self.info.link.matrix if self.info.link else None
        return self.remember("link_matrix", lambda: from_json(LinkMatrix, document)) if document else None

    @property
    def lookup(self) -> NodeLookup:
        """Address -> node and rank -> node (run.json topology, else a lab's addresses h0, h1, ...)."""
        addresses = list(self.info.lab.addresses) if self.info.lab else []
        return self.remember("node_lookup", lambda: NodeLookup.of(self.topology, addresses))

    @property
    def node_names(self) -> list[str]:
        """Every node the run knows, in the job's order: topology, then node folders, then the matrix's."""
        names = list(self.lookup.order)
        for name in [*self.nodes, *(self.link_matrix.names() if self.link_matrix else [])]:
            if name not in names:
                names.append(name)
        return names

    @property
    def all_captures(self) -> list[CaptureSet]:
        """Every node's captures (the earlier layout's one capture point where there are no nodes)."""
        if not self.nodes:
            return list(self.captures.values())
        seen = [c for node in self.nodes.values() for c in node.captures.values()]
        return seen + [c for c in self.captures.values() if all(c is not other for other in seen)]

    def fingerprints(self) -> dict[str, dict[str, Any]]:
        """node -> its fingerprint.json, for the nodes that wrote one."""
        return {name: node.fingerprint for name, node in self.nodes.items() if node.fingerprint is not None}


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        with path.open(encoding="utf-8") as handle:
            value = json.load(handle)
    except (OSError, json.JSONDecodeError):
        return None
    return value if isinstance(value, dict) else None


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return out
    for line in lines:
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError:
            continue  # a torn last line of a killed sampler
        if isinstance(value, dict):
            out.append(value)
    return out


def _tag_of(path: Path, suffixes: Sequence[str]) -> str:
    name = path.name
    for suffix in suffixes:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return path.stem


def load_run_dir(root: Path) -> RunData:
    """A run directory (diag.runinfo's layout); one of an earlier release through diag.report.legacy."""
    from diag.report import legacy

    if legacy.is_legacy(root):
        return _load_legacy_dir(root)
    record_dir = root / "records"
    record_paths = sorted(record_dir.glob("*.jsonl")) if record_dir.is_dir() else []
    if not record_paths:
        record_paths = sorted(root.glob("*.jsonl"))  # a folder of plain sweep outputs
    if not record_paths:
        raise DiagError(f"{root} has no records (records/*.jsonl): run `diag reproduce --out {root}` first")
    # The last release kept its advise steps' records apart (advise/records.jsonl): they name those steps' files.
    earlier_advise = root / "advise" / "records.jsonl"
    named_by = [load_records(earlier_advise)] if earlier_advise.is_file() else []
    return assemble(root, [load_records(p) for p in record_paths], read_run_json(root), {}, [], _load_nodes(root),
                    named_by)


def _load_legacy_dir(root: Path) -> RunData:
    """An earlier release's directory (diag.report.legacy): its one capture point at the top, each capture's N
    and transport from the records' start events."""
    from diag.report import legacy

    record_files = legacy.legacy_records(root)
    captures, tcpinfo = load_capture_point(root, "", None)
    return assemble(root, record_files, read_run_json(root), captures, tcpinfo, {})


def assemble(root: Path, record_files: list[RecordFile], meta: dict[str, Any] | None,
             captures: dict[str, CaptureSet], tcpinfo: list[dict[str, Any]], nodes: dict[str, NodeData],
             named_by: Sequence[RecordFile] = ()) -> RunData:
    """One RunData from what a layout's reader found: the nodes in the job's order (rank 0's node is the one
    capture point the one-capture-point rules read), what is missing in plain sentences, every capture's N and
    transport from the records, advise.json."""
    missing: list[str] = []
    if meta is None:
        missing.append("run.json (no measured link rate: no ideal line, no lab description)")
        meta = {}
    nodes = _in_job_order(nodes, meta)
    if nodes:
        first = next(iter(nodes.values()))
        captures = {**captures, **first.captures}
        tcpinfo = tcpinfo + first.tcpinfo
    points = [captures] + [node.captures for node in nodes.values()]
    everywhere = [c for point in points for c in point.values()]
    side_files = tcpinfo or [s for node in nodes.values() for s in node.tcpinfo]

    where = "nodes/*/" if nodes else ""
    if not any(c.analysis for c in everywhere):
        missing.append(f"{where}analysis/*.json (no capture analysis: no duplex overlap, per-connection "
                       "throughput, windows, retransmissions or idle gaps from the wire)")
    if not any(c.meta for c in everywhere):
        missing.append(f"{where}captures/*.capture.json (no capture metadata: kernel drops unknown)")
    if not any(c.observe for c in everywhere):
        missing.append(f"{where}observe/*.jsonl (no observer samples: no per-thread CPU, no ss/TCP_INFO)")
    if not side_files:
        missing.append(f"{where}tcpinfo/*.jsonl (no raw transport TCP_INFO side files)")
    without = [name for name, node in nodes.items() if node.fingerprint is None]
    if without:
        missing.append(f"nodes/<node>/fingerprint.json of {', '.join(without)} (their configuration is not "
                       "compared with the other nodes')")
    steps = steps_by_tag([*record_files, *named_by])
    for capture in everywhere:
        if capture.tag in steps:
            world_size, transport = steps[capture.tag]
            known = capture.meta or CaptureMeta()
            capture.meta = replace(known, world_size=known.world_size or world_size,
                                   transport=known.transport or transport)
    # advise.json's own reader (its schema check), below diag.advise: the report never imports a command.
    from diag.advisefile import ADVISE_NAME, load_advise

    advise = load_advise(root / "advise") if (root / "advise" / ADVISE_NAME).is_file() else None
    return RunData(root, record_files, meta, captures, tcpinfo, missing, advise=advise, nodes=nodes)


def steps_by_tag(record_files: Sequence[RecordFile]) -> dict[str, tuple[int, str]]:
    """tag -> (N, transport): every (step, N) launch's start event names the tag of its files on every node
    (meta ``tag``; an earlier release's sweep: ``capture_tag``; its run directories: the layout's own rule,
    diag.runinfo.step_tag, applied to the start event and its records file <step>.jsonl). A capture is known
    by its records, never by reading N out of its file name."""
    out: dict[str, tuple[int, str]] = {}
    for records in record_files:
        for start in records.starts:
            meta, spec, world_size = start.get("meta") or {}, start.get("spec") or {}, start.get("world_size")
            if not isinstance(world_size, int) or not isinstance(spec, dict):
                continue
            backend, algo = spec.get("backend", "?"), spec.get("algo", "default")
            tag = meta.get("tag") or meta.get("capture_tag")
            if not tag and spec.get("ops") and meta.get("run_dir"):
                # the last release's advise ran each workaround as a step of its own, into advise/records.jsonl
                step = f"advise-{meta['advise']}" if meta.get("advise") else records.path.stem
                tag = step_tag(step, backend, algo, spec.get("knobs") or {}, spec["ops"], world_size)
            if isinstance(tag, str):
                out[tag] = (world_size, transport_label(backend, algo))
    return out


def load_capture_point(folder: Path, where: str, node: str | None) -> tuple[dict[str, CaptureSet], list[dict[str, Any]]]:
    """The captures (capture.json, analysis, observer samples by tag) and raw TCP_INFO side files of one
    capture point: one node's folder (or an earlier layout's top)."""
    captures: dict[str, CaptureSet] = {}

    def capture(tag: str) -> CaptureSet:
        return captures.setdefault(tag, CaptureSet(tag, node=node, where=where))

    for path in sorted((folder / "captures").glob("*.capture.json")):
        # The capture tool names it after the pcap (<tag>.pcap.capture.json); the contract says <tag>.capture.json.
        document = _read_json(path)
        capture(_tag_of(path, [".pcap.capture.json", ".pcapng.capture.json", ".capture.json"])).meta = (
            from_json(CaptureMeta, document) if document is not None else None)
    for path in sorted((folder / "analysis").glob("*.json")):
        document = _read_json(path)
        try:
            capture(_tag_of(path, [".json"])).analysis = Analysis.from_json(document) if document else None
        except ValueError as exc:
            raise DiagError(f"{path}: {exc}") from exc
    for path in sorted((folder / "observe").glob("*.jsonl")):
        capture(_tag_of(path, [".jsonl"])).observe = _read_jsonl(path)
    tcpinfo = [s for path in sorted((folder / "tcpinfo").glob("*.jsonl")) for s in _read_jsonl(path)]
    return captures, tcpinfo


def _load_nodes(root: Path) -> dict[str, NodeData]:
    """nodes/<node>/ (docs/inplace.md), by folder name."""
    nodes: dict[str, NodeData] = {}
    folder = root / "nodes"
    if not folder.is_dir():
        return nodes
    for path in sorted(p for p in folder.iterdir() if p.is_dir()):
        where = f"nodes/{path.name}/"
        captures, tcpinfo = load_capture_point(path, where, path.name)
        nodes[path.name] = NodeData(path.name, where, _read_json(path / "fingerprint.json"), captures, tcpinfo)
    return nodes


def _in_job_order(nodes: dict[str, NodeData], meta: dict[str, Any]) -> dict[str, NodeData]:
    """The nodes with rank 0's first, then by their lowest rank (run.json topology), then by name."""
    document = RunInfo.from_json(meta).topology
    order = NodeLookup.of(from_json(Topology, document) if document else None, []).order
    rank = {name: i for i, name in enumerate(order)}
    return dict(sorted(nodes.items(), key=lambda kv: (rank.get(kv[0], len(rank)), kv[0])))


def load_run(paths: Sequence[str | os.PathLike[str]]) -> RunData:
    """A run directory, or one or more plain record files (then everything but records is missing)."""
    if not paths:
        raise DiagError("give a run directory or record files")
    resolved = [Path(p) for p in paths]
    if len(resolved) == 1 and resolved[0].is_dir():
        return load_run_dir(resolved[0])
    for p in resolved:
        if p.is_dir():
            raise DiagError(f"{p} is a directory: give one run directory, or record files only")
        if not p.exists():
            raise DiagError(f"no such file {p}: give a run directory or records .jsonl files")
    record_files = [load_records(p) for p in resolved]
    missing = ["run.json (plain record files: no run directory)",
               "analysis/*.json, captures/, observe/, tcpinfo/ (plain record files: no wire evidence)"]
    return RunData(None, record_files, {}, {}, [], missing)


__all__ = ["CaptureMeta", "CaptureSet", "LabInfo", "LinkInfo", "NodeData", "RunData", "RunInfo", "assemble",
           "load_capture_point", "load_run", "load_run_dir", "steps_by_tag"]

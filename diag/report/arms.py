"""Programs held against each other in an interleaved trial (``diag trial``): per world size and size, each
arm's busbw, each arm against the baseline (faster / slower / equal / undecided, from the same bootstrap
over rounds the trial stopped on: diag.verdicts.difference), against the link where the trial ran diag's
raw-TCP arm beside them, and the duplex overlap its connections showed on the wire where the run was
captured. Reads files only (the run's trials and capture analyses)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from diag.report.rundir import RunData
from diag.report.thresholds import BIDIR_MIN_BYTES
from diag.stats import Interval
from diag.trialspec import ARM_RULE, LINK_ARM, arms_of, cpu_of
from diag.units import human_bytes, human_rate
from diag.verdicts import Decision, control

WORDS = {"shown": ("faster", "slower"), "ruled_out": "equal", "undecided": "undecided"}


@dataclass(frozen=True)
class ArmVerdict:
    """One arm against the baseline at one size (the trial's own comparison, decided again from its blocks)."""

    arm: str
    baseline: str
    size_bytes: int
    decision: Decision
    budget_spent: bool = False
    effect: float = 0.05

    @property
    def word(self) -> str:
        d = self.decision
        if d.verdict == "shown" and d.ratio is not None:
            return "faster" if d.ratio.point < 1 else "slower"
        return "equal" if d.verdict == "ruled_out" else "undecided"

    @property
    def speedup(self) -> Interval | None:
        """baseline time / arm time, with its interval (> 1: the arm is faster)."""
        r = self.decision.ratio
        return Interval(1 / r.point, 1 / r.high, 1 / r.low) if r is not None and r.low > 0 else None

    def text(self) -> str:
        s = self.speedup
        figure = f" {s.point:.2f}x [{s.low:.2f}, {s.high:.2f}]" if s is not None else ""
        why = (" (budget)" if self.budget_spent else "") if self.word == "undecided" else ""
        if self.word == "equal":
            return f"equal within {self.effect:.0%}:{figure}"
        return f"{self.word}{why}:{figure}" if figure else self.word + why


@dataclass(frozen=True)
class ArmCell:
    arm: str
    size_bytes: int
    volume_bytes: int
    busbw_Bps: float                 # from the arm's mean time per iteration over all its blocks
    blocks: int
    statistic: str                   # what each block's time is: "samples", "mean" (program's), "p50", "harness"
    vs_link: Interval | None = None  # busbw / the link's, same rounds
    overlap: float | None = None     # duplex overlap of its two-way connections (bytes-weighted), if captured
    cpu: str = ""                    # "machine busy / busiest thread" its blocks saw (diag.verdicts.ArmCpu)


@dataclass
class ArmTable:
    name: str
    world_size: int
    baseline: str
    arms: list[str]
    sizes: list[int]
    cells: dict[tuple[str, int], ArmCell] = field(default_factory=dict)
    verdicts: list[ArmVerdict] = field(default_factory=list)
    stopped: dict[int, str] = field(default_factory=dict)
    rounds: dict[int, int] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    source: str = ""

    @property
    def title(self) -> str:
        return f"trial {self.name} N={self.world_size}"


def is_arm_trial(spec: Any) -> bool:
    return any(c.rule == ARM_RULE for c in spec.comparisons)


def arm_tables(run: RunData) -> list[ArmTable]:
    """One table per trial launch whose comparisons hold arms against a baseline (diag trial)."""
    tables = []
    for spec, blocks, end in run.trials:
        if not is_arm_trial(spec) or not blocks:
            continue
        baseline = next(c.off for c in spec.comparisons if c.rule == ARM_RULE)
        table = ArmTable(spec.name, blocks[0].world_size, baseline, [a.name for a in spec.arms], list(spec.sizes),
                         failed=dict(end.get("failed_arms") or {}), source=run.source_of(blocks[0]))
        overlaps = _overlaps(run, spec.name, table.world_size)
        for size in spec.sizes:
            arms = arms_of(blocks, spec.name, size)
            cpu = cpu_of(blocks, spec.name, size)
            summary = (end.get("sizes") or {}).get(str(size), {})
            table.stopped[size] = summary.get("stopped", "")
            table.rounds[size] = summary.get("rounds", 0)
            for name, arm in arms.items():
                row = next(r for r in blocks if r.block.get("arm") == name and r.size_bytes == size)
                program = (row.extra or {}).get("program") or {}
                vs_link = (control(arm, arms[LINK_ARM], spec.seed).ratio
                           if LINK_ARM in arms and name != LINK_ARM and arm.count and arms[LINK_ARM].count else None)
                table.cells[(name, size)] = ArmCell(
                    name, size, row.volume_bytes,
                    row.total_bytes / arm.mean_s * (row.busbw_Bps / row.algbw_Bps if row.algbw_Bps else 0.0),
                    len(arm.blocks), program.get("statistic", "harness"),
                    vs_link, overlaps.get((name, size)), _cpu_text(cpu.get(name)))
            for c in spec.comparisons:
                if c.rule != ARM_RULE or not all(n in arms for n in c.arm_names):
                    continue
                table.verdicts.append(ArmVerdict(c.on, c.off, size, c.decide(arms, cpu, spec.seed),
                                                 table.stopped[size] == "budget", c.effect))
        tables.append(table)
    return tables


def _cpu_text(cpu: Any) -> str:
    if cpu is None:
        return "-"
    parts = [f"{v:.0%}" if v is not None else "?" for v in (cpu.machine_busy, cpu.busiest_thread)]
    return " / ".join(parts)


def _overlaps(run: RunData, trial: str, world_size: int) -> dict[tuple[str, int], float]:
    """(arm, per-rank size) -> the bytes-weighted duplex overlap of the two-way connections in its blocks."""
    sums: dict[tuple[str, int], list[float]] = {}
    for capture in run.all_captures:
        for phase in capture.phases:
            key = phase.phase
            extra = key.extra or {}
            if extra.get("trial") != trial or key.world_size != world_size or not extra.get("arm"):
                continue
            for conn in phase.connections:
                smaller = min(conn.payload_bytes) if conn.payload_bytes else 0
                if smaller >= BIDIR_MIN_BYTES.value and isinstance(conn.duplex_overlap, (int, float)):
                    total = sums.setdefault((str(extra["arm"]), int(key.size_bytes or 0)), [0.0, 0.0])
                    total[0] += float(conn.duplex_overlap) * smaller
                    total[1] += smaller
    return {k: v[0] / v[1] for k, v in sums.items() if v[1] > 0}


HEADER = ["per rank", "D", "arm", "busbw", "x link", "blocks", "against the baseline", "duplex overlap",
          "CPU: machine / thread"]


def table_rows(table: ArmTable) -> list[list[str]]:
    verdicts = {(v.arm, v.size_bytes): v for v in table.verdicts}
    rows = []
    for size in table.sizes:
        first = True
        for name in table.arms:
            cell = table.cells.get((name, size))
            if cell is None:
                continue
            v = verdicts.get((name, size))
            rows.append([human_bytes(size) if first else "", human_bytes(cell.volume_bytes) if first else "", name,
                         human_rate(cell.busbw_Bps),
                         cell.vs_link.text() if cell.vs_link is not None else ("-" if name != LINK_ARM else "1"),
                         str(cell.blocks),
                         "(baseline)" if name == table.baseline else (v.text() if v is not None else "-"),
                         f"{cell.overlap:.2f}" if cell.overlap is not None else "-", cell.cpu])
            first = False
    return rows


def describe(table: ArmTable) -> str:
    stats = sorted({c.statistic for c in table.cells.values()})
    stops = ", ".join(f"{human_bytes(s)}: {table.rounds.get(s, 0)} rounds ({table.stopped.get(s) or '?'})"
                      for s in table.sizes)
    return (f"{table.title}: every arm against {table.baseline} (time ratio, 95% bootstrap interval over rounds; "
            f"speed-up = the baseline's time / the arm's); busbw from each arm's mean time per iteration (a block's "
            f"time: {', '.join(stats)}); CPU: the machine's mean busy share over the arm's blocks / the median of "
            f"its busiest thread's share of a core (a program's: sampled while it ran); {stops}; from {table.source}")


def table_lines(tables: list[ArmTable]) -> list[str]:
    """The arms' tables as terminal text."""
    lines: list[str] = []
    for table in tables:
        rows = [HEADER, *table_rows(table)]
        widths = [max(len(r[i]) for r in rows) for i in range(len(HEADER))]
        lines += ["", describe(table)]
        lines += ["  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
                  for row in rows]
        lines += [f"  arm {name} failed and left the trial: {why}" for name, why in table.failed.items()]
    return lines


def _where(items: list[ArmVerdict], by_n: dict[int, list[int]], n_of: dict[int, int]) -> str:
    """'N=2 (1 MiB .. 64 MiB)' or 'N=3 1 MiB, 16 MiB': a whole world size where every size there agrees."""
    parts = []
    for n in sorted({n_of[id(v)] for v in items}):
        sizes = [v.size_bytes for v in items if n_of[id(v)] == n]
        parts.append(f"N={n}" if len(sizes) == len(by_n[n]) else f"N={n} {', '.join(map(human_bytes, sizes))}")
    return ", ".join(parts)


def _speedups(items: list[ArmVerdict]) -> str:
    points = [v.speedup.point for v in items if v.speedup is not None]
    if not points:
        return ""
    low, high = min(points), max(points)
    return f" ({low:.2f}x)" if abs(high - low) < 0.005 else f" ({low:.2f}-{high:.2f}x)"


def _span(values: list[int]) -> str:
    low, high = min(values, default=0), max(values, default=0)
    return str(low) if low == high else f"{low}-{high}"


def arm_card(run: RunData) -> dict[str, Any] | None:
    """The verdict card's fields (diag.report.verdict.Verdict) for a run of ``diag trial`` (run.json command
    "trial"), from the arms' tables: which arm is faster than the baseline where, which are equal, what is
    undecided. None for any other run."""
    if run.info.command != "trial":
        return None
    tables = arm_tables(run)
    if not tables:
        return None
    n_of = {id(v): t.world_size for t in tables for v in t.verdicts}
    by_n = {t.world_size: t.sizes for t in tables}
    verdicts = [v for t in tables for v in t.verdicts]
    baseline = tables[0].baseline
    sentences, ruled_out, todo = [], [], []
    for arm in dict.fromkeys(v.arm for v in verdicts):
        mine = [v for v in verdicts if v.arm == arm]
        words = {w: [v for v in mine if v.word == w] for w in ("faster", "slower", "equal", "undecided")}
        said = [f"{w} at {_where(items, by_n, n_of)}{_speedups(items) if w in ('faster', 'slower') else ''}"
                for w, items in words.items() if items]
        sentences.append(f"{arm} against {baseline}: " + "; ".join(said))
        if words["equal"] and len(words["equal"]) == len(mine):
            ruled_out.append(f"{arm} differs from {baseline} by {mine[0].effect:.0%} or more (equal everywhere)")
        if words["faster"] and not words["slower"]:
            todo.append(f"{arm} is faster than {baseline} at {_where(words['faster'], by_n, n_of)} and slower "
                        "nowhere in this run")
        elif words["slower"]:
            todo.append(f"{arm} is slower than {baseline} at {_where(words['slower'], by_n, n_of)}")
    failed = [f"{name} failed ({t.title})" for t in tables for name in t.failed]
    decided = sum(v.word != "undecided" for v in verdicts)
    moved = any(v.word in ("faster", "slower") for v in verdicts)
    status = "fired" if moved else ("clear" if verdicts and decided == len(verdicts) else "undecided")
    sure = ("undecided" if not decided else "strong" if decided == len(verdicts) else "moderate")
    rounds = [r for t in tables for r in t.rounds.values() if r]
    return dict(
        slow="; ".join(sentences + failed) or "no comparison could be made: " + "; ".join(failed),
        slow_status=status,
        why="not asked: an A/B trial of programs says which arm is faster and by how much; the arms differ only in "
            "their commands (the records' knobs)",
        sure=sure,
        shown_by=f"the interleaved trial {tables[0].name} at N={', '.join(str(t.world_size) for t in tables)}, "
                 f"{_span(rounds)} rounds a size",
        todo=("; ".join(todo) + ".") if todo else (
            f"Nothing to change: no arm differs from {baseline} in this run." if status == "clear" else
            "Run more rounds where undecided (--max-rounds, --budget), on a quieter machine."),
        ruled_out=tuple(ruled_out), figure=None, rules=(),
        sure_detail=f"{decided} of {len(verdicts)} comparisons decided, each from interleaved rounds with a 95% "
                    "bootstrap interval over rounds")


__all__ = ["HEADER", "ArmCell", "ArmTable", "ArmVerdict", "arm_card", "arm_tables", "describe", "is_arm_trial",
           "table_lines", "table_rows"]

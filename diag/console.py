"""What a sweep prints: an nccl-tests-like table, row by row, under a progress bar on a terminal; and the
progress component every long command shares (sweep, reproduce, analyze).

Progress is weighted, not counted: sizes double from row to row, so the last row of a sweep takes as long
as all the others together and "7 of 14 rows" says little about the time left. A row's weight is the bytes
that cross each rank's link (the per-device volume D of the bus model, what a link's time follows) times
its iterations (``row_weight``), and the ETA is the time so far scaled by the weight left.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, TextIO

from diag.records import Record
from diag.units import RATE_SCALE, human_bytes

HEADER = (
    f"{'N':>3} {'backend':>10} {'op':>14} {'size':>10} {'count':>11} {'type':>8} "
    f"{'time(us)':>11} {'p95(us)':>10} {'algbw(MB/s)':>11} {'busbw(MB/s)':>11} {'D':>10} {'#wrong':>6}"
)

# Every iteration pays a fixed cost (barrier, a few round trips) besides its bytes: this many bytes' worth,
# so that small rows do not count as free. About what a 1 GbE link moves in the ~2 ms such a cost takes.
ITERATION_OVERHEAD_BYTES = 256 << 10


def row_weight(volume_bytes: int, iterations: int) -> float:
    """Work of one row: its per-device volume D (Record.volume_bytes) plus a fixed per-iteration cost, times
    the iterations run (warm-up included)."""
    return float(max(volume_bytes, 0) + ITERATION_OVERHEAD_BYTES) * max(iterations, 1)


def plan_weight(spec: Any, plans: Iterable[Any], world_size: int) -> float:
    """Total weight of a sweep's rows at one world size (RowPlan.used_bytes, the spec's iterations)."""
    from diag.collectives import make_collective

    return sum(row_weight(make_collective(p.op).volume_bytes(p.used_bytes, world_size), spec.warmup + spec.iters)
               for p in plans)


def format_duration(seconds: float) -> str:
    seconds = max(0, round(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


class Progress:
    """A weighted progress bar with an ETA: on a terminal a live rich bar on ``stream``; elsewhere nothing
    live, and ``status()`` gives the same bar as text for a log line.

    The ETA is ``elapsed x remaining / done`` over the weight done since this object started (work finished
    before it, ``done``, counts toward the bar but not toward the rate)."""

    def __init__(self, label: str, total: float, done: float = 0.0, stream: TextIO | None = None,
                 live: bool | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.label = label
        self.total = max(float(total), 0.0)
        self.done = min(float(done), self.total) if self.total else float(done)
        self._done_at_start = self.done
        self._clock = clock
        self._started = clock()
        self.stream = stream or sys.stderr
        self._bar: Any = None
        self._task: Any = None
        if live if live is not None else _is_terminal(self.stream):
            from rich.console import Console
            from rich.progress import BarColumn, ProgressColumn, TextColumn
            from rich.progress import Progress as RichProgress
            from rich.text import Text

            owner = self

            class Timing(ProgressColumn):  # elapsed ticks between rows; the ETA is ours (weighted)
                def render(self, task: Any) -> Text:
                    return Text(owner.timing())

            self._bar = RichProgress(
                TextColumn(f"[bold]{label}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"), Timing(),
                TextColumn("{task.description}"), console=Console(file=self.stream, force_terminal=True),
                transient=True, auto_refresh=True)
            self._task = self._bar.add_task("", total=self.total or 1, completed=self.done)
            self._bar.start()

    @property
    def fraction(self) -> float:
        return min(self.done / self.total, 1.0) if self.total > 0 else 0.0

    def elapsed_s(self) -> float:
        return self._clock() - self._started

    def eta_s(self) -> float | None:
        """Seconds left at the rate of the work done so far; None before any work is done."""
        worked = self.done - self._done_at_start
        if worked <= 0 or self.total <= 0:
            return None
        return self.elapsed_s() * max(self.total - self.done, 0.0) / worked

    def timing(self) -> str:
        eta = self.eta_s()
        return f"{format_duration(self.elapsed_s())} elapsed, eta {format_duration(eta) if eta is not None else '?'}"

    def status(self, width: int = 20) -> str:
        """'[#########-----------] 45% 1:02 elapsed, eta 1:16': the bar as text for a log line."""
        filled = round(self.fraction * width)
        return f"[{'#' * filled}{'-' * (width - filled)}] {self.fraction:4.0%} {self.timing()}"

    def describe(self, text: str) -> None:
        if self._bar is not None:
            self._bar.update(self._task, description=text)

    def update(self, done: float) -> None:
        """Set the work done so far (absolute)."""
        self.advance(done - self.done)

    def advance(self, weight: float) -> None:
        self.done = min(self.done + max(weight, 0.0), self.total) if self.total else self.done + max(weight, 0.0)
        if self._bar is not None:
            self._bar.update(self._task, completed=self.done)

    def print(self, line: str) -> None:
        """A line above the bar (or a plain line without one)."""
        if self._bar is not None:
            self._bar.console.print(line, highlight=False, markup=False)
        else:
            print(line, file=self.stream, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None


def _is_terminal(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def format_row(record: Record) -> str:
    backend = record.transport
    return (
        f"{record.world_size:>3} {backend:>10} {record.op:>14} {human_bytes(record.size_bytes):>10} "
        f"{record.count:>11} {record.dtype:>8} {record.time_s * 1e6:>11.1f} {record.p95_s * 1e6:>10.1f} "
        f"{record.algbw_Bps / RATE_SCALE:>11.2f} {record.busbw_Bps / RATE_SCALE:>11.2f} "
        f"{human_bytes(record.volume_bytes):>10} {record.nwrong:>6}"
    )


class SweepConsole:
    """Rows as they finish; on a terminal a weighted progress bar with an ETA, plain lines otherwise."""

    def __init__(self, total_rows: int, done_before: int = 0, stream: TextIO | None = None,
                 quiet: bool = False, weight_total: float = 0.0, weight_before: float = 0.0) -> None:
        self.stream = stream or sys.stdout
        self.quiet = quiet
        # Without weights (an old job file), rows count one each.
        self._weighted = weight_total > 0
        self._progress: Progress | None = None
        if not quiet and _is_terminal(self.stream):
            self._progress = Progress("sweep", weight_total if self._weighted else total_rows,
                                      weight_before if self._weighted else done_before, stream=self.stream,
                                      live=True)

    def line(self, line: str) -> None:
        if self.quiet:
            return
        if self._progress is not None:
            self._progress.print(line)
        else:
            print(line, file=self.stream, flush=True)

    def header(self, title: str) -> None:
        self.line(f"# {title}")
        self.line(HEADER)

    def row_started(self, description: str) -> None:
        if self._progress is not None:
            self._progress.describe(description)

    def row(self, record: Record) -> None:
        self.line(format_row(record))
        for warning in record.warnings:
            self.line(f"#   warning: {warning}")
        if self._progress is not None:
            self._progress.advance(row_weight(record.volume_bytes, record.iters + record.warmup)
                                   if self._weighted else 1)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.close()




def sweep_weight(spec: Any, world_size: int) -> float:
    """The weight of a whole sweep at one world size (imports the harness, so torch). A spec the harness
    would refuse weighs its sizes as asked (the sweep itself will say what is wrong)."""
    from diag.errors import DiagError
    from diag.harness import plan_rows

    try:
        return plan_weight(spec, plan_rows(spec, world_size), world_size)
    except DiagError:
        return sum(row_weight(size * max(world_size - 1, 1), spec.warmup + spec.iters)
                   for size in spec.sizes) * len(spec.ops)


def plan_weights(plan: Any, step_spec: Callable[[Any, Any, int], Any]) -> list[float]:
    """The weight of each action of a plan, in its order: every (step, N), a trial weighed by the blocks it
    runs at least (diag.plan.step_spec)."""
    return [sweep_weight(step_spec(plan, step, n), n) for step in plan.steps for n in plan.world_sizes_of(step)]


class ReadProgress:
    """Progress of reading capture files, told by where this process's file descriptors on them stand
    (/proc/self/fdinfo, Linux): the readers read sequentially, so bytes read / bytes to read is the share done
    of the reading, which is most of an analysis. A reader that starts a file over (the streaming analyzer's
    passes) counts as one more pass; ``passes`` is how many are expected. A thread samples five times a second,
    and only where ``stream`` is a terminal (nothing is drawn into a pipe or a log)."""

    def __init__(self, paths: Iterable[str | os.PathLike[str]], passes: int = 1, label: str = "read",
                 stream: TextIO | None = None, interval_s: float = 0.2, live: bool | None = None) -> None:
        self.sizes: dict[str, int] = {}
        for path in paths:
            real = os.path.realpath(path)
            if os.path.isfile(real):
                self.sizes[real] = os.path.getsize(real)
        self.passes = max(passes, 1)
        self._completed = dict.fromkeys(self.sizes, 0)   # bytes of finished passes, per file
        self._last = dict.fromkeys(self.sizes, 0)        # the position seen last, per file
        self.stream = stream or sys.stderr
        self.interval_s = interval_s
        self.live = _is_terminal(self.stream) if live is None else live
        self.progress: Progress | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def total(self) -> int:
        return sum(self.sizes.values()) * self.passes

    def _positions(self) -> dict[str, int]:
        out: dict[str, int] = {}
        try:
            fds = os.listdir("/proc/self/fd")
        except OSError:
            return out
        for fd in fds:
            try:
                target = os.readlink(f"/proc/self/fd/{fd}")
                if target not in self.sizes:
                    continue
                with open(f"/proc/self/fdinfo/{fd}") as info:
                    pos = next((int(line.split()[1]) for line in info if line.startswith("pos:")), 0)
            except (OSError, ValueError):
                continue   # closed meanwhile
            out[target] = max(out.get(target, 0), pos)
        return out

    def sample(self) -> float:
        """Bytes read so far over all files and passes (also moves the bar)."""
        now = self._positions()
        for path, size in self.sizes.items():
            pos = now.get(path)
            if pos is None:
                if self._last[path] > 0:            # read and closed: that pass is done
                    self._completed[path] += size
                    self._last[path] = 0
                continue
            if pos + size // 100 < self._last[path]:  # started over: a new pass
                self._completed[path] += size
            self._last[path] = pos
        done = sum(self._completed.values()) + sum(self._last.values())
        if done > self.total:                         # more passes than expected: the bar grows, stays honest
            self.passes = -(-int(done) // max(sum(self.sizes.values()), 1))
            if self.progress is not None:
                self.progress.total = float(self.total)
        if self.progress is not None:
            self.progress.update(done)
        return float(done)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def __enter__(self) -> ReadProgress:
        if self.live and self.sizes:
            self.progress = Progress(f"{self._label_text()}", self.total, stream=self.stream, live=True)
            self._thread = threading.Thread(target=self._run, name="diag-read-progress", daemon=True)
            self._thread.start()
        return self

    def _label_text(self) -> str:
        return "analyze" + (f" ({self.passes} passes)" if self.passes > 1 else "")

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        if self.progress is not None:
            self.progress.close()

"""What a sweep prints: an nccl-tests-like table, row by row, under a progress bar on a terminal."""

from __future__ import annotations

import sys
from typing import TextIO

from diag.records import Record
from diag.units import human_bytes

HEADER = (
    f"{'N':>3} {'backend':>10} {'op':>14} {'size':>10} {'count':>11} {'type':>8} "
    f"{'time(us)':>11} {'p95(us)':>10} {'algbw(GB/s)':>11} {'busbw(GB/s)':>11} {'D':>10} {'#wrong':>6}"
)


def format_row(record: Record) -> str:
    backend = record.transport
    return (
        f"{record.world_size:>3} {backend:>10} {record.op:>14} {human_bytes(record.size_bytes):>10} "
        f"{record.count:>11} {record.dtype:>8} {record.time_s * 1e6:>11.1f} {record.p95_s * 1e6:>10.1f} "
        f"{record.algbw_Bps / 1e9:>11.3f} {record.busbw_Bps / 1e9:>11.3f} "
        f"{human_bytes(record.volume_bytes):>10} {record.nwrong:>6}"
    )


class SweepConsole:
    """Rows as they finish; a rich progress bar when stdout is a terminal, plain lines otherwise."""

    def __init__(self, total_rows: int, done_before: int = 0, stream: TextIO | None = None,
                 quiet: bool = False) -> None:
        self.stream = stream or sys.stdout
        self.quiet = quiet
        self._progress = None
        self._task = None
        if not quiet and self.stream.isatty():
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._progress = Progress(
                TextColumn("[bold]sweep"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                TextColumn("{task.description}"), console=Console(file=self.stream), transient=True,
            )
            self._task = self._progress.add_task("", total=total_rows, completed=done_before)
            self._progress.start()

    def _print(self, line: str) -> None:
        if self.quiet:
            return
        if self._progress is not None:
            self._progress.console.print(line, highlight=False, markup=False)
        else:
            print(line, file=self.stream, flush=True)

    def line(self, text: str) -> None:
        """A free line (a trial's round summary), above the progress bar."""
        self._print(text)

    def header(self, title: str) -> None:
        self._print(f"# {title}")
        self._print(HEADER)

    def row_started(self, description: str) -> None:
        if self._progress is not None:
            self._progress.update(self._task, description=description)

    def row(self, record: Record) -> None:
        self._print(format_row(record))
        for warning in record.warnings:
            self._print(f"#   warning: {warning}")
        if self._progress is not None:
            self._progress.advance(self._task)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()

"""Plots as data: a FigureSpec holds panels of labelled lines, bars and reference lines; ``render`` draws any
spec with one panel helper (matplotlib, Agg backend), so every plot follows the same rules:

- every line and bar carries a label, and a legend shows it (two raw variants are never two unlabelled
  lines of the same colour);
- a series with one point is drawn as a marker, not as a line;
- an axis is logarithmic only when its data spans more than one value (one point on a log axis has
  meaningless ticks);
- bars with long labels are horizontal, so the labels stay readable.
"""

from __future__ import annotations

import math
import os
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from diag import safefs
from diag.report.series import series_words
from diag.units import human_bytes

DPI = 90
# Bar labels and panel titles wrap at these many characters, so long series labels stay inside the figure.
LABEL_CHARS = 34
TITLE_CHARS = 60
LEGEND_CHARS = 56   # a legend entry's line: long series names wrap instead of widening the figure


@dataclass(frozen=True)
class Line:
    label: str
    x: Sequence[float]
    y: Sequence[float]
    style: str = "o-"                 # matplotlib format; a one-point line is drawn as its marker only
    step: bool = False                # a binned time series (drawn as steps)
    width: float | None = None


@dataclass(frozen=True)
class Bars:
    """Groups (one label each) by series (one value per group; None: no bar)."""

    groups: Sequence[str]
    series: Sequence[tuple[str, Sequence[float | None]]]
    horizontal: bool = True


@dataclass(frozen=True)
class Grid:
    """A heat map: one cell per (row, column), None where nothing was measured; each cell printed with its
    value, so the colour is never the only reading."""

    rows: Sequence[str]
    columns: Sequence[str]
    values: Sequence[Sequence[float | None]]
    unit: str                         # the colour bar's label
    fmt: str = "{:.1f}"               # how a cell prints its value


@dataclass(frozen=True)
class RefLine:
    value: float
    label: str
    style: str = "--"


@dataclass(frozen=True)
class Panel:
    title: str
    xlabel: str
    ylabel: str
    lines: Sequence[Line] = ()
    bars: Bars | None = None
    grid: Grid | None = None          # a heat map instead of lines and bars
    refs: Sequence[RefLine] = ()      # horizontal reference lines (link rate, 100%)
    x: str = "linear"                 # "linear" | "bytes" (log2, byte labels) | "int" (integer ticks, N)
    y: str = "linear"                 # "linear" | "log" | "bytes"
    y_from_zero: bool = False
    y_max: float | None = None
    legend: str | None = None         # a matplotlib legend location or "below"; None: inside if few short labels,
    #                                   else beside


@dataclass(frozen=True)
class FigureSpec:
    filename: str
    title: str
    caption: str
    panels: Sequence[Panel]
    columns: int = 3
    panel_size: tuple[float, float] = (5.0, 3.6)
    sharex: bool = False


@dataclass(frozen=True)
class Plot:
    filename: str
    title: str
    caption: str
    # The legend's series in words and the knob string each stands for (series_label: the tables', the CSV's)
    keys: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Skipped:
    title: str
    reason: str


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _distinct(values: Sequence[float]) -> int:
    return len({v for v in values if isinstance(v, (int, float)) and math.isfinite(v)})


def _bytes_axis(axis: Any) -> None:
    from matplotlib.ticker import FuncFormatter, LogLocator

    # Every 4x, not every 2x: byte labels are wide and collide otherwise.
    axis.set_major_locator(LogLocator(base=4))
    axis.set_major_formatter(FuncFormatter(lambda v, _pos: human_bytes(v) if v >= 1 else ""))


def _scale(ax: Any, which: str, kind: str, values: Sequence[float]) -> None:
    axis = ax.xaxis if which == "x" else ax.yaxis
    set_scale = ax.set_xscale if which == "x" else ax.set_yscale
    spread = _distinct(values) > 1
    if kind == "bytes" and spread:
        set_scale("log", base=2)
        _bytes_axis(axis)
    elif kind == "bytes":
        from matplotlib.ticker import FixedLocator, FuncFormatter

        axis.set_major_locator(FixedLocator(sorted({v for v in values if v > 0})))
        axis.set_major_formatter(FuncFormatter(lambda v, _pos: human_bytes(v) if v >= 1 else ""))
    elif kind == "log" and spread:
        from matplotlib.ticker import FuncFormatter, NullFormatter

        set_scale("log")
        axis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
        positive = [v for v in values if isinstance(v, (int, float)) and v > 0 and math.isfinite(v)]
        # Within about a decade there may be one major tick or none: label the 2x, 3x and 5x minor ticks.
        narrow = bool(positive) and max(positive) / min(positive) < 50
        axis.set_minor_formatter(FuncFormatter(lambda v, _pos: f"{v:g}" if f"{v:g}"[0] in "235" else "")
                                 if narrow else NullFormatter())
    elif kind == "int":
        from matplotlib.ticker import MaxNLocator

        axis.set_major_locator(MaxNLocator(integer=True))


def draw_panel(ax: Any, panel: Panel) -> None:
    """The one panel helper every plot goes through."""
    if panel.grid is not None:
        _draw_grid(ax, panel, panel.grid)
        return
    xs: list[float] = []
    ys: list[float] = []
    for line in panel.lines:
        xs += list(line.x)
        ys += list(line.y)
        label = textwrap.fill(series_words(line.label), LEGEND_CHARS)
        if len(line.x) == 1:
            style = "".join(c for c in line.style if c not in "-:") or "o"
            ax.plot(line.x, line.y, style, ms=7, label=label)
        elif line.step:
            ax.step(line.x, line.y, line.style, where="post", label=label, lw=line.width or 1.2)
        else:
            ax.plot(line.x, line.y, line.style, ms=4, label=label, lw=line.width or 1.5)
    if panel.bars is not None:
        _draw_bars(ax, panel.bars)
        ys += [v for _, values in panel.bars.series for v in values if v is not None]
    for ref in panel.refs:
        if panel.bars is not None and panel.bars.horizontal:
            ax.axvline(ref.value, color="k", ls=ref.style, lw=1, label=ref.label)
        else:
            ax.axhline(ref.value, color="k", ls=ref.style, lw=1, label=ref.label)
        ys.append(ref.value)
    if panel.bars is None:
        _scale(ax, "x", panel.x, xs)
        _scale(ax, "y", panel.y, ys)
        if panel.y_from_zero:
            ax.set_ylim(bottom=0)  # from zero, so run-to-run noise does not look like a dip
    else:
        _scale(ax, "x" if panel.bars.horizontal else "y", panel.y, ys)
    if panel.y_max is not None:
        (ax.set_xlim if panel.bars is not None and panel.bars.horizontal else ax.set_ylim)(0, panel.y_max)
    horizontal = panel.bars is not None and panel.bars.horizontal
    ax.set_xlabel(panel.ylabel if horizontal else panel.xlabel, fontsize=8)
    ax.set_ylabel(panel.xlabel if horizontal else panel.ylabel, fontsize=8)
    ax.set_title(textwrap.fill(series_words(panel.title), TITLE_CHARS), fontsize=9, pad=22 if horizontal else 6)
    ax.tick_params(labelsize=7)
    ax.grid(True, which="both", alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        if horizontal:  # above the axes: bars fill the plot area, a legend inside would hide some
            ax.legend(fontsize=7, loc="lower left", bbox_to_anchor=(0.0, 1.0), ncol=3, frameon=False)
        elif panel.legend == "below":  # one entry a row under the axes: a narrow figure stays legible on a phone
            ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(0.0, -0.15), ncol=1, frameon=False)
        elif panel.legend is not None:
            ax.legend(fontsize=8, loc=panel.legend)
        elif len(panel.lines) > 4 or any(len(series_words(line.label)) > 40 for line in panel.lines):
            ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside: many or long labels
        else:
            ax.legend(fontsize=7)


def _draw_grid(ax: Any, panel: Panel, grid: Grid) -> None:
    """Cells coloured by value (a colour-blind-safe sequential map, low = dark), each labelled with its value;
    empty cells (nothing measured, the diagonal of a matrix) stay blank."""
    import numpy as np

    data = np.array([[np.nan if v is None else float(v) for v in row] for row in grid.values], dtype=float)
    finite = data[np.isfinite(data)]
    import matplotlib

    cmap = matplotlib.colormaps["viridis"].with_extremes(bad="#eeeeee")   # not measured: light grey
    image = ax.imshow(np.ma.masked_invalid(data), cmap=cmap, vmin=0.0,
                      vmax=float(finite.max()) if finite.size else 1.0, aspect="auto")
    ax.figure.colorbar(image, ax=ax, label=grid.unit, shrink=0.85)
    middle = (float(finite.max()) / 2) if finite.size else 0.0
    for i, row in enumerate(data):
        for j, value in enumerate(row):
            if np.isfinite(value):
                ax.text(j, i, grid.fmt.format(value), ha="center", va="center", fontsize=8,
                        color="white" if value < middle else "black")
    ax.set_xticks(range(len(grid.columns)))
    ax.set_xticklabels(grid.columns, fontsize=8)
    ax.set_yticks(range(len(grid.rows)))
    ax.set_yticklabels(grid.rows, fontsize=8)
    ax.set_xlabel(panel.xlabel, fontsize=8)
    ax.set_ylabel(panel.ylabel, fontsize=8)
    ax.set_title(textwrap.fill(panel.title, TITLE_CHARS), fontsize=9)


def _draw_bars(ax: Any, bars: Bars) -> None:
    count = max(1, len(bars.series))
    width = 0.8 / count
    positions = range(len(bars.groups))
    for index, (name, values) in enumerate(bars.series):
        offset = (index - (count - 1) / 2) * width
        heights = [v if v is not None else float("nan") for v in values]
        at = [p + offset for p in positions]
        if bars.horizontal:
            ax.barh(at, heights, width, label=name)
        else:
            ax.bar(at, heights, width, label=name)
    if bars.horizontal:
        ax.set_yticks(list(positions))
        ax.set_yticklabels([textwrap.fill(series_words(g), LABEL_CHARS) for g in bars.groups], fontsize=7)
        ax.invert_yaxis()  # first group on top, as it is read
    else:
        ax.set_xticks(list(positions))
        ax.set_xticklabels(bars.groups, fontsize=7)


def _series_of(text: str) -> str:
    """The series label a title or legend entry opens with ('raw:ring [conn=shared] all_gather' -> 'raw:ring
    [conn=shared]'), for the table of what the words stand for."""
    head, _, rest = text.partition(" ")
    if rest.startswith("["):
        return f"{head} [{rest[1:].partition(']')[0]}]"
    return head if series_words(head) != head else text


def render(spec: FigureSpec, out: Path) -> Plot:
    plt = _pyplot()
    count = len(spec.panels)
    cols = max(1, min(count, spec.columns))
    rows = math.ceil(count / cols)
    width, height = spec.panel_size
    # Horizontal bars: room for each group's wrapped label (lines of text) and its bars.
    tall_bars = max((len(p.bars.groups) * max(0.45, 0.14 * max(len(textwrap.wrap(g, LABEL_CHARS)) for g in p.bars.groups)
                                               + 0.15)
                     for p in spec.panels if p.bars is not None and p.bars.horizontal and p.bars.groups), default=0.0)
    height = max(height, tall_bars + 1.6)
    # A legend below the axes: the figure grows by its lines, so the axes keep their height.
    height += max((0.17 * (sum(len(textwrap.wrap(series_words(line.label), LEGEND_CHARS)) for line in p.lines)
                           + len(p.refs)) + 0.3 for p in spec.panels if p.legend == "below"), default=0.0)
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False, sharex=spec.sharex)
    flat = [ax for row in axes for ax in row]
    for ax in flat[count:]:
        ax.set_visible(False)
    for ax, panel in zip(flat, spec.panels, strict=False):
        draw_panel(ax, panel)
    fig.tight_layout()
    # Into a new file (O_EXCL, O_NOFOLLOW): never through a symlink at that name.
    with os.fdopen(safefs.create(out / spec.filename, replace=True), "wb") as handle:
        fig.savefig(handle, format=Path(spec.filename).suffix.lstrip(".") or "png", dpi=DPI,
                    bbox_inches="tight")  # long labels and outside legends fit
    plt.close(fig)
    labels = dict.fromkeys([*(_series_of(panel.title) for panel in spec.panels),
                            *(_series_of(line.label) for panel in spec.panels for line in panel.lines)])
    keys = tuple((series_words(label), label) for label in labels if series_words(label) != label)
    return Plot(spec.filename, spec.title, spec.caption, keys)

"""``diag compare A B --html``: the two runs overlaid, as flent draws several runs on one plot.

One panel per (op, N): busbw against per-rank size, A solid and B dashed, each series with a band from the
10th to the 90th percentile of its per-iteration busbw (the spread the significance test sees), then the
row-by-row table of the comparison (decided on launches and trial rounds, docs/report.md). One self-contained HTML file (the PNG inlined), from files only.
"""

from __future__ import annotations

import base64
import html
import io
import textwrap
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from diag import safefs
from diag.records import Record
from diag.report.compare import Comparison
from diag.report.series import busbw_samples, mean_busbw, series_label, series_words
from diag.units import human_bytes, human_rate

SPREAD = (0.10, 0.90)        # the band: these quantiles of a row's per-iteration busbw


def _quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return 0.0
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def _series(records: Sequence[Record]) -> dict[tuple[str, int], dict[str, list[Record]]]:
    """(op, N) -> series label -> rows sorted by size (a repeated row: the later one)."""
    out: dict[tuple[str, int], dict[str, dict[int, Record]]] = defaultdict(lambda: defaultdict(dict))
    for r in records:
        out[(r.op, r.world_size)][series_label(r)][r.size_bytes] = r
    return {key: {label: [rows[s] for s in sorted(rows)] for label, rows in per.items()} for key, per in out.items()}


def overlay_png(a: Sequence[Record], b: Sequence[Record], a_name: str, b_name: str) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sa, sb = _series(a), _series(b)
    keys = sorted(set(sa) | set(sb), key=lambda k: (k[0], k[1]))
    columns = min(3, max(len(keys), 1))
    rows = max(1, -(-len(keys) // columns))
    fig, axes = plt.subplots(rows, columns, figsize=(5.2 * columns, 3.8 * rows), squeeze=False, dpi=90)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    # one colour per series across every panel, and one legend for the figure (below the panels)
    everyone = sorted({label for series in (sa, sb) for per in series.values() for label in per})
    legend: dict[str, Any] = {}
    for index, key in enumerate(keys):
        ax = axes[index // columns][index % columns]
        labels = sorted(set(sa.get(key, {})) | set(sb.get(key, {})))
        for label in labels:
            colour = colours[everyone.index(label) % len(colours)]
            for side, series, style in (("A", sa, "-"), ("B", sb, "--")):
                rows_of = series.get(key, {}).get(label)
                if not rows_of:
                    continue
                x = [r.size_bytes for r in rows_of]
                y = [mean_busbw(r) / 1e6 for r in rows_of]
                samples = [busbw_samples(r) or [mean_busbw(r)] for r in rows_of]
                low = [_quantile(s, SPREAD[0]) / 1e6 for s in samples]
                high = [_quantile(s, SPREAD[1]) / 1e6 for s in samples]
                name = f"{side}: {series_words(label)}"
                (handle,) = ax.plot(x, y, style, marker="o" if side == "A" else "s", markersize=3, color=colour)
                legend.setdefault(name, handle)
                ax.fill_between(x, low, high, color=colour, alpha=0.18 if side == "A" else 0.10, linewidth=0)
        op, n = key
        ax.set_title(f"{op}, N={n}", fontsize=10)
        if len({r.size_bytes for per in (sa.get(key, {}), sb.get(key, {})) for rs in per.values() for r in rs}) > 1:
            ax.set_xscale("log", base=2)
        ticks = sorted({r.size_bytes for per in (sa.get(key, {}), sb.get(key, {})) for rs in per.values() for r in rs})
        if len(ticks) <= 8:
            ax.set_xticks(ticks, [human_bytes(t) for t in ticks], fontsize=7, rotation=30)
        ax.set_xlabel("per-rank size", fontsize=8)
        ax.set_ylabel("busbw (MB/s)", fontsize=8)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    for index in range(len(keys), rows * columns):
        axes[index // columns][index % columns].set_visible(False)
    # the files' names only (their paths are on the page), wrapped to the figure's width: never clipped
    fig.suptitle(textwrap.fill(f"busbw of the mean time vs size, A = {Path(a_name).name} (solid), B = "
                               f"{Path(b_name).name} (dashed); bands: p{SPREAD[0] * 100:.0f}..p{SPREAD[1] * 100:.0f}"
                               " of the iterations", 28 * columns), fontsize=10)
    fig.tight_layout()
    # under every panel, one entry a row: long series names never spill into a neighbouring panel
    fig.legend(list(legend.values()), list(legend), loc="upper left", bbox_to_anchor=(0.02, 0.0), fontsize=8,
               frameon=False)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", bbox_inches="tight")
    plt.close(fig)
    return buffer.getvalue()


_CSS = ("body{font-family:sans-serif;max-width:1150px;margin:1.5em auto;padding:0 .8em;color:#222}"
        "img{max-width:100%}table{border-collapse:collapse;font-size:12px}td,th{border:1px solid #ccc;"
        "padding:2px 6px}th{background:#eee}.slower{background:#fde8e8}.faster{background:#e8f6e8}"
        ".muted{color:#666;font-size:12px}.scroll{overflow-x:auto}"
        "@media (max-width:520px){.wide{overflow-x:auto}.wide img{max-width:none;width:760px}}")


def write_compare_html(path: Path, a: Sequence[Record], b: Sequence[Record], result: Comparison,
                       a_name: str, b_name: str, summary: str) -> Path:
    png = base64.b64encode(overlay_png(a, b, a_name, b_name)).decode("ascii")
    head = ["op", "N", "size", "A series", "B series", "from", "blocks A/B", "A busbw (mean time)",
            "B busbw (mean time)", "time B/A [interval]", "Welch p (shown only)", "verdict"]
    body = "".join(
        f"<tr class='{r.verdict}'>" + "".join(f"<td>{html.escape(c)}</td>" for c in (
            r.op, str(r.world_size), human_bytes(r.size_bytes), r.a_transport, r.b_transport, r.origin,
            f"{r.a_blocks}/{r.b_blocks}", human_rate(r.a_busbw_Bps), human_rate(r.b_busbw_Bps),
            f"{r.time_ratio:.2f}x" + (f" [{r.ratio_low:.2f}, {r.ratio_high:.2f}]" if r.verdict != "untested" else ""),
            f"{r.p_value:.2g}" if r.p_value is not None else "-", r.verdict)) + "</tr>"
        for r in result.rows)
    page = (f"<!doctype html><html><head><meta charset='utf-8'><meta name='viewport' "
            f"content='width=device-width, initial-scale=1'><title>diag compare</title><style>{_CSS}</style>"
            f"</head><body><h1>diag compare</h1><p><b>A</b> {html.escape(a_name)}<br><b>B</b> "
            f"{html.escape(b_name)}</p><p>{html.escape(summary)}</p>"
            f"<div class='wide'><img alt='busbw vs size, both runs' src='data:image/png;base64,{png}'></div>"
            f"<h2>Rows</h2><div class='scroll'><table><thead><tr>{''.join(f'<th>{h}</th>' for h in head)}</tr></thead>"
            f"<tbody>{body}</tbody></table></div><p class='muted'>time B/A &gt; 1: B is slower (mean time per iteration). "
            f"A difference counts when the bootstrap interval of the ratio over blocks (launches, or trial "
            f"rounds) excludes 1 and the ratio changed by at least the threshold; a row with fewer than 3 blocks "
            f"a side is untested. Welch's p on the iterations is shown, never decides (diag compare --help)."
            f"</p></body></html>")
    safefs.write_file(safefs.make_parent(path), page)
    return path

"""The report's plots (matplotlib, Agg backend): each one has units on its axes and a caption that says what
to look for. A plot whose inputs are missing is skipped with the reason, never drawn empty.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from diag.report.rundir import CaptureSet, RunData
from diag.report.series import PAIRWISE_OPS, by_series, series_label
from diag.units import human_bytes

# At most this many panels/lines per plot, so a big sweep stays readable.
MAX_PANELS = 6
MAX_LINES = 8
DPI = 90


@dataclass(frozen=True)
class Plot:
    filename: str
    title: str
    caption: str


@dataclass(frozen=True)
class Skipped:
    title: str
    reason: str


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _grid(plt: Any, count: int, width: float = 5.0, height: float = 3.6) -> tuple[Any, list[Any]]:
    cols = min(count, 3)
    rows = math.ceil(count / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False)
    flat = [ax for row in axes for ax in row]
    for ax in flat[count:]:
        ax.set_visible(False)
    return fig, flat[:count]


def _save(plt: Any, fig: Any, out: Path, filename: str) -> None:
    fig.tight_layout()
    fig.savefig(out / filename, dpi=DPI)
    plt.close(fig)


def _bytes_axis(ax: Any, axis: str = "x") -> None:
    from matplotlib.ticker import FuncFormatter, LogLocator

    target = ax.xaxis if axis == "x" else ax.yaxis
    # Every 4x, not every 2x: byte labels are wide and collide otherwise.
    target.set_major_locator(LogLocator(base=4))
    target.set_major_formatter(FuncFormatter(lambda v, _pos: human_bytes(v) if v >= 1 else ""))


def _main_op(run: RunData) -> str | None:
    ops = [r.op for r in run.records if r.op not in PAIRWISE_OPS]
    if not ops:
        return None
    return "all_gather" if "all_gather" in ops else max(set(ops), key=ops.count)


def plot_time_vs_volume(run: RunData, out: Path) -> Plot | Skipped:
    title = "Time vs per-device volume D"
    op = _main_op(run)
    if op is None:
        return Skipped(title, "no collective rows (only pairwise ops)")
    series = {label: per_n for (label, o), per_n in by_series(run.records).items() if o == op}
    plt = _pyplot()
    fig, axes = _grid(plt, min(len(series), MAX_PANELS))
    link = run.link_Bps
    for ax, (label, per_n) in zip(axes, sorted(series.items()), strict=False):
        volumes: list[int] = []
        for n in sorted(per_n)[:MAX_LINES]:
            rows = sorted(per_n[n].values(), key=lambda r: r.volume_bytes)
            volumes += [r.volume_bytes for r in rows if r.volume_bytes > 0]
            ax.plot([r.volume_bytes for r in rows], [r.time_s * 1e3 for r in rows], "o-", ms=3, label=f"N={n}")
        if link and volumes:
            lo, hi = min(volumes), max(volumes)
            ax.plot([lo, hi], [lo / link * 1e3, hi / link * 1e3], "k--", lw=1,
                    label=f"ideal D / link ({link * 8 / 1e9:.3g} Gbit/s)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        _bytes_axis(ax)
        ax.set_xlabel("per-device volume D = (N-1) x size [bytes]")
        ax.set_ylabel("time per operation [ms]")
        ax.set_title(f"{label} {op}", fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    _save(plt, fig, out, "time_vs_volume.png")
    ideal = (f"The dashed line is the ideal time D / link rate ({run.link_source})." if link
             else "No link rate in run.json, so no ideal line.")
    return Plot("time_vs_volume.png", title,
                f"{op} time against the bytes each rank receives, one line per world size N. For the same D all "
                f"lines should fall on one curve near the ideal; a line above the others (N=2 in the reported "
                f"anomaly) moves the same volume more slowly. {ideal}")


def plot_busbw(run: RunData, out: Path) -> Plot | Skipped:
    title = "Bus bandwidth vs size"
    series = by_series(run.records)
    if not series:
        return Skipped(title, "no records")
    plt = _pyplot()
    keys = sorted(series)[:MAX_PANELS]
    fig, axes = _grid(plt, len(keys))
    link = run.link_Bps
    for ax, key in zip(axes, keys, strict=False):
        for n in sorted(series[key])[:MAX_LINES]:
            rows = sorted(series[key][n].values(), key=lambda r: r.size_bytes)
            ax.plot([r.size_bytes for r in rows], [r.busbw_Bps / 1e6 for r in rows], "o-", ms=3, label=f"N={n}")
        if link:
            ax.axhline(link / 1e6, color="k", ls="--", lw=1, label="link rate")
        ax.set_xscale("log", base=2)
        _bytes_axis(ax)
        ax.set_xlabel("per-rank size [bytes]")
        ax.set_ylabel("busbw [MB/s]")
        ax.set_ylim(bottom=0)  # from zero, so run-to-run noise does not look like a dip
        ax.set_title(f"{key[0]} {key[1]}", fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    _save(plt, fig, out, "busbw_vs_size.png")
    return Plot("busbw_vs_size.png", title,
                "busbw (nccl-tests convention, MB/s = 1e6 B/s) per transport, one line per N. busbw is normalised "
                "so that all N should reach the same plateau at large sizes; a line that plateaus lower (N=2) is "
                "the anomaly, and the size where it leaves the others is where it starts. Compare the torch "
                "panels with the raw-TCP reference panels.")


def plot_efficiency(run: RunData, out: Path) -> Plot | Skipped:
    title = "Efficiency: backend busbw / raw busbw"
    best_raw: dict[tuple[str, int, int], float] = {}
    for r in run.records:
        if r.backend == "raw":
            k = (r.op, r.world_size, r.size_bytes)
            best_raw[k] = max(best_raw.get(k, 0.0), r.busbw_Bps)
    if not best_raw:
        return Skipped(title, "no raw rows: cannot compare the backend with the raw-TCP reference")
    lines: dict[tuple[str, str], dict[int, list[tuple[int, float]]]] = defaultdict(lambda: defaultdict(list))
    for r in run.records:
        ref = best_raw.get((r.op, r.world_size, r.size_bytes))
        if r.backend != "raw" and ref:
            lines[(series_label(r), r.op)][r.world_size].append((r.size_bytes, r.busbw_Bps / ref))
    if not lines:
        return Skipped(title, "backend and raw rows share no op, N and size")
    plt = _pyplot()
    keys = sorted(lines)[:MAX_PANELS]
    fig, axes = _grid(plt, len(keys))
    for ax, key in zip(axes, keys, strict=False):
        for n in sorted(lines[key])[:MAX_LINES]:
            points = sorted(lines[key][n])
            ax.plot([p[0] for p in points], [p[1] for p in points], "o-", ms=3, label=f"N={n}")
        ax.axhline(1.0, color="k", ls="--", lw=1)
        ax.set_xscale("log", base=2)
        _bytes_axis(ax)
        ax.set_xlabel("per-rank size [bytes]")
        ax.set_ylabel("busbw / best raw busbw [ratio]")
        ax.set_ylim(bottom=0)
        ax.set_title(f"{key[0]} {key[1]}", fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    _save(plt, fig, out, "efficiency.png")
    return Plot("efficiency.png", title,
                "The backend's busbw divided by the best raw-TCP busbw for the same op, N and size (1.0 = as "
                "fast as plain sockets on the same link). A line well below the others at one N says the "
                "backend, not the link, loses bandwidth there.")


def _busiest(capture: CaptureSet) -> dict[str, Any] | None:
    def moved(conn: dict[str, Any]) -> int:
        return sum((d or {}).get("payload_bytes", 0) or 0 for d in (conn.get("directions") or {}).values())

    conns = [c for c in capture.connections if moved(c) > 0]
    return max(conns, key=moved) if conns else None


def _pick_captures(run: RunData) -> list[CaptureSet]:
    """One capture at N=2 and one at N=4 (else the nearest N>2), same transport, preferring torch."""
    analysed = [c for c in run.captures.values() if c.analysis and c.world_size]
    if not analysed:
        return []
    by_transport: dict[str | None, dict[int, CaptureSet]] = defaultdict(dict)
    for c in sorted(analysed, key=lambda c: c.tag):
        by_transport[c.transport].setdefault(c.world_size or 0, c)
    ranked = sorted(by_transport, key=lambda t: (not (t or "").startswith("torch"), 2 not in by_transport[t], str(t)))
    per_n = by_transport[ranked[0]]
    picks = [per_n[2]] if 2 in per_n else []
    others = sorted((n for n in per_n if n != 2), key=lambda n: abs(n - 4))
    if others:
        picks.append(per_n[others[0]])
    return picks


def plot_conn_throughput(run: RunData, out: Path) -> Plot | Skipped:
    title = "Per-connection throughput over time"
    picks = [(c, _busiest(c)) for c in _pick_captures(run)]
    picks = [(c, conn) for c, conn in picks if conn]
    if not picks:
        return Skipped(title, "no analysed capture with connections (analysis/*.json)")
    plt = _pyplot()
    fig, axes = plt.subplots(len(picks), 1, figsize=(10, 3.2 * len(picks)), squeeze=False)
    drawn = False
    for ax, (capture, conn) in zip((row[0] for row in axes), picks, strict=False):
        t_first = None
        for direction, style in (("a->b", "-"), ("b->a", "--")):
            d = (conn.get("directions") or {}).get(direction) or {}
            tp = d.get("throughput") or {}
            values = tp.get("Bps") or []
            if not values:
                continue
            t0 = tp.get("t0", 0.0)
            t_first = t0 if t_first is None else min(t_first, t0)
            bin_s = tp.get("bin_s", 1.0)
            xs = [t0 + i * bin_s for i in range(len(values))]
            a, b = conn.get("a"), conn.get("b")
            name = f"{a} -> {b}" if direction == "a->b" else f"{b} -> {a}"
            ax.step([x - (t_first or 0) for x in xs], [v * 8 / 1e6 for v in values], style, where="post", label=name)
            drawn = True
        ax.set_xlabel("time since capture start [s]")
        ax.set_ylabel("throughput [Mbit/s]")
        overlap = conn.get("duplex_overlap")
        ax.set_title(f"{capture.label}: busiest connection"
                     + (f", duplex overlap {overlap:.0%}" if isinstance(overlap, (int, float)) else ""), fontsize=9)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    if not drawn:
        plt.close(fig)
        return Skipped(title, "the analyses carry no per-direction throughput series")
    _save(plt, fig, out, "conn_throughput.png")
    return Plot("conn_throughput.png", title,
                "The busiest connection of the N=2 capture above the N=4 one (solid: a->b, dashed: b->a). On a "
                "full-duplex link both directions of a connection should run at once; curves that alternate "
                "(one high while the other is zero) mean the directions take turns, which halves what the link "
                "can carry.")


def plot_duplex(run: RunData, out: Path) -> Plot | Skipped:
    title = "Duplex overlap per N and transport"
    bars: list[tuple[str, float, float | None]] = []
    for c in sorted(run.captures.values(), key=lambda c: (str(c.transport), c.world_size or 0, c.tag)):
        if not c.analysis:
            continue
        weights = []
        for conn in c.connections:
            overlap = conn.get("duplex_overlap")
            moved = [(d or {}).get("payload_bytes", 0) or 0 for d in (conn.get("directions") or {}).values()]
            if isinstance(overlap, (int, float)) and len(moved) == 2 and min(moved) > 0:
                weights.append((overlap, sum(moved)))
        hosts = [h.get("duplex_overlap") for h in c.hosts if isinstance(h.get("duplex_overlap"), (int, float))]
        conn_mean = sum(o * w for o, w in weights) / sum(w for _, w in weights) if weights else float("nan")
        bars.append((f"{c.transport or '?'}\nN={c.world_size or '?'}", conn_mean,
                     statistics.mean(hosts) if hosts else None))
    if not bars:
        return Skipped(title, "no capture analysis (analysis/*.json)")
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(5, 1.3 * len(bars)), 3.8))
    _paired_bars(ax, bars, "connections (byte-weighted)", "hosts")
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("duplex overlap [fraction of active time]")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=7)
    _save(plt, fig, out, "duplex_overlap.png")
    return Plot("duplex_overlap.png", title,
                "Fraction of active time in which both directions move data at once, for connections that carry "
                "both directions and for each host's NIC that the capture sees (1.0 = full duplex used; hosts "
                "seen only through their traffic with the captured host are left out). A low bar at one N, high at "
                "the others, says the traffic pattern at that N wastes half the link. Missing bars: no "
                "connection carried both directions (a ring at N>=3 sends one way per connection).")


def _paired_bars(ax: Any, bars: list[tuple[str, Any, Any]], left: str, right: str) -> None:
    """Two bars per labelled group, (label, left value, right value); None draws no bar."""
    xs = range(len(bars))
    ax.bar([x - 0.2 for x in xs], [b[1] if b[1] is not None else float("nan") for b in bars], 0.4, label=left)
    ax.bar([x + 0.2 for x in xs], [b[2] if b[2] is not None else float("nan") for b in bars], 0.4, label=right)
    ax.set_xticks(list(xs))
    ax.set_xticklabels([b[0] for b in bars], fontsize=7)


def _tcp_series(run: RunData) -> dict[str, list[dict[str, Any]]]:
    series: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for c in run.captures.values():
        for s in c.observe:
            if s.get("kind") == "tcp_info":
                series[f"{c.tag} {s.get('local')}->{s.get('remote')}"].append(s)
    for s in run.tcpinfo:
        series[f"raw rank {s.get('rank')}->{s.get('peer')} {s.get('conn') or ''}".strip()].append(s)
    return {k: sorted(v, key=lambda s: s.get("t_ns", 0)) for k, v in series.items()
            if any(isinstance(s.get("cwnd"), (int, float)) for s in v)}


def plot_window(run: RunData, out: Path) -> Plot | Skipped:
    title = "Congestion window and queued bytes"
    series = _tcp_series(run)
    if not series:
        return Skipped(title, "no TCP_INFO samples (observe/*.jsonl tcp_info, tcpinfo/*.jsonl)")
    busiest = sorted(series, key=lambda k: -max((s.get("cwnd") or 0) for s in series[k]))[:MAX_LINES]
    plt = _pyplot()
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
    t_min = min(s.get("t_ns", 0) for k in busiest for s in series[k])
    any_queue = False
    for key in busiest:
        samples = series[key]
        ts = [(s.get("t_ns", 0) - t_min) / 1e9 for s in samples]
        ax1.plot(ts, [s.get("cwnd") for s in samples], ".-", ms=3, label=key[:50])
        queue = [s.get("send_q") for s in samples]
        if any(isinstance(q, (int, float)) for q in queue):
            any_queue = True
            ax2.plot(ts, [q if isinstance(q, (int, float)) else float("nan") for q in queue], ".-", ms=3)
    ax1.set_ylabel("cwnd [segments]")
    ax1.grid(True, alpha=0.3)
    ax1.legend(fontsize=6)
    ax2.set_ylabel("send queue [bytes]" if any_queue else "send queue [bytes] (not sampled)")
    ax2.set_xlabel("time since first sample [s]")
    ax2.grid(True, alpha=0.3)
    _save(plt, fig, out, "window.png")
    return Plot("window.png", title,
                "TCP_INFO per connection: congestion window (segments) and bytes waiting in the send queue. A "
                "cwnd that collapses to a few segments after each pause is slow start after idle; a full send "
                "queue with a small cwnd means the network side limits, an empty one means the application does "
                "not keep the socket fed.")


def plot_in_flight(run: RunData, out: Path) -> Plot | Skipped:
    title = "Bytes in flight per direction (from the wire)"
    bars: list[tuple[str, float, float]] = []
    for c in sorted(run.captures.values(), key=lambda c: (str(c.transport), c.world_size or 0, c.tag)):
        conn = _busiest(c) if c.analysis else None
        for label, key in (("a->b", "a->b"), ("b->a", "b->a")):
            d = ((conn or {}).get("directions") or {}).get(key) or {}
            flight = d.get("bytes_in_flight") or {}
            if isinstance(flight.get("median"), (int, float)) and (d.get("payload_bytes") or 0) > 0:
                bars.append((f"{c.transport or '?'} N={c.world_size or '?'}\n{label}", flight["median"],
                             flight.get("p95") or flight["median"]))
    if not bars:
        return Skipped(title, "the analyses carry no bytes_in_flight (analysis/*.json)")
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(5, 1.1 * len(bars)), 3.8))
    _paired_bars(ax, bars, "median", "p95")
    ax.set_yscale("log", base=2)
    _bytes_axis(ax, "y")
    ax.set_ylabel("unacknowledged bytes in flight [bytes]")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=7)
    _save(plt, fig, out, "in_flight.png")
    return Plot("in_flight.png", title,
                "Bytes sent but not yet acknowledged, per direction of each capture's busiest connection. To "
                "fill a link the sender needs about rate x RTT in flight; a direction far below that at N=2 "
                "but not at N>=3 waits on its window, its ACKs or the application.")


def plot_cpu(run: RunData, out: Path) -> Plot | Skipped:
    title = "Per-thread CPU"
    per_capture: dict[str, dict[tuple[Any, Any], list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    host: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for c in run.captures.values():
        for s in c.observe:
            if s.get("kind") == "cpu_thread" and isinstance(s.get("cpu_pct"), (int, float)):
                per_capture[c.tag][(s.get("pid"), s.get("tid"))].append(s)
            elif s.get("kind") == "cpu_host" and isinstance(s.get("busy_pct"), (int, float)):
                host[c.tag].append(s)
    if not per_capture:
        return Skipped(title, "no per-thread CPU samples (observe/*.jsonl cpu_thread)")
    plt = _pyplot()
    tags = sorted(per_capture)[:MAX_PANELS]
    fig, axes = _grid(plt, len(tags), width=5.5)
    for ax, tag in zip(axes, tags, strict=False):
        threads = sorted(per_capture[tag].values(), key=lambda v: -statistics.mean(s["cpu_pct"] for s in v))
        t_min = min(s.get("t_ns", 0) for v in threads for s in v)
        for samples in threads[:5]:
            samples = sorted(samples, key=lambda s: s.get("t_ns", 0))
            ax.plot([(s.get("t_ns", 0) - t_min) / 1e9 for s in samples], [s["cpu_pct"] for s in samples], ".-",
                    ms=3, label=f"{samples[0].get('name', '?')} ({samples[0].get('tid')})")
        machine = sorted(host.get(tag, []), key=lambda s: s.get("t_ns", 0))
        if machine:
            ax.plot([(s.get("t_ns", 0) - t_min) / 1e9 for s in machine], [s["busy_pct"] for s in machine], "k-",
                    lw=2, alpha=0.5, label=f"whole machine ({machine[0].get('cpus')} CPUs, % busy)")
        ax.axhline(100, color="k", ls="--", lw=1)
        ax.set_ylim(0, 110)
        ax.set_xlabel("time [s]")
        ax.set_ylabel("CPU [% of one core; machine: % of all]")
        ax.set_title(run.captures[tag].label, fontsize=9)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=6)
    _save(plt, fig, out, "cpu_threads.png")
    return Plot("cpu_threads.png", title,
                "The busiest threads of each captured run, in % of one core, and the whole machine (grey, % of "
                "all its CPUs busy). A thread that stays near the dashed 100% line is CPU-bound; a machine near "
                "100% has no core left even when no single thread is pinned (many ranks on few cores). Either "
                "way the network is not what limits that run, and a bandwidth dip there says more about the "
                "CPU than about TCP.")


PLOTS: tuple[Callable[[RunData, Path], Plot | Skipped], ...] = (
    plot_time_vs_volume, plot_busbw, plot_efficiency, plot_conn_throughput, plot_duplex, plot_window, plot_in_flight,
    plot_cpu,
)


def render_plots(run: RunData, out: Path) -> list[Plot | Skipped]:
    out.mkdir(parents=True, exist_ok=True)
    return [make(run, out) for make in PLOTS]

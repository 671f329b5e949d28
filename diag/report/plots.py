"""The report's plots, as data: each builder reads the run through the evidence queries and returns a
FigureSpec (panels of labelled lines and bars, units on every axis, a caption that says what to look for)
or the reason it drew nothing; diag.report.figures draws every spec with one panel helper.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

from diag import safefs
from diag.records import Record
from diag.report.figures import Bars, FigureSpec, Grid, Line, Panel, Plot, RefLine, Skipped, render
from diag.report.queries import (
    busiest_connection,
    capture_name,
    host_cpu,
    raw_reference,
    tcp_info_series,
    thread_cpu,
)
from diag.report.rundir import CaptureSet, RunData
from diag.report.series import PAIRWISE_OPS, by_series, mean_busbw, mean_time, series_label
from diag.units import RATE_SCALE, RATE_UNIT, human_bytes, human_rate

# At most this many panels/lines per plot, so a big sweep stays readable.
MAX_PANELS = 6
MAX_LINES = 8
# Rows whose per-device volume is within this fraction of the headline's D count as "at D" (D / (N-1) is
# rounded to whole elements, so D itself differs by a few bytes between N).
SAME_VOLUME = 0.01

Builder = Callable[[RunData], FigureSpec | Skipped]


def main_op(run: RunData) -> str | None:
    """all_gather when present, else the commonest collective (not a pairwise op)."""
    ops = [r.op for r in run.records if r.op not in PAIRWISE_OPS]
    if not ops:
        return None
    return "all_gather" if "all_gather" in ops else max(set(ops), key=ops.count)


def _link_ref(run: RunData) -> list[RefLine]:
    link = run.link_Bps
    if not link:
        return []
    return [RefLine(link / 1e6, f"link rate {link / 1e6:.1f} MB/s ({run.link_source.split(' (')[0]})")]


def _style(label: str) -> str:
    return "o-" if label.startswith("torch:") else "s--"


def headline(run: RunData) -> FigureSpec | Skipped:
    title = "Headline: backend vs raw TCP busbw against N at equal per-device volume D"
    op = main_op(run)
    if op is None:
        return Skipped(title, "no collective rows (only pairwise ops)")
    series = {label: per_n for (label, o), per_n in by_series(run.records).items() if o == op}
    torch_n2 = [r.volume_bytes for label, per_n in series.items() if label.startswith("torch:")
                for r in per_n.get(2, {}).values()]
    volumes = torch_n2 or [r.volume_bytes for per_n in series.values() for rows in per_n.values()
                           for r in rows.values()]
    target = max(volumes)
    lines = []
    for label, per_n in sorted(series.items(), key=lambda kv: (not kv[0].startswith("torch:"), kv[0])):
        points: list[tuple[int, float]] = []
        for n in sorted(per_n):
            near = min(per_n[n].values(), key=lambda r: abs(r.volume_bytes - target))
            if abs(near.volume_bytes - target) <= SAME_VOLUME * target:
                points.append((n, mean_busbw(near) / 1e6))
        if points:
            lines.append(Line(label, [p[0] for p in points], [p[1] for p in points], _style(label),
                              width=2.5 if label.startswith("torch:") else 1.5))
    if not lines:
        return Skipped(title, f"no rows at D={human_bytes(target)}")
    panel = Panel(f"{op} busbw at D = {human_bytes(target)} per device", "world size N", "busbw of the mean time [MB/s]",
                  lines, refs=_link_ref(run), x="int", y_from_zero=True, legend="below")
    return FigureSpec("headline.png", title,
                      f"{op} bus bandwidth of the mean time per iteration (nccl-tests convention, MB/s = 1e6 B/s) against the number of ranks N, "
                      f"each rank receiving the same volume D = {human_bytes(target)} at every N. On a full-duplex "
                      "link every transport should sit near the dashed link rate at every N; a backend line that "
                      "drops at N=2 while the raw-TCP lines stay up is the anomaly, and the gap is what the "
                      "backend loses. Raw experiments run at one N only are single markers.",
                      [panel], columns=1, panel_size=(4.6, 3.5))  # narrow: its text stays legible on a phone


def time_vs_volume(run: RunData) -> FigureSpec | Skipped:
    title = "Time vs per-device volume D"
    op = main_op(run)
    if op is None:
        return Skipped(title, "no collective rows (only pairwise ops)")
    series = {label: per_n for (label, o), per_n in by_series(run.records).items() if o == op
              and sum(len(rows) for rows in per_n.values()) > 1}
    if not series:
        return Skipped(title, f"no {op} series with more than one row")
    link = run.link_Bps
    panels = []
    for label, per_n in sorted(series.items())[:MAX_PANELS]:
        lines: list[Line] = []
        volumes: list[int] = []
        for n in sorted(per_n)[:MAX_LINES]:
            rows = sorted(per_n[n].values(), key=lambda r: r.volume_bytes)
            volumes += [r.volume_bytes for r in rows if r.volume_bytes > 0]
            lines.append(Line(f"N={n}", [r.volume_bytes for r in rows], [mean_time(r) * 1e3 for r in rows]))
        if link and len(set(volumes)) > 1:
            lo, hi = min(volumes), max(volumes)
            lines.append(Line(f"ideal D / link ({human_rate(link)})", [lo, hi],
                              [lo / link * 1e3, hi / link * 1e3], "k--"))
        panels.append(Panel(f"{label} {op}", "per-device volume D = (N-1) x size [bytes]", "mean time per operation [ms]",
                            lines, x="bytes", y="log"))
    ideal = (f"The dashed line is the ideal time D / link rate ({run.link_source})." if link
             else "No link rate in run.json, so no ideal line.")
    return FigureSpec("time_vs_volume.png", title,
                      f"{op} time against the bytes each rank receives, one line per world size N. For the same D "
                      f"all lines should fall on one curve near the ideal; a line above the others (N=2 in the "
                      f"reported anomaly) moves the same volume more slowly. {ideal} Series with a single row "
                      f"(one-N experiments) are in the headline and the busbw plot.", panels)


def busbw_vs_size(run: RunData) -> FigureSpec | Skipped:
    title = "Bus bandwidth vs size"
    series = by_series(run.records)
    if not series:
        return Skipped(title, "no records")
    refs = _link_ref(run)
    multi = sorted(k for k, per_n in series.items() if sum(len(rows) for rows in per_n.values()) > 1)
    single = sorted(k for k in series if k not in multi)
    panels = []
    for key in multi[:MAX_PANELS]:
        lines = []
        for n in sorted(series[key])[:MAX_LINES]:
            rows = sorted(series[key][n].values(), key=lambda r: r.size_bytes)
            lines.append(Line(f"N={n}", [r.size_bytes for r in rows], [mean_busbw(r) / 1e6 for r in rows]))
        panels.append(Panel(f"{key[0]} {key[1]}", "per-rank size [bytes]", "busbw of the mean time [MB/s]", lines, refs=refs,
                            x="bytes", y_from_zero=True))
    if single:
        rows: list[Record] = [next(iter(next(iter(series[k].values())).values())) for k in single]
        panels.append(Panel("one-row experiments", "", "busbw of the mean time [MB/s]",
                            bars=Bars([f"{series_label(r)} {r.op} N={r.world_size} {human_bytes(r.size_bytes)}"
                                       for r in rows], [("busbw", [mean_busbw(r) / 1e6 for r in rows])]),
                            refs=refs))
    return FigureSpec("busbw_vs_size.png", title,
                      "busbw of the mean time per iteration (nccl-tests convention, MB/s = 1e6 B/s) per transport, one line per N. busbw is "
                      "normalised so that all N should reach the same plateau at large sizes; a line that plateaus "
                      "lower (N=2) is the anomaly, and the size where it leaves the others is where it starts. "
                      "Compare the torch panels with the raw-TCP reference panels; experiments with one row each "
                      "(one size, one N) are the labelled bars.", panels)


def efficiency(run: RunData) -> FigureSpec | Skipped:
    title = "Efficiency: backend busbw / raw busbw"
    best_raw = raw_reference(run.records)
    if not best_raw:
        return Skipped(title, "no raw rows: cannot compare the backend with the raw-TCP reference")
    lines: dict[tuple[str, str], dict[int, list[tuple[int, float]]]] = defaultdict(lambda: defaultdict(list))
    for r in run.records:
        ref = best_raw.get((r.op, r.world_size, r.size_bytes))
        if r.backend != "raw" and ref and mean_busbw(ref) > 0:
            lines[(series_label(r), r.op)][r.world_size].append((r.size_bytes, mean_busbw(r) / mean_busbw(ref)))
    if not lines:
        return Skipped(title, "backend and raw rows share no op, N and size")
    panels = []
    for key in sorted(lines)[:MAX_PANELS]:
        drawn = [Line(f"N={n}", [p[0] for p in sorted(lines[key][n])], [p[1] for p in sorted(lines[key][n])])
                 for n in sorted(lines[key])[:MAX_LINES]]
        panels.append(Panel(f"{key[0]} {key[1]} / fastest raw", "per-rank size [bytes]",
                            "busbw / best raw busbw [ratio]", drawn, refs=[RefLine(1.0, "as fast as raw TCP")],
                            x="bytes", y_from_zero=True))
    return FigureSpec("efficiency.png", title,
                      "The backend's busbw divided by the best raw-TCP busbw for the same op, N and size (1.0 = as "
                      "fast as plain sockets on the same link). A line well below the others at one N says the "
                      "backend, not the link, loses bandwidth there.", panels)


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


def conn_throughput(run: RunData) -> FigureSpec | Skipped:
    title = "Per-connection throughput over time"
    panels = []
    for capture in _pick_captures(run):
        conn = busiest_connection(capture)
        if conn is None:
            continue
        series = [(d, conn.direction(d).throughput) for d in ("a->b", "b->a")]
        series = [(d, tp) for d, tp in series if tp is not None and tp.Bps]
        if not series:
            continue
        t_first = min(tp.t0 for _, tp in series)
        lines = [Line(f"{conn.a} -> {conn.b}" if d == "a->b" else f"{conn.b} -> {conn.a}",
                      [t - t_first for t in tp.times()], [v / RATE_SCALE for v in tp.Bps],
                      "-" if d == "a->b" else "--", step=True) for d, tp in series]
        overlap = conn.duplex_overlap
        panels.append(Panel(f"{capture_name(run, capture)}: busiest connection"
                            + (f", duplex overlap {overlap:.0%}" if isinstance(overlap, (int, float)) else ""),
                            "time since capture start [s]", f"throughput [{RATE_UNIT}]", lines))
    if not panels:
        return Skipped(title, "no analysed capture with a per-direction throughput series (analysis/*.json)")
    return FigureSpec("conn_throughput.png", title,
                      "The busiest connection of the N=2 capture above the N=4 one (solid: a->b, dashed: b->a). On "
                      "a full-duplex link both directions of a connection should run at once; curves that alternate "
                      "(one high while the other is zero) mean the directions take turns, which halves what the "
                      "link can carry.", panels, columns=1, panel_size=(10.0, 3.2))


def _captures_in_order(run: RunData) -> list[CaptureSet]:
    return sorted((c for c in run.captures.values() if c.analysis),
                  key=lambda c: (str(c.transport), c.world_size or 0, c.tag))


def duplex(run: RunData) -> FigureSpec | Skipped:
    title = "Duplex overlap per N and transport"
    groups: list[str] = []
    connections: list[float | None] = []
    hosts: list[float | None] = []
    for c in _captures_in_order(run):
        weights = [(float(conn.duplex_overlap), sum(conn.payload_bytes)) for conn in c.connections
                   if isinstance(conn.duplex_overlap, (int, float)) and min(conn.payload_bytes) > 0]
        host_values = [h.duplex_overlap for h in c.hosts if isinstance(h.duplex_overlap, (int, float))]
        groups.append(capture_name(run, c))
        connections.append(sum(o * w for o, w in weights) / sum(w for _, w in weights) if weights else None)
        hosts.append(statistics.mean(host_values) if host_values else None)
    if not groups:
        return Skipped(title, "no capture analysis (analysis/*.json)")
    panel = Panel("duplex overlap per capture", "", "duplex overlap [fraction of active time]",
                  bars=Bars(groups, [("connections carrying both directions (byte-weighted)", connections),
                                     ("hosts' NICs (mean)", hosts)]), y_max=1.05)
    return FigureSpec("duplex_overlap.png", title,
                      "Fraction of active time in which both directions move data at once, for connections that "
                      "carry both directions and for each host's NIC that the capture sees (1.0 = full duplex used; "
                      "hosts seen only through their traffic with the captured host are left out). A short bar at one "
                      "N, long at the others, says the traffic pattern at that N wastes half the link. A missing "
                      "connection bar: no connection carried both directions (a ring at N>=3 sends one way per "
                      "connection).", [panel], columns=1, panel_size=(10.0, 3.8))


# Samples further apart than this are not joined by a line: the connection was idle or gone in between.
SAMPLE_GAP_S = 5.0


def _gaps_broken(ts: list[float], ys: list[float]) -> tuple[list[float], list[float]]:
    """ts, ys with a NaN point inside every gap longer than SAMPLE_GAP_S (matplotlib breaks the line there)."""
    out_t: list[float] = []
    out_y: list[float] = []
    for i, (t, y) in enumerate(zip(ts, ys, strict=True)):
        if i and t - ts[i - 1] > SAMPLE_GAP_S:
            out_t.append((t + ts[i - 1]) / 2)
            out_y.append(float("nan"))
        out_t.append(t)
        out_y.append(y)
    return out_t, out_y


def window(run: RunData) -> FigureSpec | Skipped:
    title = "Congestion window and queued bytes"
    series = [s for s in tcp_info_series(run) if s.has_cwnd]
    if not series:
        return Skipped(title, "no TCP_INFO samples (observe/*.jsonl tcp_info, tcpinfo/*.jsonl)")
    busiest = sorted(series, key=lambda s: -max(s.values("cwnd")))[:MAX_LINES]
    t_min = min(sample.t_ns for one in busiest for sample in one.samples)
    cwnd: list[Line] = []
    queue: list[Line] = []
    for one in busiest:
        name = f"{capture_name(run, run.captures[one.tag])}: {one.label}" if one.tag else f"raw {one.label}"
        ts = [(sample.t_ns - t_min) / 1e9 for sample in one.samples]
        cwnd.append(Line(name, *_gaps_broken(ts, [s.cwnd if isinstance(s.cwnd, (int, float)) else float("nan")
                                                  for s in one.samples]), ".-"))
        if any(isinstance(s.send_q, (int, float)) for s in one.samples):
            queue.append(Line(name, *_gaps_broken(ts, [s.send_q / 1024 if isinstance(s.send_q, (int, float))
                                                       else float("nan") for s in one.samples]), ".-"))
    panels = [Panel("congestion window", "time since first sample [s]", "cwnd [segments]", cwnd),
              Panel("send queue", "time since first sample [s]",
                    "send queue [KiB]" if queue else "send queue [KiB] (not sampled)", queue)]
    return FigureSpec("window.png", title,
                      "TCP_INFO per connection: congestion window (segments) and bytes waiting in the send queue. A "
                      "cwnd that collapses to a few segments after each pause is slow start after idle; a full send "
                      "queue with a small cwnd means the network side limits, an empty one means the application "
                      "does not keep the socket fed.", panels, columns=1, panel_size=(11.0, 3.4), sharex=True)


def _ends(src: str, dst: str) -> str:
    """'10.77.0.1:35797 -> 10.77.0.2:57972': a direction as the wire names it."""
    return f"{src} -> {dst}"


def in_flight(run: RunData) -> FigureSpec | Skipped:
    title = "Bytes in flight per direction (from the wire)"
    groups: list[str] = []
    medians: list[float | None] = []
    p95s: list[float | None] = []
    for c in _captures_in_order(run):
        conn = busiest_connection(c)
        if conn is None:
            continue
        for key in ("a->b", "b->a"):
            d = conn.direction(key)
            flight = d.bytes_in_flight
            if isinstance(flight.median, (int, float)) and d.payload_bytes > 0:
                src, dst = (conn.a, conn.b) if key == "a->b" else (conn.b, conn.a)
                groups.append(f"{capture_name(run, c)}, {_ends(src, dst) if '?' not in (src, dst) else key}")
                medians.append(flight.median)
                p95s.append(flight.p95 or flight.median)
    if not groups:
        return Skipped(title, "the analyses carry no bytes_in_flight (analysis/*.json)")
    panel = Panel("busiest connection of each capture", "", "unacknowledged bytes in flight [bytes]",
                  bars=Bars(groups, [("median", medians), ("p95", p95s)]), y="bytes")
    return FigureSpec("in_flight.png", title,
                      "Bytes sent but not yet acknowledged, per direction of each capture's busiest connection "
                      "(each bar names its direction: from the address:port that sent the connection's first packet, "
                      "the client when the SYN was captured, or back to it). To "
                      "fill a link the sender needs about rate x RTT in flight; a direction far below that at N=2 "
                      "but not at N>=3 waits on its window, its ACKs or the application.", [panel], columns=1,
                      panel_size=(10.0, 3.8))


def cpu(run: RunData) -> FigureSpec | Skipped:
    title = "Per-thread CPU"
    per_capture = defaultdict(list)
    for thread in thread_cpu(run):
        per_capture[thread.tag].append(thread)
    if not per_capture:
        return Skipped(title, "no per-thread CPU samples (observe/*.jsonl cpu_thread)")
    machines = host_cpu(run)
    panels = []
    for tag in sorted(per_capture)[:MAX_PANELS]:
        threads = sorted(per_capture[tag], key=lambda t: -statistics.mean(t.cpu_pct))
        t_min = min(t for thread in threads for t in thread.t_ns)
        lines = [Line(f"{t.name} ({t.tid})", [(x - t_min) / 1e9 for x in t.t_ns], list(t.cpu_pct), ".-")
                 for t in threads[:5]]
        machine = machines.get(tag)
        if machine:
            lines.append(Line(f"whole machine ({machine.cpus} CPUs, % busy)", [(x - t_min) / 1e9 for x in machine.t_ns],
                              list(machine.busy_pct), "k-", width=2.5))
        panels.append(Panel(capture_name(run, run.captures[tag]), "time [s]", "CPU [% of one core; machine: % of all]",
                            lines, refs=[RefLine(100.0, "one full core")], y_max=110))
    return FigureSpec("cpu_threads.png", title,
                      "The busiest threads of each captured run, in % of one core, and the whole machine (black, % "
                      "of all its CPUs busy). A thread that stays near the dashed 100% line is CPU-bound; a machine "
                      "near 100% has no core left even when no single thread is pinned (many ranks on few cores). "
                      "Either way the network is not what limits that run, and a bandwidth dip there says more "
                      "about the CPU than about TCP.", panels, panel_size=(5.5, 3.6))


def link_matrix(run: RunData) -> FigureSpec | Skipped:
    title = "Link matrix: goodput between every pair of nodes"
    matrix = run.link_matrix
    if matrix is None or not matrix.alone():
        return Skipped(title, "no link matrix (run.json link.matrix)")
    names = matrix.names()
    panels = []
    for what, values in (("alone (the other direction idle)", matrix.alone()),
                         ("both directions at once", matrix.bidir())):
        if values:
            cells = [[values[(src, dst)] / 1e6 if (src, dst) in values else None for dst in names]
                     for src in names]
            panels.append(Panel(f"src -> dst goodput, {what}", "receiving node (dst)", "sending node (src)",
                                grid=Grid(names, names, cells, "goodput [MB/s]")))
    shares, delivered = matrix.incast_shares()
    if shares:
        # Each sender's share of what the column's node received, the column headed by what its port delivered
        # in all: starved flows beside one at the link rate read as what they are, an uneven share of a full
        # port, not as loss (their resends per segment sent say little when they send almost nothing).
        link = run.link_Bps
        columns = [f"{dst}\n{delivered[dst] / 1e6:.1f} MB/s" + (f" ({delivered[dst] / link:.0%})" if link else "")
                   if dst in delivered else dst for dst in names]
        cells = [[100 * shares[(src, dst)] if (src, dst) in shares else None for dst in names] for src in names]
        panels.append(Panel("incast: each sender's share of what dst received, every other node sending into dst at "
                            "once", "receiving node (dst), with the goodput its port delivered in all",
                            "sending node (src)", grid=Grid(names, columns, cells, "share of dst's goodput [%]",
                                                            fmt="{:.0f}")))
    size = max(4.0, 0.8 * len(names) + 2.0)
    return FigureSpec("link_matrix.png", title,
                      f"Goodput from each node (row) to each other node (column), MB/s = 1e6 B/s, measured with "
                      f"{matrix.tool or '?'} in rounds of disjoint pairs ({len(matrix.rounds)} rounds"
                      + (f", {matrix.seconds:g} s per phase" if matrix.seconds else "") + "). Every cell should "
                      "read about the link rate. A dark row is a host that sends slowly, a dark column one that "
                      "receives slowly, both a slow host (its NIC, cable or port); one dark cell alone is one slow "
                      "link. The right panel runs both directions of a pair at once (each its own connection): a "
                      "full-duplex link keeps each near the left panel's value."
                      + (" The third panel is the incast: every other node sends into the column's node at once, "
                         "the one time traffic converges on a host's port. Under each column, what that port "
                         "delivered in all (and its share of the link rate): near 100% is a port that delivers what "
                         "converges on it, however unevenly the senders share it (TCP flows into one tail-drop queue "
                         "often leave one near the link rate and starve the others: unfairness, not loss); a column "
                         "well below the others is a port that drops what converges on it, a shallow buffer "
                         "(loss_at_host reads its senders' resends)." if shares else ""),
                      panels, columns=len(panels), panel_size=(size + 1.2, size))


# In report order; the headline first.
PLOTS: tuple[Builder, ...] = (headline, link_matrix, time_vs_volume, busbw_vs_size, efficiency, conn_throughput,
                              duplex, window, in_flight, cpu)


def render_plots(run: RunData, out: Path) -> list[Plot | Skipped]:
    safefs.private_dir(out)
    drawn: list[Plot | Skipped] = []
    for build in PLOTS:
        spec = build(run)
        drawn.append(render(spec, out) if isinstance(spec, FigureSpec) else spec)
    return drawn

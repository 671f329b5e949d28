"""Per-connection plots (matplotlib, Agg): throughput of both directions on one axis, a tcptrace-style
time-sequence graph, advertised window and bytes in flight, and the segment-size histogram."""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np

from diag import safefs
from diag.analysisdoc import Analysis
from diag.capture.document import Packets
from diag.units import RATE_SCALE, RATE_UNIT

# Plot at most this many connections (the ones that carried the most bytes) so a busy capture stays readable.
MAX_PLOTTED_CONNECTIONS = 8


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_")


def plot_connections(result: Analysis, packets: Packets, out_dir: str | Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = safefs.private_dir(out_dir, "--plot")   # ours, closed to others: savefig by name is safe there
    conns = sorted(result.connections, key=lambda c: -c.total_payload_bytes)
    written: list[Path] = []
    cols, st = packets.cols, packets.state
    for conn in conns[:MAX_PLOTTED_CONNECTIONS]:
        c = conn.stream
        name = _safe(f"{conn.a}_{conn.b}")
        rows = np.flatnonzero(st.conn == c)
        t0 = cols["ts_ns"][rows].min() / 1e9 if rows.size else 0.0
        fig, axes = plt.subplots(2, 2, figsize=(13, 8))
        ax_tp, ax_seq, ax_win, ax_hist = axes.ravel()
        for label, d in (("a->b", 0), ("b->a", 1)):
            series = conn.direction(label).throughput
            if series:
                x = series.t0 - t0 + series.bin_s * np.arange(len(series.Bps))
                ax_tp.step(x, np.asarray(series.Bps) / RATE_SCALE, where="post", label=label)
            drows = rows[(st.direction[rows] == d)]
            data = drows[cols["plen"][drows] > 0]
            ts = cols["ts_ns"][data] / 1e9 - t0
            seq = st.seq_rel[data] / 1e6
            retrans = st.retransmission[data]
            ax_seq.plot(ts[~retrans], seq[~retrans], ".", markersize=2, label=f"{label} data")
            if retrans.any():
                ax_seq.plot(ts[retrans], seq[retrans], "r+", markersize=5, label=f"{label} retransmitted")
            inflight = st.in_flight[data]
            ok = inflight >= 0
            ax_win.plot(ts[ok], inflight[ok] / 1e3, ".", markersize=2, label=f"{label} in flight")
            wrows = drows[(cols["flags"][drows] & 0x02) == 0]
            ax_win.plot(cols["ts_ns"][wrows] / 1e9 - t0, st.window_bytes[wrows] / 1e3, "-", linewidth=0.8,
                        label=f"window advertised by {label.split('->')[0]}")
            sizes = cols["plen"][data]
            if sizes.size:
                ax_hist.hist(sizes, bins=50, alpha=0.6, label=label)
        ax_tp.set(title=f"throughput (overlap {conn.duplex_overlap or 0:.0%})", xlabel="s", ylabel=RATE_UNIT)
        ax_seq.set(title="time-sequence (relative, MB)", xlabel="s", ylabel="MB")
        ax_win.set(title="window and bytes in flight", xlabel="s", ylabel="KB")
        ax_hist.set(title="segment sizes (payload)", xlabel="bytes", ylabel="segments")
        ax_hist.set_yscale("log")
        for ax in axes.ravel():
            ax.grid(alpha=0.3)
            if ax.get_legend_handles_labels()[0]:  # a panel with nothing drawn (no data one way) has no legend
                ax.legend(fontsize=7)
        fig.suptitle(f"{conn.a}  <->  {conn.b}")
        fig.tight_layout()
        path = out / f"conn_{c}_{name}.png"
        with os.fdopen(safefs.create(path, replace=True), "wb") as handle:   # never through a planted symlink
            fig.savefig(handle, format="png", dpi=90)
        plt.close(fig)
        written.append(path)
    return written

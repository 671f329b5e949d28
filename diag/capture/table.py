"""The plain-text table `diag analyze` prints: per direction, per connection, per host and per phase."""

from __future__ import annotations

from diag.analysisdoc import Analysis, Stats
from diag.units import human_bits, human_bytes


def _rate(Bps: float) -> str:
    return human_bits(Bps * 8)


def _ms(stats: Stats) -> str:
    return f"{stats.median:.3g}" if stats.median is not None else "-"


def _pct(value: float | None) -> str:
    return f"{value:.0%}" if value is not None else "-"


def format_table(result: Analysis) -> str:
    lines = []
    cap = result.capture
    flag = "  FLAGGED: kernel dropped packets" if cap.flagged else ""
    lines.append(f"{cap.packets} TCP packets of {cap.frames} frames in {len(result.files)} file(s); "
                 f"kernel dropped: {cap.kernel_dropped if cap.kernel_dropped is not None else 'unknown'}{flag}")
    header = (f"{'direction':<48} {'pkts':>8} {'bytes':>10} {'goodput':>12} {'active':>12} {'retr':>6} "
              f"{'fast':>5} {'dupack':>6} {'zwin':>5} {'wfull':>5} {'rtt ms':>7}")
    lines.append("")
    lines.append(header)
    lines.append("-" * len(header))
    for conn in result.connections:
        for label, d in conn.directions.items():
            src, dst = (conn.a, conn.b) if label == "a->b" else (conn.b, conn.a)
            lines.append(f"{src + ' > ' + dst:<48} {d.packets:>8} {human_bytes(d.payload_bytes):>10} "
                         f"{_rate(d.goodput_Bps):>12} {_rate(d.active_goodput_Bps):>12} "
                         f"{d.retransmissions:>6} {d.fast_retransmissions:>5} {d.dup_acks:>6} "
                         f"{d.zero_windows:>5} {d.window_full:>5} {_ms(d.rtt_ms):>7}")
        overlap, alone = conn.overlap_Bps, conn.alone_Bps
        lines.append(f"{'':<4}duplex overlap {_pct(conn.duplex_overlap)} of {conn.active_s:.3g} s active; "
                     f"a->b {_rate(overlap.get('a->b', 0.0))} overlapping / {_rate(alone.get('a->b', 0.0))} alone; "
                     f"b->a {_rate(overlap.get('b->a', 0.0))} / {_rate(alone.get('b->a', 0.0))}")
    if result.hosts:
        lines.append("")
        lines.append(f"{'host':<40} {'tx':>10} {'rx':>10} {'overlap':>8} {'tx while rx':>12} {'rx while tx':>12}")
        for h in result.hosts:
            overlap = _pct(h.duplex_overlap) if h.duplex_overlap is not None else "not seen"
            lines.append(f"{h.address:<40} {human_bytes(h.tx_bytes):>10} {human_bytes(h.rx_bytes):>10} "
                         f"{overlap:>8} {_rate(h.tx_Bps_overlap):>12} {_rate(h.rx_Bps_overlap):>12}")
        unseen = [h.address for h in result.hosts if h.duplex_overlap is None]
        if unseen:
            lines.append(f"not seen: the capture does not see the NIC of {', '.join(unseen)} (only its traffic with "
                         f"{', '.join(result.capture_point) or 'other hosts'}), so it has no host overlap")
    if result.phases:
        lines.append("")
        lines.append(f"{'phase':<44} {'pkts':>8} {'conn overlap':>13} {'turns':>6} {'host overlap (per host)':<30}")
        for ph in result.phases:
            p = ph.phase
            it = "" if p.iteration is None else f" it{p.iteration}"
            name = f"{p.backend}/{p.algo} {p.op} N={p.world_size} {human_bytes(p.size_bytes or 0)}{it}"
            conn_ov = ",".join(_pct(c.duplex_overlap) for c in ph.connections[:4]) or "-"
            host_ov = ",".join(f"{h.address}={_pct(h.duplex_overlap)}" for h in ph.hosts
                               if h.duplex_overlap is not None) or "-"
            handoffs = sum(c.turns.handoff_count for c in ph.connections if c.turns is not None)
            lines.append(f"{name:<44} {ph.packets:>8} {conn_ov:>13} {handoffs:>6} {host_ov:<30}")
    if result.turn_summary:
        lines.append("")
        lines.append(f"{'run (medians over repetitions)':<40} {'reps':>5} {'turns':>6} {'leader':>7} {'both':>6} "
                     f"{'follower':>8} {'delay ms':>9} {'at byte':>8}")
        for g in result.turn_summary:
            name = f"{g.backend}/{g.algo} {g.op} N={g.world_size} {human_bytes(g.size_bytes or 0)}"
            lines.append(f"{name:<40} {g.repetitions:>5} {g.turn_taking_repetitions:>6} "
                         f"{_pct(g.leader_only_fraction):>7} {_pct(g.both_fraction):>6} "
                         f"{_pct(g.follower_only_fraction):>8} "
                         f"{'-' if g.handoff_delay_ms is None else format(g.handoff_delay_ms, '.3g'):>9} "
                         f"{_pct(g.trigger_offset_fraction):>8}")
    for warning in result.warnings:
        lines.append(f"warning: {warning}")
    return "\n".join(lines)

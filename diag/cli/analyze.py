"""Per-connection, per-direction TCP analysis of pcap/pcapng files (gzip too), optionally cut into sweep phases.

Counts follow tshark's tcp.analysis definitions (see docs/analyzer.md); duplex overlap shows whether the two
directions of a connection (and the transmit/receive of a host) carry data at the same time.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("pcaps", nargs="+", metavar="PCAP", help="capture files (.pcap, .pcapng, .gz)")
    parser.add_argument("--records", nargs="+", action="extend", metavar="RUN.jsonl",
                        help="record files whose iteration windows cut the capture into phases")
    parser.add_argument("--json", action="store_true", help="print the JSON object (docs/analyzer.md)")
    parser.add_argument("--out", metavar="FILE", help="write the JSON object to FILE as well")
    parser.add_argument("--plot", metavar="DIR", help="write per-connection plots (PNG) into DIR")
    parser.add_argument("--bin", dest="bin_s", type=float, default=0.01, metavar="SECONDS",
                        help="throughput time-series bin (default 0.01 s)")
    parser.add_argument("--idle-gap", dest="idle_gap_s", type=float, default=0.002, metavar="SECONDS",
                        help="a silence longer than this ends a direction's busy period (default 0.002 s)")
    parser.add_argument("--no-series", action="store_true", help="leave the throughput series out of the JSON")


def run(args: argparse.Namespace) -> int:
    import os

    from diag import validate
    from diag.records import load_records

    validate.seconds(args.bin_s, "--bin")
    validate.seconds(args.idle_gap_s, "--idle-gap")
    if args.out:
        validate.output_file(args.out, "--out")
    if args.plot:
        validate.output_dir(args.plot, "--plot")
    for records in args.records or ():
        load_records(records)  # a wrong --records file fails now, not after the captures were read

    # numpy asks the kernel for transparent huge pages for every large array; the analysis allocates and
    # frees hundreds of them, and zeroing/compacting huge pages then costs more system time than it saves
    # in TLB misses (measured: -40% sys time on 2M packets). Must be set before numpy is imported.
    os.environ.setdefault("NUMPY_MADVISE_HUGEPAGE", "0")
    _keep_freed_memory()
    from diag.capture.flows import analyze

    result, packets = analyze(args.pcaps, args.records, args.bin_s, args.idle_gap_s, not args.no_series)
    if args.out:
        from pathlib import Path

        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result) + "\n")
    if args.plot:
        from diag.capture.plots import plot_connections

        written = plot_connections(result, packets, args.plot)
        print(f"wrote {len(written)} plot(s) to {args.plot}", file=sys.stderr)
    if args.json:
        json.dump(result, sys.stdout)
        sys.stdout.write("\n")
    else:
        print(format_table(result))
    return 0


# glibc mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
# Above any one array of the analysis (columns of millions of packets are tens of MB).
_MMAP_THRESHOLD = 1 << 30


def _keep_freed_memory() -> None:
    """Have glibc serve the analysis's many large temporaries from its heap and keep freed memory there.

    By default every array over glibc's dynamic threshold (128 kB growing to 32 MB) is a fresh mmap, so each
    temporary of the analysis pays its page faults and zeroing again and is unmapped when freed; reusing
    heap pages cut system time by about a quarter (0.7 -> 0.5 s on 2.36 M packets). Peak RSS is unchanged:
    the peak is live data anyway. Set only here, in the one-shot command, not in the library: a long-lived
    caller would keep freed memory forever.
    Best effort: other C libraries have no mallopt and keep their default.
    """
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")  # not ctypes.util.find_library: it runs ldconfig (~0.1 s)
        libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD)
        libc.mallopt(_M_TRIM_THRESHOLD, 2**31 - 1)
        # One arena: the analysis's helper threads (decoder, hosts, TCP state) then draw on the same
        # kept heap instead of each growing its own (measured: 234k -> fewer page faults, less sys time).
        libc.mallopt(_M_ARENA_MAX, 1)
    except (OSError, AttributeError):
        return


def _rate(bps: float) -> str:
    from diag.units import human_bits

    return human_bits(bps * 8)


def _ms(stats: dict[str, Any]) -> str:
    return f"{stats['median']:.3g}" if stats.get("median") is not None else "-"


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def format_table(result: dict[str, Any]) -> str:
    from diag.units import human_bytes

    lines = []
    cap = result["capture"]
    flag = "  FLAGGED: kernel dropped packets" if cap.get("flagged") else ""
    lines.append(f"{cap['packets']} TCP packets of {cap['frames']} frames in {len(result['files'])} file(s); "
                 f"kernel dropped: {cap['kernel_dropped'] if cap['kernel_dropped'] is not None else 'unknown'}{flag}")
    header = (f"{'direction':<48} {'pkts':>8} {'bytes':>10} {'goodput':>12} {'active':>12} {'retr':>6} "
              f"{'fast':>5} {'dupack':>6} {'zwin':>5} {'wfull':>5} {'rtt ms':>7}")
    lines.append("")
    lines.append(header)
    lines.append("-" * len(header))
    for conn in result["connections"]:
        for label, d in conn["directions"].items():
            src, dst = (conn["a"], conn["b"]) if label == "a->b" else (conn["b"], conn["a"])
            lines.append(f"{src + ' > ' + dst:<48} {d['packets']:>8} {human_bytes(d['payload_bytes']):>10} "
                         f"{_rate(d['goodput_Bps']):>12} {_rate(d['active_goodput_Bps']):>12} "
                         f"{d['retransmissions']:>6} {d['fast_retransmissions']:>5} {d['dup_acks']:>6} "
                         f"{d['zero_windows']:>5} {d['window_full']:>5} {_ms(d['rtt_ms']):>7}")
        lines.append(f"{'':<4}duplex overlap {conn['duplex_overlap']:.0%} of {conn['active_s']:.3g} s active; "
                     f"a->b {_rate(conn['overlap_Bps']['a->b'])} overlapping / {_rate(conn['alone_Bps']['a->b'])} alone; "
                     f"b->a {_rate(conn['overlap_Bps']['b->a'])} / {_rate(conn['alone_Bps']['b->a'])}")
    if result["hosts"]:
        lines.append("")
        lines.append(f"{'host':<40} {'tx':>10} {'rx':>10} {'overlap':>8} {'tx while rx':>12} {'rx while tx':>12}")
        for h in result["hosts"]:
            overlap = f"{h['duplex_overlap']:>8.0%}" if h["duplex_overlap"] is not None else f"{'not seen':>8}"
            lines.append(f"{h['address']:<40} {human_bytes(h['tx_bytes']):>10} {human_bytes(h['rx_bytes']):>10} "
                         f"{overlap} {_rate(h['tx_Bps_overlap']):>12} {_rate(h['rx_Bps_overlap']):>12}")
        unseen = [h["address"] for h in result["hosts"] if h["duplex_overlap"] is None]
        if unseen:
            lines.append(f"not seen: the capture does not see the NIC of {', '.join(unseen)} (only its traffic with "
                         f"{', '.join(result.get('capture_point') or []) or 'other hosts'}), so it has no host overlap")
    if result["phases"]:
        lines.append("")
        lines.append(f"{'phase':<44} {'pkts':>8} {'conn overlap':>13} {'turns':>6} {'host overlap (per host)':<30}")
        for ph in result["phases"]:
            p = ph["phase"]
            it = "" if p["iteration"] is None else f" it{p['iteration']}"
            name = f"{p['backend']}/{p['algo']} {p['op']} N={p['world_size']} {human_bytes(p['size_bytes'])}{it}"
            conn_ov = ",".join(f"{c['duplex_overlap']:.0%}" for c in ph["connections"][:4]) or "-"
            host_ov = ",".join(f"{h['address']}={h['duplex_overlap']:.0%}" for h in ph["hosts"]
                               if h["duplex_overlap"] is not None) or "-"
            handoffs = sum((c.get("turns") or {}).get("handoff_count", 0) for c in ph["connections"])
            lines.append(f"{name:<44} {ph['packets']:>8} {conn_ov:>13} {handoffs:>6} {host_ov:<30}")
    if result.get("turn_summary"):
        lines.append("")
        lines.append(f"{'run (medians over repetitions)':<40} {'reps':>5} {'turns':>6} {'leader':>7} {'both':>6} "
                     f"{'follower':>8} {'delay ms':>9} {'at byte':>8}")
        for g in result["turn_summary"]:
            name = f"{g['backend']}/{g['algo']} {g['op']} N={g['world_size']} {human_bytes(g['size_bytes'])}"
            lines.append(f"{name:<40} {g['repetitions']:>5} {g['turn_taking_repetitions']:>6} "
                         f"{_share(g['leader_only_fraction']):>7} {_share(g['both_fraction']):>6} "
                         f"{_share(g['follower_only_fraction']):>8} "
                         f"{'-' if g['handoff_delay_ms'] is None else format(g['handoff_delay_ms'], '.3g'):>9} "
                         f"{_share(g['trigger_offset_fraction']):>8}")
    for warning in result["warnings"]:
        lines.append(f"warning: {warning}")
    return "\n".join(lines)

"""Per-connection, per-direction TCP analysis of pcap/pcapng files (gzip too), optionally cut into sweep phases.

Counts follow tshark's tcp.analysis definitions (see docs/analyzer.md); duplex overlap shows whether the two
directions of a connection (and the transmit/receive of a host) carry data at the same time.

examples:
  diag analyze run.pcap
  diag analyze run.pcap --records runs/sweep.jsonl --json --out run.analysis.json
  diag analyze big.pcap.gz --plot plots/
"""

from __future__ import annotations

import argparse
import json
import sys

# How many times the analyzer reads one big capture file (diag/capture/source.py: a pass each, the first two
# together): the progress bar's expectation; more reads only make the bar longer.
BIG_FILE_READS = 5
# File bytes a captured packet takes, to guess from a file's size whether the analyzer keeps it (tcpdump at
# snaplen 128 on bulk TCP: ~143 bytes a packet on the bench captures).
GUESSED_PACKET_BYTES = 140


def in_chunks(paths: list[str], plot: bool) -> bool:
    """Whether the analysis reads these captures in chunks: one regular file, no --plot (analysis.chunked)."""
    import os

    return not plot and len(paths) == 1 and os.path.isfile(paths[0])


def expected_reads(paths: list[str], plot: bool) -> int:
    """Reads of the input the progress bar expects: one file in chunks is read once where the analyzer keeps
    its chunks (guessed from its size on disk), else once a pass; several files, a pipe or --plot are read
    once into one chunk."""
    import os

    from diag.capture.source import CACHE_BYTES, KEPT_ROW_BYTES

    if not in_chunks(paths, plot):
        return 1
    rows = os.path.getsize(paths[0]) // GUESSED_PACKET_BYTES
    return 1 if rows * KEPT_ROW_BYTES <= CACHE_BYTES else BIG_FILE_READS


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
    parser.epilog = ("One capture file is read in chunks: once where it fits in memory, else once a pass, in\n"
                     "bounded memory whatever its size (docs/analyzer.md). Several files, a pipe and --plot are\n"
                     "analyzed in memory.")


def run(args: argparse.Namespace) -> int:
    from diag import validate
    from diag.cli.memory import tune_for_one_shot_analysis

    validate.seconds(args.bin_s, "--bin")
    validate.seconds(args.idle_gap_s, "--idle-gap")
    if args.out:
        validate.output_file(args.out, "--out")
    if args.plot:
        validate.output_dir(args.plot, "--plot")
    if args.records:
        from diag.records import load_records

        for records in args.records:
            load_records(records)  # a wrong --records file fails now, not after the captures were read

    tune_for_one_shot_analysis(in_chunks(args.pcaps, bool(args.plot)))  # before numpy is imported
    from diag.capture.analysis import analyze
    from diag.console import ReadProgress

    # On a terminal, a bar over the bytes read: one file is read in chunks, once where the analyzer keeps
    # them, else once a pass; several files, a pipe or --plot are read once.
    with ReadProgress(args.pcaps, expected_reads(args.pcaps, bool(args.plot))):
        result, packets = analyze(args.pcaps, args.records, args.bin_s, args.idle_gap_s, not args.no_series,
                                  keep_sequence=bool(args.plot))
    # One string from the C encoder, built once for --out and --json alike (json.dump streams thousands of
    # small writes through Python).
    text = json.dumps(result.to_json()) + "\n" if args.out or args.json else ""
    if args.out:
        from diag import safefs

        safefs.write_file(safefs.make_parent(args.out), text, flag="--out")
    if args.plot:
        from diag.capture.plots import plot_connections

        written = plot_connections(result, packets, args.plot)
        print(f"wrote {len(written)} plot(s) to {args.plot}", file=sys.stderr)
    if args.json:
        sys.stdout.write(text)
    else:
        from diag.capture.table import format_table

        print(format_table(result))
    return 0

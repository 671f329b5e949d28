"""Fuzz the capture analyzer: mutated pcap/pcapng/gzip files through ``diag analyze``'s library entry point.

    python -m bench.fuzz_analyze --cases 100000 --seed 1 [--start 0] [--out DIR]

The seed corpus is built by code (scapy builds the packets; the file formats are written here so every
length and timestamp field's offset is known): a TCP conversation (handshake with options, data both ways,
a retransmission, duplicate ACKs, FIN) over IPv4 and IPv6, in pcap (both byte orders, micro- and nanosecond
stamps; Ethernet, SLL, SLL2, raw IP, BSD loopback) and pcapng (two sections of opposite byte order, several
interfaces with their own link types and if_tsresol, enhanced, simple and obsolete packet blocks, a custom
block), each also gzip-compressed.

Case ``i`` is drawn from ``random.Random(f"{seed}:{i}")`` alone, so a run can be split into parts
(``--start``) and any case replayed (``--replay I``). Each case applies one to three mutations: bit flips,
byte overwrites with boundary values, truncation, insertion/deletion of bytes, records or blocks spliced in
from any seed (duplicated, dropped, swapped, cross-format), huge or off-by-one values in length, snaplen,
option-length and timestamp fields, and damage to the gzip stream itself.

Outcome of a case: ``ok`` (analyzed), ``clean`` (a one-line DiagError, what a user sees as an error) or a
failure: ``traceback`` (any other exception), ``hang`` (over --case-timeout), ``multiline`` (a DiagError
message of several lines) or ``memory`` (the process's peak RSS passed --memory-limit-mb during the case).
Failing inputs are written to --out with their traceback. The command exits 1 if any case failed.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import resource
import signal
import struct
import sys
import tempfile
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Values that sit on the edges of the reader's checks (0, sign bits, 2^16, 2^20, 2^32 - 1, ...).
BOUNDARY_U32 = (0, 1, 3, 11, 12, 15, 16, 19, 20, 27, 28, 31, 32, 0x7F, 0x80, 0xFF, 0xFFFF, 0x10000, 0x10001,
                (1 << 20) - 1, 1 << 20, (1 << 20) + 64, (1 << 20) + 68, 0x7FFFFFFF, 0x80000000, 0xFFFFFFF0,
                0xFFFFFFFF)
BOUNDARY_BYTES = (0x00, 0x01, 0x7F, 0x80, 0xFE, 0xFF)
CASE_TIMEOUT_S = 20.0
MEMORY_LIMIT_MB = 1024


@dataclass
class Seed:
    """A valid capture and where its structure lives, so mutations can aim at it."""

    name: str
    data: bytes
    units: list[tuple[int, int]]                               # (offset, length) of records / blocks
    fields: list[tuple[int, int, str]] = field(default_factory=list)   # (offset, size, endianness "<" or ">")


# --- seed corpus -------------------------------------------------------------------------------------------

def conversation(ipv6: bool = False) -> list[tuple[float, bytes]]:
    """(time, IP packet bytes) of a small TCP conversation with everything the analyzer looks at."""
    from scapy.layers.inet import IP, TCP
    from scapy.layers.inet6 import IPv6

    a, b = ("fd00::1", "fd00::2") if ipv6 else ("10.0.0.1", "10.0.0.2")

    def ip(src: str, dst: str) -> Any:
        return IPv6(src=src, dst=dst) if ipv6 else IP(src=src, dst=dst)

    opts = [("MSS", 1448), ("SAckOK", b""), ("Timestamp", (100, 0)), ("NOP", None), ("WScale", 7)]
    ts = [("NOP", None), ("NOP", None), ("Timestamp", (200, 100))]
    packets = [
        ip(a, b) / TCP(sport=40000, dport=5000, flags="S", seq=1000, options=opts),
        ip(b, a) / TCP(sport=5000, dport=40000, flags="SA", seq=9000, ack=1001, options=opts),
        ip(a, b) / TCP(sport=40000, dport=5000, flags="A", seq=1001, ack=9001, options=ts),
    ]
    seq_a, seq_b = 1001, 9001
    for k in range(6):
        packets.append(ip(a, b) / TCP(sport=40000, dport=5000, flags="PA", seq=seq_a, ack=seq_b, options=ts)
                       / (bytes([k]) * 700))
        seq_a += 700
        packets.append(ip(b, a) / TCP(sport=5000, dport=40000, flags="PA", seq=seq_b, ack=seq_a, window=0 if k == 3 else 500,
                                      options=ts) / (b"r" * 300))
        seq_b += 300
    packets.append(ip(a, b) / TCP(sport=40000, dport=5000, flags="PA", seq=seq_a - 700, ack=seq_b, options=ts)
                   / (b"\x05" * 700))  # a retransmission
    packets += [ip(b, a) / TCP(sport=5000, dport=40000, flags="A", seq=seq_b, ack=seq_a, options=ts)] * 3
    packets.append(ip(a, b) / TCP(sport=40000, dport=5000, flags="FA", seq=seq_a, ack=seq_b))
    packets.append(ip(b, a) / TCP(sport=5000, dport=40000, flags="FA", seq=seq_b, ack=seq_a + 1))
    return [(1_700_000_000.0 + 0.001 * i, bytes(p)) for i, p in enumerate(packets)]


def link_frame(linktype: int, packet: bytes, ipv6: bool) -> bytes:
    ethertype = 0x86DD if ipv6 else 0x0800
    if linktype == 1:
        return b"\x02\x00\x00\x00\x00\x02\x02\x00\x00\x00\x00\x01" + struct.pack(">H", ethertype) + packet
    if linktype == 113:
        return struct.pack(">HHH8sH", 0, 1, 6, b"\x02\x00\x00\x00\x00\x01\x00\x00", ethertype) + packet
    if linktype == 276:
        return struct.pack(">HHIHBB8s", ethertype, 0, 1, 1, 0, 6, b"\x02\x00\x00\x00\x00\x01\x00\x00") + packet
    if linktype == 0:
        return struct.pack("<I", 30 if ipv6 else 2) + packet
    return packet  # raw IP (101)


def pcap_seed(name: str, linktype: int, endian: str, nanos: bool, ipv6: bool) -> Seed:
    magic = 0xA1B23C4D if nanos else 0xA1B2C3D4
    out = bytearray(struct.pack(endian + "IHHiIII", magic, 2, 4, 0, 0, 262144, linktype))
    units, fields = [], [(16, 4, endian), (20, 4, endian)]
    for t, packet in conversation(ipv6):
        frame = link_frame(linktype, packet, ipv6)
        sec, frac = int(t), round((t % 1) * (1e9 if nanos else 1e6))
        units.append((len(out), 16 + len(frame)))
        fields += [(len(out), 4, endian), (len(out) + 4, 4, endian), (len(out) + 8, 4, endian),
                   (len(out) + 12, 4, endian)]
        out += struct.pack(endian + "IIII", sec, frac, len(frame), len(frame)) + frame
    return Seed(name, bytes(out), units, fields)


def pcapng_block(endian: str, block_type: int, body: bytes) -> bytes:
    body += b"\x00" * (-len(body) % 4)
    length = 12 + len(body)
    return struct.pack(endian + "II", block_type, length) + body + struct.pack(endian + "I", length)


def pcapng_option(endian: str, code: int, value: bytes) -> bytes:
    return struct.pack(endian + "HH", code, len(value)) + value + b"\x00" * (-len(value) % 4)


def pcapng_seed(name: str) -> Seed:
    """Two sections (little then big endian), each with interfaces of different link types and resolutions."""
    out = bytearray()
    units: list[tuple[int, int]] = []
    fields: list[tuple[int, int, str]] = []

    def add(endian: str, block: bytes, extra_fields: tuple[int, ...] = ()) -> None:
        units.append((len(out), len(block)))
        fields.append((len(out) + 4, 4, endian))              # block total length
        fields.append((len(out) + len(block) - 4, 4, endian))  # trailing length
        fields.extend((len(out) + offset, 4, endian) for offset in extra_fields)
        out.extend(block)

    for section, endian in enumerate(("<", ">")):
        shb = struct.pack(endian + "IHHq", 0x1A2B3C4D, 1, 0, -1) + pcapng_option(endian, 4, b"diag fuzz") + b"\0" * 4
        add(endian, pcapng_block(endian, 0x0A0D0D0A, shb))
        interfaces = [(1, b"\x06"), (101, b"\x09"), (113, b"\x86"), (276, b"\x03")]
        for linktype, resolution in interfaces:
            idb = struct.pack(endian + "HHI", linktype, 0, 262144) + pcapng_option(endian, 9, resolution) + b"\0" * 4
            add(endian, pcapng_block(endian, 1, idb), (8,))
        for i, (t, packet) in enumerate(conversation(ipv6=bool(section))):
            iface = i % len(interfaces)
            linktype, resolution = interfaces[iface]
            frame = link_frame(linktype, packet, bool(section))
            exponent = resolution[0] & 0x7F
            ticks = int(t * (2 ** exponent if resolution[0] & 0x80 else 10 ** exponent))
            if i == 5:    # an obsolete packet block
                body = struct.pack(endian + "HHIIII", iface, 0, ticks >> 32, ticks & 0xFFFFFFFF, len(frame), len(frame))
                add(endian, pcapng_block(endian, 2, body + frame), (20, 24))
            else:
                body = struct.pack(endian + "IIIII", iface, ticks >> 32, ticks & 0xFFFFFFFF, len(frame), len(frame))
                add(endian, pcapng_block(endian, 6, body + frame), (8, 12, 16, 20, 24))
        frame = link_frame(1, conversation(ipv6=bool(section))[3][1], bool(section))
        add(endian, pcapng_block(endian, 3, struct.pack(endian + "I", len(frame)) + frame), (8,))  # simple packet
        add(endian, pcapng_block(endian, 0x00000BAD, struct.pack(endian + "I", 32473) + b"custom"))
    return Seed(name, bytes(out), units, fields)


def seed_corpus() -> list[Seed]:
    seeds = [
        pcap_seed("eth-le-usec", 1, "<", False, False),
        pcap_seed("eth-be-nsec-v6", 1, ">", True, True),
        pcap_seed("sll-le-nsec", 113, "<", True, False),
        pcap_seed("sll2-be-usec-v6", 276, ">", False, True),
        pcap_seed("raw-le-usec", 101, "<", False, False),
        pcap_seed("null-le-usec-v6", 0, "<", False, True),
        pcapng_seed("pcapng-two-sections"),
    ]
    return seeds + [Seed(s.name + ".gz", gzip.compress(s.data, mtime=0), [], []) for s in seeds]


# --- mutations ---------------------------------------------------------------------------------------------

def _plain(seed: Seed, seeds: list[Seed]) -> Seed:
    """The uncompressed seed a gzip seed was made from (mutations aim at its structure)."""
    if not seed.name.endswith(".gz"):
        return seed
    return next(s for s in seeds if s.name == seed.name[:-3])


def mutate(rng: random.Random, seeds: list[Seed]) -> tuple[bytes, list[str]]:
    """One mutated file and the names of the mutations applied."""
    seed = rng.choice(seeds)
    compress = seed.name.endswith(".gz")
    base = _plain(seed, seeds)
    data = bytearray(base.data)
    units = list(base.units)
    applied: list[str] = []
    damage_gzip = compress and rng.random() < 0.25
    for _ in range(rng.randint(1, 3)):
        kind = rng.choice(("flip", "flip", "boundary_byte", "truncate", "insert", "delete", "splice", "splice",
                           "length", "length", "length", "timestamp"))
        applied.append(kind)
        if not data:
            data = bytearray(b"\x00")
        if kind == "flip":
            for _ in range(rng.randint(1, 16)):
                pos = rng.randrange(len(data))
                data[pos] ^= 1 << rng.randrange(8)
        elif kind == "boundary_byte":
            for _ in range(rng.randint(1, 4)):
                data[rng.randrange(len(data))] = rng.choice(BOUNDARY_BYTES)
        elif kind == "truncate":
            del data[rng.randrange(len(data)):]
        elif kind == "insert":
            pos = rng.randrange(len(data) + 1)
            data[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.choice((1, 2, 3, 4, 16, 100))))
        elif kind == "delete":
            pos = rng.randrange(len(data))
            del data[pos:pos + rng.choice((1, 2, 4, 8, 16, 100))]
        elif kind == "splice":
            donor = _plain(rng.choice(seeds), seeds)
            if donor.units and rng.random() < 0.8:
                start, length = rng.choice(donor.units)
            else:
                start = rng.randrange(len(donor.data))
                length = rng.randint(1, 256)
            piece = donor.data[start:start + length]
            # mostly at a record/block boundary of this file
            pos = rng.choice(units)[0] if units and rng.random() < 0.7 else rng.randrange(len(data) + 1)
            if rng.random() < 0.3 and units:  # replace a unit instead of inserting
                old_start, old_length = rng.choice(units)
                data[old_start:old_start + old_length] = piece
            else:
                data[pos:pos] = piece * rng.choice((1, 1, 1, 2, 50))
        elif kind in ("length", "timestamp"):
            if not base.fields:
                data[rng.randrange(len(data))] ^= 0xFF
                continue
            offset, size, endian = rng.choice(base.fields)
            if offset + size > len(data):
                continue
            value = rng.choice(BOUNDARY_U32) if kind == "length" else rng.choice((0, 0x7FFFFFFF, 0xFFFFFFFF, 1 << 31))
            if kind == "length" and rng.random() < 0.3:
                old = struct.unpack_from(endian + "I", data, offset)[0]
                value = (old + rng.choice((-4, -1, 1, 4, 8, 1 << 16))) & 0xFFFFFFFF
            struct.pack_into(endian + "I", data, offset, value)
    out = bytes(data)
    if compress:
        out = gzip.compress(out, mtime=0)
        if damage_gzip:
            applied.append("gzip_damage")
            damaged = bytearray(out)
            if rng.random() < 0.5:
                for _ in range(rng.randint(1, 8)):
                    damaged[rng.randrange(len(damaged))] ^= 1 << rng.randrange(8)
            else:
                del damaged[rng.randrange(len(damaged)):]
            out = bytes(damaged)
    return out, applied


# --- running -----------------------------------------------------------------------------------------------

class CaseTimeout(Exception):
    pass


def _alarm(_signum: int, _frame: object) -> None:
    raise CaseTimeout


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def analyze_once(path: Path) -> None:
    """What `diag analyze FILE` and `diag analyze --json FILE` do, short of printing."""
    from diag.capture.analysis import analyze
    from diag.capture.table import format_table

    result, _packets = analyze([path])
    json.dumps(result.to_json())
    format_table(result)


@dataclass
class FuzzReport:
    cases: int = 0
    outcomes: Counter = field(default_factory=Counter)
    mutations: Counter = field(default_factory=Counter)
    errors: Counter = field(default_factory=Counter)          # first words of the DiagErrors seen
    failures: list[dict[str, Any]] = field(default_factory=list)
    peak_rss_mb: float = 0.0
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {"cases": self.cases, "outcomes": dict(self.outcomes), "mutations": dict(self.mutations),
                "failures": len(self.failures), "failure_kinds": dict(Counter(f["outcome"] for f in self.failures)),
                "peak_rss_mb": round(self.peak_rss_mb, 1), "seconds": round(self.seconds, 1),
                "top_errors": dict(self.errors.most_common(12))}


def run_cases(seed: int, start: int, count: int, out_dir: Path | None = None, case_timeout_s: float = CASE_TIMEOUT_S,
              memory_limit_mb: float = MEMORY_LIMIT_MB, progress_every: int = 0) -> FuzzReport:
    from diag.errors import DiagError

    seeds = seed_corpus()
    report = FuzzReport()
    began = time.monotonic()
    scratch_root = Path("/dev/shm") if Path("/dev/shm").is_dir() and os.access("/dev/shm", os.W_OK) else None
    previous = signal.signal(signal.SIGALRM, _alarm) if case_timeout_s > 0 else None
    try:
        with tempfile.TemporaryDirectory(prefix="diag-fuzz-", dir=scratch_root) as tmp:
            path = Path(tmp) / "case.pcap"
            for index in range(start, start + count):
                rng = random.Random(f"{seed}:{index}")
                data, applied = mutate(rng, seeds)
                report.mutations.update(applied)
                path.write_bytes(data)
                rss_before = peak_rss_mb()
                outcome, detail = "ok", ""
                if case_timeout_s > 0:
                    signal.setitimer(signal.ITIMER_REAL, case_timeout_s)
                try:
                    analyze_once(path)
                except DiagError as exc:
                    message = str(exc)
                    outcome = "multiline" if "\n" in message.strip() else "clean"
                    report.errors[_error_kind(message)] += 1
                    detail = message
                except CaseTimeout:
                    outcome, detail = "hang", f"over {case_timeout_s} s"
                except Exception:  # anything else is a traceback a user would see
                    outcome, detail = "traceback", traceback.format_exc()
                finally:
                    if case_timeout_s > 0:
                        signal.setitimer(signal.ITIMER_REAL, 0)
                peak = peak_rss_mb()
                if peak > memory_limit_mb and rss_before <= memory_limit_mb:
                    outcome, detail = "memory", f"peak RSS {peak:.0f} MB (was {rss_before:.0f} MB)"
                report.outcomes["clean" if outcome == "clean" else outcome] += 1
                if outcome not in ("ok", "clean"):
                    failure = {"case": index, "outcome": outcome, "mutations": applied, "detail": detail[-3000:]}
                    report.failures.append(failure)
                    if out_dir is not None:
                        out_dir.mkdir(parents=True, exist_ok=True)
                        (out_dir / f"case-{index}.bin").write_bytes(data)
                        (out_dir / f"case-{index}.json").write_text(json.dumps(failure, indent=1))
                report.cases += 1
                if progress_every and report.cases % progress_every == 0:
                    print(f"# {report.cases}/{count} cases, {len(report.failures)} failures, "
                          f"{time.monotonic() - began:.0f} s, peak {peak:.0f} MB", file=sys.stderr, flush=True)
    finally:
        if previous is not None:
            signal.signal(signal.SIGALRM, previous)
    report.peak_rss_mb = peak_rss_mb()
    report.seconds = time.monotonic() - began
    return report


def _error_kind(message: str) -> str:
    """A DiagError's message without the file path, numbers and details: groups alike errors."""
    text = message.split(": ", 1)[1] if message.startswith("/") and ": " in message else message
    words = [w for w in text.replace(";", " ").split()[:6] if not any(c.isdigit() for c in w)]
    return " ".join(words)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fuzz_analyze", description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=100_000, help="how many cases (default 100000)")
    parser.add_argument("--seed", type=int, default=1, help="fuzz seed (default 1)")
    parser.add_argument("--start", type=int, default=0, help="first case index (to run in parts)")
    parser.add_argument("--replay", type=int, help="run only this case and print its traceback")
    parser.add_argument("--out", type=Path, help="write failing inputs and a summary JSON here")
    parser.add_argument("--case-timeout", type=float, default=CASE_TIMEOUT_S, help="seconds before a case is a hang")
    parser.add_argument("--memory-limit-mb", type=float, default=MEMORY_LIMIT_MB, help="peak RSS bar (default 1024)")
    parser.add_argument("--progress", type=int, default=5000, help="print progress every N cases (0: never)")
    args = parser.parse_args(argv)
    os.environ.setdefault("NUMPY_MADVISE_HUGEPAGE", "0")  # as diag analyze does
    start, count = (args.replay, 1) if args.replay is not None else (args.start, args.cases)
    report = run_cases(args.seed, start, count, args.out, args.case_timeout, args.memory_limit_mb, args.progress)
    summary = {"seed": args.seed, "start": start, **report.to_json()}
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"summary-{args.seed}-{start}.json").write_text(json.dumps(summary, indent=1))
    for failure in report.failures[:5]:
        print(f"case {failure['case']} ({failure['outcome']}, {'+'.join(failure['mutations'])}):\n{failure['detail']}",
              file=sys.stderr)
    print(json.dumps(summary))
    return 1 if report.failures else 0


if __name__ == "__main__":
    sys.exit(main())

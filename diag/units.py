"""Byte sizes and rates: parsing user input and printing human units.

Sizes follow nccl-tests (`-b 1K -e 64M`): K/M/G/T are binary (1K = 1024 bytes). An explicit decimal
suffix (KB, MB, GB) is decimal, so "12589824", "12M" and "12MiB" all mean what they say.
Rates follow tc and iperf: "1gbit" = 1e9 bit/s, "100mbit", "1000kbit"; "125MBps" = bytes per second.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

from diag.errors import DiagError

_BINARY = {"": 1, "B": 1, "K": 1 << 10, "KIB": 1 << 10, "M": 1 << 20, "MIB": 1 << 20,
           "G": 1 << 30, "GIB": 1 << 30, "T": 1 << 40, "TIB": 1 << 40}
_DECIMAL = {"KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")

_RATE_UNITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12,
               "bps": 8, "kbps": 8e3, "mbps": 8e6, "gbps": 8e9}
_RATE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]+)\s*$")


# TCP payload of a full-size segment on a 1500-byte Ethernet MTU with TCP timestamps (1500 - 20 IP - 20 TCP
# - 12 options): the segment size diag assumes wherever it does not know one (the analyzer without a SYN, the
# link matrix turning goodput into segments).
ETHERNET_MSS = 1448
# No per-rank buffer is larger (and a 400-digit size must be an error, not an overflow in float()).
MAX_SIZE_BYTES = 1 << 40
# A size sweep longer than this is a typo (e.g. --factor 1.0000001), not a plan.
MAX_SIZES = 1000


def parse_size(text: str) -> int:
    """'512K' -> 524288, '12589824' -> 12589824, '1.5M' -> 1572864, '200MB' -> 200000000."""
    match = _SIZE_RE.match(str(text))
    if not match:
        raise DiagError(f"bad size {text!r}: use bytes or a unit, e.g. 1024, 512K, 64M, 12589824")
    number, unit = match.groups()
    unit = unit.upper()
    factor = _BINARY.get(unit) or _DECIMAL.get(unit)
    if factor is None:
        raise DiagError(f"bad size unit in {text!r}: use K, M, G (binary) or KB, MB, GB (decimal)")
    if len(number) > 40:
        raise DiagError(f"size {text[:20]}... is absurdly long; sizes go up to {human_bytes(MAX_SIZE_BYTES)}")
    value = Fraction(number) * factor  # exact: no float rounding or overflow
    if value.denominator != 1:
        raise DiagError(f"size {text!r} is not a whole number of bytes")
    if value > MAX_SIZE_BYTES:
        raise DiagError(f"size {text!r} is larger than {human_bytes(MAX_SIZE_BYTES)} per rank; use a smaller size")
    return int(value)


def parse_size_list(text: str) -> list[int]:
    """'1,512K,12589824,200M' -> sorted unique byte counts."""
    items = [item for item in str(text).split(",") if item.strip()]
    if not items:
        raise DiagError("empty size list: give sizes like --sizes 1K,1M,64M")
    return sorted({parse_size(item) for item in items})


def geometric_sizes(min_bytes: int, max_bytes: int, factor: float) -> list[int]:
    """nccl-tests' -b/-e/-f: min, min*f, ... up to and including max."""
    if min_bytes <= 0 or max_bytes < min_bytes:
        raise DiagError(f"bad size range {min_bytes}..{max_bytes}: need 0 < --min <= --max")
    if not (math.isfinite(factor) and factor > 1):
        raise DiagError(f"--factor must be a number > 1, got {factor}")
    steps = math.log(max_bytes / min_bytes) / math.log(factor) if max_bytes > min_bytes else 0.0
    if steps + 1 > MAX_SIZES:
        raise DiagError(f"--factor {factor} makes {steps + 1:.0f} sizes from {min_bytes} to {max_bytes} B "
                        f"(at most {MAX_SIZES}); use a larger --factor, e.g. 2, or list --sizes")
    sizes = []
    size = float(min_bytes)
    while size <= max_bytes * (1 + 1e-9):
        sizes.append(round(size))
        size *= factor
    return sorted(set(sizes))


def parse_rate_bps(text: str) -> float:
    """'1gbit' -> 1e9 (bits per second), as tc understands rates."""
    match = _RATE_RE.match(str(text))
    unit = match.group(2).lower() if match else ""
    if not match or unit not in _RATE_UNITS:
        raise DiagError(f"bad rate {text!r}: use a number and a unit, e.g. 100mbit, 1gbit, 2.5gbit")
    value = float(match.group(1)) * _RATE_UNITS[unit]
    if not (0 < value < 1e15):
        raise DiagError(f"rate {text!r} must be positive and below 1000 Tbit/s")
    return value


def human_bytes(n: float) -> str:
    """1536 -> '1.5 KiB' (binary units, as sizes are given)."""
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            if unit == "B":
                return f"{int(n)} B"
            return f"{n:.3g} {unit}" if n < 100 else f"{n:.0f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


# The one rate unit people read, in the terminal, the report and the plots: MB/s, 1e6 bytes per second.
# Bytes, because a collective's sizes, algbw and busbw are bytes (nccl-tests' GB/s are bytes too: 1 GB/s =
# 1000 MB/s); one fixed scale, because 4.7 MB/s beside 1.25 GB/s reads as a smaller number; mega, because the
# links diag measures (100 Mbit/s .. 10 Gbit/s: 12.5 .. 1250 MB/s) then print as 2-4 digits. Machine outputs
# (JSON, CSV) keep base units (_Bps: bytes per second); link rates given to tc keep tc's syntax (200mbit).
RATE_UNIT = "MB/s"
RATE_SCALE = 1e6


def rate_number(bytes_per_s: float) -> str:
    """A rate in RATE_UNIT without the unit: 3 significant digits, whole numbers from 100 up."""
    value = float(bytes_per_s) / RATE_SCALE
    if not math.isfinite(value):
        return str(value)
    if abs(value) >= 100:
        return f"{value:.0f}"
    return f"{value:.3g}"


def human_rate(bytes_per_s: float) -> str:
    """A rate for people, always in RATE_UNIT: '4.7 MB/s', '1250 MB/s', '0.0125 MB/s'."""
    return f"{rate_number(bytes_per_s)} {RATE_UNIT}"


def human_bits(bits_per_s: float) -> str:
    """A rate given in bits per second (tc, iperf3), shown in RATE_UNIT like every other rate."""
    return human_rate(float(bits_per_s) / 8)


def shaped_rate(bits_per_s: float) -> str:
    """A rate set on a link, as tc is told it and as people read it: '200mbit (25 MB/s)'."""
    value = float(bits_per_s)
    for unit, scale in (("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:g}{unit} ({human_bits(value)})"
    return f"{value:g}bit ({human_bits(value)})"


def human_time(seconds: float) -> str:
    s = float(seconds)
    if s >= 1:
        return f"{s:.3g} s"
    if s >= 1e-3:
        return f"{s * 1e3:.3g} ms"
    return f"{s * 1e6:.3g} us"

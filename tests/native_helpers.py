"""Read a capture with the C kernel and with its numpy twin, and hold the two results to each other."""

from __future__ import annotations

import importlib
import os
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bench.fuzz_analyze import pcapng_block, pcapng_option
from diag.capture import pcapfile, reader
from diag.errors import DiagError
from tests import decode_twin

BUILD_COMMAND = "python -c 'import setuptools; setuptools.setup()' build_ext --inplace"


def need_kernels(*names: str) -> None:
    """Skip (with the build command) when a C kernel is not built; under CI (CI set) fail instead."""
    missing = []
    for name in names:
        try:
            importlib.import_module(f"diag.capture.{name}")
        except ImportError as exc:
            missing.append(f"{name} ({exc})")
    if missing:
        message = f"the C kernel(s) {', '.join(missing)} not built; build them with `{BUILD_COMMAND}`"
        if os.environ.get("CI"):
            pytest.fail(message + " - under CI the kernels must be built")
        pytest.skip(message)


def claim_caplen(pcap: bytes, record: int, claim: int) -> bytes:
    """A copy of a little-endian pcap whose record number `record` (0-based) claims `claim` captured bytes."""
    bad = bytearray(pcap)
    at = 24
    for _ in range(record):
        at += 16 + struct.unpack_from("<I", bad, at + 8)[0]
    struct.pack_into("<I", bad, at + 8, claim)
    return bytes(bad)


def read(path: Path, use_kernel: bool, first_frame: int = 1) -> pcapfile.ReadResult | str:
    """The ReadResult (by the kernel, or by its numpy twin), or the one-line DiagError message."""
    try:
        if use_kernel:
            return reader.read_capture(path, first_frame=first_frame)
        return decode_twin.read_capture(path, first_frame=first_frame)
    except DiagError as exc:
        return f"DiagError: {exc}"


def comparable(result: pcapfile.ReadResult | str) -> Any:
    """Everything of a ReadResult, endpoint ids replaced by their (address, port)."""
    if isinstance(result, str):
        return result
    endpoints = result.endpoints
    columns = {}
    for name, column in result.columns.items():
        assert column.dtype == np.dtype(pcapfile.COLUMN_DTYPES[name]), (name, column.dtype)
        assert column.ndim == 1 and column.size == result.packets
        columns[name] = [endpoints[i] for i in column.tolist()] if name in ("src", "dst") else column.tolist()
    syns = [(s.frame, s.ts_ns, endpoints[s.src], endpoints[s.dst], s.flags, s.mss, s.wscale, s.sack_permitted,
             s.timestamps) for s in result.syns]
    return {
        "columns": columns, "syns": syns, "frames": result.frames,
        "skipped": list(result.skipped.items()),  # key order too: it reaches the JSON
        "linktypes": result.linktypes, "snaplen": result.snaplen, "file_format": result.file_format,
        "warnings": result.warnings, "endpoints": sorted(set(endpoints)),
    }


def assert_twins(path: Path, first_frame: int = 1) -> pcapfile.ReadResult | str:
    """Kernel and twin give the same result (or the same error) for path; returns the kernel's."""
    fast = read(path, True, first_frame)
    twin = read(path, False, first_frame)
    a, b = comparable(fast), comparable(twin)
    if a != b:
        if isinstance(a, str) or isinstance(b, str):
            raise AssertionError(f"{path}: kernel {str(a)[:300]!r} vs twin {str(b)[:300]!r}")
        for key in a:
            if key == "columns":
                for name in a[key]:
                    x, y = a[key][name], b[key][name]
                    if x != y:
                        first = next((i for i, (u, v) in enumerate(zip(x, y, strict=False)) if u != v), min(len(x), len(y)))
                        raise AssertionError(f"{path}: column {name} differs first at row {first} "
                                             f"(kernel {x[first:first + 3]}, twin {y[first:first + 3]}; "
                                             f"{len(x)} vs {len(y)} rows)")
            elif a[key] != b[key]:
                raise AssertionError(f"{path}: {key}: kernel {str(a[key])[:300]} vs twin {str(b[key])[:300]}")
    return fast


def pcapng_capture(sections: list[tuple[str, list[tuple[int, int]], list[tuple[int, int, bytes, bool]]]]) -> bytes:
    """sections: (byte order, interfaces (link type, if_tsresol byte), packets (interface, ticks, frame,
    simple block)); a packet's interface -1 means a custom block instead."""
    out = bytearray()
    for endian, interfaces, packets in sections:
        out += pcapng_block(endian, 0x0A0D0D0A, struct.pack(endian + "IHHq", 0x1A2B3C4D, 1, 0, -1))
        for linktype, resolution in interfaces:
            options = pcapng_option(endian, 9, bytes([resolution])) + b"\0" * 4 if resolution >= 0 else b""
            out += pcapng_block(endian, 1, struct.pack(endian + "HHI", linktype, 0, 262144) + options)
        for iface, ticks, frame, simple in packets:
            if iface < 0:
                out += pcapng_block(endian, 0x40000BAD, struct.pack(endian + "I", 1) + frame[:8])
            elif simple:
                out += pcapng_block(endian, 3, struct.pack(endian + "I", len(frame)) + frame)
            else:
                out += pcapng_block(endian, 6, struct.pack(endian + "IIIII", iface, ticks >> 32, ticks & 0xFFFFFFFF,
                                                           len(frame), len(frame)) + frame)
    return bytes(out)

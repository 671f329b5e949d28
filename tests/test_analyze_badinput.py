"""Bad input never makes a traceback: a one-line DiagError for broken files, a counted skip for odd packets."""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path

import pytest
from capture_helpers import LINK_HEADERS, synthetic_flow, write_pcap
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from diag.capture import analyze_files
from diag.errors import DiagError


def _good_pcap(tmp_path: Path) -> Path:
    frames = [(t, LINK_HEADERS[1](ip, False)) for t, ip in synthetic_flow()]
    return write_pcap(tmp_path / "good.pcap", frames, 1)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "diag", "analyze", *args], capture_output=True, text=True,
                          timeout=60)


@pytest.mark.parametrize("content,needle", [
    (b"", "empty"),
    (b"hello world, not a capture", "not a pcap"),
    (b"\xd4\xc3\xb2\xa1\x02\x00", "truncated"),
])
def test_broken_files_are_one_line_errors(tmp_path: Path, content: bytes, needle: str) -> None:
    path = tmp_path / "bad.pcap"
    path.write_bytes(content)
    with pytest.raises(DiagError, match=needle):
        analyze_files([path])
    proc = _cli(str(path))
    assert proc.returncode != 0
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert needle in proc.stderr


def test_missing_file_and_absurd_record_length(tmp_path: Path) -> None:
    with pytest.raises(DiagError, match="no capture file"):
        analyze_files([tmp_path / "nope.pcap"])
    good = _good_pcap(tmp_path).read_bytes()
    bad = bytearray(good)
    struct.pack_into("<I", bad, 24 + 8, 50_000_000)  # first record claims 50 MB
    path = tmp_path / "absurd.pcap"
    path.write_bytes(bytes(bad))
    with pytest.raises(DiagError, match="corrupt"):
        analyze_files([path])


def test_truncated_last_record_is_a_counted_skip(tmp_path: Path) -> None:
    good = _good_pcap(tmp_path).read_bytes()
    path = tmp_path / "cut.pcap"
    path.write_bytes(good[:-20])
    result = analyze_files([path])
    assert result["files"][0]["skipped"] == {"truncated_record": 1}
    assert result["capture"]["flagged"] is True
    assert any("cut short" in w for w in result["warnings"])


def test_odd_packets_are_counted_skips(tmp_path: Path) -> None:
    from scapy.layers.inet import ICMP, IP, TCP, UDP
    from scapy.layers.l2 import ARP, Ether

    ether = Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02")
    good = ether / IP(src="10.0.0.1", dst="10.0.0.2") / TCP(sport=1, dport=2, flags="A") / (b"x" * 10)
    bad_ihl = bytearray(bytes(good))
    bad_ihl[14] = 0x42  # IHL 2 words
    bad_doff = bytearray(bytes(good))
    bad_doff[14 + 20 + 12] = 0xF0  # TCP header of 60 bytes in a 40-byte IP packet + 10 payload
    fragment = ether / IP(src="10.0.0.1", dst="10.0.0.2", flags="MF", frag=0) / TCP(sport=1, dport=2) / (b"y" * 40)
    later_fragment = ether / IP(src="10.0.0.1", dst="10.0.0.2", frag=10, proto=6) / (b"z" * 40)
    frames = [
        bytes(good),
        bytes(ether / IP(src="10.0.0.1", dst="10.0.0.2") / UDP(sport=1, dport=2) / b"u"),
        bytes(ether / IP(src="10.0.0.1", dst="10.0.0.2") / ICMP()),
        bytes(ether / ARP()),
        bytes(bad_ihl),
        bytes(bad_doff),
        bytes(fragment),
        bytes(later_fragment),
        bytes(good)[:30],  # snaplen shorter than the headers
        b"\x01\x02",        # shorter than the link header
    ]
    path = write_pcap(tmp_path / "odd.pcap", [(1.0 + i * 0.001, f) for i, f in enumerate(frames)], 1)
    result = analyze_files([path])
    skipped = result["files"][0]["skipped"]
    assert result["capture"]["packets"] == 1
    assert skipped == {"non_tcp": 2, "non_ip": 2, "bad_header_length": 2, "fragment": 2, "truncated_headers": 1}
    assert result["connections"][0]["directions"]["a->b"]["payload_bytes"] == 10


def test_unsupported_link_type(tmp_path: Path) -> None:
    path = write_pcap(tmp_path / "lt.pcap", [(1.0, b"\x00" * 40)], 147)
    with pytest.raises(DiagError, match="link type 147"):
        analyze_files([path])


_GOOD_CACHE: dict[str, bytes] = {}


def _good_bytes() -> bytes:
    if "b" not in _GOOD_CACHE:
        frames = [(t, LINK_HEADERS[1](ip, False)) for t, ip in synthetic_flow()]
        frames += [(t + 1, LINK_HEADERS[1](ip, True)) for t, ip in synthetic_flow(ipv6=True)]
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            _GOOD_CACHE["b"] = write_pcap(Path(tmp) / "g.pcap", frames, 1).read_bytes()
    return _GOOD_CACHE["b"]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.integers(min_value=0, max_value=10_000), st.integers(min_value=0, max_value=255)),
                min_size=1, max_size=12),
       st.integers(min_value=0, max_value=12_000), st.booleans())
def test_fuzz_random_corruption_never_tracebacks(tmp_path: Path, flips: list[tuple[int, int]], cut: int,
                                                 gz: bool) -> None:
    data = bytearray(_good_bytes())
    for position, value in flips:
        data[position % len(data)] = value
    data = data[: max(0, len(data) - cut)] if cut < len(data) else data
    path = tmp_path / "fuzz.pcap"
    if gz:
        import gzip

        path.write_bytes(gzip.compress(bytes(data))[: max(10, len(data) // 2)] if cut % 3 == 0
                         else gzip.compress(bytes(data)))
    else:
        path.write_bytes(bytes(data))
    try:
        result = analyze_files([path])
    except DiagError as exc:
        assert "\n" not in str(exc)
        return
    assert result["capture"]["packets"] >= 0
    for conn in result["connections"]:
        for d in conn["directions"].values():
            assert d["packets"] >= 0 and d["payload_bytes"] >= 0

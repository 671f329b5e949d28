"""Hostile captures in bounded memory (issue 24, points 3 and 4): the whole `diag analyze --json` process,
its peak RSS measured with os.wait4.

- A gzip capture whose first MiB is UDP and whose rest is two million tiny TCP packets: one regular file is
  always read in chunks, whatever its first bytes say, so its memory does not grow with its packets.
- SYN-only captures (a port scan, a busy server's listen queue): memory per connection stays small, and the
  JSON lists the MAX_LISTED_CONNECTIONS busiest connections in full, with `connections_omitted` for the rest.

Captures are written record by record with struct (scapy is far too slow for millions of packets).
"""

from __future__ import annotations

import gzip
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from native_helpers import need_kernels

from diag.capture import source
from diag.capture.analysis import analyze_files

REPO = Path(__file__).resolve().parent.parent
T0 = 1_700_000_000


def _ipv4(src: bytes, dst: bytes, proto: int, payload: bytes) -> bytes:
    return struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(payload), 0, 0x4000, 64, proto, 0, src, dst) + payload


def _tcp(sport: int, dport: int, seq: int, ack: int, flags: int, payload: bytes = b"") -> bytes:
    return struct.pack("!HHIIBBHHH", sport, dport, seq, ack, 5 << 4, flags, 64240, 0, 0) + payload


def _record(i: int, data: bytes) -> bytes:
    us = i * 10
    return struct.pack("<IIII", T0 + us // 1_000_000, us % 1_000_000, len(data), len(data)) + data


def write_raw_ip_pcap(path: Path, packets: object, compress: bool = False) -> Path:
    """packets: an iterable of raw IPv4 packets (link type 101), stamped 10 us apart."""
    opener = gzip.open(path, "wb", compresslevel=1) if compress else path.open("wb")  # noqa: SIM115
    with opener as out:
        out.write(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 101))
        batch: list[bytes] = []
        for i, data in enumerate(packets):  # type: ignore[call-overload]
            batch.append(_record(i, data))
            if len(batch) == 1 << 16:
                out.write(b"".join(batch))
                batch.clear()
        out.write(b"".join(batch))
    return path


def udp_then_tiny_tcp(udp: int, tcp: int) -> object:
    a, b = bytes([10, 0, 0, 1]), bytes([10, 0, 0, 2])
    datagram = _ipv4(a, b, 17, struct.pack("!HHHH", 5000, 5001, 8 + 1372, 0) + b"u" * 1372)
    for _ in range(udp):  # 800 of them fill the first MiB: a sample of it holds no TCP row
        yield datagram
    for i in range(tcp // 2):  # one connection: 1-byte segments, each ACKed
        yield _ipv4(a, b, 6, _tcp(40000, 80, 1000 + i, 5000, 0x18, b"x"))
        yield _ipv4(b, a, 6, _tcp(80, 40000, 5000, 1001 + i, 0x10))


def syn_only(connections: int) -> object:
    """One SYN per connection, each from its own address and port (a spoofed SYN flood: the worst case, one
    host per connection too)."""
    dst = bytes([192, 168, 0, 1])
    for i in range(connections):
        src = bytes([10, (i >> 16) & 0xFF, (i >> 8) & 0xFF, i & 0xFF])
        yield _ipv4(src, dst, 6, _tcp(40000 + i % 20000, 80, i * 7919 % (1 << 32), 0, 0x02))


# Started from pytest, a child would report pytest's own peak too: Linux carries a process's peak RSS into
# the processes it forks and through exec. This small shim forks and waits for the analysis itself.
PEAK_SHIM = """
import os, sys
pid = os.fork()
if pid == 0:
    os.execv(sys.executable, [sys.executable, *sys.argv[1:]])
_, status, usage = os.wait4(pid, 0)
print(os.waitstatus_to_exitcode(status), usage.ru_maxrss, file=sys.stderr)
"""


def analyze_peak_mb(pcap: Path, *args: str) -> tuple[dict, float]:
    """`diag analyze --json` in a fresh process: its JSON and its peak RSS (MB, wait4's rusage)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out_path, err_path = pcap.with_suffix(".json"), pcap.with_suffix(".err")
    with out_path.open("wb") as out, err_path.open("wb") as err:
        subprocess.run([sys.executable, "-c", PEAK_SHIM, "-m", "diag", "analyze", str(pcap), "--json", *args],
                       cwd=REPO, stdout=out, stderr=err, env=env, check=True, timeout=600)
    code, peak_kib = (int(v) for v in err_path.read_text().split()[-2:])
    assert code == 0, err_path.read_text()[-2000:]
    return json.loads(out_path.read_text()), peak_kib / 1024


@pytest.fixture(autouse=True)
def _kernels() -> None:
    need_kernels("_cpcap", "_ctcp")


def test_gzip_capture_with_a_harmless_first_mib_is_read_in_bounded_memory(tmp_path: Path) -> None:
    """800 UDP datagrams (1.1 MB) then 3.2 M tiny TCP packets, gzip. Chosen from the first MiB, the analysis
    used to hold such a file in memory (298 MB at 2 M packets, 2.03 GB at 20 M); in chunks it stays near
    100 MB (95 MB at 2 M and 78 MB at 0.5 M without the chunk cache: what grows is the TCP state's segment
    ends, kept in memory up to SPILL_WINDOW a direction). 3.2 M packets are more than source.CACHE_BYTES
    keeps, so every pass reads the file."""
    pcap = write_raw_ip_pcap(tmp_path / "hostile.pcap.gz", udp_then_tiny_tcp(800, 3_200_000), compress=True)
    out, peak_mb = analyze_peak_mb(pcap, "--no-series")
    assert out["capture"]["packets"] == 3_200_000
    assert out["files"][0]["skipped"] == {"non_tcp": 800}
    assert peak_mb < 160, f"peak {peak_mb:.0f} MB"


def test_syn_only_connections_cost_little_and_the_json_lists_the_busiest(tmp_path: Path) -> None:
    """200 k SYN-only connections: a few hundred bytes each, and a JSON of MAX_LISTED_CONNECTIONS of them."""
    n = 200_000
    pcap = write_raw_ip_pcap(tmp_path / "syn.pcap", syn_only(n))
    out, peak_mb = analyze_peak_mb(pcap, "--no-series")
    listed = source.MAX_LISTED_CONNECTIONS
    assert len(out["connections"]) == listed
    omitted = out["connections_omitted"]
    assert omitted == {"count": n - listed, "packets": n - listed, "payload_bytes": 0}
    assert out["capture"]["packets"] == n
    assert peak_mb < 250, f"peak {peak_mb:.0f} MB for {n} connections"


def test_listed_connections_are_the_busiest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With more connections than the list holds: the ones that moved the most bytes (then packets) are listed
    in full, in order of first appearance, and the rest are counted in connections_omitted."""
    a = bytes([10, 9, 0, 1])

    def packets() -> object:
        for i in range(30):  # connection i sends i bytes of data (after a SYN)
            src = bytes([10, 9, 1, i])
            yield _ipv4(src, a, 6, _tcp(1000 + i, 80, 1, 0, 0x02))
            if i:
                yield _ipv4(src, a, 6, _tcp(1000 + i, 80, 2, 0, 0x18, b"x" * i))

    pcap = write_raw_ip_pcap(tmp_path / "thirty.pcap", packets())
    full = analyze_files([pcap])
    assert len(full["connections"]) == 30 and "connections_omitted" not in full
    monkeypatch.setattr(source, "MAX_LISTED_CONNECTIONS", 5)
    out = analyze_files([pcap])
    assert [c["stream"] for c in out["connections"]] == [25, 26, 27, 28, 29]
    assert out["connections"] == full["connections"][25:]  # listed connections are analyzed exactly as before
    assert out["connections_omitted"] == {"count": 25, "packets": 25 + 24, "payload_bytes": sum(range(25))}


def test_json_and_out_encode_the_document_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    from diag.cli import analyze as cli

    pcap = write_raw_ip_pcap(tmp_path / "s.pcap", syn_only(3))
    calls: list[int] = []
    real = json.dumps
    monkeypatch.setattr(json, "dumps", lambda obj, *a, **k: calls.append(1) or real(obj, *a, **k))
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    assert cli.run(parser.parse_args([str(pcap), "--json", "--out", str(tmp_path / "o.json")])) == 0
    assert len(calls) == 1
    assert (tmp_path / "o.json").read_text() == capsys.readouterr().out

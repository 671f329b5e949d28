"""The reader on synthetic captures built with scapy: every link type, IPv4/IPv6, pcap flavours, pcapng, gzip.

Each file holds the same flow with known answers (capture_helpers.SYNTHETIC_EXPECTED), and tshark, where
installed, must agree with both the answers and diag.
"""

from __future__ import annotations

import gzip
import shutil
import subprocess
from pathlib import Path

import pytest
from capture_helpers import (
    LINK_HEADERS,
    SYNTHETIC_EXPECTED,
    diag_directions,
    synthetic_flow,
    tshark_directions,
    write_pcap,
)

from diag.capture import analyze_files, pcapfile

LINKS = [1, "vlan", 113, 276, 101, 0]


def _check_expected(result: dict) -> None:
    assert len(result["connections"]) == 1
    conn = result["connections"][0]
    for direction, expected in SYNTHETIC_EXPECTED.items():
        got = {key: conn["directions"][direction][key] for key in expected}
        assert got == expected, direction


@pytest.mark.parametrize("ipv6", [False, True], ids=["ipv4", "ipv6"])
@pytest.mark.parametrize("link", LINKS, ids=[str(x) for x in LINKS])
def test_link_types_give_the_known_answers(tmp_path: Path, link: object, ipv6: bool) -> None:
    frames = [(t, LINK_HEADERS[link](ip, ipv6)) for t, ip in synthetic_flow(ipv6)]
    pcap = write_pcap(tmp_path / "flow.pcap", frames, 1 if link == "vlan" else int(link))  # type: ignore[call-overload]
    result = analyze_files([pcap])
    _check_expected(result)
    conn = result["connections"][0]
    assert conn["a"] == ("[fd00::1]:40000" if ipv6 else "10.9.0.1:40000")
    ab = conn["directions"]["a->b"]
    assert ab["window"]["scale"] == 7 and ab["segment_sizes"]["mss"] == 1000
    assert ab["rtt_ms"]["n"] >= 3 and ab["ts_rtt_ms"]["n"] >= 3
    assert conn["directions"]["b->a"]["acks"]["pure"] >= 6
    if shutil.which("tshark"):
        theirs = tshark_directions(pcap)
        ours = diag_directions(result)
        for key, t in theirs.items():
            for name in ("packets", "payload_bytes"):
                assert ours[key][name] == t[name]
            for name in ("retransmissions", "fast_retransmissions", "dup_acks", "zero_windows"):
                assert ours[key][name] == len(t[name]), name


@pytest.mark.parametrize("nanosecond,big_endian", [(True, False), (False, True), (True, True)])
def test_pcap_variants(tmp_path: Path, nanosecond: bool, big_endian: bool) -> None:
    frames = [(t, LINK_HEADERS[1](ip, False)) for t, ip in synthetic_flow()]
    pcap = write_pcap(tmp_path / "v.pcap", frames, 1, nanosecond=nanosecond, big_endian=big_endian)
    result = analyze_files([pcap])
    _check_expected(result)
    assert abs(result["connections"][0]["directions"]["a->b"]["first_ts"] - frames[0][0]) < 1e-5


def test_gzip_and_pcapng(tmp_path: Path) -> None:
    frames = [(t, LINK_HEADERS[1](ip, False)) for t, ip in synthetic_flow()]
    pcap = write_pcap(tmp_path / "f.pcap", frames, 1)
    gz = tmp_path / "f.pcap.gz"
    gz.write_bytes(gzip.compress(pcap.read_bytes()))
    _check_expected(analyze_files([gz]))
    from scapy.utils import PcapNgWriter  # scapy writes pcapng with microsecond if_tsresol defaults

    ng = tmp_path / "f.pcapng"
    writer = PcapNgWriter(str(ng))
    from scapy.layers.l2 import Ether

    for ts, data in frames:
        packet = Ether(data)
        packet.time = ts
        writer.write(packet)
    writer.close()
    result = analyze_files([ng])
    _check_expected(result)
    assert result["files"][0]["format"] == "pcapng"
    ng_gz = tmp_path / "f.pcapng.gz"
    ng_gz.write_bytes(gzip.compress(ng.read_bytes()))
    _check_expected(analyze_files([ng_gz]))
    if shutil.which("editcap"):  # Wireshark's own pcapng writer, nanosecond resolution
        ws = tmp_path / "ws.pcapng"
        subprocess.run(["editcap", "-F", "pcapng", "--set-tsresol", "1000000000", str(pcap), str(ws)],
                       check=False, capture_output=True)
        if not ws.exists():
            subprocess.run(["editcap", "-F", "pcapng", str(pcap), str(ws)], check=True, capture_output=True)
        _check_expected(analyze_files([ws]))


def test_snaplen_truncated_packets_keep_true_payload_lengths(tmp_path: Path) -> None:
    frames = [(t, LINK_HEADERS[1](ip, False)) for t, ip in synthetic_flow()]
    pcap = write_pcap(tmp_path / "s.pcap", frames, 1, snaplen=66)  # Ethernet + IPv4 + TCP with 12 option bytes
    _check_expected(analyze_files([pcap]))


def test_two_files_are_merged_in_time_order(tmp_path: Path) -> None:
    frames = [(t, LINK_HEADERS[1](ip, False)) for t, ip in synthetic_flow()]
    first = write_pcap(tmp_path / "1.pcap", frames[:9], 1)
    second = write_pcap(tmp_path / "2.pcap", frames[9:], 1)
    result = analyze_files([second, first])
    _check_expected(result)
    assert result["capture"]["frames"] == len(frames)


@pytest.mark.parametrize("big_endian", [False, True])
def test_vectorized_record_finder_matches_a_record_by_record_walk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  big_endian: bool) -> None:
    """Payloads full of decoy pcap headers, a clock jump past the finder's span and a change of the top byte
    of ts_sec, read in tiny chunks: the numpy record finder must give exactly the record-by-record result."""
    import struct

    import numpy as np
    from scapy.layers.inet import IP, TCP
    from scapy.layers.l2 import Ether

    from tests.decode_twin import _PcapWalker, read_capture

    # the numpy twin's record finder (the C kernel is held to the twin in test_native_pcap.py)
    endian = ">" if big_endian else "<"
    frames: list[tuple[float, bytes]] = []
    seq = 1000
    clocks = [0x0FFFFFFE + i * 0.01 for i in range(300)]              # crosses top byte 0x0F -> 0x10
    clocks += [0x10000004 + (1 << 17) + i * 0.01 for i in range(300)]  # jumps by more than CHUNK_SPAN_S
    for i, ts in enumerate(clocks):
        decoy = struct.pack(endian + "IIII", int(ts), 5, 20, 20) * (i % 7)  # plausible header, wrong place
        payload = decoy + bytes([i % 251]) * (i % 50)
        frame = bytes(Ether() / IP(src="10.0.0.1", dst="10.0.0.2") / TCP(sport=4000, dport=5000, seq=seq,
                                                                         flags="A") / payload)
        seq += len(payload)
        frames.append((ts, frame))
    pcap = write_pcap(tmp_path / "decoys.pcap", frames, 1, big_endian=big_endian)
    monkeypatch.setattr(pcapfile, "CHUNK_BYTES", 4096)  # many chunks, many carried partial records
    fast = read_capture(pcap)
    monkeypatch.setattr(_PcapWalker, "_vectorized", lambda self, buf, arr: None)
    walked = read_capture(pcap)
    assert fast.frames == walked.frames == len(frames)
    assert fast.skipped == walked.skipped == {}
    for name in pcapfile.COLUMN_DTYPES:
        assert np.array_equal(fast.columns[name], walked.columns[name]), name
    assert np.array_equal(fast.columns["ts_ns"] // 1_000_000_000, np.array([int(t) for t in clocks]))

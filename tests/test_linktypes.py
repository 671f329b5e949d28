"""Link types as libpcap reads them, and the same answer from a pcap and a pcapng: the FCS bits of the link-type
field are masked off (0x04000001 is Ethernet with an FCS), a file of a link type diag does not read is refused in
words in both formats, a pcapng that mixes keeps the rest; a tunnel deeper than diag follows says so."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from capture_helpers import LINK_HEADERS, synthetic_flow, write_pcap
from encapsulation_helpers import _ether, _ip_over
from native_helpers import assert_twins, need_kernels, pcapng_capture

from diag.capture import analyze_files
from diag.errors import DiagError


def _analyze_cli(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "diag", "analyze", str(path)], capture_output=True, text=True,
                          timeout=60)


def test_linktype_with_fcs_bits_is_ethernet(tmp_path: Path) -> None:
    need_kernels("_cpcap")
    flow = synthetic_flow()
    # Ethernet frames with a 4-byte FCS after the IP packet, as a NIC that keeps the FCS captures them.
    frames = [(t, LINK_HEADERS[1](ip, False) + b"\xde\xad\xbe\xef") for t, ip in flow]
    plain = analyze_files([write_pcap(tmp_path / "plain.pcap", [(t, LINK_HEADERS[1](ip, False)) for t, ip in flow], 1)],
                          with_series=False)
    path = write_pcap(tmp_path / "fcs.pcap", frames, 0x04000001)
    result = assert_twins(path)
    assert not isinstance(result, str), result
    assert result.linktypes == [1] and result.packets == len(flow) and not result.skipped
    fcs = analyze_files([path], with_series=False)
    assert [c["directions"] for c in fcs["connections"]] == [c["directions"] for c in plain["connections"]]


def test_unsupported_linktype_is_refused_alike_in_pcap_and_pcapng(tmp_path: Path) -> None:
    need_kernels("_cpcap")
    flow = synthetic_flow()
    pcap = write_pcap(tmp_path / "radio.pcap", [(t, b"\x00" * 8 + ip) for t, ip in flow], 127)
    pcapng = tmp_path / "radio.pcapng"
    pcapng.write_bytes(pcapng_capture([("<", [(127, -1)], [(0, 1_000_000 + i, b"\x00" * 8 + ip, False)
                                                             for i, (_t, ip) in enumerate(flow)])]))
    messages = []
    for path in (pcap, pcapng):
        with pytest.raises(DiagError) as caught:
            analyze_files([path])
        message = str(caught.value)
        assert "link type 127 (802.11 radiotap) is not supported" in message
        messages.append(message.replace(str(path), "FILE"))
        twin = assert_twins(path)
        assert isinstance(twin, str) and "802.11 radiotap" in twin
        proc = _analyze_cli(path)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert proc.stderr.count("\n") == 1 and "802.11 radiotap" in proc.stderr
    assert messages[0] == messages[1]


def test_pcapng_mixing_link_types_keeps_the_rest_and_names_what_it_skipped(tmp_path: Path) -> None:
    need_kernels("_cpcap")
    flow = synthetic_flow()
    packets = [(0, 1_000_000 + i, LINK_HEADERS[1](ip, False), False) for i, (_t, ip) in enumerate(flow)]
    packets += [(1, 2_000_000 + i, b"\x00" * 8 + ip, False) for i, (_t, ip) in enumerate(flow[:3])]
    path = tmp_path / "mixed.pcapng"
    path.write_bytes(pcapng_capture([("<", [(1, -1), (127, -1)], packets)]))
    result = assert_twins(path)
    assert not isinstance(result, str), result
    assert result.packets == len(flow) and result.skipped == {"unsupported_linktype_127": 3}
    assert any("3 packets of link type 127 (802.11 radiotap) skipped" in w for w in result.warnings), result.warnings
    proc = _analyze_cli(path)
    assert proc.returncode == 0, proc.stderr
    assert "802.11 radiotap" in proc.stdout and "unsupported_linktype_127" not in proc.stdout


def test_tunnel_deeper_than_followed_is_counted_as_such(tmp_path: Path) -> None:
    """IP in IP four deep: diag follows three tunnels, so the fourth is 'tunnel_too_deep', not 'non_tcp'."""
    need_kernels("_cpcap")
    flow = synthetic_flow()
    inner = flow[0][1]
    for _ in range(4):
        inner = _ip_over("10.9.0.1", "10.9.0.2", 4, inner)
    frames = [(0.0, _ether(inner, 0x0800)), (0.1, _ether(_ip_over("10.9.0.1", "10.9.0.2", 17, b"\0" * 8), 0x0800))]
    frames += [(1.0 + t, LINK_HEADERS[1](ip, False)) for t, ip in flow]
    path = write_pcap(tmp_path / "deep.pcap", frames, 1)
    result = assert_twins(path)
    assert not isinstance(result, str), result
    assert result.skipped == {"tunnel_too_deep": 1, "non_tcp": 1}
    three_deep = _ip_over("10.9.0.1", "10.9.0.2", 4, _ip_over("10.9.0.1", "10.9.0.2", 4,
                                                             _ip_over("10.9.0.1", "10.9.0.2", 4, flow[0][1])))
    ok = assert_twins(write_pcap(tmp_path / "three.pcap", [(0.0, _ether(three_deep, 0x0800))], 1))
    assert not isinstance(ok, str) and ok.packets == 1 and not ok.skipped

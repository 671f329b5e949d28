"""The reader's C kernel (diag/capture/_cpcap.c) against its numpy twin: the same ReadResult or the same error.

Every test reads each capture twice, with the kernel and its numpy twin (native_helpers.assert_twins), and checks
that the kernel's result holds what the capture was built to hold, so that two equal failures cannot pass.
Without the kernel these tests skip with the reason, except under CI (CI set), where they fail: CI must
measure the fast path.
"""

from __future__ import annotations

import gzip
import os
import random
import shutil
import struct
import subprocess
from pathlib import Path

import pytest
from capture_helpers import LINK_HEADERS, loopback_capture, synthetic_flow, write_pcap
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from native_helpers import assert_twins, claim_caplen, comparable, need_kernels, pcapng_capture, read

from bench.fuzz_analyze import mutate, pcapng_block, seed_corpus
from diag.capture import pcapfile, reader
from diag.errors import DiagError

# computes in this process: may run beside an `alone` test (tests/conftest.py)
pytestmark = pytest.mark.in_process


@pytest.fixture(autouse=True)
def _need_kernel() -> None:
    need_kernels("_cpcap")


@pytest.fixture(params=[pcapfile.CHUNK_BYTES, 512], ids=["chunk-8MiB", "chunk-512B"])
def chunk_bytes(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> int:
    """The file read in the usual chunks, and in tiny ones (every record carried across chunks)."""
    monkeypatch.setattr(pcapfile, "CHUNK_BYTES", request.param)
    return int(request.param)


# --- synthetic captures: every link type, both IP versions, pcap flavours ------------------------------------

EXTRA_LINKS = {
    "qinq": lambda ip, v6: b"\x02" * 6 + b"\x04" * 6 + b"\x88\xa8\x00\x07\x81\x00\x00\x05"
    + (b"\x86\xdd" if v6 else b"\x08\x00") + ip,
    "null-be": lambda ip, v6: (30 if v6 else 2).to_bytes(4, "big") + ip,
    "loop": lambda ip, v6: (24 if v6 else 2).to_bytes(4, "big") + ip,
}
LINKS = [(1, 1), ("vlan", 1), ("qinq", 1), (113, 113), (276, 276), (101, 101), (12, 101), (14, 101),
         (0, 0), ("null-be", 0), ("loop", 108), ("v4", 228), ("v6", 229)]


def _frame(link: object, ip: bytes, v6: bool) -> bytes:
    if link in EXTRA_LINKS:
        return EXTRA_LINKS[link](ip, v6)  # type: ignore[index]
    if link in ("v4", "v6", 12, 14):
        return ip
    return LINK_HEADERS[link](ip, v6)  # type: ignore[index]


@pytest.mark.parametrize("ipv6", [False, True], ids=["ipv4", "ipv6"])
@pytest.mark.parametrize("link,linktype", LINKS, ids=[str(link) for link, _ in LINKS])
def test_link_types(tmp_path: Path, chunk_bytes: int, link: object, linktype: int, ipv6: bool) -> None:
    flow = synthetic_flow(ipv6)
    pcap = write_pcap(tmp_path / "f.pcap", [(t, _frame(link, ip, ipv6)) for t, ip in flow], linktype)
    result = assert_twins(pcap)
    assert not isinstance(result, str), result
    wrong_version = (linktype == 228 and ipv6) or (linktype == 229 and not ipv6)
    assert result.packets == (0 if wrong_version else len(flow))
    assert result.skipped == ({"non_ip": len(flow)} if wrong_version else {})
    if not wrong_version:
        assert sorted(result.endpoints) == sorted({("fd00::1", 40000), ("fd00::2", 5000)} if ipv6
                                                  else {("10.9.0.1", 40000), ("10.9.0.2", 5000)})
        assert [s.mss for s in result.syns] == [1000, 1000] and [s.wscale for s in result.syns] == [7, 7]
        assert int(result.columns["has_ts"].sum()) == len(flow) - 2  # every packet but the SYNs (TS last)


@pytest.mark.parametrize("nanosecond,big_endian", [(False, False), (True, False), (False, True), (True, True)])
def test_pcap_flavours_and_every_snaplen(tmp_path: Path, nanosecond: bool, big_endian: bool) -> None:
    """Both byte orders and time units, and the flow cut at every snaplen from 0 to past the headers."""
    frames = [(t, LINK_HEADERS[1](ip, False)) for t, ip in synthetic_flow()]
    frames += [(t + 1, LINK_HEADERS["vlan"](ip, True)) for t, ip in synthetic_flow(ipv6=True)]
    kept = []
    for snaplen in [*range(0, 110), 65535]:
        pcap = write_pcap(tmp_path / f"s{snaplen}.pcap", frames, 1, snaplen=snaplen, nanosecond=nanosecond,
                          big_endian=big_endian)
        result = assert_twins(pcap)
        assert not isinstance(result, str), result
        assert result.frames == len(frames)
        kept.append((result.packets, int(result.columns["has_ts"].sum()), len(result.syns)))
    # (packets, with a timestamp option, SYNs): none, the IPv4 half (22 packets, 20 with the option after
    # the SYNs, which carry it last), then the IPv6 half too
    assert sorted(set(kept)) == [(0, 0, 0), (22, 0, 2), (22, 20, 2), (44, 20, 4), (44, 40, 4)]
    assert kept[0] == (0, 0, 0) and kept[-1] == (44, 40, 4)


def test_tunnels_and_super_segments_at_every_snaplen(tmp_path: Path) -> None:
    """VXLAN, Geneve, GRE, IP in IP (nested too), super-segments and their look-alikes without TCP, cut at every
    snaplen through the outer and inner headers, also as pcapng (original lengths in enhanced and simple
    packet blocks): the same columns, tunnel bits, skip counts and their order."""
    from encapsulation_helpers import cases, write_cases

    from diag.capture.pcapfile import TUNNELS

    selected = cases()
    tcp_cases = [case for case in selected if case.tcp]
    packets = []
    for snaplen in [*range(0, 190, 3), 65535, 262144]:
        result = assert_twins(write_cases(tmp_path / f"t{snaplen}.pcap", selected, snaplen=snaplen))
        assert not isinstance(result, str), result
        assert result.frames == len(selected)
        packets.append(result.packets)
    assert packets[0] == 0 and packets[-1] == len(tcp_cases) and sorted(packets) == packets
    names = {bit: name for bit, name in TUNNELS.items()}
    assert [sorted(names[bit] for bit in names if value & bit) or None
            for value in result.columns["tunnel"].tolist()] == [sorted(c.tunnel) if c.tunnel else None
                                                                for c in tcp_cases]
    assert result.columns["plen"].tolist() == [case.payload for case in tcp_cases]
    assert result.skipped == {"non_tcp": len(selected) - len(tcp_cases)}
    frames = [(0, 1_000_000 * i, case.frame, i % 5 == 4) for i, case in enumerate(selected)]
    ng = tmp_path / "t.pcapng"
    # and the super-segments once more, cut to 128 bytes: their original length still gives the payload
    cut = [case for case in tcp_cases if case.payload > 10_000]
    ng.write_bytes(pcapng_capture([("<", [(1, 6)], frames)]) + b"".join(
        pcapng_block("<", 6, struct.pack("<IIIII", 0, 0, 99, 128, len(case.frame)) + case.frame[:128])
        for case in cut))
    result = assert_twins(ng)
    assert not isinstance(result, str) and result.packets == len(tcp_cases) + len(cut)
    assert result.columns["plen"].tolist() == [case.payload for case in tcp_cases + cut]


def test_mutated_tunnel_frames(tmp_path: Path) -> None:
    """Random bytes of the tunnel and super-segment frames' headers changed (lengths, ports, flags, types,
    option lengths), at random snaplens: kernel and twin agree on every one of them."""
    from encapsulation_helpers import cases

    rng = random.Random(20)
    frames = [bytearray(case.frame[:400]) for case in cases(payload=40) if case.payload < 10_000]
    for round_ in range(60):
        mutated = []
        for frame in frames:
            frame = bytearray(frame)
            for _ in range(rng.randint(1, 4)):
                frame[rng.randrange(min(len(frame), 160))] = rng.randrange(256)
            mutated.append((1.0 + len(mutated) * 0.001, bytes(frame)))
        path = write_pcap(tmp_path / f"m{round_}.pcap", mutated, 1, snaplen=rng.choice([64, 96, 128, 200, 65535]))
        result = assert_twins(path)
        assert not isinstance(result, str), result


def test_odd_packets_and_the_order_of_skip_reasons(tmp_path: Path) -> None:
    from scapy.layers.inet import ICMP, IP, TCP, UDP
    from scapy.layers.inet6 import IPv6, IPv6ExtHdrFragment, IPv6ExtHdrHopByHop, IPv6ExtHdrRouting
    from scapy.layers.l2 import ARP, Ether

    ether = Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02")
    good = ether / IP(src="10.0.0.1", dst="10.0.0.2") / TCP(sport=1, dport=2, flags="A") / (b"x" * 10)
    bad_ihl = bytearray(bytes(good))
    bad_ihl[14] = 0x42
    bad_doff = bytearray(bytes(good))
    bad_doff[14 + 20 + 12] = 0xF0
    small_doff = bytearray(bytes(good))
    small_doff[14 + 20 + 12] = 0x30
    v6 = ether / IPv6(src="fd00::1", dst="fd00::2")
    odd = [
        bytes(ether / IP(src="10.0.0.1", dst="10.0.0.2", flags="MF") / TCP(sport=1, dport=2) / (b"y" * 40)),
        bytes(ether / IP(src="10.0.0.1", dst="10.0.0.2", frag=10, proto=6) / (b"z" * 40)),
        bytes(ether / IP(src="10.0.0.1", dst="10.0.0.2", flags="DF") / TCP(sport=1, dport=2) / b"df"),
        bytes(v6 / IPv6ExtHdrFragment() / TCP(sport=1, dport=2)),
        bytes(v6 / IPv6ExtHdrHopByHop() / TCP(sport=1, dport=2)),   # decoded: tshark walks hop-by-hop too
        bytes(v6 / IPv6ExtHdrRouting() / TCP(sport=1, dport=2)),
        bytes(v6 / UDP(sport=1, dport=2)),
        bytes(ether / IP(src="10.0.0.1", dst="10.0.0.2") / UDP(sport=1, dport=2) / b"u"),
        bytes(ether / IP(src="10.0.0.1", dst="10.0.0.2") / ICMP()),
        bytes(ether / ARP()),
        bytes(bad_ihl), bytes(bad_doff), bytes(small_doff),
        bytes(good)[:30], bytes(good)[:14], bytes(good)[:15], b"\x01\x02", b"",
    ]
    rng = random.Random(5)
    for order in range(8):  # the skip reasons' first appearances in different orders
        frames = [bytes(good), *rng.sample(odd, len(odd))]
        path = write_pcap(tmp_path / f"odd{order}.pcap", [(1.0 + i * 0.001, f) for i, f in enumerate(frames)], 1)
        result = assert_twins(path)
        assert not isinstance(result, str), result
        assert result.packets == 3  # `good`, the DF packet and the one behind hop-by-hop options
        assert result.skipped == {"non_tcp": 3, "non_ip": 4, "bad_header_length": 3, "fragment": 3,
                                  "truncated_headers": 2, "ipv6_extension_headers": 1}


def test_truncated_and_corrupt_records(tmp_path: Path, chunk_bytes: int) -> None:
    frames = [(t, LINK_HEADERS[1](ip, False)) for t, ip in synthetic_flow()]
    good = write_pcap(tmp_path / "g.pcap", frames, 1).read_bytes()
    path = tmp_path / "cut.pcap"
    outcomes = set()
    for cut in range(0, 200):
        path.write_bytes(good[:len(good) - cut])
        result = assert_twins(path)
        outcomes.add(result if isinstance(result, str) else tuple(result.skipped))
    assert ("truncated_record",) in outcomes and () in outcomes
    for record, claim in ((0, 50_000_000), (7, 65535 + 129), (len(frames) - 1, (1 << 20) + 1)):
        path.write_bytes(claim_caplen(good, record, claim))
        result = assert_twins(path)
        assert isinstance(result, str) and f"record {record + 1} claims {claim} bytes" in result, result
    for head in (b"", b"\xd4\xc3\xb2\xa1\x02\x00", b"nonsense!", good[:24]):
        path.write_bytes(head)
        assert_twins(path)


def test_a_pipe_grows_the_columns(tmp_path: Path, chunk_bytes: int) -> None:
    """From a pipe the size is unknown: the columns start at one chunk's bound and grow in place."""
    import threading

    flow = [(t, LINK_HEADERS[1](ip, v6)) for v6 in (False, True) for t, ip in synthetic_flow(v6)]
    frames = [(t + k, frame) for k in range(300) for t, frame in flow]
    data = write_pcap(tmp_path / "big.pcap", frames, 1).read_bytes()
    results = []
    for use_kernel in (True, False):
        readable, writable = os.pipe()
        writer = threading.Thread(target=lambda fd=writable: (os.write(fd, data), os.close(fd)))
        writer.start()
        try:
            results.append(comparable(read(Path(f"/dev/fd/{readable}"), use_kernel)))
        finally:
            writer.join()
            os.close(readable)
    assert results[0] == results[1]
    assert not isinstance(results[0], str) and len(results[0]["columns"]["ts_ns"]) == len(frames)


def test_first_frame_continues_across_files(tmp_path: Path) -> None:
    frames = [(t, LINK_HEADERS[1](ip, False)) for t, ip in synthetic_flow()]
    pcap = write_pcap(tmp_path / "f.pcap", frames, 1)
    result = assert_twins(pcap, first_frame=1000)
    assert not isinstance(result, str)
    assert result.columns["frame"].tolist() == list(range(1000, 1000 + len(frames)))


# --- pcapng and gzip -------------------------------------------------------------------------------------------


def test_fuzz_seed_corpus(tmp_path: Path, chunk_bytes: int) -> None:
    """pcap of every link type, pcapng with two sections of opposite byte order, four interfaces of four link
    types and time resolutions, obsolete and simple packet blocks, a custom block; each also gzipped."""
    for seed in seed_corpus():
        path = tmp_path / seed.name
        path.write_bytes(seed.data)
        result = assert_twins(path)
        assert not isinstance(result, str) and result.packets >= 20 and not result.skipped, (seed.name, result)


def test_mutated_captures_give_the_same_result_or_error(tmp_path: Path) -> None:
    """The analyzer fuzzer's mutations (lengths, timestamps, splices, cuts, damaged gzip): kernel and twin agree."""
    seeds = seed_corpus()
    path = tmp_path / "m.pcap"
    errors = 0
    for case in range(600):
        data, _names = mutate(random.Random(f"native:{case}"), seeds)
        path.write_bytes(data)
        errors += isinstance(assert_twins(path), str)
    assert 30 < errors < 570  # both outcomes occur


def test_pcapng_link_types_resolutions_and_ticks(tmp_path: Path, chunk_bytes: int) -> None:
    """Interfaces of several link types (one unsupported) in one chunk, every if_tsresol form, ticks near the
    int64 nanosecond limit on both sides (an error, word for word the twin's)."""
    flow = synthetic_flow()
    links = [(1, 1), (113, 113), (101, 101), (147, 1)]
    resolutions = [-1, 6, 9, 0, 3, 12, 19, 30, 0x80 | 10, 0x80 | 30, 0x80, 0x80 | 70, 127]
    for resolution in resolutions:
        interfaces = [(linktype, resolution) for linktype, _ in links]
        packets = [(i % len(links), 1_000_000 + i, _frame(links[i % len(links)][1], ip, False), i == 4)
                   for i, (_t, ip) in enumerate(flow)]
        packets.insert(3, (-1, 0, b"custom block", False))
        for endian in "<>":
            path = tmp_path / f"r{resolution}{endian}.pcapng"
            path.write_bytes(pcapng_capture([(endian, interfaces, packets)]))
            result = assert_twins(path)
            assert not isinstance(result, str), result
            assert result.frames == len(flow) and result.skipped.get("unsupported_linktype_147", 0) > 0
    for ticks in ((1 << 63) // 1000 - 5, (1 << 63) // 1000 + 5, (1 << 64) - 1):
        path = tmp_path / "t.pcapng"
        path.write_bytes(pcapng_capture([("<", [(1, -1)], [(0, ticks, LINK_HEADERS[1](flow[0][1], False), False)])]))
        fast = assert_twins(path)
        assert isinstance(fast, str) == (ticks * 1000 >= 1 << 63), fast


def test_gzip_and_editcappcapng_capture(tmp_path: Path) -> None:
    frames = [(t, LINK_HEADERS[1](ip, v6)) for v6 in (False, True) for t, ip in synthetic_flow(v6)]
    pcap = write_pcap(tmp_path / "f.pcap", frames, 1, nanosecond=True)
    gz = tmp_path / "f.pcap.gz"
    gz.write_bytes(gzip.compress(pcap.read_bytes()))
    result = assert_twins(gz)
    assert not isinstance(result, str) and result.file_format == "pcap.gz" and result.packets == len(frames)
    if not shutil.which("editcap"):
        return
    ng = tmp_path / "f.pcapng"
    subprocess.run(["editcap", "-F", "pcapng", str(pcap), str(ng)], check=True, capture_output=True)
    result = assert_twins(ng)
    assert not isinstance(result, str) and result.file_format == "pcapng" and result.packets == len(frames)
    ng_gz = tmp_path / "f.pcapng.gz"
    ng_gz.write_bytes(gzip.compress(ng.read_bytes()))
    assert_twins(ng_gz)


# --- a real capture ------------------------------------------------------------------------------------------------


def test_real_tcpdump_capture(tmp_path: Path, chunk_bytes: int) -> None:
    """tcpdump on loopback (IPv4 and IPv6 transfers, snaplen 96), as pcap, pcapng (editcap) and gzip."""
    pcap = tmp_path / "lo.pcap"
    info = loopback_capture(pcap, 96, ("127.0.0.1", 300_000, 20_000), ("::1", 200_000, 0))
    paths = [pcap]
    gz = tmp_path / "lo.pcap.gz"
    gz.write_bytes(gzip.compress(pcap.read_bytes()))
    paths.append(gz)
    if shutil.which("editcap"):
        subprocess.run(["editcap", "-F", "pcapng", str(pcap), str(tmp_path / "lo.pcapng")], check=True,
                       capture_output=True)
        paths.append(tmp_path / "lo.pcapng")
    for path in paths:
        result = assert_twins(path)
        assert not isinstance(result, str), result
        assert result.packets == info.packets and len(result.syns) == 4
        assert {address for address, _ in result.endpoints} == {"127.0.0.1", "::1"}


# --- generated record streams ----------------------------------------------------------------------------------

PCAP_LINKTYPES = [0, 1, 12, 14, 101, 108, 113, 228, 229, 276]
OPTION_LAYOUTS = [b"", b"\x01\x01\x08\x0a" + bytes(8), b"\x08\x0a" + bytes(8) + b"\x01\x01",
                  b"\x02\x04\x05\xb4\x04\x02\x08\x0a" + bytes(8) + b"\x01\x03\x03\x07",
                  b"\x01\x01\x08\x0a", b"\x03\x03\x0f\x00", b"\x02\x00", b"\x04\x02\x00\x00\x00\x00"]


@st.composite
def packets(draw: st.DrawFn, linktype: int) -> bytes:
    """A frame for linktype: mostly well-formed TCP/IP, with every field the decoder looks at drawn from the
    values its checks turn on (versions, IHL, fragments, next headers, data offsets, lengths, options)."""
    version = draw(st.sampled_from([4, 4, 6, 6, 5]))
    ints = st.integers
    options = draw(st.sampled_from(OPTION_LAYOUTS) | st.binary(max_size=40))
    options = (options + bytes(-len(options) % 4))[:40]
    doff = draw(st.sampled_from([5 + len(options) // 4] * 4 + [0, 4, 5, 15]))
    payload = draw(st.binary(max_size=30))
    tcp = (struct.pack(">HHIIBBHHH", draw(ints(0, 65535)), draw(ints(0, 65535)), draw(ints(0, 2**32 - 1)),
                       draw(ints(0, 2**32 - 1)), doff << 4, draw(st.sampled_from([0x02, 0x12, 0x10, 0x18, 0x11]) |
                                                                 ints(0, 255)),
                       draw(ints(0, 65535)), 0, 0) + options)
    if version == 4:
        ihl = draw(st.sampled_from([5, 5, 5, 6, 4, 0, 15]))
        length = 4 * ihl + len(tcp) + len(payload) + draw(st.sampled_from([0, 0, 0, -4, 8]) | ints(-60, 60))
        ip = struct.pack(">BBHHHBBH4s4s", 0x40 | ihl, 0, max(0, min(length, 65535)), 1,
                         draw(st.sampled_from([0, 0, 0x4000, 0x2000, 0x0001, 0x1FFF])), 64,
                         draw(st.sampled_from([6, 6, 6, 17, 1])), 0,
                         bytes([10, 0, 0, draw(ints(1, 3))]), bytes([10, 0, 0, draw(ints(1, 3))]))
        ip += bytes(max(0, 4 * ihl - 20))
    elif version == 6:
        length = len(tcp) + len(payload) + draw(st.sampled_from([0, 0, 0, -4]) | ints(-30, 30))
        ip = struct.pack(">IHBB16s16s", 0x60000000, max(0, min(length, 65535)),
                         draw(st.sampled_from([6, 6, 6, 44, 0, 43, 60, 17, 135])), 64,
                         bytes(15) + bytes([draw(ints(1, 3))]), bytes(15) + bytes([draw(ints(1, 3))]))
    else:
        ip = draw(st.binary(max_size=60))
    packet = ip + tcp + payload
    ethertype = draw(st.sampled_from([b"\x08\x00" if version == 4 else b"\x86\xdd", b"\x08\x06"]))
    if linktype == 1:
        tags = draw(st.sampled_from([b"", b"", b"\x81\x00\x00\x05", b"\x88\xa8\x00\x01\x81\x00\x00\x02",
                                     b"\x81\x00\x00\x01" * 3]))
        frame = bytes(12) + tags + ethertype + packet
    elif linktype == 113:
        frame = bytes(14) + ethertype + packet
    elif linktype == 276:
        frame = ethertype + bytes(18) + packet
    elif linktype in (0, 108):
        family = draw(st.sampled_from([2, 10, 24, 28, 30, 7]))
        frame = family.to_bytes(4, draw(st.sampled_from(["big", "little"]))) + packet
    else:
        frame = packet
    cut = draw(st.sampled_from([len(frame)] * 3) | ints(0, len(frame)))
    return frame[:cut]


@st.composite
def pcap_streams(draw: st.DrawFn) -> tuple[bytes, int]:
    """A pcap of generated packets, sometimes cut short; and how many of its records are complete."""
    linktype = draw(st.sampled_from(PCAP_LINKTYPES))
    endian = draw(st.sampled_from("<>"))
    frames = draw(st.lists(packets(linktype), min_size=1, max_size=25))
    out = bytearray(struct.pack(endian + "IHHiIII", draw(st.sampled_from([0xA1B2C3D4, 0xA1B23C4D])), 2, 4, 0, 0,
                                draw(st.sampled_from([65535, 96, 0])), linktype))
    ends = []
    for i, frame in enumerate(frames):
        out += struct.pack(endian + "IIII", 1_700_000_000 + i, draw(st.integers(0, 2**32 - 1)), len(frame),
                           len(frame) + draw(st.integers(0, 3))) + frame
        ends.append(len(out))
    size = len(out) - draw(st.sampled_from([0, 0, 0, 1, 15, 17]))
    return bytes(out[:size]), sum(end <= size for end in ends)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pcap_streams())
def test_generated_pcap_streams(tmp_path: Path, stream: tuple[bytes, int]) -> None:
    data, complete = stream
    path = tmp_path / "gen.pcap"
    path.write_bytes(data)
    result = assert_twins(path)
    if len(data) < 24:  # cut into the file header
        assert isinstance(result, str) and "pcap header is truncated" in result, result
        return
    assert not isinstance(result, str), result
    assert result.frames == complete


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.sampled_from([1, 113, 101, 0, 276, 12]), st.sampled_from([-1, 6, 9, 0x80 | 20])),
                min_size=1, max_size=4),
       st.data())
def test_generated_pcapng_streams(tmp_path: Path, interfaces: list[tuple[int, int]], data: st.DataObject) -> None:
    count = data.draw(st.integers(1, 20))
    packets_ = []
    for _ in range(count):
        iface = data.draw(st.integers(0, len(interfaces) - 1))
        frame = data.draw(packets(interfaces[iface][0]))
        packets_.append((iface, data.draw(st.integers(0, 2**52)), frame, data.draw(st.booleans())))
    path = tmp_path / "gen.pcapng"
    path.write_bytes(pcapng_capture([(data.draw(st.sampled_from("<>")), interfaces, packets_)]))
    result = assert_twins(path)
    if not isinstance(result, str):
        assert result.frames == count


def test_errors_are_one_line_diag_errors(tmp_path: Path) -> None:
    path = tmp_path / "bad.pcapng"
    path.write_bytes(pcapng_capture([("<", [], [(0, 1, b"x" * 60, False)])]))
    with pytest.raises(DiagError, match="inconsistent"):
        reader.read_capture(path)
    message = read(path, True)
    assert isinstance(message, str) and "\n" not in message

"""Frames built with scapy whose TCP is inside a tunnel (VXLAN, Geneve, GRE, IP in IP) or is a super-segment
(IPv4 total length 0, an IPv6 jumbogram), and frames that look like them but carry no TCP: the captures the
decoder (its C kernel and numpy twin) and tshark are held to each other on.

Each case has its own inner endpoints, so a capture of all of them has one connection per TCP case.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

from capture_helpers import write_pcap

T0 = 1_700_000_000.0


@dataclass(frozen=True)
class Case:
    name: str
    frame: bytes               # an Ethernet frame
    tunnel: list[str] | None   # the JSON's tunnel for its connection (None: no tunnel)
    payload: int               # TCP payload bytes (0 with tunnel None and no TCP: a frame that carries none)
    tcp: bool = True


def _tcp(src: str, dst: str, payload: int, sport: int) -> bytes:
    from scapy.layers.inet import IP, TCP
    from scapy.layers.inet6 import IPv6
    from scapy.packet import Raw

    net = IPv6(src=src, dst=dst) if ":" in src else IP(src=src, dst=dst)
    return bytes(net / TCP(sport=sport, dport=5001, flags="PA", seq=1000, ack=1, window=500) / Raw(b"t" * payload))


def _ether(payload: bytes, ethertype: int, vlan: int | None = None) -> bytes:
    head = b"\x02\x00\x00\x00\x00\x02" + b"\x02\x00\x00\x00\x00\x01"
    if vlan is not None:
        head += struct.pack("!HH", 0x8100, vlan)
    return head + struct.pack("!H", ethertype) + payload


def _ip_over(outer_src: str, outer_dst: str, proto: int, payload: bytes) -> bytes:
    from scapy.layers.inet import IP
    from scapy.layers.inet6 import IPv6
    from scapy.packet import Raw

    if ":" in outer_src:
        return bytes(IPv6(src=outer_src, dst=outer_dst, nh=proto) / Raw(payload))
    return bytes(IP(src=outer_src, dst=outer_dst, proto=proto) / Raw(payload))


def _udp(sport: int, dport: int, payload: bytes) -> bytes:
    return struct.pack("!HHHH", sport, dport, 8 + len(payload), 0) + payload


def _vxlan(inner_frame: bytes) -> bytes:
    return struct.pack("!BBHI", 0x08, 0, 0, 42 << 8) + inner_frame


def _geneve(protocol: int, inner: bytes, options: bytes = b"", version: int = 0) -> bytes:
    return struct.pack("!BBHI", (version << 6) | (len(options) // 4), 0, protocol, 42 << 8) + options + inner


def _gre(protocol: int, inner: bytes, key: int | None = None, seq: int | None = None, checksum: bool = False,
         version: int = 0) -> bytes:
    flags = (0x8000 if checksum else 0) | (0x2000 if key is not None else 0) | (0x1000 if seq is not None else 0)
    head = struct.pack("!HH", flags | version, protocol)
    if checksum:
        head += b"\x00\x00\x00\x00"
    if key is not None:
        head += struct.pack("!I", key)
    if seq is not None:
        head += struct.pack("!I", seq)
    return head + inner


def _super_v4(src: str, dst: str, payload: int, sport: int) -> bytes:
    packet = bytearray(_tcp(src, dst, payload, sport))
    packet[2:4] = b"\x00\x00"  # total length 0: a TSO/GSO super-segment, as Linux writes one beyond 64 KiB
    return bytes(packet)


def _jumbogram(src: str, dst: str, payload: int, sport: int) -> bytes:
    """IPv6 payload length 0 and a hop-by-hop Jumbo Payload option (RFC 2675), as IPv6 BIG TCP wrote them."""
    from scapy.layers.inet import TCP
    from scapy.layers.inet6 import IPv6, IPv6ExtHdrHopByHop, Jumbo
    from scapy.packet import Raw

    tcp = TCP(sport=sport, dport=5001, flags="PA", seq=1000, ack=1, window=500) / Raw(b"j" * payload)
    return bytes(IPv6(src=src, dst=dst, plen=0) / IPv6ExtHdrHopByHop(options=[Jumbo(jumboplen=8 + 20 + payload)])
                 / tcp)


def cases(payload: int = 10) -> list[Case]:
    """Every encapsulation and super-segment case (payload bytes of TCP in each tunnel case)."""
    from scapy.layers.inet6 import IPv6, IPv6ExtHdrHopByHop, RouterAlert
    from scapy.layers.l2 import ARP
    from scapy.packet import Raw

    def inner(k: int, v6: bool = False, size: int = payload) -> bytes:
        return _tcp(f"fd00:{k}::1" if v6 else f"192.168.{k}.1", f"fd00:{k}::2" if v6 else f"192.168.{k}.2",
                    size, 40000 + k)

    def e(packet: bytes, v6: bool = False, vlan: int | None = None) -> bytes:
        return _ether(packet, 0x86DD if v6 else 0x0800, vlan)

    out4, out6 = ("10.0.0.1", "10.0.0.2"), ("fd99::1", "fd99::2")

    def vxlan(k: int, sport: int = 51000, dport: int = 4789, frame: bytes | None = None, outer=out4) -> bytes:
        carried = e(inner(k)) if frame is None else frame
        return e(_ip_over(*outer, 17, _udp(sport, dport, _vxlan(carried))), v6=":" in outer[0])

    def geneve(k: int, protocol: int, carried: bytes, options: bytes = b"", version: int = 0) -> bytes:
        return e(_ip_over(*out4, 17, _udp(51000 + k, 6081, _geneve(protocol, carried, options, version))))

    def gre(carried_protocol: int, carried: bytes, outer=out4, **fields: int | bool | None) -> bytes:
        return e(_ip_over(*outer, 47, _gre(carried_protocol, carried, **fields)), v6=":" in outer[0])  # type: ignore[arg-type]

    hbh = bytes(IPv6(src="fd00:21::1", dst="fd00:21::2") / IPv6ExtHdrHopByHop(nh=6, options=[RouterAlert()])
                / Raw(inner(21, v6=True)[40:]))
    vxlan_in_gre = e(_ip_over("10.1.0.1", "10.1.0.2", 17, _udp(51005, 4789, _vxlan(e(inner(13))))))
    super_in_vxlan = e(_super_v4("192.168.15.1", "192.168.15.2", 20000, 40015))
    return [
        Case("vxlan", vxlan(1), ["vxlan"], payload),
        Case("vxlan reply (source port 4789)", vxlan(2, sport=4789, dport=51000), ["vxlan"], payload),
        Case("vxlan, IPv6 inside, VLAN-tagged inner frame", vxlan(3, frame=e(inner(3, v6=True), v6=True, vlan=7)),
             ["vxlan"], payload),
        Case("vxlan over IPv6", vxlan(4, outer=out6), ["vxlan"], payload),
        Case("geneve, Ethernet inside, with options", geneve(5, 0x6558, e(inner(5)), options=b"\x01" * 8),
             ["geneve"], payload),
        Case("geneve, IPv6 inside directly", geneve(6, 0x86DD, inner(6, v6=True)), ["geneve"], payload),
        Case("gre", gre(0x0800, inner(7)), ["gre"], payload),
        Case("gre with checksum, key and sequence number", gre(0x0800, inner(8), key=9, seq=3, checksum=True),
             ["gre"], payload),
        Case("gretap (transparent Ethernet bridging)", gre(0x6558, e(inner(9)), key=1), ["gre"], payload),
        Case("gre over IPv6, IPv6 inside", gre(0x86DD, inner(10, v6=True), outer=out6), ["gre"], payload),
        Case("ip in ip", e(_ip_over(*out4, 4, inner(11))), ["ip-in-ip"], payload),
        Case("ipv6 in ipv4", e(_ip_over(*out4, 41, inner(12, v6=True))), ["ip-in-ip"], payload),
        Case("vxlan inside gre", gre(0x6558, vxlan_in_gre), ["vxlan", "gre"], payload),
        Case("IPv4 super-segment (total length 0)", e(_super_v4("192.168.14.1", "192.168.14.2", 30000, 40014)),
             None, 30000),
        Case("super-segment inside vxlan", vxlan(15, sport=51006, frame=super_in_vxlan), ["vxlan"], 20000),
        Case("IPv6 jumbogram", e(_jumbogram("fd00:16::1", "fd00:16::2", 70000, 40016), v6=True), None, 70000),
        Case("hop-by-hop options before TCP", e(hbh, v6=True), None, payload),
        # no TCP inside: other UDP ports, a non-IP inner frame, versions not decoded
        Case("udp to another port", vxlan(17, sport=51007, dport=53), None, 0, False),
        Case("vxlan with ARP inside", vxlan(0, sport=51008, frame=_ether(bytes(ARP()), 0x0806)), None, 0, False),
        Case("gre version 1 (PPTP)", gre(0x880B, inner(18), version=1), None, 0, False),
        Case("geneve of an unknown protocol", geneve(19, 0x1234, e(inner(19))), None, 0, False),
    ]


def write_cases(path: Path, selected: list[Case], snaplen: int = 262144) -> Path:
    """One pcap of the cases' frames, 1 ms apart (snaplen: the largest frame is the 70 kB jumbogram)."""
    return write_pcap(path, [(T0 + i * 0.001, case.frame) for i, case in enumerate(selected)], 1, snaplen=snaplen)

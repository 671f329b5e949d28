"""TCP_INFO per connection: getsockopt(TCP_INFO) parsed by offset (linux/tcp.h ``struct tcp_info``).

Older kernels return a shorter struct; fields past the returned length are None ("where the kernel
provides them"). Times the kernel keeps in microseconds (busy/rwnd-limited/sndbuf-limited) are converted
to seconds so field names can carry their unit.
"""

from __future__ import annotations

import socket
import struct
from typing import Any

TCP_INFO_BYTES = 232

# name -> (offset, struct format) in struct tcp_info
_FIELDS: dict[str, tuple[int, str]] = {
    "state": (0, "B"),
    "retransmits": (2, "B"),
    "rto_us": (8, "I"),
    "snd_mss": (16, "I"),
    "unacked": (24, "I"),
    "lost": (32, "I"),
    "retrans": (36, "I"),
    "rtt_us": (68, "I"),
    "rttvar_us": (72, "I"),
    "snd_ssthresh": (76, "I"),
    "cwnd": (80, "I"),
    "rcv_space": (96, "I"),
    "total_retrans": (100, "I"),
    "pacing_rate_Bps": (104, "Q"),
    "bytes_acked": (120, "Q"),
    "bytes_received": (128, "Q"),
    "notsent_bytes": (144, "I"),
    "min_rtt_us": (148, "I"),
    "delivery_rate_Bps": (160, "Q"),
    "busy_us": (168, "Q"),
    "rwnd_limited_us": (176, "Q"),
    "sndbuf_limited_us": (184, "Q"),
    "bytes_sent": (200, "Q"),
    "bytes_retrans": (208, "Q"),
    "snd_wnd": (228, "I"),
}
_MICROSECOND_TIMES = {"busy_us": "busy_s", "rwnd_limited_us": "rwnd_limited_s",
                      "sndbuf_limited_us": "sndbuf_limited_s"}


def parse_tcp_info(raw: bytes) -> dict[str, Any]:
    info: dict[str, Any] = {}
    for name, (offset, fmt) in _FIELDS.items():
        size = struct.calcsize(fmt)
        value = struct.unpack_from("<" + fmt, raw, offset)[0] if offset + size <= len(raw) else None
        if name in _MICROSECOND_TIMES:
            info[_MICROSECOND_TIMES[name]] = None if value is None else value / 1e6
        else:
            info[name] = value
    return info


def read_tcp_info(sock: socket.socket) -> dict[str, Any] | None:
    """None when the socket is closed or the platform has no TCP_INFO."""
    try:
        raw = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, TCP_INFO_BYTES)
    except (OSError, AttributeError):
        return None
    return parse_tcp_info(raw)


def summarize(begin: dict[str, Any], end: dict[str, Any], samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Row summary of one connection over a row: counters as deltas, gauges as median/max/last."""
    def delta(name: str) -> Any:
        if begin.get(name) is None or end.get(name) is None:
            return None
        return end[name] - begin[name]

    def gauge(name: str) -> list[float]:
        return sorted(s[name] for s in samples if s.get(name) is not None)

    rtts = gauge("rtt_us")
    cwnds = gauge("cwnd")
    rates = gauge("delivery_rate_Bps")
    return {
        "cwnd_last": end.get("cwnd"),
        "cwnd_max": cwnds[-1] if cwnds else None,
        "rtt_us_median": rtts[len(rtts) // 2] if rtts else None,
        "rtt_us_max": rtts[-1] if rtts else None,
        "retrans": delta("total_retrans"),
        "bytes_acked": delta("bytes_acked"),
        "bytes_received": delta("bytes_received"),
        "delivery_rate_Bps_max": rates[-1] if rates else None,
        "busy_s": delta("busy_s"),
        "rwnd_limited_s": delta("rwnd_limited_s"),
        "sndbuf_limited_s": delta("sndbuf_limited_s"),
        "samples": len(samples),
    }

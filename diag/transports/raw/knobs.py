"""Mechanism knobs of the raw transport: each one switches on a single suspected mechanism.

See docs/raw-tcp.md for which hypothesis each knob tests. ``resolve_knobs`` turns the user's (possibly
partial) dict into a validated ``RawKnobs``; ``--emulate gloo`` starts from the settings that model gloo's
pair protocol (ring, 2 chunks per block, one socket per pair, in-band notices, send posted before
receive), and every knob given explicitly on top of it switches that one piece, so "gloo's protocol with
the receive posted first" is ``--emulate gloo --order recv-first``. The dataclass defaults below are the
one source of every knob's default.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from diag.errors import DiagError

ALGOS = ("ring", "pairwise", "direct")
CONN_MODES = ("shared", "split")
HANDSHAKES = ("none", "notify")
IO_MODES = ("duplex", "alternate")
NOTICES = ("in-band", "own-conn")
ORDERS = ("recv-first", "send-first")
EMULATIONS = ("gloo",)

# gloo's pattern (gloo/allgather.cc + gloo/transport/tcp/pair.cc): a ring for every N, each block in
# 2 chunks, each step posts its send and then its receive, one socket per rank pair carrying both
# directions, a send writes data only once the peer's RECV_READY arrived, and RECV_READY travels in-band
# on the same byte stream as the rank's own data.
GLOO_EMULATION: dict[str, Any] = {"algo": "ring", "conn": "shared", "handshake": "notify", "chunks": 2,
                                  "io": "duplex", "streams": 1, "order": "send-first", "notice": "in-band"}
MAX_SKEW_US = 10_000_000

MAX_CHUNKS = 1024
# Without --chunks a block is cut into messages of at most this size, so the ring forwards a piece as
# soon as it arrived (steps pipeline; the links never wait for a whole block) while each message stays
# big enough that per-message work is negligible. --chunks K restores K messages per block (gloo: 2).
DEFAULT_CHUNK_BYTES = 1 << 20
MIN_CHUNK_BYTES = 4096
MAX_STREAMS = 64


@dataclass(frozen=True)
class RawKnobs:
    algo: str = "ring"
    order: str = "recv-first"
    conn: str = "split"
    handshake: str = "none"
    io: str = "duplex"
    chunks: int | None = None           # messages per block and stream; None = pieces of chunk_bytes
    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    sockbuf: int | None = None          # bytes for SO_SNDBUF and SO_RCVBUF; None = kernel autotuning
    nodelay: bool = True
    streams: int = 1
    notice: str = "in-band"             # --handshake notify: notices on the data stream or on their own socket
    skew_us: int = 0                    # every rank but 0 starts each operation this much later
    emulate: str | None = None
    iface: str | None = None
    tcpinfo_interval_s: float | None = None
    tcpinfo_dir: str | None = None

    def as_record(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def chunks_for(self, nbytes: int) -> int:
        """Messages per stream for a block of ``nbytes``: --chunks, else enough that each of the
        ``chunks x streams`` parts is at most ``chunk_bytes`` (capped at MAX_CHUNKS)."""
        if self.chunks is not None:
            return self.chunks
        per_stream = self.chunk_bytes * self.streams
        return max(1, min(MAX_CHUNKS, -(-nbytes // per_stream)))


def _as_bool(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "on", "true", "yes"):
        return True
    if text in ("0", "off", "false", "no"):
        return False
    raise DiagError(f"--{name} takes on or off, not {value!r}")


def _choice(name: str, value: Any, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise DiagError(f"unknown --{name} {value!r}: choose one of {', '.join(choices)}")
    return str(value)


def _bounded_int(name: str, value: Any, low: int, high: int) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise DiagError(f"--{name} takes a whole number, not {value!r}") from None
    if not low <= number <= high:
        raise DiagError(f"--{name} must be between {low} and {high}, not {number}")
    return number


def resolve_knobs(algo: str, order: str, knobs: dict[str, Any] | None) -> RawKnobs:
    """Validate user knobs; unknown keys are an error so a typo never silently measures the default.

    ``algo`` and ``order`` are the sweep's (or backend's) own settings; ``--emulate gloo`` replaces them
    and the other preset knobs, and any knob present in ``knobs`` (``order`` and ``algo`` included)
    replaces the preset in turn."""
    given = {k: v for k, v in (knobs or {}).items() if v is not None or k in ("sockbuf", "emulate", "iface")}
    fields = {f.name for f in dataclasses.fields(RawKnobs)}
    unknown = sorted(set(given) - fields)
    if unknown:
        raise DiagError(f"unknown raw transport knob(s) {', '.join(unknown)}: known are {', '.join(sorted(fields))}")
    values: dict[str, Any] = {"algo": "ring" if algo in ("", "default") else algo, "order": order}
    emulate = given.get("emulate")
    if emulate is not None:
        _choice("emulate", emulate, EMULATIONS)
        values.update(GLOO_EMULATION)
    values.update(given)
    defaults = RawKnobs()
    sockbuf = values.get("sockbuf")
    interval = values.get("tcpinfo_interval_s")
    if interval is not None and float(interval) <= 0:
        raise DiagError("--tcpinfo-interval must be positive")
    handshake = _choice("handshake", values.get("handshake", defaults.handshake), HANDSHAKES)
    notice = _choice("notice", values.get("notice", defaults.notice), NOTICES)
    if notice != "in-band" and handshake != "notify":
        raise DiagError(f"--notice {notice} only applies to the notify protocol: add --handshake notify "
                        "(or --emulate gloo)")
    return RawKnobs(
        algo=_choice("algo", values["algo"], ALGOS),
        order=_choice("order", values["order"], ORDERS),
        conn=_choice("conn", values.get("conn", defaults.conn), CONN_MODES),
        handshake=handshake,
        io=_choice("io", values.get("io", defaults.io), IO_MODES),
        chunks=None if values.get("chunks") is None else _bounded_int("chunks", values["chunks"], 1, MAX_CHUNKS),
        chunk_bytes=_bounded_int("chunk-bytes", values.get("chunk_bytes", defaults.chunk_bytes), MIN_CHUNK_BYTES,
                                 1 << 30),
        sockbuf=None if sockbuf is None else _bounded_int("sockbuf", sockbuf, 1024, 1 << 30),
        nodelay=_as_bool("nodelay", values.get("nodelay", defaults.nodelay)),
        streams=_bounded_int("streams", values.get("streams", defaults.streams), 1, MAX_STREAMS),
        notice=notice,
        skew_us=_bounded_int("skew-us", values.get("skew_us", defaults.skew_us), 0, MAX_SKEW_US),
        emulate=emulate,
        iface=values.get("iface"),
        tcpinfo_interval_s=None if interval is None else float(interval),
        tcpinfo_dir=values.get("tcpinfo_dir"),
    )


def knobs_from_args(args: Any) -> dict[str, Any]:
    """The raw-transport knobs a command line set (``diag sweep``, ``diag exec``), in the transport's units;
    options a command does not have, or that were not given, are left out."""
    from diag.units import parse_size

    knobs: dict[str, Any] = {}
    for name in ("emulate", "conn", "handshake", "io", "chunks", "streams", "notice", "skew_us", "iface"):
        value = getattr(args, name, None)
        if value is not None:
            knobs[name] = value
    for name in ("sockbuf", "chunk_bytes"):
        value = getattr(args, name, None)
        if value is not None:
            knobs[name] = parse_size(value)
    # --order is the sweep's setting too (exchange); as a knob it only counts when given, so that it can
    # switch one piece of --emulate gloo. Commands leave its default None for that reason.
    order = getattr(args, "order", None)
    if order is not None:
        knobs["order"] = order
    nodelay = getattr(args, "nodelay", None)
    if nodelay is not None:
        knobs["nodelay"] = nodelay == "on"
    return knobs

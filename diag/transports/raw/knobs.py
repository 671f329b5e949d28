"""Mechanism knobs of the raw transport: each one switches on a single suspected mechanism.

See docs/raw-tcp.md for which hypothesis each knob tests. ``resolve_knobs`` turns the user's (possibly
partial) dict into a validated ``RawKnobs``; ``--emulate gloo`` overrides the settings that mirror gloo's
pattern (one socket per pair, in-band ready-to-receive notice, 2 chunks per block, ring).
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
ORDERS = ("recv-first", "send-first")
EMULATIONS = ("gloo",)

# gloo's pattern (gloo/allgather.cc + gloo/transport/tcp/pair.cc): a ring for every N, each block in
# 2 chunks, one socket per rank pair carrying both directions, and a send starts only after the peer's
# in-band notice that it posted the matching receive.
GLOO_EMULATION: dict[str, Any] = {"algo": "ring", "conn": "shared", "handshake": "notify", "chunks": 2,
                                  "io": "duplex", "streams": 1, "order": "send-first"}

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
    """Validate user knobs; unknown keys are an error so a typo never silently measures the default."""
    given = dict(knobs or {})
    fields = {f.name for f in dataclasses.fields(RawKnobs)}
    unknown = sorted(set(given) - fields)
    if unknown:
        raise DiagError(f"unknown raw transport knob(s) {', '.join(unknown)}: known are {', '.join(sorted(fields))}")
    values: dict[str, Any] = {"algo": "ring" if algo in ("", "default") else algo, "order": order}
    values.update({k: v for k, v in given.items() if v is not None or k in ("sockbuf", "emulate", "iface")})
    emulate = values.get("emulate")
    if emulate is not None:
        _choice("emulate", emulate, EMULATIONS)
        values.update(GLOO_EMULATION)
    sockbuf = values.get("sockbuf")
    interval = values.get("tcpinfo_interval_s")
    if interval is not None and float(interval) <= 0:
        raise DiagError("--tcpinfo-interval must be positive")
    return RawKnobs(
        algo=_choice("algo", values["algo"], ALGOS),
        order=_choice("order", values["order"], ORDERS),
        conn=_choice("conn", values.get("conn", "split"), CONN_MODES),
        handshake=_choice("handshake", values.get("handshake", "none"), HANDSHAKES),
        io=_choice("io", values.get("io", "duplex"), IO_MODES),
        chunks=None if values.get("chunks") is None else _bounded_int("chunks", values["chunks"], 1, MAX_CHUNKS),
        chunk_bytes=_bounded_int("chunk-bytes", values.get("chunk_bytes", DEFAULT_CHUNK_BYTES), MIN_CHUNK_BYTES,
                                 1 << 30),
        sockbuf=None if sockbuf is None else _bounded_int("sockbuf", sockbuf, 1024, 1 << 30),
        nodelay=_as_bool("nodelay", values.get("nodelay", True)),
        streams=_bounded_int("streams", values.get("streams", 1), 1, MAX_STREAMS),
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
    for name in ("emulate", "conn", "handshake", "io", "chunks", "streams", "iface"):
        value = getattr(args, name, None)
        if value is not None:
            knobs[name] = value
    for name in ("sockbuf", "chunk_bytes"):
        value = getattr(args, name, None)
        if value is not None:
            knobs[name] = parse_size(value)
    nodelay = getattr(args, "nodelay", None)
    if nodelay is not None:
        knobs["nodelay"] = nodelay == "on"
    return knobs

"""The `diag analyze --json` document as typed dataclasses: the one definition that the analyzer writes
(document.py builds these objects, ``to_json`` writes them) and the report and the table read.

The key names are a contract (docs/analyzer.md, DESIGN.md): connections with `a`, `b`, `directions` keyed
`"a->b"`/`"b->a"` and `duplex_overlap`; each direction with `packets`, `payload_bytes`, `retransmissions`,
... Keys are written in field order. Readers go through ``load_analysis`` / ``Analysis.from_json`` and use
attributes; a key missing from an older or hand-made file takes the field's default (0, None, empty), and a
key this version does not know is kept in ``extra`` and written back unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from diag.typedjson import OMIT_NONE, from_json, read_json_object, to_json

# Schema history (the ``schema`` key of the document):
#   1: files, capture, parameters, connections, hosts, phases, warnings (the first released shape; a file
#      without a ``schema`` key is read as 1). Keys added since, within version 1 (older files lack them and
#      read as their defaults): capture_point, turn_summary; per connection run_gap_s and turns; per host
#      nic_observed and seen_traffic_overlap (duplex_overlap null where the NIC is not seen).
#      parameters.stall_rtt_factor marks the busy runs by data in flight: from then on a direction is busy
#      while its data passes the capture point and while it is in flight (unacknowledged) up to the stall
#      limit, so duplex_overlap, active_s, overlap_s, the rates and the turns' time split read the same
#      upstream and downstream of a bottleneck; a file without that parameter counted packets passing only.
#      Per connection tunnel: the encapsulations (VXLAN, Geneve, GRE, IP in IP) its TCP was decoded from, null
#      for none (older files: the key is absent and tunnelled TCP was skipped as non_tcp).
#      connections_omitted and hosts_omitted (only where a capture has more than are listed in full), node
#      (the in-place job's node that analysed its own capture).
ANALYSIS_SCHEMA = 1
# The two keys of Connection.directions; side "a" is the sender of the connection's first captured packet.
DIRECTIONS = ("a->b", "b->a")
# A connection (or host) moving at least this many payload bytes each way carries both directions
# (TurnSummary.two_way_connections; the report's BIDIR_MIN_BYTES).
TWO_WAY_MIN_BYTES = 64 * 1024


@dataclass(frozen=True)
class Stats:
    """Median / p95 / count of a per-packet quantity (RTT in ms)."""

    median: float | None = None
    p95: float | None = None
    n: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class IdleGaps:
    threshold_s: float | None = None
    count: int = 0
    total_s: float = 0.0
    max_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SegmentSizes:
    """Data segments per size bin (edges: bin starts, the last bin closed), the largest, the SYN's MSS."""

    edges: list[int] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)
    max_bytes: int = 0
    mss: int | None = None
    super_segments: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Window:
    """The window this direction's sender advertised (bytes, scaled where the scale is known)."""

    scale: int | None = None
    scale_lower_bound: int | None = None
    min_bytes: int | None = None
    median_bytes: float | None = None
    max_bytes: int | None = None
    raw_max: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class InFlight:
    median: float | None = None
    p95: float | None = None
    max: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Acks:
    pure: int = 0
    piggybacked: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Throughput:
    """Payload bytes/s in bins of bin_s seconds from t0 (capture clock, seconds)."""

    bin_s: float = 1.0
    t0: float = 0.0
    Bps: list[float] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    def times(self) -> list[float]:
        return [self.t0 + i * self.bin_s for i in range(len(self.Bps))]


@dataclass(frozen=True)
class Direction:
    packets: int = 0
    data_packets: int = 0
    payload_bytes: int = 0
    unique_payload_bytes: int = 0
    retransmissions: int = 0
    fast_retransmissions: int = 0
    spurious_retransmissions: int = 0
    out_of_order: int = 0
    lost_segments: int = 0
    dup_acks: int = 0
    zero_windows: int = 0
    window_full: int = 0
    first_ts: float | None = None
    last_ts: float | None = None
    goodput_Bps: float = 0.0
    active_s: float = 0.0
    active_goodput_Bps: float = 0.0
    rtt_ms: Stats = field(default_factory=Stats)
    ts_rtt_ms: Stats = field(default_factory=Stats)
    idle_gaps: IdleGaps = field(default_factory=IdleGaps)
    segment_sizes: SegmentSizes = field(default_factory=SegmentSizes)
    window: Window = field(default_factory=Window)
    bytes_in_flight: InFlight = field(default_factory=InFlight)
    acks: Acks = field(default_factory=Acks)
    syn_seen: bool = False
    throughput: Throughput | None = field(default=None, metadata=OMIT_NONE)   # written where asked (not with --no-series)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def span_s(self) -> float:
        """Seconds from the first to the last packet (0 when either is unknown)."""
        if isinstance(self.first_ts, (int, float)) and isinstance(self.last_ts, (int, float)):
            return self.last_ts - self.first_ts
        return 0.0


@dataclass(frozen=True)
class Handoff:
    """One turn: the follower restarting its data within a few RTTs of a packet of the sender (``from``)."""

    sender: str = field(default="?", metadata={"key": "from"})   # "from" is a Python keyword
    t: float = 0.0
    delay_s: float = 0.0
    delay_rtt: float | None = None
    trigger_bytes: int = 0
    trigger_offset_bytes: int = 0
    trigger_offset_fraction: float | None = None
    burst_bytes: int = 0
    follower_silence_s: float = 0.0
    sender_continues: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ControlFrames:
    """A direction's standalone small segments (gloo's notices): how many, how many whole preambles, how many
    right after its own burst, and the median time to the peer's next data."""

    count: int = 0
    preamble_multiples: int = 0
    after_own_burst: int = 0
    peer_data_next_ms: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Turns:
    """Turn-taking on one connection (diag/capture/turns.py): who sends alone, when both send, handoffs."""

    span_s: float = 0.0
    active_s: float = 0.0
    idle_s: float = 0.0
    one_way_s: dict[str, float] = field(default_factory=dict)
    both_s: float = 0.0
    leader: str | None = None
    leader_only_fraction: float | None = None
    both_fraction: float | None = None
    follower_only_fraction: float | None = None
    bulk_bytes: dict[str, int] = field(default_factory=dict)
    handoff_count: int = 0
    handoffs: list[Handoff] = field(default_factory=list)
    control_frames: dict[str, ControlFrames] = field(default_factory=dict)
    turn_taking: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Connection:
    stream: int | None = None
    a: str = "?"
    b: str = "?"
    # the tunnels its packets came through (vxlan, geneve, gre, ip-in-ip; plus "plain" where some came
    # through none): a and b are the inner TCP's endpoints. None: no tunnel.
    tunnel: list[str] | None = None
    directions: dict[str, Direction] = field(default_factory=dict)
    duplex_overlap: float | None = None
    active_s: float = 0.0
    overlap_s: float = 0.0
    overlap_Bps: dict[str, float] = field(default_factory=dict)
    alone_Bps: dict[str, float] = field(default_factory=dict)
    run_gap_s: dict[str, float] = field(default_factory=dict)
    turns: Turns | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def direction(self, key: str) -> Direction:
        """``"a->b"`` or ``"b->a"``; an absent direction reads as an empty one."""
        return self.directions.get(key) or Direction()

    def labelled_directions(self) -> list[tuple[str, Direction]]:
        """(``"ip:port->ip:port"``, direction) for both directions, a->b first."""
        return [(f"{self.a}->{self.b}", self.direction("a->b")), (f"{self.b}->{self.a}", self.direction("b->a"))]

    @property
    def payload_bytes(self) -> tuple[int, int]:
        return self.direction("a->b").payload_bytes, self.direction("b->a").payload_bytes

    @property
    def total_payload_bytes(self) -> int:
        return sum(d.payload_bytes for d in self.directions.values())


@dataclass(frozen=True)
class Host:
    address: str = "?"
    tx_bytes: int = 0
    rx_bytes: int = 0
    duplex_overlap: float | None = None
    # False: the capture does not see this host's NIC (only its traffic with the captured host), so its
    # duplex_overlap is None and seen_traffic_overlap is the overlap of that traffic alone.
    nic_observed: bool | None = None
    seen_traffic_overlap: float | None = None
    tx_Bps_overlap: float = 0.0
    rx_Bps_overlap: float = 0.0
    tx_Bps_alone: float = 0.0
    rx_Bps_alone: float = 0.0
    active_s: float = 0.0
    overlap_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class TurnSummary:
    """The turn analysis of one run (backend, algo, op, N, size) over its repetitions (medians)."""

    backend: str | None = None
    algo: str | None = None
    op: str | None = None
    world_size: int | None = None
    size_bytes: int | None = None
    repetitions: int = 0
    connections: int = 0
    two_way_connections: int = 0
    turn_taking_repetitions: int = 0
    handoffs_per_repetition: float | None = None
    leader_only_fraction: float | None = None
    both_fraction: float | None = None
    follower_only_fraction: float | None = None
    handoff_delay_ms: float | None = None
    handoff_delay_rtt: float | None = None
    trigger_offset_fraction: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class PhaseKey:
    """One timed iteration of one record (from the records' wall-clock windows)."""

    backend: str | None = None
    algo: str | None = None
    op: str | None = None
    world_size: int | None = None
    size_bytes: int | None = None
    iteration: int | None = None
    t_start_ns: int = 0
    t_end_ns: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Phase:
    phase: PhaseKey = field(default_factory=PhaseKey)
    packets: int = 0
    connections: list[Connection] = field(default_factory=list)
    hosts: list[Host] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class CaptureFile:
    """One capture file read: its format, link types, frames, TCP rows, what was skipped and why, and the
    capture's own metadata (FILE.capture.json: tcpdump's counters) where it has one."""

    path: str = "?"
    format: str | None = None
    linktypes: list[int] = field(default_factory=list)
    snaplen: int | None = None
    frames: int = 0
    tcp_packets: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    capture: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class CaptureSummary:
    kernel_dropped: int | None = None
    flagged: bool = False
    packets: int = 0
    frames: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Parameters:
    """What the analysis was run with: the throughput bins, the idle gap and the busy runs' constants."""

    bin_s: float | None = None
    idle_gap_s: float | None = None
    cadence_factor: float | None = None
    cadence_quantile: int | None = None
    pacing_packets: int | None = None
    max_run_gap_s: float | None = None
    stall_rtt_factor: float | None = None
    control_max_bytes: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Omitted:
    """The connections (or hosts: count only) of a capture beyond those listed in full."""

    count: int = 0
    packets: int | None = field(default=None, metadata=OMIT_NONE)
    payload_bytes: int | None = field(default=None, metadata=OMIT_NONE)
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Analysis:
    schema: int = ANALYSIS_SCHEMA
    files: list[CaptureFile] = field(default_factory=list)
    capture: CaptureSummary = field(default_factory=CaptureSummary)
    parameters: Parameters = field(default_factory=Parameters)
    capture_point: list[str] = field(default_factory=list)   # addresses whose NIC the capture sees
    connections: list[Connection] = field(default_factory=list)
    connections_omitted: Omitted | None = field(default=None, metadata=OMIT_NONE)
    hosts: list[Host] = field(default_factory=list)
    hosts_omitted: Omitted | None = field(default=None, metadata=OMIT_NONE)
    phases: list[Phase] = field(default_factory=list)
    turn_summary: list[TurnSummary] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    # Not written by the analyzer; a file made by another tool may say what it captured.
    world_size: int | None = field(default=None, metadata=OMIT_NONE)
    transport: str | None = field(default=None, metadata=OMIT_NONE)
    node: str | None = field(default=None, metadata=OMIT_NONE)   # the in-place job's node that captured and analysed it
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Analysis:
        if not isinstance(data.get("schema", ANALYSIS_SCHEMA), int) or data.get("schema", 1) > ANALYSIS_SCHEMA:
            raise ValueError(f"analysis schema {data.get('schema')!r} is newer than this diag reads "
                             f"({ANALYSIS_SCHEMA}): upgrade diag")
        return from_json(cls, data)

    def to_json(self) -> dict[str, Any]:
        return to_json(self)


def load_analysis(path: Path) -> Analysis:
    """Read an analysis file; raises ValueError (bad JSON, not an object, too new) with the path."""
    return Analysis.from_json(read_json_object(path))

"""Per-packet TCP analysis flags: tshark's tcp.analysis state machine, in the C kernel diag.capture._ctcp
(_ctcp.c), which walks the packets one by one and keeps, per direction, Wireshark 4.0's
tcp_analyze_sequence_number state (``nextseq``, ``lastack``/``window``, the duplicate-ACK counter, every
data segment's end). The rules, in tshark's order, are described in docs/analyzer.md. The kernel is fed the
packets of a file chunk by chunk (source.Streamer) or all at once (analyze_packets); the tests hold it to
an independent vectorized numpy formulation of the same rules (tests/tcpstate_twin.py) and to tshark.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

import numpy as np

from diag.capture import native


@dataclass
class PacketState:
    """Arrays in the analysis' time order (one entry per TCP packet)."""

    conn: np.ndarray            # connection index
    direction: np.ndarray       # 0: a->b, 1: b->a
    seq_rel: np.ndarray | None  # unwrapped, relative to the direction's first sequence number (None: not kept)
    end_rel: np.ndarray | None  # seq_rel + payload (+1 for SYN/FIN) (None: not kept)
    new_bytes: np.ndarray       # payload bytes never seen before in this direction
    retransmission: np.ndarray  # tshark's tcp.analysis.retransmission (includes fast + spurious)
    fast_retransmission: np.ndarray
    spurious_retransmission: np.ndarray
    out_of_order: np.ndarray
    lost_segment: np.ndarray
    dup_ack: np.ndarray
    zero_window: np.ndarray
    window_full: np.ndarray
    in_flight: np.ndarray       # bytes in flight after a data packet (-1 where not defined)
    window_bytes: np.ndarray    # advertised window scaled by the known shift (raw where unknown)
    ack_rtt_ns: np.ndarray      # data -> ACK RTT, attributed to the ACK packet (-1 where none)
    ts_rtt_ns: np.ndarray       # TSval -> TSecr RTT, attributed to the echoing packet (-1 where none)
    # on an ACK of reverse-direction data not acknowledged before: that direction's data still in flight
    # after it (int32, saturated); -1 on every other packet (busy.py's busy runs read it)
    peer_in_flight: np.ndarray


def analyze_packets(cols: dict[str, np.ndarray], conn: np.ndarray, direction: np.ndarray,
                    wscale: np.ndarray, first_rtt_ns: np.ndarray, keep_sequence: bool = True) -> PacketState:
    """cols: reader columns in time order. wscale[conn, dir]: shift of dir's advertised window, -1 unknown.

    first_rtt_ns[conn]: handshake RTT (tshark's ts_first_rtt) or 0 when the handshake was not captured.
    The checks follow the order of Wireshark 4.0's tcp_analyze_sequence_number (docs/analyzer.md).
    One pass of the C kernel over the packets. keep_sequence=False leaves seq_rel and end_rel out (None): only
    plots draw them, and they are 16 bytes a packet.
    """
    return analyze_packets_native(native.require("_ctcp"), cols, conn, direction, wscale, first_rtt_ns,
                                  keep_sequence=keep_sequence)


# The kernel's input columns and their dtypes (the reader's, see pcapfile.COLUMN_DTYPES).
_KERNEL_INPUTS = {"ts_ns": np.int64, "seq": np.uint32, "ack": np.uint32, "plen": np.int32, "win": np.uint16,
                  "flags": np.uint8, "tsval": np.uint32, "tsecr": np.uint32, "has_ts": np.bool_}
# PacketState's computed fields and their dtypes.
_KERNEL_OUTPUTS = {"seq_rel": np.int64, "end_rel": np.int64, "new_bytes": np.int64, "retransmission": np.bool_,
                   "fast_retransmission": np.bool_, "spurious_retransmission": np.bool_,
                   "out_of_order": np.bool_, "lost_segment": np.bool_, "dup_ack": np.bool_,
                   "zero_window": np.bool_, "window_full": np.bool_, "in_flight": np.int64,
                   "window_bytes": np.int32, "ack_rtt_ns": np.int64, "ts_rtt_ns": np.int64,
                   "peer_in_flight": np.int32}


def analyze_packets_native(kernel: ModuleType, cols: dict[str, np.ndarray], conn: np.ndarray,
                           direction: np.ndarray, wscale: np.ndarray, first_rtt_ns: np.ndarray,
                           chunk_rows: int | None = None, keep_sequence: bool = True,
                           spill_window: int = 0) -> PacketState:
    """analyze_packets through the C kernel, writing straight into the PacketState arrays.

    chunk_rows: feed the packets in chunks of this many rows (the result is the same as one feed; the
    tests hold the kernel to that, which bounded-memory streaming relies on). spill_window: keep this many
    data segment ends a direction in memory, the older ones in a temporary file (0: all in memory; the
    result is the same).
    """
    n = conn.size
    nconn = int(np.asarray(wscale).shape[0]) if np.asarray(wscale).ndim else 0
    flat_wscale = np.ascontiguousarray(wscale, dtype=np.int64).reshape(-1)
    analyzer = kernel.Analyzer(2 * nconn, flat_wscale, np.ascontiguousarray(first_rtt_ns, dtype=np.int64),
                               spill_window=spill_window)
    inputs = {"conn": np.ascontiguousarray(conn, dtype=np.int32),
              "direction": np.ascontiguousarray(direction, dtype=np.int8)}
    inputs.update({name: np.ascontiguousarray(cols[name], dtype=dtype) for name, dtype in _KERNEL_INPUTS.items()})
    outputs: dict[str, np.ndarray | None] = {
        name: None if name in ("seq_rel", "end_rel") and not keep_sequence else np.empty(n, dtype=dtype)
        for name, dtype in _KERNEL_OUTPUTS.items()}
    step = n if not chunk_rows else max(1, chunk_rows)
    for start in range(0, max(n, 1), max(step, 1)):
        stop = min(n, start + step)
        late_ack, late_ts = analyzer.feed(*(a[start:stop] for a in inputs.values()),
                                          *(None if a is None else a[start:stop] for a in outputs.values()))
        ack_rtt, ts_rtt = outputs["ack_rtt_ns"], outputs["ts_rtt_ns"]
        assert ack_rtt is not None and ts_rtt is not None
        for row, value in late_ack:  # an ACK before its segment in file order: a sample on an earlier chunk
            ack_rtt[row] = value
        for row, value in late_ts:
            ts_rtt[row] = value
    return PacketState(conn, direction, **outputs)  # type: ignore[arg-type]



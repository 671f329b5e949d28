"""Every number a diagnosis rule or an evidence query compares against: one table of name, value, meaning.

Each finding reports the thresholds it used (``used(...)``: name -> value), and the report prints the table.
A threshold is read as ``N2_DIP_RATIO.value``; the name in a finding is the constant's own name.
"""

from __future__ import annotations

from diag.analysisdoc import TWO_WAY_MIN_BYTES
from diag.report.compare import ALPHA as _ALPHA

# The experiments' thresholds live with the decisions that use them, below the report (the trials decide with
# them while they run); the one Threshold type is theirs.
from diag.verdicts import (
    CONTROL_DIP,
    CPU_CONFOUND_MARGIN,
    CPU_CONFOUNDED,
    CPU_LINK_REACHED,
    MIN_ROUNDS,
    RULED_OUT_SHARE,
    SHOWN_SHARE,
    WORKAROUND_EFFECT,
    Threshold,
)


def _t(name: str, value: float | int, meaning: str) -> Threshold:
    return Threshold(name, value, meaning)


N2_DIP_RATIO = _t("N2_DIP_RATIO", 0.8, "busbw at N=2 below this fraction of its healthy reference (the median "
                  "busbw of the N>=3 that serve, same size or same D; else the link measured beside it) is a dip")
N2_DIP_STRONG = _t("N2_DIP_STRONG", 0.6, "a dip deeper than this at the largest size, over >= 2 sizes, is strong")
LARGE_SIZE_BYTES = _t("LARGE_SIZE_BYTES", 1 << 20, "sizes at or above this count as large (bandwidth-bound "
                      "rather than latency-bound)")
BACKEND_RAW_EFFICIENCY = _t("BACKEND_RAW_EFFICIENCY", 0.7, "backend busbw below this fraction of the raw-TCP "
                            "reference's (same op, N, size) is far below")
BIDIR_MIN_BYTES = _t("BIDIR_MIN_BYTES", TWO_WAY_MIN_BYTES, "a connection or host moving at least this many payload bytes "
                     "each way carries both directions")
DUPLEX_OVERLAP_LOW = _t("DUPLEX_OVERLAP_LOW", 0.5, "duplex overlap (fraction of active time both directions move "
                        "data) below this is low")
ORDER_EFFECT = _t("ORDER_EFFECT", 0.15, "the exchange order (send-first vs recv-first) changes time by at least "
                  "this fraction")
CONN_SPLIT_EFFECT = _t("CONN_SPLIT_EFFECT", 0.15, "one connection per direction is at least this fraction faster "
                       "than both directions on one connection (raw --conn)")
RWND_LIMITED_FRACTION = _t("RWND_LIMITED_FRACTION", 0.2, "share of busy time a connection spent receive-window "
                           "limited (TCP_INFO) before it is called rwnd limited")
SNDBUF_LIMITED_FRACTION = _t("SNDBUF_LIMITED_FRACTION", 0.2, "same, send-buffer limited")
WINDOW_FULL_RATE = _t("WINDOW_FULL_RATE", 0.001, "window-full events per data packet of a direction at or above "
                      "which its sender waited on the receiver's window (one event in thousands of packets is a "
                      "sender catching up, not a limit)")
WINDOW_FULL_MIN_COUNT = _t("WINDOW_FULL_MIN_COUNT", 3, "... and at least this many window-full events")
RETRANS_RATE = _t("RETRANS_RATE", 0.001, "retransmitted segments per data segment above which retransmissions "
                  "matter")
RETRANS_MIN_COUNT = _t("RETRANS_MIN_COUNT", 3, "... and at least this many, so one resent segment on a tiny "
                       "connection is not a finding")
IDLE_RESTART_S = _t("IDLE_RESTART_S", 0.2, "Linux resets cwnd after an idle longer than the RTO "
                    "(tcp_slow_start_after_idle); the RTO is >= 200 ms")
IDLE_FRACTION = _t("IDLE_FRACTION", 0.3, "idle time (gaps) above this fraction of a direction's active span is "
                   "significant")
TURN_GAP_SHARE = _t("TURN_GAP_SHARE", 0.5, "share of a direction's idle time during which the other direction "
                    "of its connection sends alone: at least this much, on a connection that takes turns, and the "
                    "gaps are the turns themselves")
CWND_COLLAPSE_SEGMENTS = _t("CWND_COLLAPSE_SEGMENTS", 10, "a cwnd at or below this many segments (Linux's "
                            "restart window) after having been at least 4x larger is a collapse: slow start "
                            "after idle seen in TCP_INFO")
CPU_PINNED_PCT = _t("CPU_PINNED_PCT", 90.0, "a thread at or above this % of one core ...")
CPU_PINNED_SHARE = _t("CPU_PINNED_SHARE", 0.5, "... in at least this share of its samples (and at least "
                      "CPU_MIN_SAMPLES samples) is pinned; a machine saturated this share of a run is busy")
CPU_MIN_SAMPLES = _t("CPU_MIN_SAMPLES", 3, "fewest CPU samples a thread or machine needs before it is judged")
CPU_SATURATED_PCT = _t("CPU_SATURATED_PCT", 90.0, "the machine's CPUs (all, averaged) at least this busy: the "
                       "ranks together use every core, so the CPU rather than the link may set the pace")
TURN_TAKING_GAP = _t("TURN_TAKING_GAP", 0.3, "a backend's two-way connection overlaps its directions this much "
                     "less than raw TCP on one shared connection between the same hosts: the backend takes turns")
HALF_DUPLEX_MATCH = _t("HALF_DUPLEX_MATCH", 0.2, "a backend's busbw within this fraction of a raw ring that "
                       "alternates directions (half duplex) matches it")
SLOW_LINK_RATIO = _t("SLOW_LINK_RATIO", 0.7, "a node whose best edge out (or in) of the link matrix carries less "
                     "than this fraction of the median node's best is a slow host; one edge below this fraction of "
                     "what both its ends carry on their other edges is a slow link")
LOCALIZE_MIN_NODES = _t("LOCALIZE_MIN_NODES", 3, "fewest nodes in the link matrix to pin a slow edge on one host "
                        "(with two, every edge touches both)")
PACED_TOLERANCE = _t("PACED_TOLERANCE", 0.1, "an N whose subgroup holds the slow host (or link) is paced by it when "
                     "its best large-size busbw stays within this fraction above the slow edge's goodput")
LOSS_HOST_SHARE = _t("LOSS_HOST_SHARE", 0.8, "share of all retransmitted segments on the directions into (or out "
                     "of) one host at or above which the loss is that host's")
LOSS_PEER_SHARE = _t("LOSS_PEER_SHARE", 0.1, "a peer counts towards a host's loss (\"from N peers\") only where its "
                     "direction holds at least this share of the loss placed on that host: a few segments resent "
                     "beside one edge that carries nearly all of it leave the loss that edge's")
LOSS_RATE_CONTRAST = _t("LOSS_RATE_CONTRAST", 4.0, "in the link matrix's flows, a host whose edges in (or out) lost at "
                        "least this many times the share of segments of any other host's is where they are lost; "
                        "and an observation (retransmissions, window events) on the backend's captures at least this "
                        "many times the raw reference's on the same link, at an N where the backend is slow, is a "
                        "finding")
INCAST_STARVED_SHARE = _t("INCAST_STARVED_SHARE", 0.25, "a sender of an incast (every other node into one host at "
                          "once) that moved less than this share of its fair share (the port's goodput over its "
                          "senders) while resending is starved: in retransmission timeouts for much of the round, "
                          "incast collapse (a shallow port beside the parallel suite: 0.00-0.13; senders into healthy "
                          "ports 0.67 or more, but for one starved beside the suite's load that the contrast catches)")
CWND_CUT_FACTOR = _t("CWND_CUT_FACTOR", 0.75, "cwnd falling to this fraction of its peak or below is a cut: a loss's "
                     "multiplicative decrease (CUBIC cuts to 0.7, Reno to 0.5), or a timeout's collapse")
QUOTA_THROTTLED_SHARE = _t("QUOTA_THROTTLED_SHARE", 0.5, "a node's ranks under a cgroup CPU quota that ran out in at "
                           "least this share of its enforcement periods during a step (the observers' cpu_quota "
                           "samples): their CPU was full though no thread reads near a core")
CPU_STARVED_LINK_SHARE = _t("CPU_STARVED_LINK_SHARE", 0.5, "a node whose CPU is saturated while its NIC carries "
                            "less than this share of its link rate is CPU-starved: the link waits on the CPU")
ALPHA = _t("ALPHA", _ALPHA, "significance level of Welch's t-test: a difference with p below it is confirmed")

TABLE: tuple[Threshold, ...] = (
    N2_DIP_RATIO, N2_DIP_STRONG, LARGE_SIZE_BYTES, BACKEND_RAW_EFFICIENCY, BIDIR_MIN_BYTES, DUPLEX_OVERLAP_LOW,
    ORDER_EFFECT, CONN_SPLIT_EFFECT, RWND_LIMITED_FRACTION, SNDBUF_LIMITED_FRACTION, WINDOW_FULL_RATE,
    WINDOW_FULL_MIN_COUNT, RETRANS_RATE,
    RETRANS_MIN_COUNT, IDLE_RESTART_S, IDLE_FRACTION, TURN_GAP_SHARE, CWND_COLLAPSE_SEGMENTS, CPU_PINNED_PCT, CPU_PINNED_SHARE, CPU_MIN_SAMPLES, QUOTA_THROTTLED_SHARE,
    CPU_SATURATED_PCT, CPU_LINK_REACHED, TURN_TAKING_GAP, HALF_DUPLEX_MATCH, SLOW_LINK_RATIO, LOCALIZE_MIN_NODES,
    PACED_TOLERANCE, LOSS_HOST_SHARE, LOSS_PEER_SHARE, LOSS_RATE_CONTRAST, CWND_CUT_FACTOR, CPU_STARVED_LINK_SHARE, ALPHA, CONTROL_DIP, SHOWN_SHARE,
    RULED_OUT_SHARE, MIN_ROUNDS, CPU_CONFOUNDED, CPU_CONFOUND_MARGIN, WORKAROUND_EFFECT,
)


def used(*thresholds: Threshold) -> dict[str, float]:
    """name -> value of the thresholds a finding used, in the order given (findings.json ``thresholds``)."""
    return {t.name: t.value for t in thresholds}

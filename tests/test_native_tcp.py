"""The C kernel diag.capture._ctcp against its numpy twin (tests/tcpstate_twin.py).

Every PacketState column must be identical (values and dtype) on real captures (tcpdump on loopback and
through a lossy router, the scapy-built rule captures of the tshark tests), on random packet sequences
(hypothesis: wraps, zero windows and probes, keep-alives, resets, out-of-order, ACKs beyond the capture,
missing handshakes, interleaved connections, timestamps that stand still or go back), and when the packets
are fed in several chunks instead of one. Bad input must raise ValueError, never crash.

Without the kernel built these tests skip with the build command; with CI set they fail instead, so CI
always measures the fast path.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import random
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
from capture_helpers import LINK_HEADERS, loopback_capture, synthetic_flow, write_pcap
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.tcpstate_speed import tcp_inputs
from diag.capture import tcpstate
from diag.capture.pcapfile import ACK, FIN, PSH, RST, SYN
from diag.capture.tcpstate import PacketState
from tests import tcpstate_twin

BUILD_COMMAND = "python -c \"import setuptools; setuptools.setup()\" build_ext --inplace"


@pytest.fixture(scope="module")
def ctcp() -> ModuleType:
    try:
        return importlib.import_module("diag.capture._ctcp")
    except ImportError as error:
        message = f"the C kernel diag.capture._ctcp is not built ({error}); build it with {BUILD_COMMAND}"
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the C kernel: {message}")
        pytest.skip(message)


def assert_twins(ctcp: ModuleType, cols: dict[str, np.ndarray], conn: np.ndarray, direction: np.ndarray,
                 wscale: np.ndarray, first_rtt: np.ndarray, chunk_sizes: tuple[int, ...] = (1, 7, 1000),
                 spill_window: int = 2) -> PacketState:
    """Kernel (one feed and chunked; without the sequence numbers; chunked with the segment ends spilled to
    disk beyond spill_window, as streaming runs it) == numpy twin, field by field, values and dtypes."""
    twin = tcpstate_twin.analyze_packets_numpy(cols, conn, direction, wscale, first_rtt)
    runs = [(chunk, True, 0) for chunk in (None, *chunk_sizes)] + [(None, False, 0)]
    runs.append((chunk_sizes[-1], False, spill_window))
    for chunk, keep_sequence, spill in runs:
        state = tcpstate.analyze_packets_native(ctcp, cols, conn, direction, wscale, first_rtt, chunk_rows=chunk,
                                                keep_sequence=keep_sequence, spill_window=spill)
        for field in dataclasses.fields(PacketState):
            ours, theirs = getattr(state, field.name), getattr(twin, field.name)
            if not keep_sequence and field.name in ("seq_rel", "end_rel"):
                assert ours is None, field.name  # not kept, and the kernel wrote nowhere
                continue
            assert ours.dtype == theirs.dtype, (field.name, chunk)
            if not np.array_equal(ours, theirs):
                rows = np.flatnonzero(ours != theirs)[:5]
                raise AssertionError(f"{field.name} differs (chunk_rows={chunk}, spill={spill}) at rows {rows.tolist()}: "
                                     f"kernel {ours[rows].tolist()}, numpy {theirs[rows].tolist()}")
    return twin


def assert_twins_on_capture(ctcp: ModuleType, paths: list[Path]) -> PacketState:
    cols, conn, direction, wscale, first_rtt = tcp_inputs(paths)
    n = conn.size
    return assert_twins(ctcp, cols, conn, direction, wscale, first_rtt, chunk_sizes=(max(1, n // 3), 4096),
                        spill_window=64)


# --- real captures ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("ipv6", [False, True])
def test_synthetic_flow_capture(ctcp: ModuleType, tmp_path: Path, ipv6: bool) -> None:
    """The handshake, a lost segment, duplicate ACKs, a fast retransmission, a zero window, a wrap."""
    frames = [(t, LINK_HEADERS[1](ip, ipv6)) for t, ip in synthetic_flow(ipv6=ipv6)]
    pcap = write_pcap(tmp_path / "flow.pcap", frames, linktype=1)
    state = assert_twins_on_capture(ctcp, [pcap])
    assert state.fast_retransmission.sum() == 1 and state.dup_ack.sum() == 4 and state.zero_window.sum() == 1


@pytest.mark.parametrize("name", ["duplex", "mid_stream", "acked_unseen"])
def test_tshark_rule_captures(ctcp: ModuleType, tmp_path: Path, name: str) -> None:
    """The scapy-built captures whose exact answers test_analyze_tshark pins (one rule each)."""
    from tests.test_analyze_tshark import SCAPY_BUILDERS

    pcap = SCAPY_BUILDERS[name](tmp_path / f"{name}.pcap")
    assert_twins_on_capture(ctcp, [pcap])


def test_loopback_capture_both_ways(ctcp: ModuleType, tmp_path: Path) -> None:
    pcap = tmp_path / "lo.pcap"
    loopback_capture(pcap, 128, ("127.0.0.1", 3_000_000, 1_000_000))
    state = assert_twins_on_capture(ctcp, [pcap])
    assert (state.ack_rtt_ns >= 0).any() and (state.ts_rtt_ns >= 0).any()
    # ACKs of new data: some leave data in flight, the last ones none; most packets are none of them
    assert (state.peer_in_flight > 0).any() and (state.peer_in_flight == 0).any()
    assert (state.peer_in_flight == -1).any()


@pytest.mark.slow
def test_lossy_duplex_capture_with_kernel_drops(ctcp: ModuleType, tmp_path: Path) -> None:
    """Bulk both ways through a dropping router, the capture itself missing packets: every rule fires."""
    from tests.test_analyze_tshark import _capture_duplex

    pcap = tmp_path / "duplex.pcap"
    _capture_duplex(pcap, "nt", 4_000_000, 4_000_000, mid_stream=False)
    state = assert_twins_on_capture(ctcp, [pcap])
    assert state.retransmission.any() and state.dup_ack.any()


# --- random packet sequences -----------------------------------------------------------------------------

# One step of a random sequence: small integers an interpreter turns into a packet, so hypothesis shrinks
# failures to short, readable sequences.
STEP = st.tuples(st.integers(0, 3), st.integers(0, 1), st.integers(0, 11), st.integers(0, 5),
                 st.integers(0, 5), st.integers(0, 9), st.integers(0, 7), st.integers(0, 6), st.integers(0, 5))
SIZES = (0, 1, 100, 1448, 1, 7)
WINDOWS = (0, 1, 512, 65535)
FLAGS = (ACK, ACK | PSH, ACK, ACK | PSH, SYN, SYN | ACK, FIN | ACK, RST, RST | ACK, 0)
STEPS_NS = (0, 1, 1_000, 100_000, 2_000_000, 5_000_000, 30_000_000, -1_000)


def packet_sequence(steps: list[tuple[int, ...]], isn: list[int], wscale: list[int], first_rtt: list[int]
                    ) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Interpret steps as packets of up to 4 interleaved connections (cols, conn, direction, wscale, rtt).

    Each direction keeps its highest sequence offset sent; a step sends new data, retransmits, jumps a
    hole, sends a pure ACK, a keep-alive, a zero-window probe or a wild sequence number, and ACKs the peer
    fully, partly, again, beyond what it sent, or anywhere.
    """
    nconn = 1 + max((s[0] for s in steps), default=0)
    hi = [[0, 0] for _ in range(nconn)]
    last_win = [[65535, 65535] for _ in range(nconn)]
    last_ack = [[0, 0] for _ in range(nconn)]
    clock = [[1000, 5000] for _ in range(nconn)]
    last_tsval = [[0, 0] for _ in range(nconn)]
    rows = []
    t = 1_700_000_000_000_000_000
    for c, d, kind, size_sel, win_sel, flag_sel, dt_sel, ack_sel, ts_sel in steps:
        plen = SIZES[size_sel]
        base = isn[(2 * c + d) % len(isn)]
        peer_base = isn[(2 * c + 1 - d) % len(isn)]
        mine = hi[c][d]
        if kind <= 3:       # new data (or a pure ACK when plen is 0)
            offset = mine
        elif kind == 4:     # retransmission of recent data
            offset = max(0, mine - plen * (1 + ts_sel % 3))
        elif kind == 5:     # a hole: data the capture missed
            offset = mine + 1448 * (1 + ts_sel % 2)
        elif kind == 6:     # keep-alive: one byte below what was sent
            offset, plen = mine - 1, size_sel % 2
        elif kind == 7:     # zero-window probe candidate
            offset, plen = mine, 1
        elif kind == 8:     # a segment far away (wraps the 32-bit space)
            offset = mine + (1 << 31) - 10 + ts_sel
        elif kind == 9:     # out of order: just below the highest
            offset = max(0, mine - 2 * max(plen, 1))
        else:               # pure ACK exactly at the highest
            offset, plen = mine, 0
        flags = FLAGS[flag_sel]
        seq = (base + offset) % (1 << 32)
        peer_hi = hi[c][1 - d]
        ack_choice = (peer_hi + 1, peer_hi // 2, last_ack[c][d], peer_hi + 3000, (peer_hi * 7919) % 100000,
                      last_ack[c][d], peer_hi)[ack_sel]
        ack = (peer_base + ack_choice) % (1 << 32)
        win = last_win[c][d] if win_sel >= 4 else WINDOWS[win_sel]
        t += STEPS_NS[dt_sel]
        if ts_sel == 0:
            clock[c][d] += 1
        has_ts = ts_sel != 5
        tsecr = (last_tsval[c][1 - d], 0, 12345, last_tsval[c][1 - d], last_tsval[c][1 - d] + 1, 0)[ts_sel]
        rows.append((t, seq, ack, plen, win, flags, clock[c][d], tsecr if has_ts else 0, has_ts, c, d))
        hi[c][d] = max(mine, offset + plen + ((flags & (SYN | FIN)) != 0))
        last_win[c][d], last_ack[c][d], last_tsval[c][d] = win, ack_choice, clock[c][d]
    columns = list(zip(*rows, strict=True)) if rows else [()] * 11
    dtypes = (np.int64, np.uint32, np.uint32, np.int32, np.uint16, np.uint8, np.uint32, np.uint32, np.bool_,
              np.int32, np.int8)
    arrays = [np.array(values, dtype=dtype) for values, dtype in zip(columns, dtypes, strict=True)]
    names = ("ts_ns", "seq", "ack", "plen", "win", "flags", "tsval", "tsecr", "has_ts")
    cols = dict(zip(names, arrays[:9], strict=True))
    shifts = np.array([wscale[k % len(wscale)] for k in range(2 * nconn)], dtype=np.int64).reshape(nconn, 2)
    rtt = np.array([first_rtt[k % len(first_rtt)] for k in range(nconn)], dtype=np.int64)
    return cols, arrays[9], arrays[10], shifts, rtt


ISN = st.lists(st.sampled_from([0, 1, 1000, (1 << 32) - 1, (1 << 32) - 3000, 1 << 31, 2_000_000_000]),
               min_size=2, max_size=8)
WSCALE = st.lists(st.sampled_from([-1, 0, 2, 7, 14]), min_size=1, max_size=4)
FIRST_RTT = st.lists(st.sampled_from([0, 20_000, 5_000_000]), min_size=1, max_size=4)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(STEP, min_size=1, max_size=120), isn=ISN, wscale=WSCALE, first_rtt=FIRST_RTT,
       chunk=st.integers(1, 40))
def test_random_sequences_twins(ctcp: ModuleType, steps: list[tuple[int, ...]], isn: list[int],
                                wscale: list[int], first_rtt: list[int], chunk: int) -> None:
    cols, conn, direction, shifts, rtt = packet_sequence(steps, isn, wscale, first_rtt)
    assert_twins(ctcp, cols, conn, direction, shifts, rtt, chunk_sizes=(chunk, 1))


def test_random_sequences_reach_every_rule(ctcp: ModuleType) -> None:
    """The generator above is no toy: over a fixed corpus every verdict and both RTTs occur, and the
    kernel equals the twin on every sequence (long ones too: several hundred packets, four connections)."""
    rng = random.Random(13)
    seen = dict.fromkeys(("retransmission", "fast_retransmission", "spurious_retransmission", "out_of_order",
                          "lost_segment", "dup_ack", "zero_window", "window_full"), 0)
    rtts = [0, 0]
    for _ in range(60):
        steps = [tuple(rng.randint(0, top) for top in (3, 1, 11, 5, 5, 9, 7, 6, 5))
                 for _ in range(rng.randint(50, 600))]
        # bias towards runs that build state: mostly new data and pure ACKs on one connection
        steps = [(s[0] if rng.random() < 0.3 else 0, *s[1:]) for s in steps]
        cols, conn, direction, shifts, rtt = packet_sequence(
            steps, [rng.choice([0, (1 << 32) - 3000, 1 << 31]) for _ in range(8)], [rng.choice([-1, 0, 7])],
            [rng.choice([0, 5_000_000])])
        twin = assert_twins(ctcp, cols, conn, direction, shifts, rtt, chunk_sizes=(rng.randint(1, 50),))
        for name in seen:
            seen[name] += int(getattr(twin, name).sum())
        rtts[0] += int((twin.ack_rtt_ns >= 0).sum())
        rtts[1] += int((twin.ts_rtt_ns >= 0).sum())
    assert all(seen.values()), seen
    assert all(rtts), rtts


def test_many_interleaved_connections(ctcp: ModuleType) -> None:
    """Forty connections (80 directions: the twin's radix-sort and lifted running-max paths), interleaved
    packet by packet, and the same connections one after another."""
    rng = random.Random(40)
    steps = [(rng.randint(0, 39), *(rng.randint(0, top) for top in (1, 11, 5, 5, 9, 7, 6, 5))) for _ in range(4000)]
    for sequence in (steps, sorted(steps, key=lambda step: step[0])):
        cols, conn, direction, shifts, rtt = packet_sequence(list(sequence), [0, (1 << 32) - 3000, 1 << 31],
                                                             [7, -1, 0], [0, 5_000_000])
        assert np.unique(conn).size == 40
        assert_twins(ctcp, cols, conn, direction, shifts, rtt, chunk_sizes=(333,))


def test_hash_maps_grow(ctcp: ModuleType) -> None:
    """Tens of thousands of distinct TSvals, echoes of TSvals never sent, and ACKs of ends no segment has
    (the kernel's hash maps grow several times over), interleaved with data whose ends go back and forth."""
    n = 60_000
    rng = np.random.default_rng(7)
    direction = (np.arange(n) % 2).astype(np.int8)
    k = np.arange(n, dtype=np.int64)
    cols = {"ts_ns": 1_000_000 * k + rng.integers(-500_000, 500_000, n),
            "seq": np.where(direction == 0, 1000 + 100 * (k // 2) - 300 * (k % 7 == 0), 5000).astype(np.uint32),
            "ack": np.where(direction == 1, 1050 + 50 * k, 1000).astype(np.uint32),
            "plen": np.where(direction == 0, 100, 0).astype(np.int32),
            "win": np.full(n, 1000, dtype=np.uint16), "flags": np.full(n, ACK, dtype=np.uint8),
            "tsval": (10 * k).astype(np.uint32), "tsecr": (10 * k - 10 + 3 * (k % 3 == 0)).astype(np.uint32),
            "has_ts": np.ones(n, dtype=bool)}
    conn = np.zeros(n, dtype=np.int32)
    shifts, rtt = np.full((1, 2), 7, dtype=np.int64), np.zeros(1, dtype=np.int64)
    twin = assert_twins(ctcp, cols, conn, direction, shifts, rtt, chunk_sizes=(4999,))
    assert (twin.ack_rtt_ns >= 0).sum() > 100 and (twin.ts_rtt_ns >= 0).sum() > 10_000


def test_ack_before_its_segment_gives_a_late_sample(ctcp: ModuleType) -> None:
    """An ACK (and a TSecr echo) earlier in the file than the segment it matches, same timestamp: the
    twin pairs them (delta 0); fed one packet at a time, the kernel returns the sample as a late one."""
    n = 4  # a: pure ACK; b: ACK of 200 (+ echo of TSval 7); b: ACK of 150; a: data 100..200 with TSval 7
    cols = {"ts_ns": np.full(n, 1_000, dtype=np.int64), "seq": np.array([100, 500, 500, 100], dtype=np.uint32),
            "ack": np.array([500, 200, 150, 500], dtype=np.uint32),
            "plen": np.array([0, 0, 0, 100], dtype=np.int32), "win": np.full(n, 100, dtype=np.uint16),
            "flags": np.full(n, ACK, dtype=np.uint8), "tsval": np.array([5, 9, 9, 7], dtype=np.uint32),
            "tsecr": np.array([0, 7, 5, 0], dtype=np.uint32), "has_ts": np.ones(n, dtype=bool)}
    conn = np.zeros(n, dtype=np.int32)
    direction = np.array([0, 1, 1, 0], dtype=np.int8)
    shifts, rtt = np.full((1, 2), -1, dtype=np.int64), np.zeros(1, dtype=np.int64)
    twin = assert_twins(ctcp, cols, conn, direction, shifts, rtt, chunk_sizes=(1, 2, 3))
    assert twin.ack_rtt_ns.tolist() == [-1, 0, -1, -1]
    assert twin.ts_rtt_ns.tolist() == [-1, 0, 0, -1]
    analyzer = ctcp.Analyzer(2, shifts.ravel(), rtt)
    outs = {name: np.empty(1, dtype=dtype) for name, dtype in tcpstate._KERNEL_OUTPUTS.items()}
    lates = []
    for row in range(n):
        ins = [conn[row:row + 1], direction[row:row + 1],
               *(cols[name][row:row + 1] for name in tcpstate._KERNEL_INPUTS)]
        lates.append(analyzer.feed(*ins, *outs.values()))
    assert lates == [([], []), ([], []), ([], []), ([(1, 0)], [(1, 0)])]
    assert analyzer.rows == n


# --- bad input -------------------------------------------------------------------------------------------


def _valid_feed(n: int = 4) -> tuple[list[np.ndarray], list[np.ndarray]]:
    cols, conn, direction, _, _ = packet_sequence([(0, k % 2, 0, 2, 3, 0, 3, 0, 1) for k in range(n)],
                                                  [0, 1000], [7], [0])
    ins = [conn, direction, *(cols[name] for name in tcpstate._KERNEL_INPUTS)]
    outs = [np.empty(n, dtype=dtype) for dtype in tcpstate._KERNEL_OUTPUTS.values()]
    return ins, outs


def test_bad_input_raises_value_error(ctcp: ModuleType) -> None:
    shifts, rtt = np.full(2, 7, dtype=np.int64), np.zeros(1, dtype=np.int64)
    analyzer = ctcp.Analyzer(2, shifts, rtt)
    ins, outs = _valid_feed()
    cases = {
        "conn has": lambda: ([*ins[:2], ins[2][:-1], *ins[3:]], outs),                      # short ts_ns
        "needs dtype": lambda: ([ins[0].astype(np.int64), *ins[1:]], outs),                  # int64 conn
        "seq_rel: needs": lambda: (ins, [outs[0].astype(np.float64), *outs[1:]]),            # float output
        "outside 0..0": lambda: ([ins[0] + 1, *ins[1:]], outs),                              # conn beyond wscale
        "must be 0 or 1": lambda: ([*ins[:1], ins[1] * 2, *ins[2:]], outs),                   # direction 2
        "C-contiguous": lambda: ([*ins[:2], np.repeat(ins[2], 2)[::2], *ins[3:]], outs),     # strided
        "writable": lambda: (ins, [np.frombuffer(outs[0].tobytes(), dtype=np.int64), *outs[1:]]),
    }
    for message, make in cases.items():
        bad_ins, bad_outs = make()
        with pytest.raises(ValueError, match=message):
            analyzer.feed(*bad_ins, *bad_outs)
    with pytest.raises(ValueError, match="ngroups"):
        ctcp.Analyzer(3, shifts, rtt)
    with pytest.raises(ValueError, match="wscale"):
        ctcp.Analyzer(4, shifts, rtt)
    with pytest.raises(ValueError, match="first_rtt_ns"):
        ctcp.Analyzer(2, shifts, np.zeros(3, dtype=np.int64))
    with pytest.raises(TypeError):
        analyzer.feed(*ins)  # outputs missing
    with pytest.raises(RuntimeError, match="already initialised"):
        analyzer.__init__(2, shifts, rtt)
    with pytest.raises(RuntimeError, match="not initialised"):
        ctcp.Analyzer.__new__(ctcp.Analyzer).feed(*ins, *outs)
    # A rejected feed changed nothing: the analyzer still gives a fresh one's result.
    analyzer.feed(*ins, *outs)
    fresh_outs = [np.empty_like(o) for o in outs]
    ctcp.Analyzer(2, shifts, rtt).feed(*ins, *fresh_outs)
    for ours, theirs in zip(outs, fresh_outs, strict=True):
        assert np.array_equal(ours, theirs)


def test_analyze_packets_runs_the_kernel(ctcp: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """analyze_packets is the kernel; without it, a one-line DiagError that says how to build it."""
    from diag.capture import native
    from diag.errors import DiagError

    frames = [(t, LINK_HEADERS[1](ip, False)) for t, ip in synthetic_flow()]
    pcap = write_pcap(tmp_path / "flow.pcap", frames, linktype=1)
    cols, conn, direction, wscale, first_rtt = tcp_inputs([pcap])
    calls: list[str] = []
    real_native = tcpstate.analyze_packets_native
    monkeypatch.setattr(tcpstate, "analyze_packets_native", lambda *a, **k: calls.append("c") or real_native(*a, **k))
    tcpstate.analyze_packets(cols, conn, direction, wscale, first_rtt)
    assert calls == ["c"]
    monkeypatch.setattr(native, "kernel", lambda name: None)
    with pytest.raises(DiagError, match=r"_ctcp is not built.*build_ext --inplace") as caught:
        tcpstate.analyze_packets(cols, conn, direction, wscale, first_rtt)
    assert "\n" not in str(caught.value)


def test_spilled_segment_ends_answer_like_kept_ones(ctcp: ModuleType) -> None:
    """With spill_window=2 nearly every segment end lives in the temporary file when its ACKs come: a
    repeated ACK of an old end gives no second RTT sample, a retransmission of an old segment is not taken
    for a first one, and every array equals the all-in-memory run and the numpy twin."""
    rows = []
    t = 1_700_000_000_000_000_000
    for k in range(12):  # a->b: twelve 100-byte segments
        rows.append((t + k * 1000, 1000 + 100 * k, 5000, 100, 0))
    t += 100_000
    for k, end in enumerate([1, 1, 2, 5, 5, 3, 12, 12]):  # b->a: ACKs of old ends, some repeated
        rows.append((t + k * 1000, 5000, 1000 + 100 * end, 0, 1))
    rows.append((t + 20_000, 1000 + 100 * 4, 5000, 100, 0))   # a retransmission of segment 5 (end 500)
    rows.append((t + 21_000, 5000, 1000 + 100 * 5, 0, 1))     # its ACK: the end was already acked
    ts, seq, ack, plen, direction = (np.array(column) for column in zip(*rows, strict=True))
    n = ts.size
    cols = {"ts_ns": ts.astype(np.int64), "seq": seq.astype(np.uint32), "ack": ack.astype(np.uint32),
            "plen": plen.astype(np.int32), "win": np.full(n, 1000, np.uint16), "flags": np.full(n, ACK, np.uint8),
            "tsval": np.zeros(n, np.uint32), "tsecr": np.zeros(n, np.uint32), "has_ts": np.zeros(n, bool)}
    conn, direction = np.zeros(n, np.int32), direction.astype(np.int8)
    wscale, first_rtt = np.zeros((1, 2), np.int64), np.zeros(1, np.int64)
    twin = assert_twins(ctcp, cols, conn, direction, wscale, first_rtt, chunk_sizes=(1, 5), spill_window=2)
    samples = twin.ack_rtt_ns[twin.ack_rtt_ns >= 0]
    assert samples.size == 5, twin.ack_rtt_ns   # ends 1, 2, 5, 3, 12: one sample each
    assert bool(twin.retransmission[-2])


def test_spilled_ends_go_to_tmpdir(ctcp: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The temporary file of old segment ends is made in $TMPDIR; one that cannot be made is an OSError that
    says what to do, not a crash or a wrong result."""
    n = 64
    cols = {"ts_ns": np.arange(n, dtype=np.int64) * 1000, "seq": (1000 + 100 * np.arange(n)).astype(np.uint32),
            "ack": np.full(n, 5000, np.uint32), "plen": np.full(n, 100, np.int32), "win": np.full(n, 1000, np.uint16),
            "flags": np.full(n, ACK, np.uint8), "tsval": np.zeros(n, np.uint32), "tsecr": np.zeros(n, np.uint32),
            "has_ts": np.zeros(n, bool)}
    conn, direction = np.zeros(n, np.int32), np.zeros(n, np.int8)
    wscale, first_rtt = np.zeros((1, 2), np.int64), np.zeros(1, np.int64)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    kept = tcpstate.analyze_packets_native(ctcp, cols, conn, direction, wscale, first_rtt, spill_window=4)
    assert np.array_equal(kept.new_bytes, np.full(n, 100))
    monkeypatch.setenv("TMPDIR", str(tmp_path / "missing"))
    with pytest.raises(OSError, match="set TMPDIR"):
        tcpstate.analyze_packets_native(ctcp, cols, conn, direction, wscale, first_rtt, spill_window=4)

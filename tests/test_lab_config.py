"""Lab config rules, derived shaping numbers and tc output parsing: pure code, no root needed."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from diag.errors import DiagError
from diag.lab import LabConfig
from diag.lab.config import (
    BURST_MIN_FRAMES,
    ETH_WIRE_OVERHEAD_BYTES,
    MAX_HOSTS,
    host_address,
    lab_name_of,
    owns_netns,
    parse_delay_s,
    parse_loss_pct,
)
from diag.lab.shaping import netem_line, parse_qdiscs, tbf_line
from diag.lab.topology import Lab, plan_lab, tear_down


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"rate": "fast"}, "bad rate 'fast'"),
        ({"hosts": 0}, "--hosts must be between 2"),
        ({"hosts": 300}, f"between 2 and {MAX_HOSTS}"),
        ({"hosts": 1}, "--hosts"),
        ({"mtu": 100}, "--mtu"),
        ({"name": "Bad-Name"}, "bad lab name"),
        ({"name": "x" * 13}, "bad lab name"),
        ({"queue_limit_bytes": 100}, "--queue-limit"),
        ({"burst_bytes": 10}, "--burst"),
        ({"delay": "soon"}, "--delay"),
        ({"loss": "200%"}, "--loss"),
        ({"rate": 10.0}, "outside"),
    ],
)
def test_bad_config_is_one_clear_line(kwargs: dict, needle: str) -> None:
    with pytest.raises(DiagError) as caught:
        LabConfig(**kwargs).validated()
    assert needle in str(caught.value)
    assert "\n" not in str(caught.value)


def test_rate_string_and_number_are_the_same_lab() -> None:
    assert LabConfig(rate="1gbit").shape_key() == LabConfig(rate=1e9).shape_key()
    assert LabConfig(rate="1gbit").shape_key() != LabConfig(rate="2gbit").shape_key()


def test_burst_is_the_larger_of_eight_frames_and_100us() -> None:
    slow = LabConfig(rate="200mbit")
    assert slow.frame_bytes == 1500 + 14 + ETH_WIRE_OVERHEAD_BYTES
    assert slow.effective_burst_bytes == BURST_MIN_FRAMES * slow.frame_bytes      # 100 us = 2500 B < 8 frames
    fast = LabConfig(rate="10gbit")
    assert fast.effective_burst_bytes == 125_000                                  # 100 us of 10 Gbit/s
    assert LabConfig(rate="1gbit", burst_bytes=3000).effective_burst_bytes == 3000


def test_queue_limit_default_and_override() -> None:
    assert LabConfig(rate="1gbit").effective_queue_limit_bytes == 625_000          # 5 ms of 1 Gbit/s
    assert LabConfig(rate="1mbit").effective_queue_limit_bytes == 64 * 1024        # floor
    assert LabConfig(rate="1gbit", queue_limit_bytes=30_000).effective_queue_limit_bytes == 30_000


def test_expected_goodput_counts_ethernet_ip_tcp_overhead() -> None:
    # 1448 payload bytes per 1538 wire bytes (preamble+IFG+FCS+Ethernet+IP+TCP with timestamps)
    assert LabConfig(rate="1gbit").expected_goodput_Bps == pytest.approx(1e9 / 8 * 1448 / 1538)
    assert LabConfig(rate="1gbit", mtu=9000).expected_goodput_Bps == pytest.approx(1e9 / 8 * 8948 / 9038)


def test_tbf_line_carries_rate_burst_limit_and_wire_overhead() -> None:
    config = LabConfig(rate="200mbit", queue_limit_bytes=30_000)
    line = tbf_line("eth0", config.host_shape(0))
    assert line == ("qdisc replace dev eth0 root handle 1: tbf rate 200000000bit burst 12304 limit 30000 "
                    "overhead 24")
    host_side = tbf_line("eth0", config.host_shape(0), host_side=True)
    assert "limit 1538000 " in host_side          # the NIC's 1000 frames, not the switch port's queue


def test_netem_line_only_when_asked() -> None:
    assert netem_line("eth0", LabConfig()) is None
    line = netem_line("eth0", LabConfig(delay="2ms", loss="0.1%"))
    assert line is not None
    assert "parent 1:1" in line and "delay 2000us" in line and "loss 0.1%" in line


def test_delay_and_loss_parsing() -> None:
    assert parse_delay_s("100us") == pytest.approx(1e-4)
    assert parse_delay_s("2ms") == pytest.approx(2e-3)
    assert parse_delay_s("50") == pytest.approx(50e-6)
    assert parse_loss_pct("0.1%") == pytest.approx(0.1)


def test_namespace_ownership_is_exact() -> None:
    assert owns_netns("a", "diag-a-h0")
    assert owns_netns("a", "diag-a-sw")
    assert owns_netns("a", "diag-a-h12")
    assert not owns_netns("a", "diag-a_b-h0")
    assert not owns_netns("a", "diag-a-hx")
    assert not owns_netns("a", "diag-ab-h0")
    assert not owns_netns("a", "other")


@given(st.from_regex(r"[a-z0-9][a-z0-9_]{0,11}", fullmatch=True), st.from_regex(r"[a-z0-9][a-z0-9_]{0,11}",
                                                                                  fullmatch=True))
def test_two_lab_names_never_claim_each_others_namespaces(first: str, second: str) -> None:
    lab = plan_lab(LabConfig(name=second, hosts=3))
    claimed = [ns for ns in [lab.switch_netns, *(h.netns for h in lab.hosts)] if owns_netns(first, ns)]
    assert (claimed != []) == (first == second)


def test_plan_addresses_and_json_round_trip() -> None:
    lab = plan_lab(LabConfig(name="x", hosts=3, rate="100mbit"))
    assert [h.address for h in lab.hosts] == ["10.77.0.1", "10.77.0.2", "10.77.0.3"]
    assert [h.netns for h in lab.hosts] == ["diag-x-h0", "diag-x-h1", "diag-x-h2"]
    assert lab.exec_prefix(lab.hosts[1]) == ["ip", "netns", "exec", "diag-x-h1"]
    assert lab.host("h2") == lab.host(2) == lab.host("2") == lab.host("10.77.0.3")
    with pytest.raises(DiagError, match="no host"):
        lab.host("h9")
    again = Lab.from_json(json.loads(json.dumps(lab.to_json())))
    assert again == lab
    assert host_address(252) == "10.77.0.253"


def test_parse_tc_json() -> None:
    sample = json.dumps([
        {"kind": "tbf", "handle": "1:", "root": True, "refcnt": 3, "options": {"rate": 25000000, "burst": 12325,
                                                                            "lat": 5000, "overhead": 24},
         "bytes": 1000, "packets": 2, "drops": 3, "overlimits": 0, "requeues": 0, "backlog": 0, "qlen": 0},
        {"kind": "netem", "handle": "10:", "parent": "1:1", "options": {"limit": 1000, "delay": {"delay": 0.0001}}},
    ])
    tbf, netem = parse_qdiscs("ns", "eth0", sample)
    assert tbf.kind == "tbf" and tbf.parent == "root" and tbf.rate_bps == 200e6
    assert tbf.burst_bytes == 12325 and tbf.overhead_bytes == 24 and tbf.drops == 3
    assert netem.kind == "netem" and netem.parent == "1:1" and netem.rate_bps is None
    assert parse_qdiscs("ns", "eth0", "not json") == []


@pytest.mark.parametrize("name", ["zzq\n", "diag\n", "a\nb", "x" * 13, "", "Zz"])
def test_lab_name_is_matched_whole(name: str) -> None:
    # "zzq\n" passed NAME_RE.match (its "$" matches before a final newline) and would split an ip -batch line.
    with pytest.raises(DiagError, match="bad lab name"):
        LabConfig(name=name).validated()
    with pytest.raises(DiagError, match="bad lab name"):
        tear_down(name)   # checked before anything looks at namespaces


def test_down_all_sees_only_namespaces_a_lab_could_create() -> None:
    # One length bound for both: a namespace named like a lab whose name is too long is not a lab's, so
    # `lab down --all` never stops on a name it would refuse.
    longest = "x" * 12
    assert lab_name_of(f"diag-{longest}-h0") == longest
    assert lab_name_of(f"diag-{longest}y-h0") is None
    assert lab_name_of("diag-zzq\n-h0") is None
    assert lab_name_of("diag-zzq-h0\n") is None
    for netns in ("diag-a-h0", "diag-a-sw", f"diag-{longest}-h63"):
        name = lab_name_of(netns)
        assert name is not None
        LabConfig(name=name).validated()


def test_a_streams_bound_on_the_lab_is_its_slower_hosts_link() -> None:
    """The in-place job's "the CPU limits this machine" note compares its first stream with this bound: on a
    lab where h1's NIC is slowed, h0 -> h1 is bounded by h1's link, not the lab's rate (else a slow NIC
    reads as a busy CPU)."""
    from diag.inplace.links import lab_stream_bound_Bps
    from diag.lab.topology import plan_lab
    from diag.runplan import lab_meta

    meta = lab_meta(plan_lab(LabConfig(name="bound", hosts=3, rate="200mbit").with_faults(["h1:rate=25%"])))
    full, quarter = meta["expected_goodput_Bps"], meta["host_list"][1]["link"]["expected_goodput_Bps"]
    assert 0.24 < quarter / full < 0.26
    assert lab_stream_bound_Bps(meta, "h0", "h1") == lab_stream_bound_Bps(meta, "h1", "h2") == quarter
    assert lab_stream_bound_Bps(meta, "h0", "h2") == full
    assert lab_stream_bound_Bps({"expected_goodput_Bps": full}, "a", "b") == full   # hosts not listed
    assert lab_stream_bound_Bps({}, "a", "b") is None                               # not a lab

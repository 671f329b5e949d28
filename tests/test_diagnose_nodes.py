"""The report side of the in-place job: a run directory with nodes/ loads (fingerprints, every node's captures
and TCP_INFO, typed topology and link matrix, address -> node), and the rules that name the cause and the
host fire on runs built to show each fault, stay silent on healthy ones, and never let a fault fire the N=2
mechanism. Inputs are run directories written by code (node_helpers, report_helpers)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from node_helpers import (
    ADDRESS,
    NODES,
    LAB_Bps,
    SLOW_Bps,
    endpoint,
    fingerprint,
    link_matrix,
    nic_samples,
    observer_series,
    rank_cpu,
    ring_records,
    write_inplace_run,
)
from report_helpers import (
    ANOMALY_SHAPES,
    MiB,
    analysis,
    anomaly_records,
    connection,
    direction,
    flat_records,
    host_cpu_samples,
    make_record,
    n2_trial,
    shaped_times,
    trial_records,
    write_run_dir,
    write_trial,
)

from diag.report import diagnose, load_run, write_report
from diag.report.diagnose import (
    cpu_bound,
    loss_at_host,
    negative_control,
    node_fingerprints,
    slow_host_link,
    window_at_host,
)
from diag.report.diagnose.findings import Finding
from diag.report.nodes import NodeFlow, node_flows
from diag.report.thresholds import LOSS_HOST_SHARE, SLOW_LINK_RATIO
from diag.report.verdict import build_verdict, verdict_lines

# computes in this process: may run beside an `alone` test (tests/conftest.py)
pytestmark = pytest.mark.in_process

HEALTHY = {2: LAB_Bps, 3: LAB_Bps, 4: LAB_Bps}
PACED_BY_H3 = {2: LAB_Bps, 3: LAB_Bps, 4: SLOW_Bps}     # subgroups h0,h1 / h0..h2 / h0..h3: only N=4 has h3


def by_rule(findings: list[Finding]) -> dict[str, list[Finding]]:
    out: dict[str, list[Finding]] = {}
    for f in findings:
        out.setdefault(f.rule, []).append(f)
    return out


def ring(world_size: int, flows: dict[tuple[str, str], dict], backend: str = "gloo") -> dict:
    """An analysis of a ring capture: each (src, dst) one connection src:5000+i -> dst:40000+i carrying
    ``flows[(src, dst)]`` one way (the other direction ACKs only)."""
    conns = [connection(endpoint(src, 5000 + i), endpoint(dst, 40000 + i), d, direction(0, packets=400), 0.0)
             for i, ((src, dst), d) in enumerate(sorted(flows.items()))]
    doc = analysis(world_size, conns, backend=backend)
    doc["phases"][0]["phase"]["t_end_ns"] = 2_000_000_000   # one record phase over the 2 s the flows ran
    return doc


# --- loading ---


def test_inplace_layout_loads_nodes_topology_matrix_and_names_directions(tmp_path: Path) -> None:
    n4 = ring(4, {("h0", "h1"): direction(12 * MiB), ("h2", "h3"): direction(12 * MiB)})
    root = write_inplace_run(tmp_path / "run", ring_records(HEALTHY), matrix=link_matrix(),
                             fingerprints={n: fingerprint(n) for n in NODES if n != "h3"},
                             analyses={"h0": {"gloo--gloo-all_gather-n4": n4}, "h2": {"gloo--gloo-all_gather-n4": n4}},
                             tcpinfo={"h1": observer_series(endpoint("h1", 40000), endpoint("h0", 5000))})
    run = load_run([root])
    assert list(run.nodes) == list(NODES) and run.info.mode == "lab"
    assert run.topology is not None and run.topology.subgroup(3) == [0, 1, 2]
    assert run.link_matrix is not None and len(run.link_matrix.alone()) == 12
    # rank 0's node is the capture point every earlier rule reads; every node's captures are there too
    assert list(run.captures) == ["gloo--gloo-all_gather-n4"] and run.captures["gloo--gloo-all_gather-n4"].node == "h0"
    assert sorted(c.node for c in run.all_captures) == ["h0", "h2"]
    assert run.captures["gloo--gloo-all_gather-n4"].source("analysis") == "nodes/h0/analysis/gloo--gloo-all_gather-n4.json"
    assert set(run.fingerprints()) == {"h0", "h1", "h2"}
    assert any("fingerprint.json of h3" in m for m in run.missing)
    lookup = run.lookup
    assert lookup.direction_text("10.77.0.3:4711->10.77.0.1:5000") == "into h0 from h2"
    assert lookup.node_of("[::ffff:10.77.0.2]:40000") == "h1" and lookup.node_of_rank(3) == "h3"
    assert lookup.node_of("10.9.9.9:1") is None
    # a connection both h0's and h2's captures saw is one flow per capture tag, with its ends named
    flows = node_flows(run)
    assert {(f.src, f.dst) for f in flows} == {("h0", "h1"), ("h1", "h0"), ("h2", "h3"), ("h3", "h2")}
    assert all(isinstance(f, NodeFlow) for f in flows) and flows[0].text.startswith("into ")


def test_the_earlier_layout_names_lab_hosts_by_address(tmp_path: Path) -> None:
    root = write_run_dir(tmp_path / "run", flat_records(), meta={"lab": {"name": "t", "rate_bps": 1e8, "hosts": 2,
                                                                          "addresses": ["10.77.0.1", "10.77.0.2"]}})
    run = load_run([root])
    assert run.nodes == {} and run.node_names == ["h0", "h1"]
    assert run.lookup.direction_text("10.77.0.2:40000->10.77.0.1:5000") == "into h0 from h1"


# --- slow host link ---


def test_slow_host_link_names_the_host_and_the_n_it_paces(tmp_path: Path) -> None:
    root = write_inplace_run(tmp_path / "run", ring_records(PACED_BY_H3),
                             matrix=link_matrix(out_Bps={"h3": SLOW_Bps}, in_Bps={"h3": SLOW_Bps}))
    [found] = slow_host_link(load_run([root]))
    assert found.status == "fired" and found.strength == "strong"
    assert found.statement.startswith("h3's link is slow both ways")
    assert "every N that includes it (N=4) is paced by it" in found.statement
    assert "without it N=2,3 reach up to" in found.statement
    assert found.evidence[0].values["node"] == "h3" and found.evidence[0].plot == "link_matrix.png"
    paced = [e for e in found.evidence if e.values.get("includes")]
    assert [e.values["world_size"] for e in paced] == [4] and paced[0].values["share"] <= 1.1


def test_a_host_slow_only_receiving_and_one_slow_edge(tmp_path: Path) -> None:
    root = write_inplace_run(tmp_path / "rx", ring_records(HEALTHY), matrix=link_matrix(in_Bps={"h2": SLOW_Bps}))
    [found] = slow_host_link(load_run([root]))
    assert found.statement.startswith("h2's link is slow receiving")
    edge = write_inplace_run(tmp_path / "edge", ring_records(HEALTHY),
                             matrix=link_matrix(edges={("h1", "h3"): 0.5 * LAB_Bps}))
    [found] = slow_host_link(load_run([edge]))
    assert found.status == "fired" and found.statement.startswith("the one edge h1 -> h3 is slow")
    assert "node" not in found.evidence[0].values


def test_slow_host_link_clear_undecided_and_a_survey_that_disagrees(tmp_path: Path) -> None:
    healthy = write_inplace_run(tmp_path / "ok", ring_records(HEALTHY), matrix=link_matrix())
    [found] = slow_host_link(load_run([healthy]))
    assert found.status == "clear" and f"{1 - SLOW_LINK_RATIO.value:.0%}" in found.statement
    assert slow_host_link(load_run([write_inplace_run(tmp_path / "none", ring_records(HEALTHY))]))[0].status == "undecided"
    two = write_inplace_run(tmp_path / "two", ring_records({2: LAB_Bps}), nodes=NODES[:2],
                            matrix=link_matrix(nodes=NODES[:2]))
    [found] = slow_host_link(load_run([two]))
    assert found.status == "undecided" and "every edge touches both ends" in found.statement
    # the matrix says h3 is slow, yet N=4 (with h3) ran at the full rate: said, and one step less sure
    disagree = write_inplace_run(tmp_path / "disagree", ring_records(HEALTHY),
                                 matrix=link_matrix(out_Bps={"h3": SLOW_Bps}, in_Bps={"h3": SLOW_Bps}))
    [found] = slow_host_link(load_run([disagree]))
    assert found.status == "fired" and found.strength == "moderate"
    assert "the matrix and the survey disagree" in found.statement


# --- loss at one host ---


def lossy_rx_run(root: Path, *, into: str = "h1", matrix: dict | None = None) -> Path:
    """A shallow receive queue at ``into``: its peers' segments to it are dropped and resent (seen by the
    sender's capture, which saw the originals leave), its ranks' cwnd cut in TCP_INFO; N=2, 3, 4 captured on
    every node, each connection by both ends."""
    others = [n for n in NODES if n != into]
    analyses: dict[str, dict[str, dict]] = {n: {} for n in NODES}
    observe: dict[str, dict[str, list]] = {n: {} for n in NODES}
    for n, senders in ((2, others[:1]), (3, others[:2]), (4, others)):
        flows = {(s, into): {**direction(16 * MiB, packets=12000, retrans=150, idle_count=3, idle_total_s=0.9,
                                         idle_max_s=0.31), "active_goodput_Bps": 6.1e6} for s in senders}
        flows.update({(into, d): direction(16 * MiB, packets=12000, retrans=0) for d in others[:len(senders)]})
        doc = ring(n, flows)
        for node in NODES:
            analyses[node][f"gloo-all_gather--gloo-all_gather-n{n}"] = doc
    for s in others:
        observe[s]["gloo-all_gather--gloo-all_gather-n4"] = observer_series(
            endpoint(s, 5000), endpoint(into, 40000), cwnd=[60, 64, 40, 44, 48, 30, 34, 8], retrans=150)
    return write_inplace_run(root, ring_records(HEALTHY), analyses=analyses, observe=observe,
                             matrix=matrix or link_matrix())


def test_one_edge_that_carries_nearly_all_the_loss_is_that_edges(tmp_path: Path) -> None:
    """The slow-nic saved run: h1's shaper drops what h0 sends it (128,463 segments resent h0 -> h1), while
    h0 -> h2 and h0 -> h3 resend 47 and 51, enough for the retransmissions rule's bar. The loss is the edge's
    into h1, never "out of h0 from 3 peers"."""
    resent = {("h0", "h1"): (1_521_086, 128_463), ("h0", "h2"): (17_792, 47), ("h0", "h3"): (22_545, 51)}
    flows = {pair: direction(16 * MiB, packets=packets, retrans=count) for pair, (packets, count) in resent.items()}
    flows.update({(d, "h0"): direction(16 * MiB, packets=12000) for d in ("h1", "h2", "h3")})
    doc = ring(4, flows)
    root = write_inplace_run(tmp_path / "run", ring_records(HEALTHY),
                             analyses={n: {"gloo-all_gather--gloo-all_gather-n4": doc} for n in NODES})
    [found] = loss_at_host(load_run([root]))
    assert found.status == "fired" and found.statement.startswith("segments are lost on the directions into h1 (the "
                                                                  "edge h0 -> h1 carries them")
    assert "out of h0" not in found.statement and found.thresholds["LOSS_PEER_SHARE"] == 0.1


def test_loss_at_one_host_names_it_with_cwnd_cuts_and_cost(tmp_path: Path) -> None:
    [found] = loss_at_host(load_run([lossy_rx_run(tmp_path / "run")]))
    assert found.status == "fired" and found.strength == "strong"
    assert found.statement.startswith("segments are lost on the directions into h1 (from 3 peers)")
    assert "the lossy directions moved data at 73% of the rate of the other directions of the same steps" in found.statement
    assert ("inside timed iterations they idled 5.4 s of 12 s (longest gap 0.31 s, past the 0.2 s minimum "
            "retransmission timeout)") in found.statement
    assert "cwnd cut" in found.statement
    first = found.evidence[0]
    assert first.values["dst"] == "h1" and first.text.startswith("into h1 from ")
    # each connection both ends captured counts once: 150 per sender and N, not twice
    assert first.values["retransmissions"] == 450
    cuts = next(e for e in found.evidence if "cwnd_cuts" in e.values)
    assert cuts.values["cwnd_cuts"] >= 3 and cuts.values["cwnd_collapses"] == 3


def test_loss_on_one_edge_is_placed_by_the_senders_own_capture_or_the_matrix(tmp_path: Path) -> None:
    """In a ring, h0 alone sends to h1: h0's sending side and h1's receiving side are both candidates. The
    sender's capture saw the segments leave (no gaps), so they were lost on the way into h1; with a matrix
    that shows h0 sending slowly, h0's side is named."""
    def edge_run(root: Path, gaps: int, matrix: dict) -> Path:
        lossy = direction(16 * MiB, packets=12000, retrans=150)
        lossy["lost_segments"] = gaps
        clean = direction(16 * MiB, packets=12000)
        flows = {("h0", "h1"): lossy, ("h1", "h2"): clean, ("h2", "h3"): clean, ("h3", "h0"): clean}
        doc = ring(4, flows)
        return write_inplace_run(root, ring_records(HEALTHY), matrix=matrix,
                                 analyses={n: {"gloo-all_gather--gloo-all_gather-n4": doc} for n in NODES})
    [into] = loss_at_host(load_run([edge_run(tmp_path / "a", 0, link_matrix())]))
    assert into.statement.startswith("segments are lost on the directions into h1 (the edge h0 -> h1 carries them")
    assert "h0's own capture saw the segments leave" in into.statement and into.strength == "moderate"
    [out] = loss_at_host(load_run([edge_run(tmp_path / "b", 0, link_matrix(out_Bps={"h0": 0.5 * LAB_Bps}))]))
    assert out.statement.startswith("segments are lost on the directions out of h0")
    [both] = loss_at_host(load_run([edge_run(tmp_path / "c", 40, link_matrix())]))
    assert both.strength == "weak" and "h0's sending side or h1's receiving side" in both.statement


def test_loss_spread_over_hosts_or_seen_from_one_point_names_no_host(tmp_path: Path) -> None:
    spread = {(s, d): direction(16 * MiB, packets=12000, retrans=40)
              for s, d in (("h0", "h1"), ("h1", "h2"), ("h2", "h3"), ("h3", "h0"))}
    root = write_inplace_run(tmp_path / "spread", ring_records(HEALTHY), matrix=link_matrix(),
                             analyses={n: {"gloo-all_gather--gloo-all_gather-n4": ring(4, spread)} for n in NODES})
    [found] = loss_at_host(load_run([root]))
    assert found.status == "clear" and f"no one host holds {LOSS_HOST_SHARE.value:.0%}" in found.statement
    # the earlier layout's one capture point (h0) sees every direction of h0 but only those of the others that
    # touch it: the lab's addresses name the hosts, yet no host is named from it
    lab = {"lab": {"name": "t", "rate_bps": 2e8, "hosts": 3, "addresses": [ADDRESS[n] for n in NODES[:3]]}}
    into_h0 = {("h1", "h0"): direction(16 * MiB, packets=12000, retrans=150),
               ("h2", "h0"): direction(16 * MiB, packets=12000, retrans=150), ("h0", "h1"): direction(16 * MiB)}
    one = write_run_dir(tmp_path / "one", flat_records(), analyses={"gloo_n3": ring(3, into_h0)}, meta=lab)
    [found] = loss_at_host(load_run([one]))
    assert found.status == "undecided" and "one capture point" in found.statement
    # two nodes saw it, but data ran one way only (the other way ACKs): nothing into another host to compare with
    solo = ring(2, {("h1", "h0"): direction(16 * MiB, packets=12000, retrans=150)})
    alone = write_inplace_run(tmp_path / "alone", ring_records(HEALTHY), nodes=NODES[:2],
                              analyses={"h0": {"x-n2": solo}, "h1": {"x-n2": solo}})
    [found] = loss_at_host(load_run([alone]))
    assert found.status == "undecided" and "no direction into another host was seen" in found.statement
    clean = write_inplace_run(tmp_path / "clean", ring_records(HEALTHY), matrix=link_matrix(),
                              analyses={"h0": {"x-n4": ring(4, {("h0", "h1"): direction(16 * MiB, packets=12000)})}})
    assert loss_at_host(load_run([clean]))[0].status == "clear"


def test_loss_the_ring_cannot_place_is_placed_by_the_link_matrix(tmp_path: Path) -> None:
    """A shallow port in front of h1: the ring's steps send into h1 from h0 alone (loss on one edge, below the
    share bar), but the matrix's flows reach h1 from every peer and resend there, both ways at once above all;
    the steps corroborate. Loss spread over the matrix, or on one peer's edges only, names no host."""
    into_h1 = {("h0", "h1"): (2, 300), ("h2", "h1"): (1, 520), ("h3", "h1"): (4, 260), ("h1", "h0"): (0, 3)}
    shallow = link_matrix(retransmits=into_h1, bidir={pair: 0.4 for pair in into_h1 if pair[1] == "h1"})
    steps = {("h0", "h1"): direction(16 * MiB, packets=12000, retrans=14),
             ("h1", "h2"): direction(16 * MiB, packets=12000, retrans=3),
             ("h2", "h3"): direction(16 * MiB, packets=12000, retrans=2),
             ("h3", "h0"): direction(16 * MiB, packets=12000, retrans=4)}
    analyses = {n: {"gloo-all_gather--gloo-all_gather-n4": ring(4, steps)} for n in NODES}
    root = write_inplace_run(tmp_path / "shallow", ring_records(HEALTHY), matrix=shallow, analyses=analyses)
    [found] = loss_at_host(load_run([root]))
    assert found.status == "fired" and "into h1 (from 3 peers, in the link matrix's flows)" in found.statement
    assert found.strength == "strong" and "lose most there too" in found.statement
    assert {e.values.get("node") for e in found.evidence if "src" in e.values} == {"h1"}
    assert {e.values["src"] for e in found.evidence if "src" in e.values} == {"h0", "h2", "h3"}
    # the same matrix without the steps' corroboration: moderate
    quiet = {n: {"gloo-all_gather--gloo-all_gather-n4": ring(4, {pair: direction(16 * MiB, packets=12000)
                                                                    for pair in steps})} for n in NODES}
    [found] = loss_at_host(load_run([write_inplace_run(tmp_path / "m", ring_records(HEALTHY), matrix=shallow,
                                                       analyses=quiet)]))
    assert found.status == "fired" and found.strength == "moderate"
    # spread: every host's edges resend alike
    spread = {(s, d): (1, 200) for s in NODES for d in NODES if s != d}
    root = write_inplace_run(tmp_path / "spread", ring_records(HEALTHY), matrix=link_matrix(retransmits=spread),
                             analyses=analyses)
    [found] = loss_at_host(load_run([root]))
    assert found.status == "clear" and "link matrix" not in found.statement
    # one peer's edge only: no host can be told from that peer's sending side
    one = link_matrix(retransmits={("h0", "h1"): (5, 900)})
    root = write_inplace_run(tmp_path / "one", ring_records(HEALTHY), matrix=one, analyses=quiet)
    assert loss_at_host(load_run([root]))[0].status == "clear"
    # one edge with nearly all of it and a few segments on another (the jumbo-host lab beside a busy machine:
    # 91 h2 -> h0, 3 h1 -> h0): the few (under LOSS_PEER_SHARE of it) are no second peer: no host's loss
    nearly_one = link_matrix(retransmits={("h2", "h0"): (40, 400), ("h1", "h0"): (1, 20)})
    root = write_inplace_run(tmp_path / "nearly-one", ring_records(HEALTHY), matrix=nearly_one, analyses=quiet)
    assert loss_at_host(load_run([root]))[0].status == "clear"
    # the same two edges with the second holding a real part of it: a host's loss, from 2 peers
    two = link_matrix(retransmits={("h2", "h0"): (40, 400), ("h1", "h0"): (10, 90)})
    root = write_inplace_run(tmp_path / "two", ring_records(HEALTHY), matrix=two, analyses=quiet)
    [found] = loss_at_host(load_run([root]))
    assert found.status == "fired" and "into h0 (from 2 peers, in the link matrix's flows)" in found.statement
    # a matrix from before retransmits were recorded: the captures' reading alone
    root = write_inplace_run(tmp_path / "old", ring_records(HEALTHY), matrix=link_matrix(), analyses=analyses)
    assert loss_at_host(load_run([root]))[0].status == "clear"


def test_loss_converging_on_one_host_is_placed_by_the_matrix_incast(tmp_path: Path) -> None:
    """A shallow port in front of h1 (measured on the lab, reno: 7.8-8.7% of the segments into h1 resent after
    the warm-up, 0.39-0.57% into the others): the incast names h1 from its three senders. Loss alike into
    every host (bbr: 3.7-4.7% everywhere), a contrast under LOSS_RATE_CONTRAST, one lossy sender, a host that
    stands out in one round of two (a fluke), or counts that were not read, name no host from the incast."""
    quiet = {n: {"gloo-all_gather--gloo-all_gather-n4": ring(4, {(a, b): direction(16 * MiB, packets=12000)
                                                                    for a, b in zip(NODES, NODES[1:] + NODES[:1], strict=True)})}
             for n in NODES}

    def verdict(name: str, incast: dict[tuple[str, str], int | None] | list[dict[tuple[str, str], int | None]]
                ) -> Finding:
        root = write_inplace_run(tmp_path / name, ring_records(HEALTHY), matrix=link_matrix(incast=incast),
                                 analyses=quiet)
        [found] = loss_at_host(load_run([root]))
        return found

    def everywhere(resent: int) -> dict[tuple[str, str], int | None]:
        return {(s, d): resent for s in NODES for d in NODES if s != d}

    shallow = {**everywhere(4), **{(s, "h1"): 700 for s in NODES if s != "h1"}}
    found = verdict("shallow", shallow)
    assert found.status == "fired" and "into h1: with every other node sending into it at once" in found.statement
    assert "in 2 rounds" in found.statement and "starved" not in found.statement
    assert found.strength == "moderate"      # the steps saw no loss: nothing corroborates, and it cost them little
    assert "the run's own steps lost only 0.000% of their packets into h1" in found.statement
    blamed = [e.values for e in found.evidence if "src" in e.values]
    assert {v["node"] for v in blamed} == {"h1"} and {v["src"] for v in blamed} == {"h0", "h2", "h3"}
    for shares in (e.values["shares"] for e in found.evidence if "shares" in e.values):
        assert shares["h1"] > 0.08 and max(v for k, v in shares.items() if k != "h1") < 0.001
    # a fluke: h1 stands out in the first round, h3 loses as much in the second
    fluke = [shallow, {**everywhere(4), **{(s, "h3"): 700 for s in NODES if s != "h3"},
                       **{(s, "h1"): 650 for s in NODES if s != "h1"}}]
    assert verdict("fluke", fluke).status == "clear"
    # one round only (measure_incast(rounds=1)): judged on it
    assert verdict("one-round", [shallow]).status == "fired"
    # incast collapse (CI, 2026-12-03): in round 1 h2 -> h1 sat in retransmission timeouts (a few KB/s, 22
    # segments resent) and h1's share read low; a starved sender into h1 alone keeps that round h1's
    root = write_inplace_run(tmp_path / "starved", ring_records(HEALTHY), matrix=link_matrix(incast=[everywhere(4),
                             shallow]), analyses=quiet)
    data = json.loads((root / "run.json").read_text())
    first_into_h1 = next(ph for ph in data["link"]["matrix"]["incast"] if ph["round"] == 1 and ph["dst"] == "h1")
    first_into_h1["flows"][1].update(goodput_Bps=8.7e3, steady_retransmits=22)
    (root / "run.json").write_text(json.dumps(data))
    [found] = loss_at_host(load_run([root]))
    assert found.status == "fired" and "in round 1 h2 -> h1 starved" in found.statement, found.statement
    # a sender held to an eighth of its fair share is starved too (beside the parallel suite, 2026-12-05: 1.58 MB/s
    # beside 23.5 MB/s into the shallow port, 22 segments resent); one at two thirds of it (the least of a healthy
    # port's senders beside the suite) is not, and that round then names nobody
    saved = [dict(flow) for flow in first_into_h1["flows"]]
    for share, fired in ((0.126, True), (0.67, False)):
        others = 23.5e6 + 12e6
        held = share * others / (len(saved) - share)    # held / mean(all three) == share
        for flow, goodput in zip(first_into_h1["flows"], (23.5e6, held, 12e6), strict=True):
            flow.update(goodput_Bps=goodput)
        (root / "run.json").write_text(json.dumps(data))
        [found] = loss_at_host(load_run([root]))
        assert (found.status == "fired") is fired, (share, found.statement)
    for flow, before in zip(first_into_h1["flows"], saved, strict=True):
        flow.update(before)
    # ... but not where a sender into another host starves in that round too (bbr's unfair incasts)
    first_into_h3 = next(ph for ph in data["link"]["matrix"]["incast"] if ph["round"] == 1 and ph["dst"] == "h3")
    first_into_h3["flows"][0].update(goodput_Bps=1e4, steady_retransmits=30)
    (root / "run.json").write_text(json.dumps(data))
    assert loss_at_host(load_run([root]))[0].status == "clear"
    # a starved round alone, no round where the share stands out: nothing
    both_starved = write_inplace_run(tmp_path / "starved2", ring_records(HEALTHY),
                                     matrix=link_matrix(incast=[everywhere(4), everywhere(4)]), analyses=quiet)
    data = json.loads((both_starved / "run.json").read_text())
    for ph in data["link"]["matrix"]["incast"]:
        if ph["dst"] == "h1":
            ph["flows"][1].update(goodput_Bps=8.7e3, steady_retransmits=22)
    (both_starved / "run.json").write_text(json.dumps(data))
    assert loss_at_host(load_run([both_starved]))[0].status == "clear"
    # the same into every host: nothing to place
    assert verdict("alike", everywhere(320)).status == "clear"
    # into h1 3x the others: under the contrast
    assert verdict("weak", {**everywhere(100), **{(s, "h1"): 300 for s in NODES if s != "h1"}}).status == "clear"
    # one sender into h1 resends: its own sending side is as likely as h1's port
    assert verdict("one", {**everywhere(2), ("h0", "h1"): 900}).status == "clear"
    # a count not read (a sender without TCP_INFO): h1's incast cannot be compared; two hosts remain
    unread = {**shallow, ("h2", "h1"): None}
    assert verdict("unread", unread).status == "clear"


# --- window or buffer limit at one host ---


def window_run(root: Path, *, rmem_h2: str | None = "4096 16384 65536", everyone: bool = False,
               matrix: dict | None = None, fingerprints: dict[str, dict] | None = None) -> Path:
    """Sockets sending to h2 spend most of their busy time rwnd-limited (h2's small receive buffer); the
    others' barely."""
    observe: dict[str, dict[str, list]] = {n: {} for n in NODES}
    for i, (src, dst) in enumerate((("h1", "h2"), ("h3", "h2"), ("h0", "h1"), ("h2", "h3"), ("h1", "h0"))):
        limited = 1.3 if dst == "h2" or everyone else 0.04
        observe[src][f"gloo-all_gather--gloo-all_gather-n4-{i}"] = observer_series(
            endpoint(src, 5000 + i), endpoint(dst, 40000 + i), rwnd_limited_s=limited, pid=100 + i)
    fingerprints = {n: fingerprint(n) for n in NODES} | (fingerprints or {})
    if rmem_h2:
        fingerprints["h2"] = fingerprint("h2", tcp_rmem=rmem_h2)
    return write_inplace_run(root, ring_records(HEALTHY), observe=observe, fingerprints=fingerprints,
                             matrix=matrix or link_matrix())


def test_window_limit_at_one_host_tied_to_its_tcp_rmem(tmp_path: Path) -> None:
    [found] = window_at_host(load_run([window_run(tmp_path / "run")]))
    assert found.status == "fired" and found.strength == "strong"
    assert found.statement.startswith("h2's receive window limits its peers: sockets sending to h2 spent 65%")
    assert "h2's net.ipv4.tcp_rmem (4096 16384 65536) differs from h0, h1, h3's (4096 131072 6291456)" in found.statement
    assert any(e.source == "nodes/h2/fingerprint.json" for e in found.evidence)


def test_window_limit_without_a_sysctl_difference_or_at_every_host(tmp_path: Path) -> None:
    [found] = window_at_host(load_run([window_run(tmp_path / "same", rmem_h2=None)]))
    assert found.status == "fired" and found.strength == "moderate"
    assert "its net.ipv4.tcp_rmem = 4096 131072 6291456, net.core.rmem_max = 212992: as on the other nodes" in found.statement
    [alike] = window_at_host(load_run([window_run(tmp_path / "all", rmem_h2=None, everyone=True)]))
    assert alike.status == "clear" and "every host's receive window limits alike" in alike.statement


def test_a_slow_edge_at_a_window_limited_end_is_no_evidence_against_its_link(tmp_path: Path) -> None:
    """Edges at a host whose window caps its flows measure that window (about one per round trip), not the
    link: into h2 (its receive window, window_at_host) and out of h3 (its tcp_wmem below every other node's,
    from the fingerprint alone) are undecided; the same edge into a host with ordinary windows still fires."""
    slow_edges = {("h1", "h2"): 0.5 * LAB_Bps, ("h3", "h0"): 0.5 * LAB_Bps}
    root = window_run(tmp_path / "windows", matrix=link_matrix(edges=slow_edges),
                      fingerprints={"h3": fingerprint("h3", tcp_wmem="4096 16384 65536")})
    found = {f.statement.split(" carries")[0]: f for f in slow_host_link(load_run([root]))}
    assert set(found) == {"the one edge h1 -> h2", "the one edge h3 -> h0"}
    into_h2, out_of_h3 = found["the one edge h1 -> h2"], found["the one edge h3 -> h0"]
    assert into_h2.status == "undecided" and "h2's receive window limits its peers (window_at_host, strong)" in (
        into_h2.statement)
    assert out_of_h3.status == "undecided" and ("h3's net.ipv4.tcp_wmem caps its send buffer at 65536 bytes, below "
                                                "every other node's (fingerprint)") in out_of_h3.statement
    assert all("the matrix cannot tell whether this link is slow" in f.statement for f in found.values())
    # a whole host slow receiving, with its receive window the limit: undecided too
    host = window_run(tmp_path / "host", matrix=link_matrix(in_Bps={"h2": SLOW_Bps}))
    [h2] = slow_host_link(load_run([host]))
    assert h2.status == "undecided" and h2.statement.startswith("h2's link is slow receiving in the link matrix, but h2's")
    # the contrast: ordinary windows everywhere, the same slow edge fires
    plain = window_run(tmp_path / "plain", rmem_h2=None, everyone=True, matrix=link_matrix(edges=slow_edges))
    assert [f.status for f in slow_host_link(load_run([plain]))] == ["fired", "fired"]


# --- CPU-starved ranks ---


def cpu_run(root: Path, h2_nic_Bps: float, quota: float | None = 0.5) -> Path:
    """h2's ranks capped by a CPU quota (its fingerprint says how many cores), the others free; the lab's
    nodes share one machine (one boot id), which is not busy."""
    observe = {}
    for n in NODES:
        starved = n == "h2"
        samples = rank_cpu(0.48 if starved else 0.7) + nic_samples(h2_nic_Bps if starved else LAB_Bps)
        observe[n] = {"gloo-all_gather--gloo-all_gather-n4": samples + host_cpu_samples(35.0, cpus=16)}
    fingerprints = {n: fingerprint(n) for n in NODES}
    if quota is not None:
        fingerprints["h2"]["cpu_quota_cores"] = quota
    return write_inplace_run(root, ring_records(HEALTHY), observe=observe, fingerprints=fingerprints,
                             matrix=link_matrix())


def test_cpu_starved_ranks_name_their_host(tmp_path: Path) -> None:
    [found] = cpu_bound(load_run([cpu_run(tmp_path / "run", h2_nic_Bps=2.0e6)]))
    assert found.status == "fired" and found.strength == "strong"
    assert found.statement.startswith("h2's ranks are CPU-starved")
    starved = [e for e in found.evidence if e.values.get("kind") == "starved"]
    assert {e.values["node"] for e in starved} == {"h2"} and starved[0].values["link_share"] < 0.1
    assert "of its CPU quota (0.5 cores)" in starved[0].text


def quota_samples(throttled: list[int], periods_per_sample: int = 20, cores: float = 0.1) -> list[dict[str, Any]]:
    """The observers' cpu_quota samples: cumulative enforcement periods and the ones whose quota ran out."""
    return [{"kind": "cpu_quota", "t_ns": 1_000_000_000 + i * 200_000_000, "cgroup": "/diag-lab-h2",
             "quota_cores": cores, "periods": 1000 + i * periods_per_sample, "throttled_periods": 300 + held,
             "throttled_s": held * 0.009} for i, held in enumerate(throttled)]


def test_ranks_held_by_their_quota_are_starved_though_no_thread_reads_busy(tmp_path: Path) -> None:
    """Threads at ~8% of a core under a 0.1-core quota read idle; the kernel's throttling counters say the
    quota ran out in most periods, while the NIC carried a trickle: h2 is named."""
    observe = {n: {"gloo-all_gather--gloo-all_gather-n4": rank_cpu(0.08 if n == "h2" else 0.7)
                   + nic_samples(2.0e6 if n == "h2" else LAB_Bps) + host_cpu_samples(35.0, cpus=16)} for n in NODES}
    observe["h2"]["gloo-all_gather--gloo-all_gather-n4"] += quota_samples([0, 15, 31, 46, 62, 77, 93, 108])
    root = write_inplace_run(tmp_path / "run", ring_records(HEALTHY), observe=observe, matrix=link_matrix())
    [found] = cpu_bound(load_run([root]))
    assert found.status == "fired" and found.statement.startswith("h2's ranks are CPU-starved")
    assert any("CPU quota (0.1 cores) ran out in 77% of 140 enforcement periods" in e.text for e in found.evidence)
    # the same quota, seldom reached: not starved
    observe["h2"]["gloo-all_gather--gloo-all_gather-n4"] = [
        s for s in observe["h2"]["gloo-all_gather--gloo-all_gather-n4"] if s["kind"] != "cpu_quota"
    ] + quota_samples([0, 1, 1, 2, 2, 3, 3, 4])
    root = write_inplace_run(tmp_path / "calm", ring_records(HEALTHY), observe=observe, matrix=link_matrix())
    [found] = cpu_bound(load_run([root]))
    assert found.status == "clear"


def test_a_starved_node_s_slow_edges_are_not_called_a_slow_link(tmp_path: Path) -> None:
    """The probe's iperf3 on a CPU-starved node reads its edges slow: the CPU is named, not its link."""
    observe = {n: {"gloo-all_gather--gloo-all_gather-n4": rank_cpu(0.08 if n == "h2" else 0.7)
                   + nic_samples(2.0e6 if n == "h2" else LAB_Bps) + host_cpu_samples(35.0, cpus=16)} for n in NODES}
    observe["h2"]["gloo-all_gather--gloo-all_gather-n4"] += quota_samples([0, 15, 31, 46, 62, 77, 93, 108])
    root = write_inplace_run(tmp_path / "run", ring_records(HEALTHY), observe=observe,
                             matrix=link_matrix(in_Bps={"h2": 0.6 * LAB_Bps}))
    run = load_run([root])
    [link] = slow_host_link(run)
    assert link.status == "undecided" and "h2, whose CPU was starved" in link.statement
    [cpu] = cpu_bound(run)
    assert cpu.status == "fired" and cpu.statement.startswith("h2's ranks are CPU-starved")


def test_a_busy_cpu_that_keeps_its_link_up_or_no_quota_is_not_starved(tmp_path: Path) -> None:
    [found] = cpu_bound(load_run([cpu_run(tmp_path / "up", h2_nic_Bps=0.9 * LAB_Bps)]))
    assert found.status == "clear" and "busy but keeping its link up: h2" in found.statement
    [found] = cpu_bound(load_run([cpu_run(tmp_path / "noquota", h2_nic_Bps=2.0e6, quota=None)]))
    assert found.status == "clear" and "the machine h0, h1, h2, h3 share" in found.statement


def test_a_machine_the_nodes_share_is_judged_once(tmp_path: Path) -> None:
    observe = {n: {"gloo-all_gather--gloo-all_gather-n4": rank_cpu(0.7) + host_cpu_samples(97.0, cpus=2)}
               for n in NODES}
    # raw TCP short of the link at N=4, on a healthy matrix: the machine's CPU, not a host's link, set the pace
    root = write_inplace_run(tmp_path / "run", ring_records({2: LAB_Bps, 3: LAB_Bps, 4: 0.6 * LAB_Bps}),
                             observe=observe, matrix=link_matrix())
    [found] = cpu_bound(load_run([root]))
    # nothing measured slow at N=4 (no backend row below raw there): the busy machine is an observation
    assert found.status == "observed" and "every CPU of the machine h0, h1, h2, h3 share was busy at N=4" in found.statement
    assert len([e for e in found.evidence if e.values.get("kind") == "host"]) == 1


# --- node fingerprints ---


def test_node_fingerprints_name_the_node_and_the_key(tmp_path: Path) -> None:
    fingerprints = {n: fingerprint(n) for n in NODES}
    fingerprints["h2"] = fingerprint("h2", tcp_rmem="4096 16384 65536")
    fingerprints["h3"]["interface"]["mtu"] = 9000
    root = write_inplace_run(tmp_path / "run", ring_records(HEALTHY), fingerprints=fingerprints)
    [found] = node_fingerprints(load_run([root]))
    # how the nodes differ is objective information, not an alarm: an observation (window_at_host ties a
    # limited window to a differing tcp_rmem where one costs time)
    assert found.status == "observed" and found.strength == "" and "(network keys)" in found.statement
    assert "h2's net.ipv4.tcp_rmem (4096 16384 65536) differs from h0, h1, h3's (4096 131072 6291456)" in found.statement
    assert "h3's interface.mtu (9000) differs from h0, h1, h2's (1500)" in found.statement
    assert {tuple(e.values["nodes"]) for e in found.evidence} == {("h2",), ("h3",)}


def test_volatile_keys_never_count_and_one_fingerprint_compares_nothing(tmp_path: Path) -> None:
    # every node has its own address, netns, boot id, rank and MASTER_* variables: no finding
    fingerprints = {n: fingerprint(n) for n in NODES}
    fingerprints["h1"]["boot_id"] = "another-machine"
    fingerprints["h1"]["hostname"] = "node-b"
    root = write_inplace_run(tmp_path / "run", ring_records(HEALTHY), fingerprints=fingerprints)
    [found] = node_fingerprints(load_run([root]))
    assert found.status == "clear"
    fingerprints["h1"]["torch"] = "2.12.0+cpu"
    root = write_inplace_run(tmp_path / "torch", ring_records(HEALTHY), fingerprints=fingerprints)
    [found] = node_fingerprints(load_run([root]))
    assert found.status == "observed" and "h1's torch (2.12.0+cpu) differs" in found.statement
    assert "(software keys)" in found.statement
    one = write_inplace_run(tmp_path / "one", ring_records(HEALTHY), fingerprints={"h0": fingerprint("h0")})
    assert node_fingerprints(load_run([one]))[0].status == "undecided"


def test_qdisc_handles_the_kernel_hands_out_are_no_difference(tmp_path: Path) -> None:
    """The lab's tbf on every host at the same rate and burst, each with the handle (and reference count) its
    kernel gave it: the same configuration. A different rate on one host is a difference, shown as reported."""
    fingerprints = {n: fingerprint(n) for n in NODES}
    for i, n in enumerate(NODES):
        fingerprints[n]["interface"]["qdisc"] = (f"qdisc tbf 80{17 + 2 * i}: root refcnt {2 + i % 2} rate 200Mbit "
                                                 "burst 25000b lat 50ms")
    root = write_inplace_run(tmp_path / "alike", ring_records(HEALTHY), fingerprints=fingerprints)
    [alike] = node_fingerprints(load_run([root]))
    assert alike.status == "clear"
    fingerprints["h1"]["interface"]["qdisc"] = "qdisc tbf 8019: root refcnt 2 rate 50Mbit burst 6250b lat 50ms"
    root = write_inplace_run(tmp_path / "slowed", ring_records(HEALTHY), fingerprints=fingerprints)
    [slowed] = node_fingerprints(load_run([root]))
    assert slowed.status == "observed"
    assert ("h1's interface.qdisc (qdisc tbf 8019: root refcnt 2 rate 50Mbit burst 6250b lat 50ms) differs from "
            "h0, h2, h3's (qdisc tbf 8017: root refcnt 2 rate 200Mbit burst 25000b lat 50ms)") in slowed.statement


# --- the negative control, and the mechanism it guards ---


def test_negative_control_clean_on_the_seed_anomaly_and_a_flat_run(tmp_path: Path) -> None:
    for name, records in (("anomaly", anomaly_records()), ("flat", flat_records())):
        [found] = negative_control(load_run([write_run_dir(tmp_path / name, records)]))
        assert found.status == "clear", name
        assert found.statement.startswith("N=2 is not slower with a transport that does not take turns: raw:ring")
        assert "conn=shared" not in found.statement        # the shared-connection experiment is not the control


def test_a_control_that_dips_keeps_the_mechanism_from_blaming_the_backend(tmp_path: Path) -> None:
    """The raw-TCP reference dips at N=2 like gloo (a fault that slows N=2 for every transport), and the
    interleaved trial even shows M1: the mechanism verdict does not fire, the card says it is not the
    backend's protocol."""
    root = write_run_dir(tmp_path / "run", anomaly_records(raw_dip=True))
    spec = n2_trial()
    write_trial(root / "records" / "n2-trial.jsonl", spec, trial_records(spec, shaped_times(ANOMALY_SHAPES), rounds=8))
    run = load_run([root])
    findings = diagnose(run)
    rules = by_rule(findings)
    assert rules["negative_control"][0].status == "fired"
    assert any(f.status == "fired" for f in rules["n2_busbw_dip"])
    assert rules["mechanism"][0].status == "undecided"
    assert "not its own" in rules["mechanism"][0].statement
    card = build_verdict(run, findings)
    assert card.why.startswith("Not the backend's N=2 protocol")
    assert "so is a transport that does not take turns" in card.slow


def test_the_diag_tcp_backend_is_a_control_too(tmp_path: Path) -> None:
    rows = ring_records(HEALTHY, backends=("diag_tcp",))
    [found] = negative_control(load_run([write_run_dir(tmp_path / "run", rows)]))
    assert found.status == "clear" and "torch:diag_tcp all_gather" in found.statement
    shared = [make_record("diag_tcp", r.op, r.world_size, r.size_bytes, r.times_s, knobs={"conn": "shared"})
              for r in rows]
    assert negative_control(load_run([write_run_dir(tmp_path / "shared", shared)]))[0].status == "undecided"


def test_no_control_rows_cannot_run_the_control(tmp_path: Path) -> None:
    rows = [r for r in anomaly_records() if r.backend != "raw"]
    assert negative_control(load_run([write_run_dir(tmp_path / "run", rows)]))[0].status == "undecided"


# --- fault-only runs, end to end ---


def test_a_fault_only_run_names_the_host_and_never_the_mechanism(tmp_path: Path) -> None:
    """One host at 100 Mbit/s: the link matrix and every N that includes it say so; no N=2 dip, the negative
    control clean, the mechanism not fired; the card, the report and the terminal name h3."""
    root = write_inplace_run(tmp_path / "run", ring_records(PACED_BY_H3),
                             matrix=link_matrix(out_Bps={"h3": SLOW_Bps}, in_Bps={"h3": SLOW_Bps}))
    run = load_run([root])
    result = write_report(run, root / "report")
    rules = by_rule(result.findings)
    assert rules["slow_host_link"][0].status == "fired" and "h3" in rules["slow_host_link"][0].statement
    assert rules["negative_control"][0].status == "clear"
    assert rules["mechanism"][0].status != "fired"
    assert all(f.status != "fired" for f in rules["n2_busbw_dip"])
    card = result.verdict
    assert card is not None and card.slow.startswith("One host slows the run: h3's link is slow both ways")
    assert card.why.startswith("A fault at h3: its link carries less") and "h3's NIC" in card.todo
    assert card.figure == "link_matrix.png"
    md = (root / "report" / "report.md").read_text()
    html = (root / "report" / "report.html").read_text()
    assert (root / "report" / "link_matrix.png").read_bytes().startswith(b"\x89PNG")
    assert "![Link matrix: goodput between every pair of nodes](link_matrix.png)" in md
    assert "## Nodes" in md and "| h3 | 10.77.0.4 | 3 |" in md and "N=4: h0, h1, h2, h3" in md
    assert "One host slows the run: h3" in html and "<h2 id='nodes'>Nodes<" in html
    assert "One host slows the run: h3" in "\n".join(verdict_lines(card))


def test_a_loss_fault_only_run_names_the_host_and_never_the_mechanism(tmp_path: Path) -> None:
    run = load_run([lossy_rx_run(tmp_path / "run", matrix=link_matrix(in_Bps={"h1": 0.6 * LAB_Bps}))])
    findings = diagnose(run)
    rules = by_rule(findings)
    assert rules["loss_at_host"][0].status == "fired" and "into h1" in rules["loss_at_host"][0].statement
    assert rules["mechanism"][0].status != "fired" and rules["negative_control"][0].status == "clear"
    card = build_verdict(run, findings)
    assert card.slow_status == "fired" and "h1" in card.slow
    assert any("h1" in line for line in card.hosts)     # the other host finding (the matrix) beside it


def test_a_window_fault_shows_beside_the_seed_anomaly_without_changing_its_verdict(tmp_path: Path) -> None:
    """The seed anomaly's card (dip, mechanism, workaround) stays as it is; the host finding is its own row."""
    root = window_run(tmp_path / "run")
    (root / "records" / "survey.jsonl").unlink()
    write_run_dir(root, anomaly_records())
    run = load_run([root])
    card = build_verdict(run, diagnose(run))
    assert card.slow.startswith("torch:gloo all_gather at N=2: busbw is 48% below N=3,4")
    # two causes: the host fault's own row and its own "to do" beside the workaround
    assert "And at the hosts: Give h2 the other nodes' TCP buffer settings" in card.todo
    assert any(line.startswith("h2: its receive window or send buffer holds its peers back") for line in card.hosts)

"""Write a run directory's report: report.md, a self-contained report.html (PNGs inline as base64),
the PNGs themselves, findings.json, model.json and samples.csv (every timed iteration). Reads files only, so it
can be re-run at any time.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from diag import safefs
from diag.model import Model
from diag.model.fitting import fit as fit_model
from diag.records import Record
from diag.report.arms import HEADER as ARM_HEADER
from diag.report.arms import arm_tables, describe, table_rows
from diag.report.diagnose import Finding, diagnose, findings_to_json, format_threshold
from diag.report.diagnose.findings import ordered, summary_lines
from diag.report.document import (
    Block,
    Bullets,
    Code,
    FigureBlock,
    FindingBlock,
    Heading,
    Table,
    Text,
    VerdictBlock,
    to_html,
    to_markdown,
)
from diag.report.figures import Plot, Skipped
from diag.report.nodes import differences_of, subgroup_nodes
from diag.report.plots import render_plots
from diag.report.queries import raw_link_reach
from diag.report.rundir import RunData
from diag.report.series import mean_algbw, mean_busbw, mean_time, series_label
from diag.report.thresholds import CPU_LINK_REACHED, TABLE
from diag.report.verdict import Verdict, build_verdict
from diag.typedjson import strict_document
from diag.units import human_bytes, human_rate, human_time

# Why a findings.json number can be non-finite (written as null, listed under "nonfinite").
FINDINGS_NONFINITE = "a ratio or rate over zero (a zero time or bandwidth): no finite value"
# Env values longer than this are cut in the table (the full fingerprint is in the records' start event).
ENV_VALUE_CHARS = 160


@dataclass
class ReportResult:
    out_dir: Path
    files: list[Path]
    plots: list[Plot | Skipped]
    findings: list[Finding]
    model: Model
    verdict: Verdict | None = None


def flatten(value: Any, prefix: str = "") -> list[tuple[str, str]]:
    """Nested env dicts -> ("a.b.c", "value") rows for a table."""
    if isinstance(value, dict):
        rows: list[tuple[str, str]] = []
        for k, v in value.items():
            rows += flatten(v, f"{prefix}.{k}" if prefix else str(k))
        return rows
    text = json.dumps(value) if isinstance(value, list) else str(value)
    if len(text) > ENV_VALUE_CHARS:
        text = text[: ENV_VALUE_CHARS - 3] + "..."
    return [(prefix, text)]


def record_row(r: Record) -> list[str]:
    return [series_label(r), r.op, str(r.world_size), human_bytes(r.size_bytes), human_bytes(r.volume_bytes),
            human_time(mean_time(r)), human_rate(mean_algbw(r)), human_rate(mean_busbw(r)), str(r.nwrong),
            str(len(r.times_s))]


RECORD_HEADER = ["series", "op", "N", "size", "D", "time (mean)", "algbw (mean time)", "busbw (mean time)", "#wrong",
                 "samples"]


def _model_rows(model: Model) -> list[list[str]]:
    rows = []
    for m in model.series_models:
        t = m.terms
        rows.append([m.series, m.op, ",".join(map(str, m.world_sizes)), human_time(t.alpha_s),
                     human_rate(t.bandwidth_Bps) if t.beta_s_per_byte > 0 else "-",
                     f"{t.ramp_s * 1e3:+.3g} ms, half at {human_bytes(t.ramp_half_bytes)}" if m.ramp else "-",
                     f"{t.n2_turn_share:.1%}" if m.n2_penalty else "-", f"{m.fit_error:.1%}", f"{m.stated_error:.1%}",
                     f"{m.heldout_error:.1%}" if m.heldout_error is not None else "-",
                     "yes" if m.within_stated else ("no" if m.within_stated is False else "-")])
    return rows


MODEL_HEADER = ["series", "op", "fitted N", "alpha (per step)", "1/beta (per link)", "ramp (TCP not at rate)",
                "N=2 turn-taking share", "fit error", "stated error", "held-out error", "within stated error"]


LINK_REFERENCE_HEADER = ["N", "iperf3 ring pattern (mean edge)", "of the single stream", "raw ring busbw",
                         "raw / pattern", "reference"]


def link_reference(run: RunData) -> tuple[str, list[list[str]]]:
    """Which rate each N is held against: the single-stream link, or, where the machine (CPU) could not drive
    N flows at once at that rate, the iperf3 ring pattern measured in the same run."""
    link, pattern = run.link_Bps, run.ring_pattern_Bps
    if not link or not pattern:
        return "", []
    raw_reach = raw_link_reach(run)
    rows = []
    for n in sorted(pattern):
        raw_Bps = raw_reach[n] * link if n in raw_reach else None
        cpu_limited = pattern[n] < CPU_LINK_REACHED.value * link
        rows.append([str(n), human_rate(pattern[n]), f"{pattern[n] / link:.0%}",
                     human_rate(raw_Bps) if raw_Bps is not None else "-",
                     f"{raw_Bps / pattern[n]:.0%}" if raw_Bps is not None else "-",
                     "ring pattern (CPU is the limit)" if cpu_limited else "single stream (link is the limit)"])
    intro = (f"One TCP stream carried {human_rate(link)} ({run.link_source}). Per N, iperf3 drove the ring's own "
             f"flow pattern (h(i) -> h((i+1) mod N), one flow per edge, all at once) on the same lab: where that "
             f"stayed below {CPU_LINK_REACHED.value:.0%} of the single stream, this machine's CPU, not the link, is "
             f"the limit, and the pattern is the reference at that N: the cpu_bound finding holds raw TCP against it "
             f"there (the plots keep the single stream).")
    return intro, rows


def arm_blocks(run: RunData) -> list[Block]:
    """Programs held against each other in the run's trials (diag trial), one table per world size."""
    tables = arm_tables(run)
    if not tables:
        return []
    blocks: list[Block] = [Heading(2, "Programs compared (interleaved trials)")]
    for table in tables:
        blocks += [Heading(3, table.title), Text(describe(table)), Table(ARM_HEADER, table_rows(table))]
        if table.failed:
            blocks.append(Bullets([(f"{name} failed", why) for name, why in table.failed.items()]))
    return blocks


def build_document(run: RunData, plots: list[Plot | Skipped], findings: list[Finding], model: Model,
                   title: str, created: str, verdict: Verdict | None = None) -> list[Block]:
    """The report, once: the verdict card (with the headline figure), the summary of findings, the plots,
    every finding, the records, the model, the thresholds and the environment."""
    sources = [run.relative(f.path) for f in run.record_files]
    fired = [f for f in ordered(findings) if f.status == "fired"]
    records = sorted(run.records, key=lambda r: (series_label(r), r.op, r.world_size, r.size_bytes))
    env_rows = [[k, v] for k, v in flatten(run.env)]
    meta_rows = [[k, v] for k, v in flatten(run.meta)]
    verdict = verdict or build_verdict(run, findings)
    drawn = {p.filename: p for p in plots if isinstance(p, Plot)}
    head = drawn.get(verdict.figure or "") or drawn.get("headline.png")
    blocks: list[Block] = [VerdictBlock(verdict, title, head),
                           Text(f"Generated {created} from {', '.join(sources)}.", muted=True)]
    blocks += [Heading(2, "Summary of findings"),
               Bullets([(f.rule, f"({f.strength}): {f.statement}") for f in fired] or [("", "no rule fired")]),
               Text(summary_lines(findings)[-1] + ".")]
    if run.missing:
        blocks += [Heading(3, "Missing inputs"), Bullets([("", m) for m in run.missing])]
    reference_intro, reference_rows = link_reference(run)
    if reference_rows:
        blocks += [Heading(3, "Link reference per N"), Text(reference_intro),
                   Table(LINK_REFERENCE_HEADER, reference_rows)]
    blocks += node_blocks(run)
    blocks += workaround_blocks(run.advise)
    blocks += arm_blocks(run)
    # The card's figure is drawn once, there; here its caption says how to read it.
    blocks += [Heading(2, "Plots"),
               *(Text(f"{p.title} (in the verdict card above): {p.caption}") if p is head else FigureBlock(p)
                 for p in plots)]
    blocks += [Heading(2, "Findings"), *(FindingBlock(f) for f in ordered(findings))]
    blocks += [Heading(2, "Records"), Table(RECORD_HEADER, [record_row(r) for r in records])]
    blocks += [Heading(2, "Model (per series and op, across N and size)"),
               Text("T(N,S) = L*alpha + V*beta + L*ramp*m/(m+ramp_half) + [N=2] V*n2_beta*m/(m+n2_half), with L "
                    "steps, m bytes per step and V bytes per link from the op's algorithm; the N=2 turn-taking share "
                    "is n2_beta/(beta+n2_beta) (docs/model.md). Fit error: the median error of the fitted cells' "
                    "means; stated error: 90% of them lie within it; held-out error: the worse median of fits that "
                    "left one N or one size out. Terms, intervals, every cell and where each model extrapolates: "
                    "model.json; `diag model predict`, `diag model export`.")]
    blocks += ([Table(MODEL_HEADER, _model_rows(model))] if model.series_models
               else [Text("No series has two sizes or two world sizes to fit.")])
    blocks += [Text(f"{s['series']} {s['op']}: {s['why']}", muted=True) for s in model.skipped]
    blocks += [Heading(2, "Thresholds"), Text("Every number a rule compares against (diag/report/thresholds.py)."),
               Table(["name", "value", "meaning"], [[t.name, format_threshold(t.value), t.meaning] for t in TABLE])]
    blocks += [Heading(2, "Environment"),
               Table(["key", "value"], env_rows) if env_rows else Text("No environment fingerprint in the records.")]
    if meta_rows:
        blocks += [Heading(3, "Run (run.json)"), Table(["key", "value"], meta_rows)]
    return blocks


NODE_HEADER = ["node", "address", "ranks", "data from it", "differs from the other nodes"]


def node_blocks(run: RunData) -> list[Block]:
    """The nodes (run.json topology, node folders): who they are, what each sent, what sets each apart from
    the others (fingerprint_differences, the node_fingerprints finding's source), and which nodes each N ran on."""
    names = run.node_names
    if not run.nodes and run.topology is None:
        return []     # the earlier layout: one capture point, no nodes to show
    topology = run.topology
    by_name = {n.name: n for n in topology.nodes} if topology else {}
    addresses = {node: address for address, node in run.lookup.by_address.items()}
    rows = []
    for name in names:
        node = by_name.get(name)
        ranks = ", ".join(map(str, node.ranks)) if node and node.ranks else "-"
        if node and len(node.ranks) > 1 and node.leader is not None:
            ranks += f" (leader {node.leader})"
        differs = [f"{d.key} = {d.value_of(name)}" + (f" (others: {d.groups[0][0]})" if name not in d.groups[0][1]
                                                      else " (no value the others share)")
                   for d in differences_of(run, name)]
        rows.append([name, addresses.get(name, "-"), ranks, _node_data(run, name), "; ".join(differs) or "-"])
    intro = (f"{len(names)} nodes" + (f" ({run.info.mode})" if run.info.mode else "")
             + (f" on {topology.iface}" if topology and topology.iface else "")
             + ": a node is a host as the network sees it (address, network namespace, boot id).")
    blocks: list[Block] = [Heading(2, "Nodes"), Text(intro), Table(NODE_HEADER, rows)]
    groups = subgroup_nodes(run)
    if groups:
        shared = set(topology.shared_hosts) if topology else set()
        blocks.append(Bullets([("", f"N={n}: {', '.join(nodes)}" + (" (ranks share hosts: N ranks on fewer than "
                                                                     "N hosts)" if n in shared else ""))
                               for n, nodes in sorted(groups.items())]))
    return blocks


def _node_data(run: RunData, name: str) -> str:
    left = _left_on_node(run, name)
    node = run.nodes.get(name)
    if node is None:
        return ("none (no nodes/" + name + "/)" if run.nodes else "-") + (f"; {left}" if left else "")
    analyses = sum(1 for c in node.captures.values() if c.analysis)
    observed = sum(1 for c in node.captures.values() if c.observe)
    parts = ["fingerprint" if node.fingerprint is not None else "no fingerprint",
             f"{analyses} capture analyses", f"{observed} observer files"]
    if node.tcpinfo:
        parts.append(f"{len(node.tcpinfo)} TCP_INFO samples")
    return ", ".join(parts + ([left] if left else []))


def _left_on_node(run: RunData, name: str) -> str | None:
    """What a node did not send rank 0 (too big, not a result, not a regular file), and where it stays
    (run.json ``left_on_nodes``, written where the run directory is not shared; it says why per file)."""
    left_on_nodes = run.info.extra.get("left_on_nodes")
    left = left_on_nodes.get(name) if isinstance(left_on_nodes, dict) else None
    if not (isinstance(left, dict) and isinstance(left.get("files"), list) and left["files"]):
        return None
    return f"{len(left['files'])} files left on the node in {left.get('directory')} (run.json left_on_nodes)"


def write_report(run: RunData, out_dir: Path) -> ReportResult:
    safefs.private_dir(out_dir)   # ours and closed to others: the plots' savefig by name is safe there
    plots = render_plots(run, out_dir)
    findings = diagnose(run)
    sources = [run.relative(f.path) for f in run.record_files]
    model = fit_model(run.model_records, sources=sources)

    findings_path = out_dir / "findings.json"
    safefs.write_file(findings_path, json.dumps(strict_document(findings_to_json(findings, run), FINDINGS_NONFINITE),
                                                indent=1, default=str, allow_nan=False) + "\n")
    model_path = out_dir / "model.json"
    safefs.write_file(model_path, json.dumps(model.to_json(), indent=1, allow_nan=False) + "\n")

    title = f"diag report: {run.root.name if run.root else ', '.join(sources)}"
    verdict = build_verdict(run, findings)
    blocks = build_document(run, plots, findings, model, title, time.strftime("%Y-%m-%d %H:%M:%S %Z"), verdict)
    md_path = out_dir / "report.md"
    safefs.write_file(md_path, to_markdown(blocks))
    html_path = out_dir / "report.html"
    safefs.write_file(html_path, to_html(blocks, title, out_dir))

    # Every timed iteration, long format, for pandas and R (diag.records.SAMPLE_FIELDS)
    from diag.records import export_samples_csv

    samples_path = out_dir / "samples.csv"
    export_samples_csv(run.model_records, samples_path)   # the profile's too
    files = [html_path, md_path, findings_path, model_path, samples_path] + [out_dir / p.filename for p in plots
                                                                             if isinstance(p, Plot)]
    return ReportResult(out_dir, files, plots, findings, model, verdict)


WORKAROUND_HEADER = ("workaround", "N", "per-rank size", "gloo busbw", "workaround busbw", "speed-up [95% CI]",
                     "verdict", "rounds", "#wrong")


def workaround_blocks(advise: dict[str, Any] | None) -> list[Block]:
    """The measured workarounds (advise/advise.json): a table of speed-ups against plain gloo in the same
    interleaved rounds, each with the trial's verdict, then the code a user puts in their script."""
    if not advise or not advise.get("workarounds"):
        return []
    n = advise.get("world_size") or 2

    def rate(value: float | None) -> str:
        return human_rate(value) if value is not None else "?"

    def speed(r: dict[str, Any]) -> str:
        interval = (f" [{r['speedup_low']:.2f}, {r['speedup_high']:.2f}]"
                    if r.get("speedup_low") is not None and r.get("speedup_high") is not None else "")
        return f"{r['speedup']:.2f}x{interval}"

    rows = [[w["title"], str(n), human_bytes(r["size_bytes"]), rate(r.get("baseline_busbw_Bps")),
             rate(r.get("busbw_Bps")), speed(r), r.get("verdict", "undecided"), str(r.get("rounds") or "-"),
             str(r["nwrong"])]
            for w in advise["workarounds"] for r in w.get("rows", []) if r.get("speedup") is not None]
    where = f"lab {advise['lab']}" if advise.get("lab") else "loopback"
    how = ("in one interleaved trial: every arm once a round in a fresh random order, so background load falls "
           "on all alike; speed-up = gloo's mean time / the workaround's, with the 95% bootstrap interval over "
           f"rounds; faster only where the whole interval clears {advise.get('effect', 0.1):.0%} (finding "
           "`workarounds`)")
    if advise.get("read_from_schema") == 1:
        how = ("one after the other (an earlier release's advise.json: its arms ran minutes apart, so no verdict "
               "is drawn from it; speed-up = gloo's median time / the workaround's)")
    blocks: list[Block] = [
        Heading(2, "Workarounds (measured)"),
        Text(f"Each workaround ran beside plain gloo all_gather on the same hosts ({where}), {how}."),
        Table(WORKAROUND_HEADER, rows)]
    for failure in advise.get("failures", []):
        blocks.append(Text(f"failed: {failure.get('workaround')}: {failure.get('error')}", muted=True))
    for w in advise["workarounds"]:
        if w.get("code"):
            blocks += [Heading(3, w["title"]), Code(w["code"])]
    return blocks

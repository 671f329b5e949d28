"""Write a run directory's report: report.md, a self-contained report.html (PNGs inline as base64),
the PNGs themselves, findings.json and model.json. Reads files only, so it can be re-run at any time.
"""

from __future__ import annotations

import base64
import html
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from diag.records import Record
from diag.report.diagnose import Finding, diagnose, findings_to_json, format_threshold, raw_link_reach
from diag.report.model import GroupModel, fit_all, models_to_json
from diag.report.plots import Plot, Skipped, render_plots
from diag.report.rundir import RING_PATTERN_CPU_LIMIT, RunData
from diag.report.series import series_label
from diag.units import human_bytes, human_rate, human_time

# Env values longer than this are cut in the table (the full fingerprint is in the records' start event).
ENV_VALUE_CHARS = 160


@dataclass
class ReportResult:
    out_dir: Path
    files: list[Path]
    plots: list[Plot | Skipped]
    findings: list[Finding]
    models: list[GroupModel]


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
            human_time(r.time_s), human_rate(r.algbw_Bps), human_rate(r.busbw_Bps), str(r.nwrong), str(len(r.times_s))]


RECORD_HEADER = ["series", "op", "N", "size", "D", "time (median)", "algbw", "busbw", "#wrong", "samples"]


def _md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return lines


def _html_table(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _model_rows(models: list[GroupModel]) -> list[list[str]]:
    rows = []
    for m in models:
        lin = m.linear
        bend = (f"{human_bytes(m.two_segment.breakpoint_bytes)}: {human_rate(1 / m.two_segment.beta1_s_per_byte)}"
                f" -> {human_rate(1 / m.two_segment.beta2_s_per_byte)}"
                if m.best == "two_segment" and m.two_segment and m.two_segment.beta1_s_per_byte > 0
                and m.two_segment.beta2_s_per_byte > 0 else "-")
        rows.append([m.transport, m.op, str(m.world_size), human_time(lin.alpha_s),
                     human_rate(lin.bandwidth_Bps) if lin.beta_s_per_byte > 0 else "-", f"{lin.rel_rms:.1%}",
                     m.best, bend])
    return rows


MODEL_HEADER = ["transport", "op", "N", "alpha (latency)", "1/beta (per-rank bytes/s)", "fit error (rel. RMS)",
                "best fit", "bend (two-segment)"]

_STATUS_ORDER = {"fired": 0, "undecided": 1, "clear": 2}


def _finding_lines_md(f: Finding) -> list[str]:
    head = {"fired": f"**Finding ({f.strength})**", "undecided": "**Cannot decide**", "clear": "ok"}[f.status]
    lines = [f"- {head} `{f.rule}`: {f.statement}"]
    for e in f.evidence:
        where = f"`{e.source}`" + (f", plot `{e.plot}`" if e.plot else "")
        lines.append(f"    - {e.text} ({where})")
    if f.thresholds:
        lines.append("    - thresholds: " + ", ".join(f"`{k}` = {format_threshold(v)}" for k, v in f.thresholds.items()))
    return lines


def _finding_html(f: Finding) -> str:
    head = {"fired": f"Finding ({f.strength})", "undecided": "Cannot decide", "clear": "ok"}[f.status]
    items = "".join(
        f"<li>{html.escape(e.text)} <span class='src'>[{html.escape(e.source)}"
        f"{', plot ' + html.escape(e.plot) if e.plot else ''}]</span></li>" for e in f.evidence)
    thresholds = ", ".join(f"{html.escape(k)} = {format_threshold(v)}" for k, v in f.thresholds.items())
    return (f"<div class='finding {f.status}'><b>{head}</b> <code>{html.escape(f.rule)}</code>: "
            f"{html.escape(f.statement)}<ul>{items}</ul>"
            + (f"<div class='thr'>thresholds: {thresholds}</div>" if thresholds else "") + "</div>")


_CSS = """body{font-family:sans-serif;max-width:1100px;margin:2em auto;color:#222}
table{border-collapse:collapse;font-size:12px;margin:1em 0}td,th{border:1px solid #ccc;padding:2px 6px}
th{background:#eee}.finding{margin:.6em 0;padding:.4em .8em;border-left:4px solid #999}
.fired{border-color:#c33;background:#fff4f4}.undecided{border-color:#c93;background:#fffbf0}
.clear{border-color:#3a3}.src,.thr{color:#666;font-size:11px}figure{margin:1.5em 0}
figcaption{font-size:13px;color:#444;max-width:900px}img{max-width:100%}"""


LINK_REFERENCE_HEADER = ["N", "iperf3 ring pattern (mean edge)", "of the single stream", "raw ring busbw",
                         "raw / pattern", "reference"]


def _link_reference(run: RunData) -> tuple[str, list[list[str]]]:
    """Which rate each N is held against: the single-stream link, or, where the machine (CPU) could not drive
    N flows at once at that rate, the iperf3 ring pattern measured in the same run."""
    link, pattern = run.link_Bps, run.ring_pattern_Bps
    if not link or not pattern:
        return "", []
    raw_reach = raw_link_reach(run)
    rows = []
    for n in sorted(pattern):
        raw_Bps = raw_reach[n] * link if n in raw_reach else None
        cpu_limited = pattern[n] < RING_PATTERN_CPU_LIMIT * link
        rows.append([str(n), human_rate(pattern[n]), f"{pattern[n] / link:.0%}",
                     human_rate(raw_Bps) if raw_Bps is not None else "-",
                     f"{raw_Bps / pattern[n]:.0%}" if raw_Bps is not None else "-",
                     "ring pattern (CPU is the limit)" if cpu_limited else "single stream (link is the limit)"])
    intro = (f"One TCP stream carried {human_rate(link)} ({run.link_source}). Per N, iperf3 drove the ring's own "
             f"flow pattern (h(i) -> h((i+1) mod N), one flow per edge, all at once) on the same lab: where that "
             f"stayed below {RING_PATTERN_CPU_LIMIT:.0%} of the single stream, this machine's CPU, not the link, is "
             f"the limit, and the pattern is the reference at that N: the cpu_bound finding holds raw TCP against it "
             f"there (the plots keep the single stream).")
    return intro, rows


def write_report(run: RunData, out_dir: Path) -> ReportResult:
    out_dir.mkdir(parents=True, exist_ok=True)
    plots = render_plots(run, out_dir)
    findings = diagnose(run)
    models = fit_all(run.records)
    sources = [run.relative(f.path) for f in run.record_files]

    findings_path = out_dir / "findings.json"
    findings_path.write_text(json.dumps(findings_to_json(findings, run), indent=1, default=str) + "\n")
    model_path = out_dir / "model.json"
    model_path.write_text(json.dumps(models_to_json(models, sources), indent=1) + "\n")

    ordered = sorted(findings, key=lambda f: _STATUS_ORDER[f.status])
    fired = [f for f in findings if f.status == "fired"]
    records = sorted(run.records, key=lambda r: (series_label(r), r.op, r.world_size, r.size_bytes))
    env_rows = [[k, v] for k, v in flatten(run.env)]
    meta_rows = [[k, v] for k, v in flatten(run.meta)]
    title = f"diag report: {run.root.name if run.root else ', '.join(sources)}"
    created = time.strftime("%Y-%m-%d %H:%M:%S %Z")

    md: list[str] = [f"# {title}", "", f"Generated {created} from {', '.join(sources)}.", "", "## Summary", ""]
    md += [f"- **{f.rule}** ({f.strength}): {f.statement}" for f in fired] or ["- no rule fired"]
    md += ["", f"{len(fired)} findings, {sum(f.status == 'undecided' for f in findings)} rules could not decide, "
           f"{sum(f.status == 'clear' for f in findings)} checked clear.", ""]
    if run.missing:
        md += ["### Missing inputs", ""] + [f"- {m}" for m in run.missing] + [""]
    reference_intro, reference_rows = _link_reference(run)
    if reference_rows:
        md += ["### Link reference per N", "", reference_intro, "", *_md_table(LINK_REFERENCE_HEADER, reference_rows),
               ""]
    md += ["## Plots", ""]
    for p in plots:
        if isinstance(p, Plot):
            md += [f"### {p.title}", "", f"![{p.title}]({p.filename})", "", p.caption, ""]
        else:
            md += [f"### {p.title}", "", f"Not drawn: {p.reason}.", ""]
    md += ["## Findings", ""]
    for f in ordered:
        md += _finding_lines_md(f)
    md += ["", "## Records", "", *_md_table(RECORD_HEADER, [record_row(r) for r in records])]
    md += ["", "## Model (T = alpha + beta x per-rank bytes)", "", "Full fit with covariance: `model.json`.", ""]
    md += _md_table(MODEL_HEADER, _model_rows(models)) if models else ["No group has two sizes to fit."]
    md += ["", "## Environment", ""]
    md += _md_table(["key", "value"], env_rows) if env_rows else ["No environment fingerprint in the records."]
    if meta_rows:
        md += ["", "### Run (run.json)", "", *_md_table(["key", "value"], meta_rows)]
    md_path = out_dir / "report.md"
    md_path.write_text("\n".join(md) + "\n")

    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
             f"<style>{_CSS}</style></head><body><h1>{html.escape(title)}</h1>",
             f"<p>Generated {html.escape(created)} from {html.escape(', '.join(sources))}.</p><h2>Summary</h2><ul>"]
    parts += [f"<li><b>{html.escape(f.rule)}</b> ({f.strength}): {html.escape(f.statement)}</li>" for f in fired] \
        or ["<li>no rule fired</li>"]
    parts.append("</ul>")
    if run.missing:
        parts.append("<h3>Missing inputs</h3><ul>" + "".join(f"<li>{html.escape(m)}</li>" for m in run.missing)
                     + "</ul>")
    if reference_rows:
        parts.append(f"<h3>Link reference per N</h3><p>{html.escape(reference_intro)}</p>"
                     + _html_table(LINK_REFERENCE_HEADER, reference_rows))
    parts.append("<h2>Plots</h2>")
    for p in plots:
        if isinstance(p, Plot):
            data = base64.b64encode((out_dir / p.filename).read_bytes()).decode("ascii")
            parts.append(f"<figure><h3>{html.escape(p.title)}</h3><img alt='{html.escape(p.title)}' "
                         f"src='data:image/png;base64,{data}'><figcaption>{html.escape(p.caption)}</figcaption>"
                         f"</figure>")
        else:
            parts.append(f"<h3>{html.escape(p.title)}</h3><p>Not drawn: {html.escape(p.reason)}.</p>")
    parts.append("<h2>Findings</h2>" + "".join(_finding_html(f) for f in ordered))
    parts.append("<h2>Records</h2>" + _html_table(RECORD_HEADER, [record_row(r) for r in records]))
    parts.append("<h2>Model (T = alpha + beta x per-rank bytes)</h2>"
                 + (_html_table(MODEL_HEADER, _model_rows(models)) if models else "<p>No group has two sizes.</p>"))
    parts.append("<h2>Environment</h2>" + (_html_table(["key", "value"], env_rows) if env_rows
                                            else "<p>No environment fingerprint in the records.</p>"))
    if meta_rows:
        parts.append("<h3>Run (run.json)</h3>" + _html_table(["key", "value"], meta_rows))
    parts.append("</body></html>")
    html_path = out_dir / "report.html"
    html_path.write_text("".join(parts))

    files = [html_path, md_path, findings_path, model_path] + [out_dir / p.filename for p in plots
                                                               if isinstance(p, Plot)]
    return ReportResult(out_dir, files, plots, findings, models)

"""One report document, two renderings: the report is built once as a list of blocks (headings, text,
lists, tables, figures, findings) and written as Markdown and as self-contained HTML from the same blocks,
so the two never disagree."""

from __future__ import annotations

import base64
import html
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from diag.report.diagnose.findings import Finding, format_threshold
from diag.report.figures import Plot, Skipped
from diag.report.verdict import Verdict, sure_text
from diag.textsafe import markdown as md
from diag.textsafe import visible


@dataclass(frozen=True)
class Heading:
    level: int
    text: str


@dataclass(frozen=True)
class Text:
    text: str
    muted: bool = False


@dataclass(frozen=True)
class Bullets:
    items: Sequence[tuple[str, str]]      # (bold lead, rest); an empty lead is plain text


@dataclass(frozen=True)
class Table:
    header: Sequence[str]
    rows: Sequence[Sequence[str]]


@dataclass(frozen=True)
class Code:
    text: str                             # a snippet a user copies as it is


@dataclass(frozen=True)
class FigureBlock:
    plot: Plot | Skipped


@dataclass(frozen=True)
class FindingBlock:
    finding: Finding


@dataclass(frozen=True)
class VerdictBlock:
    """The verdict card (diag.report.verdict): the first thing on the page."""

    verdict: Verdict
    title: str
    figure: Plot | None = None            # the headline figure: what is slow


Block = Heading | Text | Bullets | Table | Code | FigureBlock | FindingBlock | VerdictBlock


def esc(text: str) -> str:
    """Text for HTML: its markup escaped, and no control character left (a page read with cat is safe too)."""
    return html.escape(visible(text, keep_newlines=True))


_HEADS = {"fired": "Finding ({strength})", "observed": "Observation", "undecided": "Cannot decide", "clear": "ok"}


def to_markdown(blocks: Sequence[Block]) -> str:
    """Every string that may hold what a node wrote goes through ``md`` (diag.textsafe.markdown: no control
    character, no newline, no HTML tag), as to_html escapes it; code blocks are diag's own text."""
    lines: list[str] = []
    for block in blocks:
        if isinstance(block, Heading):
            lines += ["#" * block.level + " " + md(block.text), ""]
        elif isinstance(block, Text):
            lines += [md(block.text), ""]
        elif isinstance(block, Bullets):
            lines += [f"- **{md(lead)}** {md(rest)}" if lead else f"- {md(rest)}" for lead, rest in block.items] + [""]
        elif isinstance(block, Table):
            lines += [*_md_table(block.header, block.rows), ""]
        elif isinstance(block, Code):
            lines += ["```python", *visible(block.text, keep_newlines=True).rstrip("\n").splitlines(), "```", ""]
        elif isinstance(block, VerdictBlock):
            lines += _verdict_md(block)
        elif isinstance(block, FigureBlock):
            p = block.plot
            if isinstance(p, Plot):
                lines += [f"### {md(p.title)}", "", f"![{md(p.title)}]({p.filename})", "", md(p.caption), ""]
            else:
                lines += [f"### {md(p.title)}", "", f"Not drawn: {md(p.reason)}.", ""]
        else:
            lines += _finding_md(block.finding)
    return "\n".join(lines).rstrip("\n") + "\n"


def _verdict_rows(v: Verdict) -> list[tuple[str, str]]:
    rows = [("What is slow", v.slow), ("Why", v.why)]
    if v.sure:
        rows.append(("How sure", sure_text(v) + (f"; the experiment that shows it: {v.shown_by}" if v.shown_by else "")))
    if v.hosts:
        rows.append(("At the hosts", "; ".join(v.hosts)))
    rows.append(("What to do", v.todo))
    rows.append(("Ruled out", "; ".join(v.ruled_out) if v.ruled_out else "nothing, by experiment"))
    if v.not_isolated:
        rows.append(("Not tested here", "; ".join(v.not_isolated)))
    return rows


def _verdict_md(block: VerdictBlock) -> list[str]:
    v = block.verdict
    lines = [f"# {md(block.title)}", "", "## Verdict", ""]
    lines += [f"- **{md(lead)}:** {md(text)}" for lead, text in _verdict_rows(v)] + [""]
    for fix in v.fixes[:1]:              # the others' code is in the Workarounds section
        if fix.code:
            lines += [f"{md(fix.title)}" + (f" ({fix.speedup:.2f}x):" if fix.speedup else ":"), "",
                      "```python", *visible(fix.code, keep_newlines=True).rstrip("\n").splitlines(), "```", ""]
    if block.figure is not None:
        lines += [f"![{md(block.figure.title)}]({block.figure.filename})", ""]
    lines += ["The rules behind this card, with their evidence and thresholds: [Findings](#findings).", ""]
    return lines


def _md_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    def cell(text: str) -> str:
        return md(text).replace("|", "\\|")

    out = ["| " + " | ".join(cell(h) for h in header) + " |", "|" + "---|" * len(header)]
    return out + ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]


def _finding_md(f: Finding) -> list[str]:
    head = _HEADS[f.status].format(strength=f.strength)
    lines = [f"- {'**' + head + '**' if f.status != 'clear' else head} `{md(f.rule)}`: {md(f.statement)}"]
    for e in f.evidence:
        where = f"`{md(e.source)}`" + (f", plot `{md(e.plot)}`" if e.plot else "")
        lines.append(f"    - {md(e.text)} ({where})")
    if f.thresholds:
        lines.append("    - thresholds: " + ", ".join(f"`{md(k)}` = {format_threshold(v)}" for k, v in f.thresholds.items()))
    return lines


_CSS = """body{font-family:sans-serif;max-width:1150px;margin:1.2em auto;padding:0 .8em;color:#222;line-height:1.4}
.verdict{border:2px solid #2a5db0;background:#f2f6fd;border-radius:8px;padding:.2em 1em 1em;margin:0 0 1.5em}
.verdict h1{font-size:1.35em;margin:.5em 0 .6em;overflow-wrap:anywhere}.vgrid{display:grid;
grid-template-columns:minmax(0,1fr) minmax(0,1.1fr);grid-template-areas:"slow fig" "rest fig";column-gap:1em;
align-items:start}.vslow{grid-area:slow}.vrest{grid-area:rest}.vfig{grid-area:fig}.vrow{margin:0 0 .7em}
.vlabel{display:block;font-size:12px;font-weight:bold;text-transform:uppercase;letter-spacing:.04em;color:#2a5db0}
.vrow p{margin:.1em 0}.vfig img{width:100%;background:#fff;border:1px solid #d5deee}.vfig{margin:0}
.vmore{font-size:12px;color:#555}@media (max-width:760px){.vgrid{grid-template-columns:minmax(0,1fr);grid-template-areas:"slow" "fig" "rest"}
.vfig{margin-bottom:.8em}}
.verdict pre{white-space:pre-wrap;overflow-wrap:anywhere;background:#fff;border:1px solid #d5deee}
.scroll{overflow-x:auto}
table{border-collapse:collapse;font-size:12px;margin:1em 0}td,th{border:1px solid #ccc;padding:2px 6px}
th{background:#eee}.finding{margin:.6em 0;padding:.4em .8em;border-left:4px solid #999}
.fired{border-color:#c33;background:#fff4f4}.observed{border-color:#7a8ca8;background:#f5f7fa}
.undecided{border-color:#c93;background:#fffbf0}
.clear{border-color:#3a3}.src,.thr,.muted{color:#666;font-size:12px}figure{margin:1.5em 0}
pre{background:#f6f6f6;padding:.6em;font-size:12px;overflow-x:auto}figcaption{font-size:13px;color:#444;max-width:900px}img{max-width:100%}"""


def to_html(blocks: Sequence[Block], title: str, out_dir: Path) -> str:
    """Self-contained: every figure's PNG (in out_dir) is inlined as base64."""
    parts = [f"<!doctype html><html><head><meta charset='utf-8'>"
             f"<meta name='viewport' content='width=device-width, initial-scale=1'><title>{esc(title)}</title>"
             f"<style>{_CSS}</style></head><body>"]
    for block in blocks:
        if isinstance(block, VerdictBlock):
            parts.append(_verdict_html(block, out_dir))
        elif isinstance(block, Heading):
            anchor = f" id='{block.text.lower()}'" if block.text == "Findings" else ""
            parts.append(f"<h{block.level}{anchor}>{esc(block.text)}</h{block.level}>")
        elif isinstance(block, Text):
            parts.append(f"<p{' class=muted' if block.muted else ''}>{esc(block.text)}</p>")
        elif isinstance(block, Bullets):
            parts.append("<ul>" + "".join(f"<li><b>{esc(lead)}</b> {esc(rest)}</li>" if lead
                                          else f"<li>{esc(rest)}</li>" for lead, rest in block.items)
                         + "</ul>")
        elif isinstance(block, Table):
            head = "".join(f"<th>{esc(h)}</th>" for h in block.header)
            body = "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>" for row in block.rows)
            parts.append(f"<div class='scroll'><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>")
        elif isinstance(block, Code):
            parts.append(f"<pre><code>{esc(block.text)}</code></pre>")
        elif isinstance(block, FigureBlock):
            p = block.plot
            if isinstance(p, Plot):
                data = base64.b64encode((out_dir / p.filename).read_bytes()).decode("ascii")
                parts.append(f"<figure><h3>{esc(p.title)}</h3><img alt='{esc(p.title)}' "
                             f"src='data:image/png;base64,{data}'><figcaption>{esc(p.caption)}</figcaption>"
                             f"</figure>")
            else:
                parts.append(f"<h3>{esc(p.title)}</h3><p>Not drawn: {esc(p.reason)}.</p>")
        else:
            parts.append(_finding_html(block.finding))
    parts.append("</body></html>")
    return "".join(parts)


def _verdict_html(block: VerdictBlock, out_dir: Path) -> str:
    """What is slow, then the figure that shows it, then why / what to do / ruled out: one column on a phone;
    on a desktop the figure stands beside the text."""
    v = block.verdict

    def row(lead: str, text: str) -> str:
        code = "".join(f"<pre><code>{esc(fix.code)}</code></pre>" for fix in v.fixes[:1]
                       if fix.code and lead == "What to do")
        return f"<div class='vrow'><span class='vlabel'>{esc(lead)}</span><p>{esc(text)}</p>{code}</div>"

    first, *rest = _verdict_rows(v)
    figure = ""
    if block.figure is not None:
        data = base64.b64encode((out_dir / block.figure.filename).read_bytes()).decode("ascii")
        # the PNG beside report.html opens full size (small on a phone)
        figure = (f"<figure class='vfig'><a href='{esc(block.figure.filename)}'><img "
                  f"alt='{esc(block.figure.title)}' src='data:image/png;base64,{data}'></a></figure>")
    more = ("<p class='vmore'>The rules behind this card, with evidence and thresholds: "
            "<a href='#findings'>Findings</a>.</p>")
    return (f"<section class='verdict' id='verdict'><h1>{esc(block.title)}</h1><div class='vgrid'>"
            f"<div class='vslow'>{row(*first)}</div>{figure}"
            f"<div class='vrest'>{''.join(row(*r) for r in rest)}{more}</div></div></section>")


def _finding_html(f: Finding) -> str:
    head = _HEADS[f.status].format(strength=f.strength)
    items = "".join(
        f"<li>{esc(e.text)} <span class='src'>[{esc(e.source)}"
        f"{', plot ' + esc(e.plot) if e.plot else ''}]</span></li>" for e in f.evidence)
    thresholds = ", ".join(f"{esc(k)} = {format_threshold(v)}" for k, v in f.thresholds.items())
    return (f"<div class='finding {f.status}'><b>{head}</b> <code>{esc(f.rule)}</code>: "
            f"{esc(f.statement)}<ul>{items}</ul>"
            + (f"<div class='thr'>thresholds: {thresholds}</div>" if thresholds else "") + "</div>")

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

_HEADS = {"fired": "Finding ({strength})", "observed": "Observation", "undecided": "Cannot decide", "clear": "ok"}


def to_markdown(blocks: Sequence[Block]) -> str:
    lines: list[str] = []
    for block in blocks:
        if isinstance(block, Heading):
            lines += ["#" * block.level + " " + block.text, ""]
        elif isinstance(block, Text):
            lines += [block.text, ""]
        elif isinstance(block, Bullets):
            lines += [f"- **{lead}** {rest}" if lead else f"- {rest}" for lead, rest in block.items] + [""]
        elif isinstance(block, Table):
            lines += [*_md_table(block.header, block.rows), ""]
        elif isinstance(block, Code):
            lines += ["```python", *block.text.rstrip("\n").splitlines(), "```", ""]
        elif isinstance(block, VerdictBlock):
            lines += _verdict_md(block)
        elif isinstance(block, FigureBlock):
            p = block.plot
            if isinstance(p, Plot):
                lines += [f"### {p.title}", "", f"![{p.title}]({p.filename})", "", p.caption, ""]
            else:
                lines += [f"### {p.title}", "", f"Not drawn: {p.reason}.", ""]
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
    lines = [f"# {block.title}", "", "## Verdict", ""]
    lines += [f"- **{lead}:** {text}" for lead, text in _verdict_rows(v)] + [""]
    for fix in v.fixes[:1]:              # the others' code is in the Workarounds section
        if fix.code:
            lines += [f"{fix.title}" + (f" ({fix.speedup:.2f}x):" if fix.speedup else ":"), "",
                      "```python", *fix.code.rstrip("\n").splitlines(), "```", ""]
    if block.figure is not None:
        lines += [f"![{block.figure.title}]({block.figure.filename})", ""]
    lines += ["The rules behind this card, with their evidence and thresholds: [Findings](#findings).", ""]
    return lines


def _md_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return out + ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]


def _finding_md(f: Finding) -> list[str]:
    head = _HEADS[f.status].format(strength=f.strength)
    lines = [f"- {'**' + head + '**' if f.status != 'clear' else head} `{f.rule}`: {f.statement}"]
    for e in f.evidence:
        where = f"`{e.source}`" + (f", plot `{e.plot}`" if e.plot else "")
        lines.append(f"    - {e.text} ({where})")
    if f.thresholds:
        lines.append("    - thresholds: " + ", ".join(f"`{k}` = {format_threshold(v)}" for k, v in f.thresholds.items()))
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
             f"<meta name='viewport' content='width=device-width, initial-scale=1'><title>{html.escape(title)}</title>"
             f"<style>{_CSS}</style></head><body>"]
    for block in blocks:
        if isinstance(block, VerdictBlock):
            parts.append(_verdict_html(block, out_dir))
        elif isinstance(block, Heading):
            anchor = f" id='{block.text.lower()}'" if block.text == "Findings" else ""
            parts.append(f"<h{block.level}{anchor}>{html.escape(block.text)}</h{block.level}>")
        elif isinstance(block, Text):
            parts.append(f"<p{' class=muted' if block.muted else ''}>{html.escape(block.text)}</p>")
        elif isinstance(block, Bullets):
            parts.append("<ul>" + "".join(f"<li><b>{html.escape(lead)}</b> {html.escape(rest)}</li>" if lead
                                          else f"<li>{html.escape(rest)}</li>" for lead, rest in block.items)
                         + "</ul>")
        elif isinstance(block, Table):
            head = "".join(f"<th>{html.escape(h)}</th>" for h in block.header)
            body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in block.rows)
            parts.append(f"<div class='scroll'><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>")
        elif isinstance(block, Code):
            parts.append(f"<pre><code>{html.escape(block.text)}</code></pre>")
        elif isinstance(block, FigureBlock):
            p = block.plot
            if isinstance(p, Plot):
                data = base64.b64encode((out_dir / p.filename).read_bytes()).decode("ascii")
                parts.append(f"<figure><h3>{html.escape(p.title)}</h3><img alt='{html.escape(p.title)}' "
                             f"src='data:image/png;base64,{data}'><figcaption>{html.escape(p.caption)}</figcaption>"
                             f"</figure>")
            else:
                parts.append(f"<h3>{html.escape(p.title)}</h3><p>Not drawn: {html.escape(p.reason)}.</p>")
        else:
            parts.append(_finding_html(block.finding))
    parts.append("</body></html>")
    return "".join(parts)


def _verdict_html(block: VerdictBlock, out_dir: Path) -> str:
    """What is slow, then the figure that shows it, then why / what to do / ruled out: one column on a phone;
    on a desktop the figure stands beside the text."""
    v = block.verdict

    def row(lead: str, text: str) -> str:
        code = "".join(f"<pre><code>{html.escape(fix.code)}</code></pre>" for fix in v.fixes[:1]
                       if fix.code and lead == "What to do")
        return f"<div class='vrow'><span class='vlabel'>{html.escape(lead)}</span><p>{html.escape(text)}</p>{code}</div>"

    first, *rest = _verdict_rows(v)
    figure = ""
    if block.figure is not None:
        data = base64.b64encode((out_dir / block.figure.filename).read_bytes()).decode("ascii")
        # the PNG beside report.html opens full size (small on a phone)
        figure = (f"<figure class='vfig'><a href='{html.escape(block.figure.filename)}'><img "
                  f"alt='{html.escape(block.figure.title)}' src='data:image/png;base64,{data}'></a></figure>")
    more = ("<p class='vmore'>The rules behind this card, with evidence and thresholds: "
            "<a href='#findings'>Findings</a>.</p>")
    return (f"<section class='verdict' id='verdict'><h1>{html.escape(block.title)}</h1><div class='vgrid'>"
            f"<div class='vslow'>{row(*first)}</div>{figure}"
            f"<div class='vrest'>{''.join(row(*r) for r in rest)}{more}</div></div></section>")


def _finding_html(f: Finding) -> str:
    head = _HEADS[f.status].format(strength=f.strength)
    items = "".join(
        f"<li>{html.escape(e.text)} <span class='src'>[{html.escape(e.source)}"
        f"{', plot ' + html.escape(e.plot) if e.plot else ''}]</span></li>" for e in f.evidence)
    thresholds = ", ".join(f"{html.escape(k)} = {format_threshold(v)}" for k, v in f.thresholds.items())
    return (f"<div class='finding {f.status}'><b>{head}</b> <code>{html.escape(f.rule)}</code>: "
            f"{html.escape(f.statement)}<ul>{items}</ul>"
            + (f"<div class='thr'>thresholds: {thresholds}</div>" if thresholds else "") + "</div>")

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


Block = Heading | Text | Bullets | Table | Code | FigureBlock | FindingBlock

_HEADS = {"fired": "Finding ({strength})", "undecided": "Cannot decide", "clear": "ok"}


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
        elif isinstance(block, FigureBlock):
            p = block.plot
            if isinstance(p, Plot):
                lines += [f"### {p.title}", "", f"![{p.title}]({p.filename})", "", p.caption, ""]
            else:
                lines += [f"### {p.title}", "", f"Not drawn: {p.reason}.", ""]
        else:
            lines += _finding_md(block.finding)
    return "\n".join(lines).rstrip("\n") + "\n"


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


_CSS = """body{font-family:sans-serif;max-width:1150px;margin:2em auto;color:#222;line-height:1.4}
table{border-collapse:collapse;font-size:12px;margin:1em 0}td,th{border:1px solid #ccc;padding:2px 6px}
th{background:#eee}.finding{margin:.6em 0;padding:.4em .8em;border-left:4px solid #999}
.fired{border-color:#c33;background:#fff4f4}.undecided{border-color:#c93;background:#fffbf0}
.clear{border-color:#3a3}.src,.thr,.muted{color:#666;font-size:12px}figure{margin:1.5em 0}
pre{background:#f6f6f6;padding:.6em;font-size:12px;overflow-x:auto}figcaption{font-size:13px;color:#444;max-width:900px}img{max-width:100%}"""


def to_html(blocks: Sequence[Block], title: str, out_dir: Path) -> str:
    """Self-contained: every figure's PNG (in out_dir) is inlined as base64."""
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
             f"<style>{_CSS}</style></head><body>"]
    for block in blocks:
        if isinstance(block, Heading):
            parts.append(f"<h{block.level}>{html.escape(block.text)}</h{block.level}>")
        elif isinstance(block, Text):
            parts.append(f"<p{' class=muted' if block.muted else ''}>{html.escape(block.text)}</p>")
        elif isinstance(block, Bullets):
            parts.append("<ul>" + "".join(f"<li><b>{html.escape(lead)}</b> {html.escape(rest)}</li>" if lead
                                          else f"<li>{html.escape(rest)}</li>" for lead, rest in block.items)
                         + "</ul>")
        elif isinstance(block, Table):
            head = "".join(f"<th>{html.escape(h)}</th>" for h in block.header)
            body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in block.rows)
            parts.append(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
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


def _finding_html(f: Finding) -> str:
    head = _HEADS[f.status].format(strength=f.strength)
    items = "".join(
        f"<li>{html.escape(e.text)} <span class='src'>[{html.escape(e.source)}"
        f"{', plot ' + html.escape(e.plot) if e.plot else ''}]</span></li>" for e in f.evidence)
    thresholds = ", ".join(f"{html.escape(k)} = {format_threshold(v)}" for k, v in f.thresholds.items())
    return (f"<div class='finding {f.status}'><b>{head}</b> <code>{html.escape(f.rule)}</code>: "
            f"{html.escape(f.statement)}<ul>{items}</ul>"
            + (f"<div class='thr'>thresholds: {thresholds}</div>" if thresholds else "") + "</div>")

"""One report document, two renderings: the report is built once as a list of blocks (headings, text,
lists, tables, figures, findings) and written as Markdown and as self-contained HTML from the same blocks,
so the two never disagree."""

from __future__ import annotations

import base64
import html
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from diag.report.diagnose.findings import Finding, format_threshold
from diag.report.figures import Plot, Skipped
from diag.report.verdict import Verdict, first_clause, sure_text
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


# A snippet whose first line runs a program is a shell command (a Markdown fence says so: ```sh), else Python.
_SHELL_LINE = re.compile(r"^(\$ |[A-Z_][A-Z0-9_]*=\S*\s|(diag|python3?|torchrun|pip3?|export|cd|sudo)\b)")


def code_language(text: str) -> str:
    """'sh' for a shell command (DIST_BACKEND=diag_tcp torchrun ..., python -m diag.exec ...), else 'python'."""
    first = next((line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")),
                 "")
    return "sh" if _SHELL_LINE.match(first) else "python"


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
            lines += [f"```{code_language(block.text)}", *visible(block.text, keep_newlines=True).rstrip("\n").splitlines(),
                      "```", ""]
        elif isinstance(block, VerdictBlock):
            lines += _verdict_md(block)
        elif isinstance(block, FigureBlock):
            p = block.plot
            if isinstance(p, Plot):
                lines += [f"### {md(p.title)}", "", f"![{md(p.title)}]({p.filename})", "", md(p.caption), ""]
                if p.keys:
                    lines += [*_md_table(KEYS_HEADER, [[words, f"`{label}`"] for words, label in p.keys]), ""]
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
                      f"```{code_language(fix.code)}", *visible(fix.code, keep_newlines=True).rstrip("\n").splitlines(),
                      "```", ""]
    if block.figure is not None:
        lines += [f"![{md(block.figure.title)}]({block.figure.filename})", ""]
        if block.figure.keys:
            lines += [*_md_table(KEYS_HEADER, [[words, f"`{label}`"] for words, label in block.figure.keys]), ""]
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
.fired{border-color:#c33;background:#fff4f4}.fired.moderate{border-color:#e07a2e;background:#fff8f0}
.fired.weak{border-color:#d9b44a;background:#fffdf3}.observed{border-color:#7a8ca8;background:#f5f7fa}
.undecided{border-color:#c93;background:#fffbf0}
.clear{border-color:#3a3}.src,.thr,.muted{color:#666;font-size:12px}figure{margin:1.5em 0}
pre{background:#f6f6f6;padding:.6em;font-size:12px;overflow-x:auto}figcaption{font-size:13px;color:#444;max-width:900px}img{max-width:100%}
.toc{border:1px solid #d5deee;border-radius:6px;padding:.4em 1em;margin:0 0 1.5em;font-size:14px;background:#fafcff}
.toc ul{margin:.2em 0;padding-left:1.2em}.toc .leaves{margin:.1em 0 .3em;font-size:13px;line-height:1.6}
h2,h3,.finding,figure{scroll-margin-top:.5em}.here{margin-left:.3em;color:#bbb;text-decoration:none;font-size:.8em}
.top{position:fixed;right:.6em;bottom:.6em;background:#2a5db0;color:#fff;padding:.3em .7em;border-radius:14px;
font-size:13px;text-decoration:none;opacity:.85}details summary{cursor:pointer;color:#2a5db0;font-size:13px}
.finding{overflow-wrap:anywhere}code{overflow-wrap:anywhere}
@media (max-width:520px){body{padding:0 .4em;font-size:15px}.verdict{padding:.2em .6em .8em}
.verdict h1{font-size:1.15em}td,th{padding:2px 4px}figure{margin:1em 0}
figure:not(.vfig)>a{display:block;overflow-x:auto}figure:not(.vfig)>a img{max-width:none;width:760px}}"""


def slug(text: str) -> str:
    """An anchor name: 'Model (T = alpha + beta x per-rank bytes)' -> 'model-t-alpha-beta-x-per-rank-bytes'."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "section"


@dataclass(frozen=True)
class Anchor:
    """One entry of the table of contents: a section, a plot or a finding, and where it is."""

    id: str
    text: str
    level: int                            # 2: a section, 3: a subsection, 4: a plot or a finding
    note: str = ""                        # a finding's status, shown beside its link


def anchors(blocks: Sequence[Block]) -> dict[int, Anchor]:
    """Block index -> its anchor, for every heading, plot and finding; ids unique within the page."""
    out: dict[int, Anchor] = {}
    used: set[str] = {"verdict", "contents"}

    def unique(base: str) -> str:
        name, k = base, 2
        while name in used:
            name, k = f"{base}-{k}", k + 1
        used.add(name)
        return name

    for i, block in enumerate(blocks):
        if isinstance(block, Heading):
            out[i] = Anchor(unique(slug(block.text)), block.text, block.level)
        elif isinstance(block, FigureBlock):
            stem = block.plot.filename.rsplit(".", 1)[0] if isinstance(block.plot, Plot) else slug(block.plot.title)
            out[i] = Anchor(unique("plot-" + slug(stem)), block.plot.title, 4)
        elif isinstance(block, FindingBlock):
            f = block.finding
            note = _HEADS[f.status].format(strength=f.strength).lower()
            out[i] = Anchor(unique("finding-" + slug(f.rule)), f.rule, 4, note)
    return out


def _toc_html(marks: dict[int, Anchor]) -> str:
    """Sections as a list; under each, its subsections as a list, and its plots and findings as one run of links
    (a finding's status beside it), so the contents stay short enough to read on a phone."""
    sections: list[tuple[Anchor | None, list[Anchor], list[Anchor]]] = [(None, [], [])]
    for mark in marks.values():
        if mark.level <= 2:
            sections.append((mark, [], []))
        elif mark.level == 3:
            sections[-1][1].append(mark)
        else:
            sections[-1][2].append(mark)

    def link(mark: Anchor) -> str:
        return f"<a href='#{mark.id}'>{esc(mark.text)}</a>"

    items = ["<li><a href='#verdict'>Verdict</a></li>"]
    for head, subs, leaves in sections:
        inner = ""
        if subs:
            inner += "<ul>" + "".join(f"<li>{link(m)}</li>" for m in subs) + "</ul>"
        if leaves:
            inner += "<p class='leaves'>" + ", ".join(
                link(m) + (f" <span class='muted'>{esc(m.note)}</span>" if m.note else "") for m in leaves) + "</p>"
        if head is None:
            if inner:
                items.append(f"<li>{inner}</li>")
            continue
        items.append(f"<li>{link(head)}{inner}</li>")
    return f"<nav class='toc' id='contents'><b>Contents</b><ul>{''.join(items)}</ul></nav>"


def to_html(blocks: Sequence[Block], title: str, out_dir: Path) -> str:
    """Self-contained: every figure's PNG (in out_dir) is inlined as base64. A table of contents follows the
    verdict card; every section, plot and finding has an anchor (#findings, #plot-window, #finding-cpu_bound)."""
    marks = anchors(blocks)
    known = {mark.id for mark in marks.values()}
    card = next((b for b in blocks if isinstance(b, VerdictBlock)), None)
    if card is not None and card.figure is not None:
        known.add(_figure_anchor(card.figure))   # the card's figure has its anchor
    parts = [f"<!doctype html><html lang='en'><head><meta charset='utf-8'>"
             f"<meta name='viewport' content='width=device-width, initial-scale=1'><title>{esc(title)}</title>"
             f"<style>{_CSS}</style></head><body>"]
    toc_written = False
    for i, block in enumerate(blocks):
        if not toc_written and not isinstance(block, VerdictBlock) and not (isinstance(block, Text) and block.muted):
            parts.append(_toc_html(marks))
            toc_written = True
        mark = marks.get(i)
        if isinstance(block, VerdictBlock):
            parts.append(_verdict_html(block, out_dir))
        elif isinstance(block, Heading):
            assert mark is not None
            parts.append(f"<h{block.level} id='{mark.id}'>{esc(block.text)}"
                         f"<a class='here' href='#{mark.id}' aria-label='link to this section'>#</a></h{block.level}>")
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
            parts.append(f"<pre><code class='language-{code_language(block.text)}'>{esc(block.text)}</code></pre>")
        elif isinstance(block, FigureBlock):
            assert mark is not None
            p = block.plot
            if isinstance(p, Plot):
                data = base64.b64encode((out_dir / p.filename).read_bytes()).decode("ascii")
                parts.append(f"<figure id='{mark.id}'><h3>{esc(p.title)}</h3><a href='{esc(p.filename)}'>"
                             f"<img alt='{esc(p.title)}' src='data:image/png;base64,{data}'></a>"
                             f"<figcaption>{esc(p.caption)}</figcaption>{_keys_html(p)}</figure>")
            else:
                parts.append(f"<h3 id='{mark.id}'>{esc(p.title)}</h3><p>Not drawn: {esc(p.reason)}.</p>")
        else:
            assert mark is not None
            parts.append(_finding_html(block.finding, mark.id, known))
    if not toc_written:
        parts.append(_toc_html(marks))
    parts.append("<a class='top' href='#contents'>contents</a></body></html>")
    return "".join(parts)


def _folded(text: str) -> str:
    """A paragraph; a long one as its first clause with the rest in <details> (one click away, never dropped)."""
    head, rest = first_clause(text)
    if not rest:
        return f"<p>{esc(text)}</p>"
    return (f"<p>{esc(head)}</p><details><summary>the rest ({len(rest.split())} words)</summary>"
            f"<p>{esc(rest)}</p></details>")


def _verdict_html(block: VerdictBlock, out_dir: Path) -> str:
    """What is slow, then the figure that shows it, then why / what to do / ruled out: one column on a phone;
    on a desktop the figure stands beside the text."""
    v = block.verdict

    def row(lead: str, text: str) -> str:
        code = "".join(f"<pre><code class='language-{code_language(fix.code)}'>{esc(fix.code)}</code></pre>"
                       for fix in v.fixes[:1] if fix.code and lead == "What to do")
        return (f"<div class='vrow'><span class='vlabel'>{esc(lead)}</span>{_folded(text)}{code}</div>")

    first, *rest = _verdict_rows(v)
    figure = ""
    if block.figure is not None:
        data = base64.b64encode((out_dir / block.figure.filename).read_bytes()).decode("ascii")
        # the PNG beside report.html opens full size (small on a phone)
        figure = (f"<figure class='vfig' id='{_figure_anchor(block.figure)}'><a href='{esc(block.figure.filename)}'><img "
                  f"alt='{esc(block.figure.title)}' src='data:image/png;base64,{data}'></a>"
                  f"{_keys_html(block.figure)}</figure>")
    more = ("<p class='vmore'>The rules behind this card, with evidence and thresholds: "
            "<a href='#findings'>Findings</a>.</p>")
    return (f"<section class='verdict' id='verdict'><h1>{esc(block.title)}</h1><div class='vgrid'>"
            f"<div class='vslow'>{row(*first)}</div>{figure}"
            f"<div class='vrest'>{''.join(row(*r) for r in rest)}{more}</div></div></section>")


KEYS_HEADER = ("in the legend", "series (its knobs, as the tables and CSVs name it)")


def _keys_html(plot: Plot) -> str:
    """The legend's words beside the knob strings they stand for; each legend name also carries its knobs as a
    tooltip (title)."""
    if not plot.keys:
        return ""
    rows = "".join(f"<tr><td title='{esc(label)}'>{esc(words)}</td><td><code>{esc(label)}"
                   f"</code></td></tr>" for words, label in plot.keys)
    head = "".join(f"<th>{esc(h)}</th>" for h in KEYS_HEADER)
    return (f"<details class='keys'><summary>the legend's series and their knobs</summary><div class='scroll'>"
            f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table></div></details>")


def _figure_anchor(plot: Plot) -> str:
    return "plot-" + slug(plot.filename.rsplit(".", 1)[0])


def _plot_link(filename: str, known: set[str]) -> str:
    """'plot X.png', a link to it where the page draws it (a plot not drawn has no anchor)."""
    target = "plot-" + slug(filename.rsplit(".", 1)[0])
    if target not in known:
        return f"plot {esc(filename)}"
    return f"plot <a href='#{target}'>{esc(filename)}</a>"


def _finding_html(f: Finding, anchor: str, known: set[str]) -> str:
    head = _HEADS[f.status].format(strength=f.strength)
    items = "".join(
        f"<li>{esc(e.text)} <span class='src'>[{esc(e.source)}"
        f"{', ' + _plot_link(e.plot, known) if e.plot else ''}]</span></li>" for e in f.evidence)
    thresholds = ", ".join(f"{esc(k)} = {format_threshold(v)}" for k, v in f.thresholds.items())
    strength = f" {f.strength}" if f.status == "fired" else ""
    return (f"<div class='finding {f.status}{strength}' id='{anchor}'><b>{head}</b> "
            f"<a href='#{anchor}'><code>{esc(f.rule)}</code></a>: "
            f"{esc(f.statement)}<ul>{items}</ul>"
            + (f"<div class='thr'>thresholds: {thresholds}</div>" if thresholds else "") + "</div>")

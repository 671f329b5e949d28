"""Text other machines wrote (node names, notes, errors, fingerprints, analyses), made safe to show.

diag prints and renders strings that nodes sent or wrote: a hostname, a kernel version, an interface name, a
failure's message. A terminal obeys the escape sequences such a string may carry (set the window title,
clear the screen, rewrite what was printed before it), and a Markdown viewer renders the HTML tags in it.
report.html escapes them (html.escape); the terminal and report.md escape them here:

- :func:`visible`: every C0 and C1 control character (ESC, BEL, CR, backspace, ...; newline too, unless
  kept), DEL, and the Unicode bidirectional overrides show as ``\\x1b`` / ``\\u202e`` escapes, never as
  themselves;
- :func:`markdown`: :func:`visible` on one line, and a ``<`` that would open an HTML tag, a comment or an
  autolink written as ``&lt;`` (what a Markdown viewer shows as ``<``).
"""

from __future__ import annotations

import re

# C0 but tab (and newline, handled apart), DEL, C1, and the bidirectional marks/overrides/isolates
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_TAG_START = re.compile(r"<(?=[A-Za-z/!?])")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group(0))
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def visible(text: str, *, keep_newlines: bool = False) -> str:
    """``text`` with every control character shown as an escape (``keep_newlines``: newlines stay)."""
    text = str(text)
    if not keep_newlines:
        text = text.replace("\n", "\\n")
    return _UNSAFE.sub(_escape, text)


def markdown(text: str) -> str:
    """``text`` for one line of Markdown: :func:`visible`, newlines as spaces, no HTML tag can open."""
    return _TAG_START.sub("&lt;", visible(str(text).replace("\r\n", " ").replace("\n", " ")))


def lines(text: str) -> str:
    """Several lines for the terminal: each one :func:`visible`, the newlines between them kept."""
    return "\n".join(visible(line) for line in str(text).split("\n"))


__all__ = ["lines", "markdown", "visible"]

"""Strings nodes wrote (a fingerprint's kernel and sysctls) reach the terminal and report.md with every
control and escape sequence shown as an escape and no HTML tag that a Markdown viewer would render, as
report.html already escapes them (diag.textsafe); and the report says where a node's unsent files stay."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from node_helpers import NODES, LAB_Bps, fingerprint, link_matrix, ring_records, write_inplace_run

from tests.common import run_diag

# computes in this process: may run beside an `alone` test (tests/conftest.py)
pytestmark = pytest.mark.in_process

# what a node could put in its fingerprint: set the terminal's title, clear the screen, turn the text around,
# and markup a Markdown viewer renders
RMEM = "4096 \x1b]0;owned\x07\x1b[2J\u202e 65536 <img src=x onerror=alert(1)>"
KERNEL = "6.8.0\x1b[31m\x9b-evil <script>alert(1)</script>\r\n# Verdict: all good"
RAW = ("\x1b", "\x07", "\x9b", "\u202e", "\r")


def test_node_strings_are_escaped_on_the_terminal_and_in_report_md(tmp_path: Path) -> None:
    fingerprints = {n: fingerprint(n) for n in NODES}
    fingerprints["h2"] = fingerprint("h2", tcp_rmem=RMEM)
    fingerprints["h2"]["kernel"] = KERNEL
    left = {"h3": {"directory": "/runs/r1/nodes/h3",
                   "files": [{"path": "/runs/r1/nodes/h3/captures/a.pcap", "bytes": 3 << 30, "why": "too big"}]}}
    root = write_inplace_run(tmp_path / "run", ring_records({2: LAB_Bps, 3: LAB_Bps, 4: LAB_Bps}),
                             matrix=link_matrix(), fingerprints=fingerprints, meta={"left_on_nodes": left})
    proc = run_diag("report", str(root), timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    terminal = proc.stdout + proc.stderr
    report_md = (root / "report" / "report.md").read_text(encoding="utf-8")
    # the finding quotes them: the terminal card its first clause (the rest folds into report.html), the report all
    assert "h2's net.ipv4.tcp_rmem" in terminal and "h2's kernel" in report_md
    for text in (terminal, report_md, (root / "report" / "report.html").read_text(encoding="utf-8")):
        assert not any(raw in text for raw in RAW), [raw for raw in RAW if raw in text]
    assert "\\x1b]0;owned\\x07" in terminal and "\\x1b]0;owned\\x07" in report_md   # shown, not obeyed
    assert "<img src=x" not in report_md and "<script>" not in report_md
    assert "\n# Verdict: all good" not in report_md
    # what a node did not send rank 0 stays on it: the nodes table says where
    assert "1 files left on the node in /runs/r1/nodes/h3 (run.json left_on_nodes)" in report_md
    findings = json.loads((root / "report" / "findings.json").read_text())
    assert any("6.8.0\x1b[31m\x9b-evil <script>" in text for text in strings(findings))   # the data is kept as it came


def strings(value: object) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in strings(v)]
    return []


def test_visible_and_markdown() -> None:
    from diag.textsafe import markdown, visible

    assert visible("a\x1b[2Jb\nc\u202ed\te") == "a\\x1b[2Jb\\nc\\u202ed\te"
    assert visible("a\nb", keep_newlines=True) == "a\nb"
    assert markdown("x <img src=y> <b> a < b, N<=4\n# h") == "x &lt;img src=y> &lt;b> a < b, N<=4 # h"

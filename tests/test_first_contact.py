"""What a new user meets first: a report they can navigate (contents, anchors for every section, plot and
finding), legends in words with the knobs beside them, one rate unit (MB/s) everywhere people read, and CLIs
that answer --help and refuse what cannot run before launching anything."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest
from report_helpers import LINK_BPS, advise_doc, anomaly_records, turn_taking_analyses, write_run_dir

from diag.__main__ import build_parser
from diag.report import load_run, write_report
from diag.report.diagnose.findings import Evidence, Finding, ordered
from diag.report.document import FindingBlock, code_language, to_html
from diag.report.figures import FigureSpec, Line, Panel, draw_panel, render
from diag.report.series import series_words
from diag.units import human_bits, human_rate

REPO = Path(__file__).resolve().parents[1]
# A rate a person reads in any unit but MB/s (the one unit: diag.units.RATE_UNIT).
OTHER_RATE_UNITS = re.compile(r"\d\s*(GB/s|KB/s|kB/s|B/s(?<!MB/s)|Gbit/s|Mbit/s|kbit/s|bit/s)")


class _Ids(HTMLParser):
    """Every id on the page, every in-page link, and the headings (tag, id)."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: list[str] = []
        self.links: list[str] = []
        self.headings: list[tuple[str, str | None]] = []
        self.classes: dict[str, str] = {}

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        if values.get("id"):
            self.ids.append(str(values["id"]))
            self.classes[str(values["id"])] = values.get("class") or ""
        if tag == "a" and (values.get("href") or "").startswith("#"):
            self.links.append(str(values["href"])[1:])
        if tag in ("h1", "h2", "h3"):
            self.headings.append((tag, values.get("id")))


@pytest.fixture(scope="module")
def report_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fc") / "run"
    analyses = turn_taking_analyses()
    write_run_dir(root, anomaly_records(), analyses=analyses, advise=advise_doc(),
                  meta={"lab": {"rate_bps": LINK_BPS * 8, "hosts": 4},
                        "link": {"single_stream_Bps": LINK_BPS * 0.97, "bidir_Bps": [LINK_BPS, LINK_BPS]}})
    write_report(load_run([root]), root / "report")
    return root / "report"


def test_report_has_contents_and_an_anchor_for_every_section_plot_and_finding(report_dir: Path) -> None:
    import json

    page = (report_dir / "report.html").read_text()
    parsed = _Ids()
    parsed.feed(page)
    assert len(parsed.ids) == len(set(parsed.ids)), "ids are unique"
    assert "contents" in parsed.ids and "verdict" in parsed.ids
    # every heading but the card's title has an anchor, and the contents link to each
    h2 = [anchor for tag, anchor in parsed.headings if tag == "h2"]
    assert h2 and all(h2) and all(anchor in parsed.links for anchor in h2)
    assert "findings" in h2 and "records" in h2 and "plots" in h2
    # every link on the page lands somewhere
    assert not set(parsed.links) - set(parsed.ids)
    findings = json.loads((report_dir / "findings.json").read_text())["findings"]
    finding_ids = [i for i in parsed.ids if i.startswith("finding-")]
    assert len(finding_ids) == len(findings)
    assert all(i in parsed.links for i in finding_ids)                 # each one in the contents
    plots = sorted(p.stem for p in report_dir.glob("*.png"))
    plot_ids = {i.removeprefix("plot-") for i in parsed.ids if i.startswith("plot-")}
    assert {p.replace("_", "-") for p in plots} <= plot_ids   # drawn or not; the headline: its figure in the card
    # the contents come before the first section; the Markdown says the same in its own words
    assert page.index("id='contents'") < page.index("id='summary-of-findings'")
    assert page.index("id='verdict'") < page.index("id='contents'")


def test_fired_findings_strongest_first_with_their_own_colour(report_dir: Path) -> None:
    evidence = [Evidence("x", {}, "records")]
    made = [Finding("weak_one", "fired", "w", "weak", evidence), Finding("clear_one", "clear", "c"),
            Finding("strong_one", "fired", "s", "strong", evidence), Finding("mid", "fired", "m", "moderate", evidence)]
    assert [f.rule for f in ordered(made)] == ["strong_one", "mid", "weak_one", "clear_one"]
    page = to_html([FindingBlock(f) for f in ordered(made)], "t", report_dir)
    parsed = _Ids()
    parsed.feed(page)
    assert parsed.classes["finding-weak-one"].split() == ["finding", "fired", "weak"]
    assert parsed.classes["finding-strong-one"].split() == ["finding", "fired", "strong"]
    assert ".fired.weak{" in page and ".fired.moderate{" in page


def test_legends_speak_in_words_with_the_knobs_in_a_table(report_dir: Path, tmp_path: Path) -> None:
    knobbed = "raw:ring [emulate=gloo, conn=shared, order=send-first, handshake=notify, chunks=2]"
    assert series_words(knobbed) == ("raw TCP ring: gloo's protocol, one connection per pair, sends first, "
                                     "ready notices, 2 chunks per block")
    assert series_words("torch:gloo") == "gloo (torch.distributed)"
    assert series_words("N=2") == "N=2"           # not a series: left alone
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    draw_panel(ax, Panel("t", "x", "y", [Line("torch:gloo", [2, 3], [1.0, 2.0]), Line(knobbed, [2, 3], [1.0, 1.5])]))
    legend = [t.get_text().replace("\n", " ") for t in ax.get_legend().get_texts()]
    plt.close(fig)
    assert legend == ["gloo (torch.distributed)", series_words(knobbed)]
    assert not any("=" in text for text in legend)
    plot = render(FigureSpec("p.png", "P", "c", [Panel("t", "x", "y", [Line(knobbed, [1, 2], [1.0, 2.0])])]), tmp_path)
    assert plot.keys == ((series_words(knobbed), knobbed),)
    page = (report_dir / "report.html").read_text()
    md = (report_dir / "report.md").read_text()
    assert "the legend&#x27;s series and their knobs" in page or "the legend's series and their knobs" in page
    assert "<td title='raw:ring [conn=shared, order=recv-first]'>raw TCP ring: one connection per pair, receives " \
           "posted first</td>" in page                             # the knobs as the name's tooltip
    assert "| in the legend |" in md


def test_one_rate_unit_for_people(report_dir: Path) -> None:
    assert human_rate(4.7e6) == "4.7 MB/s" and human_rate(1.25e9) == "1250 MB/s"
    assert human_rate(12_500) == "0.0125 MB/s" and human_bits(200e6) == "25 MB/s"
    for name in ("report.md", "report.html"):
        text = (report_dir / name).read_text()
        text = re.sub(r"data:image/png;base64,[A-Za-z0-9+/=]+", "", text).replace("MB/s = 1e6 B/s", "")
        assert "MB/s" in text
        assert not OTHER_RATE_UNITS.findall(text), OTHER_RATE_UNITS.findall(text)[:5]


def test_code_fences_name_their_language() -> None:
    assert code_language("DIST_BACKEND=diag_tcp torchrun --nproc-per-node 2 -m diag.exec train.py") == "sh"
    assert code_language("python -m diag.exec train.py") == "sh"
    assert code_language("import torch.distributed as dist\n\ndef f():\n    pass\n") == "python"


def _diag(*args: str, module: str = "diag") -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=120,
                          cwd=REPO)


def test_exec_answers_help() -> None:
    proc = _diag("--help", module="diag.exec")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: python -m diag.exec SCRIPT") and "DIST_BACKEND=diag_tcp" in proc.stdout
    nothing = _diag(module="diag.exec")
    assert nothing.returncode == 2 and "nothing to run" in nothing.stderr


def test_every_option_has_help() -> None:
    """Every option of every command says what it does (diag model is rewritten elsewhere: left out here)."""
    missing = []

    def walk(parser: argparse.ArgumentParser, path: str) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, f"{path} {name}")
            elif not action.help and not isinstance(action, argparse._HelpAction):
                missing.append(f"{path} {'/'.join(action.option_strings) or action.dest}")

    walk(build_parser(), "diag")
    assert [m for m in missing if not m.startswith("diag model")] == []


def test_nccl_without_cuda_is_refused_before_any_rank_starts(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible here: nccl would run")
    out = tmp_path / "nccl.jsonl"
    proc = _diag("sweep", "--backend", "nccl", "--nproc", "2", "--sizes", "4K", "--out", str(out))
    assert proc.returncode == 5, proc.stderr             # docs/cli.md: 5, the backend's device is absent
    assert proc.stderr.count("\n") == 1 and "nccl needs CUDA" in proc.stderr
    assert "Traceback" not in proc.stderr and "rank" not in proc.stdout
    assert not out.exists() and not list(tmp_path.iterdir())  # nothing launched, nothing written


def test_a_record_without_its_samples_is_named_by_file_and_row(tmp_path: Path) -> None:
    import json

    from report_helpers import write_records

    path = write_records(tmp_path / "run" / "records" / "sweep.jsonl", anomaly_records()[:3])
    lines = path.read_text().splitlines()
    events = [json.loads(line) for line in lines]
    rows = [e for e in events if e["event"] == "record"]
    del rows[1]["times_s"]
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    proc = _diag("report", str(tmp_path / "run"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"{path}: row 2: record is missing fields ['times_s']" in proc.stderr


def test_a_node_keeps_its_pcaps_only_when_asked(tmp_path: Path) -> None:
    """Each capture analysed, then its pcap deleted unless keep_pcaps (the lab's shared run directory keeps
    pcaps only with --keep-pcaps); a pcap whose analysis failed stays to be looked at."""
    from capture_helpers import LINK_HEADERS, synthetic_flow, write_pcap
    from native_helpers import need_kernels
    from report_helpers import write_records

    from diag.inplace.node import NodeWork
    from diag.inplace.topology import Node

    need_kernels("_cpcap", "_ctcp")
    records = [str(write_records(tmp_path / "records.jsonl", anomaly_records()[:2]))]
    frames = [(t, LINK_HEADERS[1](ip, False)) for t, ip in synthetic_flow()]
    for keep in (False, True):
        work = NodeWork(Node("h0", None, "host", None, None, (0,)), tmp_path / f"keep-{keep}" / "h0", None)
        captures = work.directory / "captures"
        write_pcap(captures / "step-n2.pcap", frames, 1)
        (captures / "broken-n2.pcap").write_bytes(b"not a capture at all")
        work.analyze(records, keep_pcaps=keep)
        assert (work.directory / "analysis" / "step-n2.json").exists()
        assert (captures / "step-n2.pcap").exists() == keep
        assert (captures / "broken-n2.pcap").exists() and any("broken-n2.pcap" in n for n in work.notes)


def test_a_long_card_line_shows_its_first_clause_and_keeps_the_rest() -> None:
    from diag.report.verdict import first_clause

    why = ("Not isolated: N=2 is slower (see the trial (two arms); five rounds); " + "word " * 80).strip()
    head, rest = first_clause(why)
    assert head == "Not isolated: N=2 is slower (see the trial (two arms); five rounds);"   # not inside parentheses
    assert rest == ("word " * 80).strip()
    assert first_clause("short; enough") == ("short; enough", "")
    page = to_html([], "t", Path("."))
    assert "<nav class='toc' id='contents'>" in page

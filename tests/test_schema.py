"""The analysis and findings documents as typed, versioned schemas: a real analysis survives the round trip
unchanged, older and hand-made files load with defaults, and a newer schema is refused with a clear line."""

from __future__ import annotations

import json

import pytest
from capture_helpers import LINK_HEADERS, synthetic_flow, write_pcap
from report_helpers import (
    analysis,
    anomaly_records,
    connection,
    direction,
    turn_taking_analyses,
    write_run_dir,
)

from diag.analysisdoc import ANALYSIS_SCHEMA, Analysis, load_analysis
from diag.capture import analyze_files
from diag.report import diagnose, load_run
from diag.report.diagnose import FINDINGS_SCHEMA, FindingsDocument, findings_to_json, load_findings

# computes in this process: may run beside an `alone` test (tests/conftest.py)
pytestmark = pytest.mark.in_process

LINKTYPE_ETHERNET = 1


def test_a_real_analysis_round_trips_unchanged(tmp_path) -> None:
    pcap = tmp_path / "flow.pcap"
    write_pcap(pcap, [(t, LINK_HEADERS[LINKTYPE_ETHERNET](ip, False)) for t, ip in synthetic_flow()], LINKTYPE_ETHERNET)
    document = json.loads(json.dumps(analyze_files([str(pcap)])))
    typed = Analysis.from_json(document)
    assert typed.schema == ANALYSIS_SCHEMA and typed.connections
    conn = typed.connections[0]
    assert conn.direction("a->b").packets == document["connections"][0]["directions"]["a->b"]["packets"]
    assert conn.direction("a->b").idle_gaps.count == document["connections"][0]["directions"]["a->b"]["idle_gaps"]["count"]
    assert typed.to_json() == document


def test_an_old_or_hand_made_analysis_loads_with_defaults(tmp_path) -> None:
    old = {"connections": [{"a": "10.0.0.1:1", "b": "10.0.0.2:2", "directions": {"a->b": {"packets": 3}},
                            "duplex_overlap": None, "future_key": [1, 2]}]}
    path = tmp_path / "old.json"
    path.write_text(json.dumps(old))
    typed = load_analysis(path)
    assert typed.schema == 1 and typed.capture.kernel_dropped is None and typed.phases == []
    conn = typed.connections[0]
    assert conn.direction("a->b").payload_bytes == 0 and conn.direction("b->a").packets == 0
    assert conn.duplex_overlap is None and conn.extra == {"future_key": [1, 2]}
    assert typed.to_json()["connections"][0]["future_key"] == [1, 2]


def test_a_newer_analysis_schema_is_refused(tmp_path) -> None:
    with pytest.raises(ValueError, match="newer than this diag reads"):
        Analysis.from_json({"schema": ANALYSIS_SCHEMA + 1})
    root = write_run_dir(tmp_path / "r", anomaly_records(), analyses={"n2": {"schema": ANALYSIS_SCHEMA + 1}})
    from diag.errors import DiagError

    with pytest.raises(DiagError, match="upgrade diag"):
        load_run([root])


def test_findings_document_round_trips(tmp_path) -> None:
    run = load_run([write_run_dir(tmp_path / "m", anomaly_records(), analyses=turn_taking_analyses())])
    findings = diagnose(run)
    document = findings_to_json(findings, run)
    assert document["schema"] == FINDINGS_SCHEMA
    path = tmp_path / "findings.json"
    path.write_text(json.dumps(document, default=str))
    loaded = load_findings(path)
    assert loaded.findings == findings and loaded.missing_inputs == run.missing
    assert FindingsDocument.from_json(json.loads(path.read_text())).to_json() == json.loads(path.read_text())
    with pytest.raises(ValueError, match="newer"):
        FindingsDocument.from_json({"schema": FINDINGS_SCHEMA + 1, "findings": []})


def test_rules_read_attributes_of_a_typed_capture(tmp_path) -> None:
    one = analysis(2, [connection("a:1", "b:2", direction(1 << 20), direction(1 << 20), 0.9)])
    run = load_run([write_run_dir(tmp_path / "t", anomaly_records(), analyses={"n2": one})])
    capture = run.captures["n2"]
    assert capture.analysis is not None and capture.world_size == 2 and capture.transport == "torch:gloo"
    assert capture.connections[0].payload_bytes == (1 << 20, 1 << 20)

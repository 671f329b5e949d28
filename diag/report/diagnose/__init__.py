"""Diagnosis: rules read a RunData (files only, through the evidence queries of diag.report.queries) and
say what they found, how sure, on what evidence, and which named threshold fired
(diag.report.thresholds). A rule that lacks its inputs says it cannot decide, and why.

Every rule returns Findings with status "fired", "clear" (checked, nothing wrong) or "undecided" (could
not check). A fired finding always carries evidence: numbers, the file they came from, the plot that
shows them and, where it applies, the phase.

Modules: ``findings`` (the typed findings.json document and the text summary), ``records_rules``,
``paired`` (one rule for every paired experiment, its rows as data), ``wire_rules``, ``cpu_rules``,
``mechanism`` (the verdict over all findings). ``RULES`` registers every rule once under its id.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from diag.report.diagnose.advice import workarounds
from diag.report.diagnose.base import Rule
from diag.report.diagnose.control import negative_control
from diag.report.diagnose.cpu_finding import cpu_bound
from diag.report.diagnose.cpu_rules import cpu_limited_world_sizes
from diag.report.diagnose.dip import n2_busbw_dip
from diag.report.diagnose.findings import (
    FINDINGS_SCHEMA,
    STATUSES,
    STRENGTHS,
    Evidence,
    Finding,
    FindingsDocument,
    format_threshold,
    load_findings,
    render_text,
    summary_lines,
)
from diag.report.diagnose.fingerprint_rules import node_fingerprints
from diag.report.diagnose.host_rules import loss_at_host, slow_host_link, window_at_host
from diag.report.diagnose.mechanism import MODELLED_BACKEND, SUSPECTS, mechanism, suspects
from diag.report.diagnose.paired import (
    EXCHANGE_ORDER,
    EXPERIMENTS,
    NOTICE_CHANNEL,
    SHARED_CONNECTION,
    PairedExperiment,
)
from diag.report.diagnose.records_rules import backend_below_raw, data_errors, half_duplex_match
from diag.report.diagnose.wire_rules import (
    capture_drops,
    idle_gaps,
    low_duplex_overlap,
    retransmissions,
    turn_taking,
    window_limited,
)
from diag.report.rundir import RunData


def _register(*rules: Rule) -> dict[str, Rule]:
    registry: dict[str, Rule] = {}
    for rule in rules:
        if rule.__name__ in registry:
            raise ValueError(f"two rules with the id {rule.__name__}")
        registry[rule.__name__] = rule
    return registry


# Every rule, under its id, in report order.
RULES: dict[str, Rule] = _register(
    n2_busbw_dip, negative_control, backend_below_raw, SHARED_CONNECTION, EXCHANGE_ORDER, NOTICE_CHANNEL,
    low_duplex_overlap, turn_taking, half_duplex_match, window_limited, retransmissions, idle_gaps, cpu_bound,
    slow_host_link, loss_at_host, window_at_host, node_fingerprints, capture_drops, data_errors, workarounds,
)


def diagnose(run: RunData) -> list[Finding]:
    findings: list[Finding] = []
    for rule in RULES.values():
        findings.extend(rule(run))
    findings = modelled_on_gloo(run, findings)
    verdicts = suspects(findings)
    findings.append(mechanism([*findings, *verdicts]))
    findings.extend(verdicts)
    return [f if f.explains else replace(f, explains=EXPLAINS.get(f.rule, NOT_A_TOGGLE)) for f in findings]


# Experiments whose arms model gloo's pair (its protocol model, raw TCP sharing one connection the way it does):
# they show a mechanism of gloo's, and account for a loss only where gloo is the backend under test.
GLOO_EXPERIMENTS = (NOTICE_CHANNEL.id, SHARED_CONNECTION.id)


def modelled_on_gloo(run: RunData, findings: list[Finding]) -> list[Finding]:
    """In a run whose backend under test is not gloo (the diag_tcp negative control), an experiment shown on
    gloo's protocol model costs that backend nothing: an observation about gloo, never a finding of this run."""
    backends = {r.transport for r in run.all_records if r.backend != "raw" and r.world_size == 2}
    if not backends or MODELLED_BACKEND in backends:
        return findings
    under_test = ", ".join(sorted(backends))
    return [replace(f, status="observed", strength="", explains=f"none: it shows a mechanism of {MODELLED_BACKEND}'s "
                    f"protocol model; the backend under test here is {under_test}, which does not use it")
            if f.rule in GLOO_EXPERIMENTS and f.status == "fired" else f for f in findings]


# What a finding without its own figure says of the backend's N=2 loss: only an experiment that toggles a
# cause can account for a share of it; the rest describe it, or are about something else.
NOT_A_TOGGLE = "none: an observation, not an experiment that toggles a cause"
EXPLAINS: dict[str, str] = {
    "n2_busbw_dip": "this is the N=2 loss itself",
    "backend_below_raw": "none: measures the loss against raw TCP, does not explain it",
    "data_errors": "none: about the data, not the loss",
    "capture_drops": "none: about the capture, not the loss",
    "workarounds": "none: measures what avoids the loss, not why it happens",
    "negative_control": "none: the control, a transport that does not take turns; where it dips too, the loss is "
                        "not the backend's",
    "slow_host_link": "none: a host or link fault; it slows every N that includes it, not N=2 alone",
    "loss_at_host": "none: a host fault, not the backend's N=2 mechanism",
    "window_at_host": "none: a host fault, not the backend's N=2 mechanism",
    "node_fingerprints": "none: how the nodes differ, an observation",
    "mechanism": "undecided",
}


def findings_to_json(findings: Sequence[Finding], run: RunData) -> dict[str, Any]:
    return FindingsDocument(list(findings), str(run.root) if run.root else None, list(run.missing)).to_json()


__all__ = [
    "EXCHANGE_ORDER", "EXPERIMENTS", "FINDINGS_SCHEMA", "NOTICE_CHANNEL", "RULES", "SHARED_CONNECTION", "STATUSES", "STRENGTHS", "SUSPECTS",
    "Evidence", "Finding", "FindingsDocument", "PairedExperiment", "Rule", "backend_below_raw", "capture_drops",
    "cpu_bound", "cpu_limited_world_sizes", "data_errors", "diagnose", "findings_to_json", "format_threshold",
    "half_duplex_match", "idle_gaps", "load_findings", "loss_at_host", "low_duplex_overlap", "mechanism",
    "n2_busbw_dip", "negative_control", "node_fingerprints", "render_text", "retransmissions", "slow_host_link",
    "summary_lines", "suspects", "turn_taking", "window_at_host", "window_limited", "workarounds",
]

"""Cluster in a box: network namespaces h0..hN-1 behind a bridge, each host link shaped both ways.

Public API (used by ``diag lab``, ``diag sweep --lab`` and ``diag reproduce``)::

    from diag.lab import LabConfig, Lab, LabHost, LinkMeasurement, bring_up, tear_down, load_lab, \
        measure_link, measure_ring_pattern, lab_session, HostFault, HostShape, parse_fault, load_scenario

Per-host faults (docs/lab.md, "Per-host faults"): ``LabConfig(...).with_faults(["h2:rate=100mbit"],
scenario="slow-nic", flag="--lab-fault")`` parses the ``--fault``/``--lab-fault`` syntax into a validated
config; ``lab.to_json()`` records each host's fault and link.

Everything else in this package is an implementation detail. Nothing here imports torch.
"""

from diag.lab.config import HostShape, LabConfig
from diag.lab.faults import HostFault, Scenario, builtin_scenarios, load_scenario, parse_fault
from diag.lab.measure import (
    LinkMeasurement,
    RingPatternMeasurement,
    measure_flows,
    measure_link,
    measure_ring_pattern,
)
from diag.lab.topology import Lab, LabHost, bring_up, lab_session, load_lab, remove_lab, tear_down

__all__ = [
    "HostFault",
    "HostShape",
    "Lab",
    "LabConfig",
    "LabHost",
    "LinkMeasurement",
    "RingPatternMeasurement",
    "Scenario",
    "bring_up",
    "builtin_scenarios",
    "lab_session",
    "load_lab",
    "load_scenario",
    "measure_flows",
    "measure_link",
    "measure_ring_pattern",
    "parse_fault",
    "remove_lab",
    "tear_down",
]

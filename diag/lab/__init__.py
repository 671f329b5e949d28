"""Cluster in a box: network namespaces h0..hN-1 behind a bridge, each host link shaped both ways.

Public API (used by ``diag lab``, ``diag sweep --lab`` and ``diag reproduce``)::

    from diag.lab import LabConfig, Lab, LabHost, LinkMeasurement, bring_up, tear_down, load_lab, \
        measure_link, measure_ring_pattern, lab_session

Everything else in this package is an implementation detail. Nothing here imports torch.
"""

from diag.lab.config import LabConfig
from diag.lab.measure import LinkMeasurement, RingPatternMeasurement, measure_link, measure_ring_pattern
from diag.lab.topology import Lab, LabHost, bring_up, lab_session, load_lab, remove_lab, tear_down

__all__ = [
    "Lab",
    "LabConfig",
    "LabHost",
    "LinkMeasurement",
    "RingPatternMeasurement",
    "bring_up",
    "lab_session",
    "load_lab",
    "measure_link",
    "measure_ring_pattern",
    "remove_lab",
    "tear_down",
]

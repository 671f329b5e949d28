"""The network probe, run by the job's own ranks: flows between the job's nodes measured at once by each
node's leader rank, the pairwise link matrix in rounds of disjoint pairs, and the ring pattern.

Public API (the in-place job calls it from every rank, with the same arguments)::

    from diag.probe import Coordinator, GroupCoordinator, ProbeNode, measure_flows, measure_incast, \
        measure_matrix, measure_ring_pattern

How a flow's goodput is measured is diag/goodput.py; the lab measures its links through this probe too
(diag/lab/measure.py). The link matrix's document is diag/linkmatrix.py. Importing this
package does not import torch (GroupCoordinator does, when built).
"""

from diag.linkmatrix import Incast, IncastFlow, LinkMatrix, MatrixEdge
from diag.probe.coordinator import Coordinator, GroupCoordinator
from diag.probe.flows import Flow, FlowResult, ProbeNode, measure_flows
from diag.probe.matrix import circle_rounds, measure_incast, measure_matrix
from diag.probe.ring import measure_ring_pattern

__all__ = [
    "Coordinator",
    "Flow",
    "FlowResult",
    "GroupCoordinator",
    "Incast",
    "IncastFlow",
    "LinkMatrix",
    "MatrixEdge",
    "ProbeNode",
    "circle_rounds",
    "measure_flows",
    "measure_incast",
    "measure_matrix",
    "measure_ring_pattern",
]

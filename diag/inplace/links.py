"""The job's link reference, measured in place by its own ranks (diag.probe): the pairwise link matrix between
the nodes, the ring pattern of every N, and the single-stream and both-ways figures of node 0 -> node 1 that
every plot compares with (run.json ``link``, docs/inplace.md)."""

from __future__ import annotations

from typing import Any

# A single TCP stream below this fraction of the shaped goodput means the CPU, not the link, limits the lab.
CPU_BOUND_LINK_FRACTION = 0.85
LINK_SECONDS = 2.0
# Each N's ring pattern runs this long (0.5 s of it warm-up): 7 N add ~20 s to a default run.
RING_PATTERN_SECONDS = 2.0


def measure_links(job: Any) -> None:
    try:
        import diag.probe  # noqa: F401
    except ImportError:   # the probe lands with the probe branch
        job._note(["the link matrix was not measured (diag.probe missing)"])
        return

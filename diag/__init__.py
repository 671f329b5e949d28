"""diag: root-cause bandwidth anomalies of collective communication over TCP.

The public API is small on purpose; everything else is an implementation detail:

    diag.sweep(diag.SweepSpec(...)) -> RecordFile    run a sweep from Python (needs torch: diag[torch])
    diag.load_records(path) -> RecordFile            one records file; .to_pandas(samples=False)
    diag.report.load_run(paths) -> RunData           a run directory or record files; .to_pandas()

Importing this package does not import torch (``diag analyze``/``lab``/``report`` work without it).
"""

from typing import Any

from diag.errors import DiagError

__all__ = ["SCHEMA_VERSION", "DiagError", "Record", "RecordFile", "SweepSpec", "load_records", "sweep"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    # The record API loads on first use: commands that never touch records (analyze, lab) start faster.
    if name in ("SCHEMA_VERSION", "Record", "RecordFile", "load_records"):
        from diag import records

        return getattr(records, name)
    if name == "SweepSpec":
        from diag.spec import SweepSpec

        return SweepSpec
    if name == "sweep":  # torch loads only when a sweep runs
        from diag._sweep import sweep

        return sweep
    raise AttributeError(f"module 'diag' has no attribute {name!r}")

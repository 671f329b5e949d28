"""diag: root-cause bandwidth anomalies of collective communication over TCP.

The public API is small on purpose; everything else is an implementation detail.
Importing this package does not import torch (``diag analyze``/``lab``/``report`` work without it).
"""

from typing import Any

from diag.errors import DiagError

__all__ = ["SCHEMA_VERSION", "DiagError", "Record", "RecordFile", "load_records"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    # The record API loads on first use: commands that never touch records (analyze, lab) start faster.
    if name in ("SCHEMA_VERSION", "Record", "RecordFile", "load_records"):
        from diag import records

        return getattr(records, name)
    raise AttributeError(f"module 'diag' has no attribute {name!r}")

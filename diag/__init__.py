"""diag: root-cause bandwidth anomalies of collective communication over TCP.

The public API is small on purpose; everything else is an implementation detail.
Importing this package does not import torch (``diag analyze``/``lab``/``report`` work without it).
"""

from diag.errors import DiagError
from diag.records import SCHEMA_VERSION, Record, RecordFile, load_records

__all__ = ["SCHEMA_VERSION", "DiagError", "Record", "RecordFile", "load_records"]
__version__ = "0.1.0"

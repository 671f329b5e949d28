"""The analyzer's compiled kernels, and the switch that runs the analysis without them.

The kernels are C extension modules built by ``pip install`` (``[tool.setuptools] ext-modules`` in
pyproject.toml, marked optional: a machine without a C compiler still installs diag). Each kernel has a numpy
twin that computes the same columns; the numpy code runs where a kernel is missing or disabled with
``DIAG_NATIVE=0``, and the tests hold each kernel to its twin (``DIAG_NATIVE=check`` runs both and raises
AssertionError naming what differs: the tshark agreement tests and the fuzzer use it). A source checkout that is used without being
installed builds them in place with ``python -c "import setuptools; setuptools.setup()" build_ext --inplace``.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

DISABLE_ENV = "DIAG_NATIVE"
KERNELS = ("_cpcap", "_ctcp")


def kernel(name: str) -> ModuleType | None:
    """diag.capture.<name> when it is built and not disabled (DIAG_NATIVE=0), else None (DIAG_NATIVE=check
    returns the kernel; its caller then runs the twin too and compares)."""
    if os.environ.get(DISABLE_ENV, "1") == "0":
        return None
    try:
        return importlib.import_module(f"diag.capture.{name}")
    except ImportError:
        return None


def available() -> dict[str, bool]:
    """Which kernels this process will use (the capture benchmark and `.ci/setup` report it)."""
    return {name: kernel(name) is not None for name in KERNELS}

"""The analyzer's compiled kernels: _cpcap (capture records -> TCP columns) and _ctcp (the TCP state machine).

They are C extension modules built by ``pip install`` (``[tool.setuptools] ext-modules`` in pyproject.toml).
Each is the one implementation of its algorithm; the tests hold each to an independent numpy formulation
(tests/decode_twin.py, tests/tcpstate_twin.py) and to tshark. A source checkout that is used without being
installed builds them in place with ``python -c "import setuptools; setuptools.setup()" build_ext --inplace``.
"""

from __future__ import annotations

import importlib
from types import ModuleType

KERNELS = ("_cpcap", "_ctcp")
BUILD_COMMAND = 'python -c "import setuptools; setuptools.setup()" build_ext --inplace'


def kernel(name: str) -> ModuleType | None:
    """diag.capture.<name> when it is built, else None."""
    try:
        return importlib.import_module(f"diag.capture.{name}")
    except ImportError:
        return None


def require(name: str) -> ModuleType:
    """diag.capture.<name>, or a one-line DiagError that says how to build it."""
    module = kernel(name)
    if module is None:
        from diag.errors import DiagError

        raise DiagError(f"the analyzer's C kernel {name} is not built: reinstall diag with a C compiler "
                        f"(pip install .), or in a source checkout run {BUILD_COMMAND}")
    return module


def available() -> dict[str, bool]:
    """Which kernels are built (the capture benchmark and `.ci/setup` report it)."""
    return {name: kernel(name) is not None for name in KERNELS}

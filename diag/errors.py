"""Errors a user can hit. Each one is printed as a single line that says what to do next."""

from __future__ import annotations

# Every exit status a diag command returns, documented in docs/cli.md (generated from this table). The gates
# (6..9) follow nccl-tests, which exits non-zero on wrong data and below NCCL_TESTS_MIN_BW.
EXIT_OK = 0
EXIT_FAILED = 1            # a step or rank failed (its finished rows are kept)
EXIT_USAGE = 2             # a usage error or a DiagError a user can fix (bad flag, missing file, no torch)
EXIT_MISSING_TOOL = 3      # an external program (tcpdump, ip, tc, ...) is missing
EXIT_PRIVILEGE = 4         # the operation needs root / CAP_NET_ADMIN
EXIT_NO_DEVICE = 5         # the backend's device is absent (nccl without CUDA)
EXIT_WRONG_DATA = 6        # a sweep row has #wrong > 0 (data check failed)
EXIT_BELOW_MIN_BUSBW = 7   # diag sweep --min-busbw: the average bus bandwidth is below it
EXIT_SLOWER = 8            # diag compare --fail-on slower:X%: a row of B is significantly slower than A by X
EXIT_FIRED = 9             # diag diagnose --fail-on fired|strong: a finding fired
EXIT_INTERRUPTED = 130     # Ctrl-C (128 + the signal for SIGTERM/SIGHUP); finished results are kept

EXIT_CODES: dict[int, str] = {
    EXIT_OK: "success (for gates: no gate tripped)",
    EXIT_FAILED: "a step or rank failed; finished rows are kept (diag reproduce: a step failed; diag advise: a "
                 "workaround failed to run)",
    EXIT_USAGE: "usage error, or an error with a one-line fix (bad input file, a command that needs torch "
                "without it)",
    EXIT_MISSING_TOOL: "an external tool is missing (tcpdump, tshark, ip, tc, iperf3)",
    EXIT_PRIVILEGE: "needs root / CAP_NET_ADMIN (the lab, captures in namespaces)",
    EXIT_NO_DEVICE: "the backend's device is absent (--backend nccl without CUDA)",
    EXIT_WRONG_DATA: "diag sweep: a row has #wrong > 0 (the closing line says Out of bounds values : N FAILED)",
    EXIT_BELOW_MIN_BUSBW: "diag sweep --min-busbw GBPS: the average bus bandwidth is below GBPS",
    EXIT_SLOWER: "diag compare --fail-on slower:X%: a row of B is significantly slower than A by X or more",
    EXIT_FIRED: "diag diagnose --fail-on fired (or strong): a finding fired (a strong one)",
    EXIT_INTERRUPTED: "interrupted by Ctrl-C (128 + N for signal N, e.g. 143 for SIGTERM); finished results are "
                      "kept",
}


class DiagError(Exception):
    """A failure we expect and explain: printed as one line, no traceback, non-zero exit."""

    def __init__(self, message: str, exit_code: int = 2) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class MissingToolError(DiagError):
    """An external program (tcpdump, tshark, ip, tc, ...) is not installed."""

    def __init__(self, tool: str, hint: str) -> None:
        super().__init__(f"'{tool}' was not found; {hint}", exit_code=3)


class PrivilegeError(DiagError):
    """The operation needs root or CAP_NET_ADMIN."""

    def __init__(self, what: str, instead: str) -> None:
        super().__init__(f"{what} needs root (CAP_NET_ADMIN); {instead}", exit_code=4)


# How to get torch where a command needs it: the sweep extra, or the user's own build first (CPU, CUDA, Jetson).
# diag is not on PyPI (a package named diag there is someone else's): it installs from its checkout.
TORCH_HINT = ("in diag's checkout run pip install -e '.[torch]' (no GPU: first pip install torch --index-url "
              "https://download.pytorch.org/whl/cpu; a GPU or Jetson machine keeps the torch it has)")


def torch_missing(what: str) -> str:
    return f"{what} needs torch, which is not installed here: {TORCH_HINT}"


def require_torch(what: str) -> None:
    """A one-line DiagError (exit 2) when torch is not installed: sweep, reproduce, advise and exec need it;
    analyze, report, diagnose, compare, model and lab do not. Looked up, not imported (importing it takes a
    second here, several on a small board), so a bad argument is refused at once; a torch that is installed
    but fails to import is caught where it is imported (diag.__main__)."""
    import importlib.util

    try:
        installed = importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):
        installed = False
    if not installed:
        raise DiagError(torch_missing(what))

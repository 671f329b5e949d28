"""Errors a user can hit. Each one is printed as a single line that says what to do next."""

from __future__ import annotations


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

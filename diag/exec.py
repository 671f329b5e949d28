"""``python -m diag.exec SCRIPT [ARGS]``: run an unchanged torch.distributed script with ``diag_tcp``.

The backend is registered in this process, then the script runs as ``__main__`` (runpy), so
``init_process_group(backend=os.getenv("DIST_BACKEND", "gloo"))`` with ``DIST_BACKEND=diag_tcp`` moves its
bytes over diag's raw sockets. Works under torchrun::

    DIST_BACKEND=diag_tcp python -m torch.distributed.run --nproc-per-node 2 -m diag.exec train.py --lr 1e-3

``-m MODULE`` runs a module instead of a file. Knobs: DIAG_TCP_ALGO, DIAG_TCP_ORDER, DIAG_TCP_KNOBS (JSON).

sys.path as Python would set it for the script: its directory first (what ``python SCRIPT`` does, so the
script's own modules import), except under a safe path (``python -P``, PYTHONSAFEPATH=1, as every Python
child diag starts has), where Python adds nothing and neither does diag exec. A script run as root from a
directory other users can write imports what they plant next to it, as with ``python SCRIPT``: run it with
``-P`` or from a directory only you can write.
"""

from __future__ import annotations

import runpy
import sys
from collections.abc import Sequence

from diag.errors import DiagError

USAGE = "usage: python -m diag.exec SCRIPT [ARGS...] | -m MODULE [ARGS...]"


def run_script(argv: Sequence[str]) -> None:
    """Register diag_tcp, then run ``argv`` (script path or ``-m module``) with sys.argv set as Python
    would set it. The script's own SystemExit passes through."""
    from pathlib import Path

    from diag.transports.raw.backend import register

    args = list(argv)
    if args and args[0] == "--":
        args = args[1:]
    if not args or (args[0] == "-m" and len(args) < 2):
        raise DiagError(f"nothing to run; {USAGE}")
    register()
    if args[0] == "-m":
        sys.argv = [args[1], *args[2:]]
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
        return
    script = Path(args[0])
    if not script.is_file():
        raise DiagError(f"script {args[0]!r} not found; {USAGE}")
    sys.argv = [str(script), *args[1:]]
    if not sys.flags.safe_path:
        # As `python SCRIPT` does, so the script's own imports work; with a safe path (-P, PYTHONSAFEPATH=1,
        # which every Python child of diag's has) Python adds nothing, and neither does this.
        sys.path.insert(0, str(script.resolve().parent))
    runpy.run_path(str(script), run_name="__main__")


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] in (["-h"], ["--help"]):  # only before the script: after it, -h is the script's own
        print(f"{USAGE}\n\nRun an unchanged torch.distributed script with diag's raw-TCP backend (diag_tcp).\n"
              f"{(__doc__ or '').split(chr(10), 2)[2].strip()}")
        return 0
    try:
        run_script(args)
    except DiagError as exc:
        print(f"diag exec: error: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())

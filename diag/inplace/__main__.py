"""``python -m diag.inplace JOB.json``: one rank of the main job, as diag's own lab/loopback launch starts it."""

from __future__ import annotations

import os
import signal
import sys


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m diag.inplace JOB.json", file=sys.stderr)
        return 2
    from diag.errors import DiagError
    from diag.lifeline import bind_to_parent, terminate_as_exception

    # Die with the launcher, and take its SIGTERM as an exception (rank 0 saves run.json, its records their end).
    bind_to_parent(signal.SIGKILL)
    terminate_as_exception()
    command = "diag"
    try:
        from diag.inplace.job import JobOptions, run_in_place

        options = JobOptions.load(args[0])
        command = f"diag {options.command}"
        return run_in_place(options)
    except DiagError as exc:
        print(f"{command}: {exc}", file=sys.stderr, flush=True)
        return exc.exit_code


if __name__ == "__main__":
    code = main()
    # The rank's work is on disk (every file closed, its captures cut, its process group destroyed): it skips the
    # interpreter's teardown of torch's modules, ~0.4 s of CPU per rank (ten times that in wall time on a node held
    # to a tenth of a core, the lab's slow-cpu host).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)

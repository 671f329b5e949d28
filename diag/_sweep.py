"""``diag.sweep(SweepSpec(...))``: the sweep diag sweep runs, called from Python (a notebook, a test, a CI
script), with the same harness, launcher, records file and data check; it returns the rows it wrote.

    import diag
    run = diag.sweep(diag.SweepSpec(backend="gloo", sizes=(1 << 20, 4 << 20), world_sizes=(2, 3), iters=5))
    frame = run.to_pandas(samples=True)          # one row per timed iteration (pandas is optional)

With ``spec.world_sizes`` the ranks start on this machine (or, with ``lab``, one per lab host), one world
size at a time; without them the calling process is one rank under an env:// launcher (torchrun, srun), as
``diag sweep`` without ``--nproc``. Wrong data does not raise: each row's ``nwrong`` says it, and
``diag.gates.sweep_status(run.records)`` gives the exit status the command line would return.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from diag.errors import DiagError, torch_missing
from diag.records import RecordFile, load_records
from diag.spec import SweepSpec


def sweep(spec: SweepSpec, out: str | os.PathLike[str] | None = None, *, run_dir: str | os.PathLike[str] | None = None,
          lab: Any = None, iface: str | None = None, master_addr: str = "127.0.0.1", master_port: int | None = None,
          capture: str | None = None, observe: bool = False, quiet: bool = True) -> RecordFile:
    """Run ``spec``; returns a RecordFile holding only this call's rows (``out`` may hold earlier runs: it is
    appended to). ``out`` defaults to runs/sweep-<time>.jsonl; ``lab`` is a ``diag.lab.load_lab(name)``;
    ``capture`` an interface to capture on ("" for the default one). Raises DiagError on a failed rank (its
    finished rows are on disk) and ImportError when torch is missing."""
    try:
        import torch  # noqa: F401
    except ImportError:
        raise ImportError(torch_missing("diag.sweep()")) from None
    from diag import validate
    from diag.runner import make_job, run_worlds

    path = Path(out) if out is not None else Path("runs") / f"sweep-{time.strftime('%Y%m%d-%H%M%S')}.jsonl"
    validate.output_file(path, "out")
    job = make_job(spec, path, argv=["diag.sweep()"], quiet=quiet)
    if spec.world_sizes or lab is not None:
        directory = Path(run_dir) if run_dir is not None else path.with_name(path.name.removesuffix(".jsonl") + ".d")
        if iface:
            os.environ["GLOO_SOCKET_IFNAME"] = iface
        run_worlds(spec, job, path, directory, world_sizes=list(spec.world_sizes) or None, lab=lab, iface=iface,
                   master_addr=master_addr, master_port=master_port, capture=capture, observe=observe)
    else:
        from diag import launchenv

        launch = launchenv.adopt(iface)
        if launch is None:
            raise DiagError("no ranks to run: give SweepSpec(world_sizes=(2,)) to start ranks on this machine, or "
                            "call diag.sweep under torchrun or srun")
        from dataclasses import replace

        from diag.worker import run_job

        code = run_job(replace(job, gate=False))
        if code != 0:
            raise DiagError(f"diag.sweep(): this rank failed (exit status {code}); finished rows are in {path}",
                            exit_code=code)
        if launch.rank != 0:
            return RecordFile(path, [], [], [])   # only rank 0 writes the records
    whole = load_records(path)
    mine = {job.run_id} | {s.get("run_id") for s in whole.starts if str(s.get("run_id", "")).startswith(f"{job.run_id}-")}
    return RecordFile(path, [s for s in whole.starts if s.get("run_id") in mine],
                      [r for r in whole.records if r.run_id in mine],
                      [e for e in whole.ends if e.get("run_id") in mine], whole.torn_lines)

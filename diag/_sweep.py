"""``diag.sweep(SweepSpec(...))``: the sweep diag sweep runs, called from Python (a notebook, a test, a CI
script), with the same plan, job, records file and data check; it returns the rows it wrote.

    import diag
    run = diag.sweep(diag.SweepSpec(backend="gloo", sizes=(1 << 20, 4 << 20), world_sizes=(2, 3), iters=5))
    frame = run.to_pandas(samples=True)          # one row per timed iteration (pandas is optional)

A sweep is a plan of one step (diag.plan.sweep_plan) run on the one job (diag.runplan): one launch of
K = max(world sizes) ranks, every N on a subgroup of them. Started by hand, the ranks start on this machine
(or, with ``lab``, one per lab host); under an env:// launcher (torchrun, srun) the calling process is one
rank of the job, and ``spec.world_sizes`` (default: the whole job) are its subgroups. Wrong data does not
raise: each row's ``nwrong`` says it, and ``diag.gates.sweep_status(run.records)`` gives the exit status the
command line would return.
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path
from typing import Any

from diag.errors import DiagError, torch_missing
from diag.records import RecordFile
from diag.spec import SweepSpec


def default_out() -> Path:
    return Path("runs") / f"sweep-{time.strftime('%Y%m%d-%H%M%S')}.jsonl"


def run_sweep(spec: SweepSpec, out: Path, *, run_dir: str | os.PathLike[str] | None = None, lab: Any = None,
              iface: str | None = None, master_addr: str = "127.0.0.1", master_port: int | None = None,
              capture: str | None = None, snaplen: int = 128, observe: bool = False, quiet: bool = True,
              argv: tuple[str, ...] = (), keep_pcaps: bool = False) -> Path:
    """Run ``spec`` as a one-step plan on the one job; returns its run directory (records/sweep.jsonl,
    nodes/<node>/ with the captures and observer samples asked for). Every event is appended to ``out`` too.
    ``capture``: an interface to capture on ("" for the job's own); ``lab``: a lab that is up."""
    from diag import validate
    from diag.collectives import PAIRWISE_OPS
    from diag.inplace.job import JobOptions
    from diag.plan import sweep_plan
    from diag.runplan import fresh_run_dir, in_place, run_plan

    world_sizes = tuple(spec.world_sizes)
    if not world_sizes and in_place(iface):
        world_sizes = (int(os.environ.get("WORLD_SIZE", "1")),)
    if not world_sizes and lab is not None:
        world_sizes = (len(lab.hosts),)
    if not world_sizes:
        raise DiagError("no ranks to run: pass --nproc 2 (ranks on this machine), --lab, or start diag sweep "
                        "under torchrun (diag.sweep(): SweepSpec(world_sizes=(2,)))")
    if min(world_sizes) < 2 and any(op in PAIRWISE_OPS for op in spec.ops):
        raise DiagError("point-to-point ops need at least 2 ranks")
    if spec.backend == "nccl" and not in_place(iface):
        import torch

        from diag.errors import EXIT_NO_DEVICE

        if not torch.cuda.is_available():   # before any rank starts (in place, each rank says it itself)
            raise DiagError("backend nccl needs CUDA, and no CUDA device is visible; use --backend gloo",
                            exit_code=EXIT_NO_DEVICE)
        gpus = torch.cuda.device_count()
        if lab is not None:
            raise DiagError("--backend nccl on the lab: every lab host is this machine and NCCL takes one GPU per "
                            "rank; run nccl on this machine (--nproc N, N at most its GPUs) or in place under torchrun",
                            exit_code=EXIT_NO_DEVICE)
        if max(world_sizes) > gpus:
            raise DiagError(f"--backend nccl runs one rank per GPU and N={max(world_sizes)} needs {max(world_sizes)}; "
                            f"this machine has {gpus} (--nproc at most {gpus}, or in place across machines)",
                            exit_code=EXIT_NO_DEVICE)
    run_id = uuid.uuid4().hex[:12]
    if run_dir is not None:
        root = Path(run_dir)
        if (root / "run.json").exists() or any((root / "records").glob("*.jsonl")):
            raise DiagError(f"--run-dir {root} already holds a run: choose a new directory (or leave --run-dir out: "
                            "each sweep then gets one beside --out)")
    else:
        root = fresh_run_dir(out.with_name(out.name.removesuffix(".jsonl") + ".d"), run_id)
    if not in_place(iface):   # in place rank 0 makes it (every rank would race to)
        validate.output_dir(root, "--run-dir")
    plan = sweep_plan(spec, world_sizes, capture=capture is not None, observe=observe)
    options = JobOptions(plan=plan.to_json(), command="sweep", out=str(root.resolve()),
                         records_out=str(out.resolve()), run_id=run_id, iface=iface, capture_iface=capture or None,
                         snaplen=snaplen, keep_going=False, quiet=quiet, argv=argv,
                         keep_pcaps=keep_pcaps)
    run_plan(options, lab=lab, master_addr=master_addr, master_port=master_port)
    return root


def sweep(spec: SweepSpec, out: str | os.PathLike[str] | None = None, *, run_dir: str | os.PathLike[str] | None = None,
          lab: Any = None, iface: str | None = None, master_addr: str = "127.0.0.1", master_port: int | None = None,
          capture: str | None = None, observe: bool = False, quiet: bool = True) -> RecordFile:
    """Run ``spec``; returns a RecordFile holding only this call's rows (``out`` may hold earlier runs: it is
    appended to). ``out`` defaults to runs/sweep-<time>.jsonl, the run directory to <out>.d (or one beside it
    named after the run where that is taken); ``lab`` is a ``diag.lab.load_lab(name)``; ``capture`` an
    interface to capture on ("" for the job's own). Raises DiagError on a failed rank (its finished rows are
    on disk) and ImportError when torch is missing. Under a launcher only rank 0 holds the rows."""
    try:
        import torch  # noqa: F401
    except ImportError:
        raise ImportError(torch_missing("diag.sweep()")) from None
    from diag import validate
    from diag.plan import SWEEP
    from diag.records import load_records
    from diag.runplan import in_place

    path = Path(out) if out is not None else default_out()
    validate.output_file(path, "out")
    root = run_sweep(spec, path, run_dir=run_dir, lab=lab, iface=iface, master_addr=master_addr,
                     master_port=master_port, capture=capture, observe=observe, quiet=quiet, argv=("diag.sweep()",))
    mine = root / "records" / f"{SWEEP}.jsonl"
    if (in_place(iface) and int(os.environ["RANK"]) != 0) or not mine.exists():
        return RecordFile(path, [], [], [])   # only rank 0 writes the records
    run = load_records(mine)
    return RecordFile(path, run.starts, run.records, run.ends, run.torn_lines)

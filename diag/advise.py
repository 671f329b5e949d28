"""Validated workarounds for gloo's N=2 all_gather: measure each against plain gloo, same hosts, same run.

The N=2 dip comes from gloo's pair protocol (docs/raw-tcp.md, "The gloo protocol model"): all four ops of
the 2-rank ring go to one pair, and a rank that is already writing its data queues its ready-to-receive
notice behind that data, so the directions take turns. A user can avoid it without touching gloo:

- ``p2p-recv-first``: build all_gather from ``torch.distributed.batch_isend_irecv`` with every receive
  posted before any send (op ``all_gather_p2p``): the notices leave before any data.
- ``diag_tcp``: run the unchanged script on diag's raw-TCP backend through ``diag exec`` (one socket per
  direction, no notices on the data path).

``run_advise`` runs plain gloo all_gather and each workaround in turn through the normal sweep machinery
(harness, records, data check on every iteration), writes the records as they finish
(``records.jsonl``) and rewrites ``advise.json`` after every step, so a crash keeps what was measured and
``diag reproduce`` and the report read the files afterwards. Each workaround row is compared with the gloo
row of the same size by Welch's t-test on the per-iteration times (diag.report.compare).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from diag import safefs
from diag.advisefile import ADVISE_NAME, ADVISE_SCHEMA
from diag.errors import DiagError
from diag.spec import SweepSpec

RECORDS_NAME = "records.jsonl"
DEFAULT_SIZES = (16 << 20, 32 << 20)

P2P_CODE = '''import torch.distributed as dist

def all_gather_recv_first(outputs, tensor):
    """dist.all_gather(outputs, tensor) on the default group, every receive posted before any send."""
    rank, world = dist.get_rank(), dist.get_world_size()
    peers = [peer for peer in range(world) if peer != rank]
    ops = [dist.P2POp(dist.irecv, outputs[peer], peer) for peer in peers]
    ops += [dist.P2POp(dist.isend, tensor, peer) for peer in peers]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    outputs[rank].copy_(tensor)'''

DIAG_TCP_CODE = '''# in the script:  dist.init_process_group(backend=os.getenv("DIST_BACKEND", "gloo"))
DIST_BACKEND=diag_tcp torchrun --nproc-per-node 2 -m diag.exec train.py ARGS'''


@dataclass(frozen=True)
class Workaround:
    name: str
    title: str
    backend: str
    op: str
    code: str


BASELINE = Workaround("gloo", "plain gloo all_gather (the baseline)", "gloo", "all_gather",
                      "dist.all_gather(outputs, tensor)")
WORKAROUNDS = (
    Workaround("p2p-recv-first", "all_gather from batch_isend_irecv, receives posted first", "gloo",
               "all_gather_p2p", P2P_CODE),
    Workaround("diag_tcp", "the diag_tcp backend through diag exec (unchanged script)", "diag_tcp", "all_gather",
               DIAG_TCP_CODE),
)


def advise_specs(sizes: tuple[int, ...], warmup: int, iters: int, timeout_s: float = 120.0,
                 dtype: str = "uint8") -> list[tuple[Workaround, SweepSpec]]:
    """The baseline first, then each workaround: same sizes, dtype and iteration counts."""
    base = SweepSpec(backend="gloo", ops=("all_gather",), sizes=sizes, warmup=warmup, iters=iters,
                     timeout_s=timeout_s, dtype=dtype, order="recv-first")
    return [(entry, base.replace(backend=entry.backend, ops=(entry.op,))) for entry in (BASELINE, *WORKAROUNDS)]


def advise_result(records: Path, world_size: int, sizes: tuple[int, ...], lab: str | None,
                  failures: list[dict[str, str]] | None = None, complete: bool = True) -> dict[str, Any]:
    """advise.json's content from the records measured so far (each workaround against the baseline)."""
    from diag.records import load_records

    return {
        "schema": ADVISE_SCHEMA, "anomaly": "gloo all_gather at N=2", "world_size": world_size,
        "sizes": list(sizes), "lab": lab, "records": RECORDS_NAME, "baseline": _describe(BASELINE),
        "workarounds": _compare(load_records(records).records if records.exists() else [], world_size),
        "failures": list(failures or []), "complete": complete,
    }


def write_advise(out_dir: Path, records: Path, *, world_size: int, sizes: tuple[int, ...], lab: str | None,
                 failures: list[dict[str, str]] | None = None, complete: bool = True) -> dict[str, Any]:
    result = advise_result(records, world_size, sizes, lab, failures, complete)
    _write(out_dir, result)
    return result


def run_advise(out_dir: Path, *, lab: Any = None, world_size: int = 2, sizes: tuple[int, ...] = DEFAULT_SIZES,
               warmup: int = 2, iters: int = 5, say: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Measure the baseline and every workaround at ``world_size`` on ``lab`` (None: loopback on this
    machine), one launch each; -> the advise.json content, also written to ``out_dir`` after every step."""
    from diag.runner import make_job, run_worlds

    say = say or (lambda text: None)
    safefs.private_dir(out_dir, "--out")
    records = out_dir / RECORDS_NAME
    steps = advise_specs(tuple(sizes), warmup, iters)
    lab_name = getattr(lab, "name", None)
    failures: list[dict[str, str]] = []
    seconds: dict[str, float] = {}
    write_advise(out_dir, records, world_size=world_size, sizes=tuple(sizes), lab=lab_name, complete=False)
    for index, (entry, spec) in enumerate(steps, 1):
        say(f"[advise {index}/{len(steps)}] {entry.title}, N={world_size}")
        started = time.monotonic()
        try:
            job = make_job(spec, records, argv=["advise"], quiet=True)
            run_worlds(spec, job, records, out_dir, world_sizes=[world_size], lab=lab,
                       tag_prefix=f"advise-{entry.name}--")
        except DiagError as exc:
            failures.append({"workaround": entry.name, "error": str(exc)})
            say(f"[advise {index}/{len(steps)}] failed: {exc}")
        seconds[entry.name] = round(time.monotonic() - started, 1)
        result = advise_result(records, world_size, tuple(sizes), lab_name, failures, complete=index == len(steps))
        result["step_seconds"] = seconds
        _write(out_dir, result)
    return result


def _describe(entry: Workaround) -> dict[str, Any]:
    return {"name": entry.name, "title": entry.title, "backend": entry.backend, "op": entry.op, "code": entry.code}


def _compare(rows: list[Any], world_size: int) -> list[dict[str, Any]]:
    """One entry per workaround: its rows against the baseline row of the same size (Welch's t-test)."""
    from diag.report.compare import compare_rows

    def rows_of(entry: Workaround) -> dict[int, Any]:
        return {row.size_bytes: row for row in rows
                if row.backend == entry.backend and row.op == entry.op and row.world_size == world_size}

    baseline = rows_of(BASELINE)
    out = []
    for entry in WORKAROUNDS:
        compared = []
        for size, row in sorted(rows_of(entry).items()):
            base = baseline.get(size)
            item: dict[str, Any] = {"size_bytes": size, "busbw_Bps": row.busbw_Bps, "time_s": row.time_s,
                                    "nwrong": row.nwrong, "iterations": len(row.times_s)}
            if base is not None:
                test = compare_rows(base, row)
                item.update(baseline_busbw_Bps=base.busbw_Bps, baseline_time_s=base.time_s,
                            baseline_nwrong=base.nwrong, speedup=base.time_s / row.time_s if row.time_s else None,
                            p_value=test.p_value, significant=test.significant, verdict=test.verdict,
                            sentence=test.sentence)
            compared.append(item)
        out.append({**_describe(entry), "rows": compared})
    return out


def _write(out_dir: Path, result: dict[str, Any]) -> None:
    safefs.write_file(out_dir / ADVISE_NAME, json.dumps(result, indent=1))


def render_text(result: dict[str, Any]) -> str:
    """The table and the code a user copies: one line per workaround and size, then each snippet."""
    from diag.units import human_bytes, human_rate

    where = f"lab {result['lab']}" if result.get("lab") else "loopback on this machine (unshaped: CPU-bound)"
    lines = [f"Workarounds for {result['anomaly']} on {where}, each against plain gloo all_gather "
             "(Welch's t-test on per-iteration times):"]
    for workaround in result["workarounds"]:
        lines.append(f"  {workaround['title']}:")
        if not workaround["rows"]:
            lines.append("    not measured (see failures)")
        for row in workaround["rows"]:
            if row.get("speedup") is None:
                lines.append(f"    {human_bytes(row['size_bytes'])}: {human_rate(row['busbw_Bps'])} busbw, "
                             f"no baseline row to compare with; #wrong {row['nwrong']}")
                continue
            significance = (f"significant, p={row['p_value']:.2g}" if row["significant"]
                            else f"not significant (p={row['p_value']:.2g})" if row["p_value"] is not None
                            else "untested")
            lines.append(f"    {human_bytes(row['size_bytes'])} per rank: {human_rate(row['baseline_busbw_Bps'])} "
                         f"-> {human_rate(row['busbw_Bps'])} busbw, {row['speedup']:.2f}x ({significance}); "
                         f"#wrong {row['nwrong']}")
    for failure in result.get("failures", []):
        lines.append(f"  failed: {failure['workaround']}: {failure['error']}")
    for workaround in result["workarounds"]:
        lines.append("")
        lines.append(f"# {workaround['title']}:")
        lines.extend(workaround["code"].splitlines())
    return "\n".join(lines)

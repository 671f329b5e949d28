"""Validated workarounds for gloo's N=2 all_gather: each measured beside plain gloo in one interleaved trial.

The N=2 dip comes from gloo's pair protocol (docs/raw-tcp.md, "The gloo protocol model"): all four ops of
the 2-rank ring go to one pair, and a rank that is already writing its data queues its ready-to-receive
notice behind that data, so the directions take turns. A user can avoid it without touching gloo:

- ``p2p-recv-first``: build all_gather from ``torch.distributed.batch_isend_irecv`` with every receive
  posted before any send (op ``all_gather_p2p``): the notices leave before any data.
- ``diag_tcp``: run the unchanged script on diag's raw-TCP backend through ``diag exec`` (one socket per
  direction, no notices on the data path).

Both run as arms of the plan's advise step (diag.plan.ADVISE_STEP) beside plain gloo all_gather: one trial,
the same ranks (gloo's subgroup and a diag_tcp subgroup of them), every arm in every round in a fresh seeded
order, each arm with its CPU, until each workaround's comparison with the baseline is decided or the budget
is spent. ``diag advise`` is a plan of that one step; ``diag reproduce`` runs the same step after its others.
advise.json (diag.advisefile, schema 2) is written from the trial's records by the same decisions
(diag.trialspec.decide_all: the "difference" design with WORKAROUND_EFFECT), so the report reads one verdict.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from diag import safefs
from diag.advisefile import ADVISE_NAME, ADVISE_SCHEMA
from diag.plan import ADVISE, ADVISE_COMPARISONS

DEFAULT_SIZES = (16 << 20, 32 << 20)
RECORDS = f"records/{ADVISE}.jsonl"       # the trial's records, relative to the run directory

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
    """One arm of the advise trial (its name is the arm's), what it is and the code a user pastes."""

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


def advise_result(root: Path, lab: str | None = None, failures: list[dict[str, str]] | None = None) -> dict[str, Any]:
    """advise.json's content from the advise trial's records in the run directory ``root``."""
    from diag.records import load_records
    from diag.trialspec import TrialSpec

    path = root / RECORDS
    run = load_records(path) if path.exists() else None
    start = next((s for s in (run.starts if run else []) if (s.get("meta") or {}).get("trial")), None)
    spec = TrialSpec.from_json(start["meta"]["trial"]) if start else None
    end = next((e for e in (run.ends if run else []) if start and e.get("run_id") == start.get("run_id")), None)
    blocks = [r for r in (run.records if run else []) if spec and r.block.get("trial") == spec.name]
    stopped = {size: summary.get("stopped") for size, summary in ((end or {}).get("trial") or {}).get("sizes", {}).items()}
    return {
        "schema": ADVISE_SCHEMA, "anomaly": "gloo all_gather at N=2",
        "world_size": start.get("world_size") if start else None, "sizes": list(spec.sizes) if spec else [],
        "lab": lab, "records": RECORDS, "trial": ADVISE, "design": "difference",
        "effect": ADVISE_COMPARISONS[0].effect, "baseline": _describe(BASELINE),
        "workarounds": [{**_describe(w), "rows": _rows(spec, blocks, w) if spec else []} for w in WORKAROUNDS],
        "stopped": stopped, "failures": list(failures or []),
        "complete": bool(end and end.get("status") == "ok"),
    }


def write_advise(root: Path, lab: str | None = None, failures: list[dict[str, str]] | None = None) -> dict[str, Any]:
    """RUN_DIR/advise/advise.json from the run's advise trial; returns what it wrote."""
    result = advise_result(root, lab, failures)
    safefs.private_dir(root / ADVISE)
    safefs.write_file(root / ADVISE / ADVISE_NAME, json.dumps(result, indent=1))
    return result


def _describe(entry: Workaround) -> dict[str, Any]:
    return {"name": entry.name, "title": entry.title, "backend": entry.backend, "op": entry.op, "code": entry.code}


def _rows(spec: Any, blocks: list[Any], workaround: Workaround) -> list[dict[str, Any]]:
    """One row per size: the workaround's mean time and busbw beside the baseline's in the same rounds, the
    speed-up with its interval, and the trial's decision."""
    from diag.trialspec import arms_of, decide_all

    comparison = next((c for c in spec.comparisons if c.on == workaround.name and c.off == BASELINE.name), None)
    rows = []
    for size in spec.sizes:
        arms = arms_of(blocks, spec.name, size)
        base, arm = arms.get(BASELINE.name), arms.get(workaround.name)
        if base is None or arm is None or comparison is None:
            continue
        decision = decide_all(spec, blocks, size).get(comparison.key)
        ratio = decision.ratio if decision is not None else None     # the workaround's time / the baseline's
        verdict = "undecided"
        if decision is not None and decision.verdict == "shown" and ratio is not None:
            verdict = "faster" if ratio.high < 1 else "slower"
        elif decision is not None and decision.verdict == "ruled_out":
            verdict = "same"
        of = {name: [r for r in blocks if r.size_bytes == size and r.block.get("arm") == name]
              for name in (BASELINE.name, workaround.name)}
        rows.append({
            "size_bytes": size, "time_s": arm.mean_s, "busbw_Bps": _busbw(of[workaround.name], arm.mean_s),
            "baseline_time_s": base.mean_s, "baseline_busbw_Bps": _busbw(of[BASELINE.name], base.mean_s),
            "speedup": base.mean_s / arm.mean_s if arm.mean_s > 0 else None,
            "speedup_low": 1 / ratio.high if ratio is not None and ratio.high > 0 else None,
            "speedup_high": 1 / ratio.low if ratio is not None and ratio.low > 0 else None,
            "verdict": verdict, "reason": decision.reason if decision is not None else "no decision",
            "rounds": decision.rounds if decision is not None else min(len(base.blocks), len(arm.blocks)),
            "nwrong": sum(r.nwrong for r in of[workaround.name]),
            "baseline_nwrong": sum(r.nwrong for r in of[BASELINE.name]),
            "decision": decision.to_json() if decision is not None else None})
    return rows


def _busbw(blocks: list[Any], mean_s: float) -> float | None:
    """busbw of a mean time: the op's total bytes over it, times its bus factor (both from a block record)."""
    if not blocks or mean_s <= 0 or blocks[0].algbw_Bps <= 0:
        return None
    row = blocks[0]
    return row.total_bytes / mean_s * row.busbw_Bps / row.algbw_Bps


def render_text(result: dict[str, Any]) -> str:
    """The table and the code a user copies: one line per workaround and size, then each snippet."""
    from diag.units import human_bytes, human_rate

    where = f"lab {result['lab']}" if result.get("lab") else "loopback on this machine (unshaped: CPU-bound)"
    lines = [f"Workarounds for {result['anomaly']} on {where}, each beside plain gloo all_gather in the same "
             "interleaved rounds (speed-up of the mean times, 95% bootstrap interval):"]
    for workaround in result["workarounds"]:
        lines.append(f"  {workaround['title']}:")
        if not workaround["rows"]:
            lines.append("    not measured (see failures)")
        for row in workaround["rows"]:
            interval = (f" [{row['speedup_low']:.2f}, {row['speedup_high']:.2f}]"
                        if row.get("speedup_low") is not None and row.get("speedup_high") is not None else "")
            speed = f"{row['speedup']:.2f}x{interval}" if row.get("speedup") is not None else "no speed-up"
            rounds = f", {row['rounds']} rounds" if row.get("rounds") is not None else ""
            lines.append(f"    {human_bytes(row['size_bytes'])} per rank: {_rate(human_rate, row['baseline_busbw_Bps'])} "
                         f"-> {_rate(human_rate, row['busbw_Bps'])} busbw, {speed}: {row['verdict']}{rounds}; "
                         f"#wrong {row['nwrong']}")
    for size, why in (result.get("stopped") or {}).items():
        if why == "budget":
            lines.append(f"  at {human_bytes(int(size))} the trial stopped on its budget: an undecided verdict "
                         "needs more rounds (--budget)")
    for failure in result.get("failures", []):
        lines.append(f"  failed: {failure['workaround']}: {failure['error']}")
    for workaround in result["workarounds"]:
        lines.append("")
        lines.append(f"# {workaround['title']}:")
        lines.extend(workaround["code"].splitlines())
    return "\n".join(lines)


def _rate(human_rate: Any, value: float | None) -> str:
    return human_rate(value) if value is not None else "?"


__all__ = ["BASELINE", "DEFAULT_SIZES", "WORKAROUNDS", "Workaround", "advise_result", "render_text",
           "write_advise"]

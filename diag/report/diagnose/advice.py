"""The measured fix: which user-level workarounds `diag advise` ran beside plain gloo on the same hosts, and
which of them is faster by a significant margin. Reads RUN_DIR/advise/advise.json only."""

from __future__ import annotations

from diag.report.diagnose.base import strength_of, undecided
from diag.report.diagnose.findings import Evidence, Finding
from diag.report.rundir import RunData
from diag.report.thresholds import ALPHA, WORKAROUND_EFFECT, used
from diag.units import human_bytes, human_rate

ADVISE_SOURCE = "advise/advise.json"


def workarounds(run: RunData) -> list[Finding]:
    """Fired when a workaround is faster than plain gloo by WORKAROUND_EFFECT at p < ALPHA at every size it
    ran; clear when the workarounds were measured and none is; undecided without measurements."""
    name = "workarounds"
    advise = run.advise
    if not advise or not advise.get("workarounds"):
        return undecided(name, "no workaround was measured (diag advise, or the advise step of diag reproduce)",
                         WORKAROUND_EFFECT, ALPHA)
    good: list[Evidence] = []
    other: list[str] = []
    for workaround in advise["workarounds"]:
        rows = [r for r in workaround.get("rows", []) if r.get("speedup") is not None]
        texts = [f"{workaround['title']}, N={advise.get('world_size', 2)} {human_bytes(r['size_bytes'])} per rank: "
                 f"{human_rate(r['baseline_busbw_Bps'])} -> {human_rate(r['busbw_Bps'])} busbw, "
                 f"{r['speedup']:.2f}x (p={r['p_value']:.2g}), #wrong {r['nwrong']}"
                 if r.get("p_value") is not None else
                 f"{workaround['title']} {human_bytes(r['size_bytes'])}: {r['speedup']:.2f}x, untested"
                 for r in rows]
        helps = bool(rows) and all(
            r["speedup"] >= 1 + WORKAROUND_EFFECT.value and r.get("p_value") is not None
            and r["p_value"] < ALPHA.value and r["nwrong"] == 0 for r in rows)
        if helps:
            good.append(Evidence("; ".join(texts), {"workaround": workaround["name"],
                                                    "world_size": advise.get("world_size", 2),
                                                    "speedup_min": min(r["speedup"] for r in rows),
                                                    "p_value_max": max(r["p_value"] for r in rows)},
                                 ADVISE_SOURCE))
        else:
            other.append("; ".join(texts) or f"{workaround['title']}: not measured")
    thresholds = used(WORKAROUND_EFFECT, ALPHA)
    if not good:
        return [Finding(name, "clear", "no measured workaround is significantly faster than plain gloo: "
                        + " | ".join(other), thresholds=thresholds)]
    best = max(e.values["speedup_min"] for e in good)
    statement = ("measured fix: " + "; ".join(e.text for e in good)
                 + (f"; not advised: {' | '.join(other)}" if other else "")
                 + " (the code to use is in the report's Workarounds section and advise/advise.json)")
    return [Finding(name, "fired", statement, strength_of(best - 1 - WORKAROUND_EFFECT.value, 0.3, 0.1),
                    tuple(good), thresholds)]

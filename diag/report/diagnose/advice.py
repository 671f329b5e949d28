"""The measured fix: which user-level workarounds the advise step ran beside plain gloo in the same interleaved
rounds, and which of them the trial decided faster. Reads RUN_DIR/advise/advise.json only (diag.advisefile),
whose rows carry the trial's own decisions (diag.verdicts' "difference" design with WORKAROUND_EFFECT): the
rule takes them as they are and decides nothing of its own."""

from __future__ import annotations

from typing import Any

from diag.report.diagnose.base import strength_of, undecided
from diag.report.diagnose.findings import Evidence, Finding
from diag.report.rundir import RunData
from diag.report.thresholds import CPU_CONFOUND_MARGIN, CPU_CONFOUNDED, MIN_ROUNDS, WORKAROUND_EFFECT, used
from diag.units import human_bytes, human_rate

ADVISE_SOURCE = "advise/advise.json"


def _row_text(workaround: dict[str, Any], row: dict[str, Any], world_size: int) -> str:
    rate = (f"{human_rate(row['baseline_busbw_Bps'])} -> {human_rate(row['busbw_Bps'])} busbw, "
            if row.get("baseline_busbw_Bps") is not None and row.get("busbw_Bps") is not None else "")
    interval = (f" [{row['speedup_low']:.2f}, {row['speedup_high']:.2f}]"
                if row.get("speedup_low") is not None and row.get("speedup_high") is not None else "")
    rounds = f", {row['rounds']} interleaved rounds" if row.get("rounds") else ""
    speed = f"{row['speedup']:.2f}x{interval}" if row.get("speedup") is not None else "no speed-up"
    return (f"{workaround['title']}, N={world_size} {human_bytes(row['size_bytes'])} per rank: {rate}{speed} "
            f"({row['verdict']}{rounds}), #wrong {row['nwrong']}")


def workarounds(run: RunData) -> list[Finding]:
    """Fired when the advise trial decided a workaround faster than plain gloo (the whole interval of its time
    ratio below 1, at least WORKAROUND_EFFECT from it) at every size it ran, with its data right; clear when
    the workarounds were measured and none is (each one's verdict said: slower, the same, or undecided within
    the trial's budget); undecided without measurements."""
    name = "workarounds"
    advise = run.advise
    thresholds = used(WORKAROUND_EFFECT, MIN_ROUNDS, CPU_CONFOUNDED, CPU_CONFOUND_MARGIN)
    if not advise or not advise.get("workarounds"):
        return undecided(name, "no workaround was measured (diag advise, or the advise step of diag reproduce)",
                         WORKAROUND_EFFECT, MIN_ROUNDS, CPU_CONFOUNDED, CPU_CONFOUND_MARGIN)
    world_size = advise.get("world_size") or 2
    good: list[Evidence] = []
    other: list[str] = []
    for workaround in advise["workarounds"]:
        rows = [r for r in workaround.get("rows", []) if r.get("speedup") is not None]
        texts = [_row_text(workaround, r, world_size) for r in rows]
        helps = bool(rows) and all(r.get("verdict") == "faster" and r.get("nwrong") == 0 for r in rows)
        if helps:
            good.append(Evidence("; ".join(texts), {
                "workaround": workaround["name"], "world_size": world_size,
                "speedup_min": min(r["speedup"] for r in rows),
                "speedup_low_min": min(r["speedup_low"] for r in rows if r.get("speedup_low") is not None),
                "rounds_min": min(r.get("rounds") or 0 for r in rows),
                # shown beside the decision, never deciding: the rank test of the trial's samples
                "p_value_max": max(((r.get("decision") or {}).get("p_value") or 0.0) for r in rows)},
                ADVISE_SOURCE))
        else:
            why = "; ".join(f"{t}: {r.get('reason', '')}" if r.get("verdict") == "undecided" else t
                            for t, r in zip(texts, rows, strict=True))
            other.append(why or f"{workaround['title']}: not measured")
    if not good:
        return [Finding(name, "clear", "no workaround was decided faster than plain gloo in the same interleaved "
                        "rounds: " + " | ".join(other), thresholds=thresholds)]
    best = max(e.values["speedup_low_min"] for e in good)
    statement = ("measured fix: " + "; ".join(e.text for e in good)
                 + (f"; not advised: {' | '.join(other)}" if other else "")
                 + " (the code to use is in the report's Workarounds section and advise/advise.json)")
    # how far the speed-up's interval clears the effect threshold at its lower end
    return [Finding(name, "fired", statement, strength_of(best - 1 - WORKAROUND_EFFECT.value, 0.3, 0.1),
                    tuple(good), thresholds)]

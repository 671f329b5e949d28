"""advise.json, the measured workarounds of a run (RUN_DIR/advise/advise.json): its name, schema and reader.
Below both `diag.advise`, which writes it, and the report, which reads it, so the report never imports the
command that runs experiments.

Schema history (bump ADVISE_SCHEMA for any change a reader must know about):
  1 - first version: the baseline and each workaround run one after the other; rows with the speed-up of the
      medians and Welch's t-test on the per-iteration times (p_value, significant, verdict).
  2 - one interleaved trial (diag.plan's advise step): every workaround beside plain gloo in the same rounds,
      in a fresh random order each round. Rows carry the speed-up of the mean times with its bootstrap interval
      (speedup_low, speedup_high), the trial's decision (diag.verdicts "difference", WORKAROUND_EFFECT) and
      ``verdict`` faster | slower | same | undecided; ``records`` is the trial's records file, relative to the
      run directory; ``stopped``: per size, why the trial stopped (decided, budget, max_rounds). No Welch.

The reader maps a schema 1 file onto schema 2 rows: its speed-ups are kept, its verdicts are not (arms run
minutes apart under different load, tested on iterations of one launch), so each row reads "undecided" with
the reason, and Welch's p stays only as ``welch_p``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from diag.errors import DiagError

ADVISE_SCHEMA = 2
READABLE_SCHEMAS = (1, 2)
ADVISE_NAME = "advise.json"
VERDICTS = ("faster", "slower", "same", "undecided")
SCHEMA_1_REASON = ("measured by advise schema 1 (the arms one after another, Welch's t-test on the iterations of "
                   "one launch), which decides nothing today: rerun diag advise for an interleaved verdict")


def load_advise(path: Path) -> dict[str, Any]:
    """advise.json from a file or the directory holding it (what the report reads), as schema 2."""
    target = path / ADVISE_NAME if path.is_dir() else path
    try:
        data = json.loads(target.read_text())
    except FileNotFoundError:
        raise DiagError(f"no {ADVISE_NAME} at {path}: run diag advise first") from None
    except json.JSONDecodeError as exc:
        raise DiagError(f"{target} is not valid JSON ({exc.msg}); rerun diag advise") from None
    if not isinstance(data, dict) or data.get("schema") not in READABLE_SCHEMAS:
        schema = data.get("schema") if isinstance(data, dict) else None
        raise DiagError(f"{target} has advise schema {schema}, this diag reads {', '.join(map(str, READABLE_SCHEMAS))}")
    return from_schema_1(data) if data["schema"] == 1 else data


def from_schema_1(data: dict[str, Any]) -> dict[str, Any]:
    """A schema 1 file as schema 2: the same figures, no decision."""
    workarounds = []
    for workaround in data.get("workarounds") or []:
        rows = []
        for row in workaround.get("rows") or []:
            rows.append({**{k: v for k, v in row.items() if k not in ("p_value", "significant", "verdict", "sentence")},
                         "speedup_low": None, "speedup_high": None, "verdict": "undecided",
                         "reason": SCHEMA_1_REASON, "welch_p": row.get("p_value"), "decision": None,
                         "rounds": None})
        workarounds.append({**workaround, "rows": rows})
    return {**data, "schema": ADVISE_SCHEMA, "read_from_schema": 1, "workarounds": workarounds,
            "records": f"advise/{data.get('records') or 'records.jsonl'}", "stopped": {}}


__all__ = ["ADVISE_NAME", "ADVISE_SCHEMA", "VERDICTS", "from_schema_1", "load_advise"]

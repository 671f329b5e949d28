"""advise.json, the file `diag advise` writes: its name, schema and reader. Below both `diag.advise`, which
writes it, and the report, which reads it, so the report never imports the command that runs experiments."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from diag.errors import DiagError

ADVISE_SCHEMA = 1   # 1: first version (baseline + workarounds, rows with speed-up and Welch p-value)
ADVISE_NAME = "advise.json"


def load_advise(path: Path) -> dict[str, Any]:
    """advise.json from a file or the directory holding it (what reproduce's report reads)."""
    target = path / ADVISE_NAME if path.is_dir() else path
    try:
        data = json.loads(target.read_text())
    except FileNotFoundError:
        raise DiagError(f"no {ADVISE_NAME} at {path}: run diag advise first") from None
    except json.JSONDecodeError as exc:
        raise DiagError(f"{target} is not valid JSON ({exc.msg}); rerun diag advise") from None
    if data.get("schema") != ADVISE_SCHEMA:
        raise DiagError(f"{target} has advise schema {data.get('schema')}, this diag reads {ADVISE_SCHEMA}")
    return data

"""Models a simulator can use: one per series (transport + mechanism knobs) and op, across N and size.

    import diag.model
    model = diag.model.load("model.json")                   # written by `diag model fit` or a report
    p = model.predict("all_gather", 8, 16 << 20, series="torch:gloo")
    p.time_s, (p.low_s, p.high_s), p.extrapolated, p.where  # mean time, 95% interval for one operation

    diag.model.fit(records, world_sizes=(2, 3, 4))          # -> Model (needs the records' series identity)

Terms, fit, held-out tests and exports: diag/model/core.py, fitting.py, export.py; docs/model.md.
Importing this package (load, predict) needs numpy only; fitting needs scipy.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from diag.model.core import CONFIDENCE, MODEL_SCHEMA, Model, Prediction, SeriesModel, Terms, load

if TYPE_CHECKING:
    from diag.records import Record

__all__ = ["CONFIDENCE", "MODEL_SCHEMA", "Model", "Prediction", "SeriesModel", "Terms", "fit", "load"]


def fit(records: Iterable[Record], world_sizes: Sequence[int] | None = None, sources: Sequence[str] = ()) -> Model:
    """One model per series and op from records (``diag.load_records(path).records``, ``load_run(...).records``)."""
    from diag.model.fitting import fit as _fit

    return _fit(records, world_sizes, sources)

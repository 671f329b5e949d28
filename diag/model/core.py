"""One model per series and op across N and size: its terms, its prediction with an interval from the
samples, and model.json (written and read here, one definition).

  T(N, S) = L*alpha + V*beta + L*ramp * m/(m + ramp_half) + [N=2] V*n2_beta * m/(m + n2_half)

with L, m, V the algorithm's steps, bytes per step and bytes through each link (diag/model/structure.py):

  alpha      per-step latency (s): what every message pays once
  beta       per-byte cost through a link (s/B); 1/beta is the link's sustained rate
  ramp       TCP not yet at rate (s per step): > 0 where small messages move slower per byte than the
             sustained rate (slow start, socket buffers), approaching +ramp per step once m >> ramp_half;
             < 0 where they move faster (a token bucket's burst), never below -beta*ramp_half, so a step
             never costs less than nothing
  n2_beta    the N=2 turn-taking penalty (s/B at N=2 only): n2_turn_share = n2_beta / (beta + n2_beta) is
             the share of N=2's transfer time lost to the two directions of one connection taking turns
             (the same quantity diag's N=2 dip measures as 1 - busbw(N=2) / busbw(N>=3)), reached once a
             step's message outgrows n2_half (half of it at n2_half; 0: at every size): turns cost nothing
             while a message fits in what the sockets hold in flight

Every term is >= 0 or bounded as above, and every structure has V >= L*m, so T > 0 for every N >= 2 and
S >= 1 byte (tests/test_model.py holds every fitted series to it from 1 B to 1 GiB).

The prediction interval is drawn from the samples, not from a normal-error formula: each fitted cell (N, S)
keeps the quantiles of its per-iteration times divided by the model's mean there (its own scatter and the
model's misfit); a prediction pools the nearest cells' ratios (same N=2-or-not regime, nearest N, the two
nearest sizes), multiplies them with the spread of the bootstrap refits, and reports the 2.5/50/97.5%
quantiles. A bimodal pool (gloo's fast and slow N=2 repetitions) is reported as two modes. Beyond the
measured N or sizes the prediction says it extrapolates, and widens the interval by the held-out error of
that kind of extrapolation.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from diag.errors import DiagError
from diag.model.structure import Structure, structure_of

# Schema history (bump MODEL_SCHEMA for any change a reader must know about):
#   1 - T = alpha + beta*S per (transport, op, N), plus a two-segment fit where the data bent; covariances.
#       Strict JSON: non-finite numbers null, listed in "nonfinite".
#   2 - schema 1's line fits per (series, op, N) rather than per transport ("series" beside "transport").
#   3 - one model per series (transport + mechanism knobs) and op across N and size ("series", not "models"):
#       per-step latency, per-byte cost, TCP's ramp and the N=2 turn-taking share (with the size it sets in
#       from) as named terms (all bounded, never a non-positive time); per cell the quantiles of its samples
#       over the model (prediction intervals from the samples); bootstrap refits; leave-one-N-out and
#       leave-one-size-out errors; where it extrapolates.
MODEL_SCHEMA = 3
# Schemas of the per-N line fits of earlier releases: read as "fit again", never as a model of this kind.
LINE_FIT_SCHEMAS = (1, 2)
# The interval a prediction reports (two-sided).
CONFIDENCE = 0.95
# Quantile levels of each cell's sample/model ratios kept in model.json: 41 evenly spaced, so the pooled
# levels of a few cells stand in for their pooled samples.
RATIO_LEVELS = tuple(i / 40 for i in range(41))
# Cells a prediction pools: the nearest N in its regime, and this many nearest sizes at that N.
NEAREST_SIZES = 2


@dataclass(frozen=True)
class Terms:
    alpha_s: float
    beta_s_per_byte: float
    ramp_s: float = 0.0
    ramp_half_bytes: float = 0.0     # 0: no ramp term
    n2_beta_s_per_byte: float = 0.0
    n2_half_bytes: float = 0.0       # 0: the N=2 penalty holds at every size

    @property
    def bandwidth_Bps(self) -> float:
        return 1.0 / self.beta_s_per_byte if self.beta_s_per_byte > 0 else math.inf

    @property
    def n2_turn_share(self) -> float:
        total = self.beta_s_per_byte + self.n2_beta_s_per_byte
        return self.n2_beta_s_per_byte / total if total > 0 else 0.0

    def vector(self) -> list[float]:
        return [self.alpha_s, self.beta_s_per_byte, self.ramp_s, self.n2_beta_s_per_byte]

    def with_vector(self, values: Sequence[float]) -> Terms:
        return Terms(float(values[0]), float(values[1]), float(values[2]), self.ramp_half_bytes, float(values[3]),
                     self.n2_half_bytes)

    def n2_onset(self, message: Any) -> Any:
        """The share of the N=2 penalty a step of ``message`` bytes pays."""
        return message / (message + self.n2_half_bytes) if self.n2_half_bytes > 0 else 1.0

    def time_s(self, structure: Structure, n: Any, s: Any, *, n2_penalty: bool = True) -> np.ndarray:
        steps, message, link = structure.counts(n, s)
        t = steps * self.alpha_s + link * self.beta_s_per_byte
        if self.ramp_half_bytes > 0 and self.ramp_s != 0.0:
            t = t + steps * self.ramp_s * message / (message + self.ramp_half_bytes)
        if n2_penalty and self.n2_beta_s_per_byte > 0:
            t = t + np.where(np.asarray(n) == 2, link * self.n2_beta_s_per_byte * self.n2_onset(message), 0.0)
        return np.asarray(t, dtype=float)

    def to_json(self) -> dict[str, float]:
        return {"alpha_s": self.alpha_s, "beta_s_per_byte": self.beta_s_per_byte, "bandwidth_Bps": self.bandwidth_Bps,
                "ramp_s": self.ramp_s, "ramp_half_bytes": self.ramp_half_bytes,
                "n2_beta_s_per_byte": self.n2_beta_s_per_byte, "n2_half_bytes": self.n2_half_bytes,
                "n2_turn_share": self.n2_turn_share}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Terms:
        return cls(float(data["alpha_s"]), float(data["beta_s_per_byte"]), float(data.get("ramp_s") or 0.0),
                   float(data.get("ramp_half_bytes") or 0.0), float(data.get("n2_beta_s_per_byte") or 0.0),
                   float(data.get("n2_half_bytes") or 0.0))


@dataclass(frozen=True)
class Cell:
    """One measured (N, S) of a series: its samples' mean, the model's mean there, and the ratio quantiles."""

    world_size: int
    size_bytes: int
    samples: int
    mean_s: float
    predicted_s: float
    ratios: tuple[float, ...]            # quantiles (RATIO_LEVELS) of sample / predicted mean
    link_bytes: float

    @property
    def error(self) -> float:
        return self.predicted_s / self.mean_s - 1.0

    def to_json(self) -> dict[str, Any]:
        from diag.stats import modes

        m = modes(self.ratios)
        return {"world_size": self.world_size, "size_bytes": self.size_bytes, "samples": self.samples,
                "mean_s": self.mean_s, "predicted_s": self.predicted_s, "error": self.error,
                "link_bytes": self.link_bytes, "ratio_quantiles": list(self.ratios),
                "modes": m.to_json() if m.bimodal else None}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Cell:
        return cls(int(data["world_size"]), int(data["size_bytes"]), int(data["samples"]), float(data["mean_s"]),
                   float(data["predicted_s"]), tuple(float(v) for v in data["ratio_quantiles"]),
                   float(data.get("link_bytes") or 0.0))


@dataclass(frozen=True)
class HeldOut:
    """One left-out group (a world size, or a size) and how well a fit without it predicted it."""

    kind: str                            # "world_size" | "size" (per-rank S) | "volume" (bytes per link, D)
    value: int
    cells: int
    median_error: float                  # median |predicted / measured mean - 1| over its cells
    max_error: float
    extrapolated: bool                   # the left-out value lay outside the rest (the edge N, the largest size)
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "value": self.value, "cells": self.cells, "median_error": self.median_error,
                "max_error": self.max_error, "extrapolated": self.extrapolated, "note": self.note}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> HeldOut:
        return cls(str(data["kind"]), int(data["value"]), int(data["cells"]), float(data["median_error"]),
                   float(data["max_error"]), bool(data["extrapolated"]), str(data.get("note", "")))


@dataclass(frozen=True)
class Prediction:
    """How long one op takes: the model's mean, and an interval for one operation drawn from the samples."""

    series: str
    op: str
    world_size: int
    size_bytes: int
    time_s: float                        # the model's mean time
    median_s: float
    low_s: float                         # CONFIDENCE interval for one operation's time
    high_s: float
    confidence: float
    modes: dict[str, float] | None       # {"fast_s", "slow_s", "slow_fraction"} where the samples are bimodal
    extrapolated: bool
    where: str                           # why it extrapolates, or "" (measured) / "between measured N"
    std_s: float = 0.0                   # standard deviation of the predictive draws (for tables that want one)

    def to_json(self) -> dict[str, Any]:
        return {"series": self.series, "op": self.op, "world_size": self.world_size, "size_bytes": self.size_bytes,
                "time_s": self.time_s, "median_s": self.median_s, "low_s": self.low_s, "high_s": self.high_s,
                "confidence": self.confidence, "std_s": self.std_s, "modes": self.modes,
                "extrapolated": self.extrapolated, "where": self.where}


@dataclass(frozen=True)
class SeriesModel:
    series: str                          # the series identity (transport + mechanism knobs)
    backend: str
    algo: str
    op: str
    terms: Terms
    intervals: dict[str, tuple[float, float]]   # 95% bootstrap intervals of the terms (and n2_turn_share)
    bootstrap: tuple[tuple[float, ...], ...]    # refits on resampled iterations: Terms.vector() each
    cells: tuple[Cell, ...]
    n2_penalty: bool                     # the N=2 term was fitted (N=2 and N>=3 both measured, not pairwise)
    ramp: bool                           # the ramp term was kept (leave-one-size-out chose it)
    fit_error: float                     # median |error| of the fitted cells' means
    stated_error: float                  # the error the model states for a mean: 90% of fitted cells within it
    heldout: tuple[HeldOut, ...] = ()
    notes: tuple[str, ...] = ()
    structure: Structure = field(init=False, repr=False, compare=False)
    _pools: dict[tuple[int, ...], tuple[np.ndarray, Any]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        found = structure_of(self.backend, self.algo, self.op)
        if found is None:
            raise DiagError(f"no structure known for {self.series} {self.op}: cannot model it")
        object.__setattr__(self, "structure", found)
        object.__setattr__(self, "_pools", {})

    # --- what was measured -------------------------------------------------------------------------------
    @property
    def world_sizes(self) -> list[int]:
        return sorted({c.world_size for c in self.cells})

    @property
    def sizes_bytes(self) -> list[int]:
        return sorted({c.size_bytes for c in self.cells})

    def heldout_of(self, kind: str) -> list[HeldOut]:
        return [h for h in self.heldout if h.kind == kind]

    def heldout_error_of(self, kind: str) -> float | None:
        """Median over the left-out groups of one kind ("world_size", or "size" for either size axis). N=2 left
        out of a model with the N=2 term is not counted: that term is fitted from N=2 and only from it."""
        kinds = ("world_size",) if kind == "world_size" else ("size", "volume")
        errors = [h.median_error for h in self.heldout if h.kind in kinds and not h.note]
        return float(np.median(errors)) if errors else None

    @property
    def heldout_error(self) -> float | None:
        """The worse of the leave-one-N-out and leave-one-size-out medians."""
        errors = [e for e in (self.heldout_error_of("world_size"), self.heldout_error_of("size")) if e is not None]
        return max(errors) if errors else None

    @property
    def within_stated(self) -> bool | None:
        error = self.heldout_error
        return None if error is None else error <= self.stated_error

    def extrapolation_error(self, kind: str, above: bool) -> float:
        """How wrong this model was when it extrapolated that way: the held-out error of the largest (above) or
        smallest measured N or size, left out and predicted from the rest. N=2 left out of a model with the
        N=2 term does not count (that term needs N=2). Without such a test: its stated error."""
        kinds = ("world_size",) if kind == "world_size" else ("size", "volume")
        groups = [h for h in self.heldout if h.kind in kinds and not h.note]
        if not groups:
            return self.stated_error
        edge = max(groups, key=lambda h: h.value) if above else min(groups, key=lambda h: h.value)
        return edge.median_error if edge.extrapolated else self.stated_error

    def where(self, world_size: int, size_bytes: int) -> tuple[bool, str]:
        """(extrapolated, why) for one question."""
        ns, sizes = self.world_sizes, self.sizes_bytes
        reasons = []
        if not self.structure.pairwise and not ns[0] <= world_size <= ns[-1]:
            reasons.append(f"N={world_size} is outside the measured N={_span(ns)}")
        if not sizes[0] <= size_bytes <= sizes[-1]:
            from diag.units import human_bytes

            reasons.append(f"{human_bytes(size_bytes)} is outside the measured {human_bytes(sizes[0])}.."
                           f"{human_bytes(sizes[-1])} per rank")
        if reasons:
            return True, "extrapolated: " + "; ".join(reasons)
        if not self.structure.pairwise and world_size not in ns:
            return False, f"N={world_size} not measured: between measured N={_span(ns)}"
        return False, ""

    # --- prediction --------------------------------------------------------------------------------------
    def mean_s(self, world_size: Any, size_bytes: Any) -> np.ndarray:
        return self.terms.time_s(self.structure, world_size, size_bytes, n2_penalty=self.n2_penalty)

    def without_n2_penalty_s(self, world_size: Any, size_bytes: Any) -> np.ndarray:
        """The time at N=2 had its connection not taken turns (the ring's own cost)."""
        return self.terms.time_s(self.structure, world_size, size_bytes, n2_penalty=False)

    def _pool(self, world_size: int, size_bytes: int) -> tuple[np.ndarray, Any]:
        """The ratio quantiles of the nearest cells (the same regime, N=2 or not; the nearest N; the
        NEAREST_SIZES nearest sizes there), and their modes (cached: nearby questions share their cells)."""
        cells = list(self.cells)
        regime = [c for c in cells if (c.world_size == 2) == (world_size == 2)] or cells
        if not self.structure.pairwise:
            nearest = min(abs(c.world_size - world_size) for c in regime)
            regime = [c for c in regime if abs(c.world_size - world_size) == nearest]
        by_size = sorted(regime, key=lambda c: abs(math.log(c.size_bytes) - math.log(size_bytes)))
        sizes = list(dict.fromkeys(c.size_bytes for c in by_size))[:NEAREST_SIZES]
        chosen = tuple(i for i, c in enumerate(self.cells) if c in regime and c.size_bytes in sizes)
        if chosen not in self._pools:
            from diag.stats import modes

            pool = np.concatenate([np.asarray(self.cells[i].ratios) for i in chosen])
            self._pools[chosen] = (pool, modes(pool.tolist()))
        return self._pools[chosen]

    def _refit_spread(self, world_size: int, size_bytes: int, mean: float) -> np.ndarray:
        """The bootstrap refits' means at (N, S) over the model's mean (both halves are shared by every refit)."""
        if not self.bootstrap:
            return np.ones(1)
        steps, message, link = (float(v) for v in self.structure.counts(np.array(world_size), np.array(size_bytes)))
        rise = steps * message / (message + self.terms.ramp_half_bytes) if self.terms.ramp_half_bytes > 0 else 0.0
        n2 = link * float(self.terms.n2_onset(message)) if self.n2_penalty and world_size == 2 else 0.0
        return np.asarray(self.bootstrap) @ np.array([steps, link, rise, n2]) / mean

    def predict(self, world_size: int, size_bytes: int, confidence: float = CONFIDENCE) -> Prediction:
        if world_size < 2:
            raise DiagError(f"N={world_size}: a collective needs at least 2 ranks")
        if size_bytes < 1:
            raise DiagError(f"size {size_bytes}: give at least 1 byte per rank")
        mean = float(self.mean_s(world_size, size_bytes))
        pool, m = self._pool(world_size, size_bytes)
        draws = np.outer(self._refit_spread(world_size, size_bytes, mean), pool).ravel() * mean
        tail = (1 - confidence) / 2
        low, median, high = (float(v) for v in np.quantile(draws, [tail, 0.5, 1 - tail]))
        extrapolated, where = self.where(world_size, size_bytes)
        if extrapolated:
            widen = 1.0
            ns, sizes = self.world_sizes, self.sizes_bytes
            if not self.structure.pairwise and not ns[0] <= world_size <= ns[-1]:
                widen += self.extrapolation_error("world_size", world_size > ns[-1])
            if not sizes[0] <= size_bytes <= sizes[-1]:
                widen += self.extrapolation_error("size", size_bytes > sizes[-1])
            low, high = low / widen, high * widen
        two = ({"fast_s": mean * m.fast_s, "slow_s": mean * m.slow_s, "slow_fraction": m.slow_fraction}
               if m.bimodal else None)
        return Prediction(self.series, self.op, world_size, size_bytes, mean, median, low, high, confidence, two,
                          extrapolated, where, float(np.std(draws)))

    # --- model.json --------------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        share = self.intervals.get("n2_turn_share")
        return {
            "series": self.series, "backend": self.backend, "algo": self.algo, "op": self.op,
            "structure": self.structure.to_json(),
            "terms": self.terms.to_json(),
            "intervals": {k: list(v) for k, v in self.intervals.items()},
            "n2_penalty": self.n2_penalty, "ramp": self.ramp,
            "n2_turn_share": {"point": self.terms.n2_turn_share, "low": share[0], "high": share[1]}
            if self.n2_penalty and share else None,
            "fitted": {"world_sizes": self.world_sizes, "sizes_bytes": [self.sizes_bytes[0], self.sizes_bytes[-1]],
                       "cells": len(self.cells), "samples": sum(c.samples for c in self.cells)},
            "fit_error": self.fit_error, "stated_error": self.stated_error,
            "heldout": {"groups": [h.to_json() for h in self.heldout], "median_error": self.heldout_error,
                        "within_stated": self.within_stated, "statement": self.heldout_statement()},
            "extrapolates": self.extrapolation_statement(),
            "notes": list(self.notes),
            "cells": [c.to_json() for c in self.cells],
            "bootstrap": [list(v) for v in self.bootstrap],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SeriesModel:
        return cls(series=str(data["series"]), backend=str(data["backend"]), algo=str(data["algo"]),
                   op=str(data["op"]), terms=Terms.from_json(data["terms"]),
                   intervals={k: (float(v[0]), float(v[1])) for k, v in data.get("intervals", {}).items()
                              if v is not None and None not in v},
                   bootstrap=tuple(tuple(float(x) for x in v) for v in data.get("bootstrap", [])),
                   cells=tuple(Cell.from_json(c) for c in data["cells"]), n2_penalty=bool(data["n2_penalty"]),
                   ramp=bool(data.get("ramp", False)), fit_error=float(data["fit_error"]),
                   stated_error=float(data["stated_error"]),
                   heldout=tuple(HeldOut.from_json(h) for h in data.get("heldout", {}).get("groups", [])),
                   notes=tuple(data.get("notes", [])))

    # --- what a reader is told ---------------------------------------------------------------------------
    def heldout_statement(self) -> str:
        error = self.heldout_error
        if error is None:
            return "no held-out test: too few world sizes and sizes to leave one out"
        parts = [f"{name} {value:.1%}" for name, value in (("leave-one-N-out", self.heldout_error_of("world_size")),
                                                            ("leave-one-size-out", self.heldout_error_of("size")))
                 if value is not None]
        if error <= self.stated_error:
            return (f"predicts data it did not see within its stated error ({', '.join(parts)}; stated "
                    f"{self.stated_error:.1%})")
        return (f"cannot predict within its stated error: {', '.join(parts)} against a stated "
                f"{self.stated_error:.1%}; treat its predictions as rough")

    def extrapolation_statement(self) -> str:
        from diag.units import human_bytes

        sizes = self.sizes_bytes
        where = f"per-rank sizes outside {human_bytes(sizes[0])}..{human_bytes(sizes[-1])}"
        if not self.structure.pairwise:
            ns = self.world_sizes
            where = f"N below {ns[0]} or above {ns[-1]} and " + where
        edge = [f"{_kind_text(h)} {_value_text(h)} left out: {h.median_error:.1%}"
                for h in self.heldout if h.extrapolated and not h.note]
        return f"extrapolates at {where}" + (f" (held-out at the edge: {'; '.join(edge)})" if edge else "")


def _kind_text(h: HeldOut) -> str:
    return {"world_size": "N", "size": "per-rank size", "volume": "D"}.get(h.kind, h.kind)


def _value_text(h: HeldOut) -> str:
    if h.kind == "world_size":
        return str(h.value)
    from diag.units import human_bytes

    return human_bytes(h.value)


def _span(values: Sequence[int]) -> str:
    values = sorted(values)
    if len(values) > 2 and values == list(range(values[0], values[-1] + 1)):
        return f"{values[0]}..{values[-1]}"
    return ",".join(map(str, values))


@dataclass(frozen=True)
class Model:
    """Every series' model of one model.json: ``load(path).predict(op, n, size, series=...)``."""

    series_models: tuple[SeriesModel, ...]
    sources: tuple[str, ...] = ()
    skipped: tuple[dict[str, str], ...] = ()    # {"series", "op", "why"}: what was not modelled

    @property
    def series(self) -> list[str]:
        return list(dict.fromkeys(m.series for m in self.series_models))

    def select(self, op: str, series: str | None = None) -> list[SeriesModel]:
        """The models of ``op``; ``series`` is a series label, or a transport (``torch:gloo``, ``gloo``,
        ``raw:ring``, ``raw``) that picks that transport's series with the fewest knobs (``raw:ring`` is the raw
        reference, labelled ``raw:ring [order=recv-first]`` by the sweeps)."""
        of_op = [m for m in self.series_models if m.op == op]
        if series is None:
            hits = of_op
        else:
            hits = [m for m in of_op if m.series == series]
            if not hits:
                transport = {"raw": "raw:ring"}.get(series, series if ":" in series else f"torch:{series}")
                of_transport = [m for m in of_op if m.series.split(" [")[0] == transport]
                fewest = min((_knob_count(m.series) for m in of_transport), default=0)
                hits = [m for m in of_transport if _knob_count(m.series) == fewest]
        if not hits:
            have = ", ".join(f"{m.series} {m.op}" for m in self.series_models) or "none"
            raise DiagError(f"no model for {op}{' of ' + series if series else ''}; the model file has: {have}")
        return hits

    def predict(self, op: str, world_size: int, size_bytes: int, series: str | None = None,
                confidence: float = CONFIDENCE) -> Prediction:
        hits = self.select(op, series)
        if len(hits) > 1:
            raise DiagError(f"{len(hits)} series model {op}: name one with series= "
                            f"({', '.join(m.series for m in hits)})")
        return hits[0].predict(world_size, size_bytes, confidence)

    def to_json(self) -> dict[str, Any]:
        """model.json: strict JSON (no Infinity or NaN); ``nonfinite`` lists what was null'ed and why."""
        import time

        from diag.typedjson import strict_json

        models, notes = strict_json([m.to_json() for m in self.series_models], _nonfinite_reason, "series")
        return {"schema": MODEL_SCHEMA, "kind": "diag-model", "created_ns": time.time_ns(),
                "sources": list(self.sources),
                "units": {"size": "bytes of per-rank input (records' size_bytes)", "time": "seconds per operation"},
                "formula": "T(N,S) = L*alpha_s + V*beta_s_per_byte + L*ramp_s*m/(m+ramp_half_bytes) "
                           "+ [N=2] V*n2_beta_s_per_byte*m/(m+n2_half_bytes); L, m, V: the series' structure "
                           "(steps, step_bytes, link_bytes); n2_turn_share = n2_beta/(beta+n2_beta); a half of 0: "
                           "that term's factor is 1",
                "interval": f"{CONFIDENCE:.0%} of one operation's time: quantiles of the nearest cells' "
                            "ratio_quantiles x the bootstrap refits (diag/model/core.py)",
                "series": models, "skipped": list(self.skipped), "nonfinite": notes}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Model:
        if data.get("kind") != "diag-model":
            raise DiagError("not a diag model file: make one with `diag model fit RUN_DIR -o model.json`")
        if data.get("schema") in LINE_FIT_SCHEMAS:
            raise DiagError(f"model file schema {data['schema']}: an earlier release's line per N; this diag reads "
                            f"schema {MODEL_SCHEMA} (one model across N): fit it again with `diag model fit RUN_DIR -o "
                            "model.json`")
        if data.get("schema") != MODEL_SCHEMA:
            raise DiagError(f"model file schema {data.get('schema')!r}: this diag reads schema {MODEL_SCHEMA}; "
                            "fit it again with `diag model fit RUN_DIR -o model.json`")
        return cls(tuple(SeriesModel.from_json(m) for m in data.get("series", [])), tuple(data.get("sources", [])),
                   tuple(data.get("skipped", [])))


def _knob_count(series: str) -> int:
    """Knobs in a series label: 'raw:ring [conn=shared, order=recv-first]' has 2."""
    return series.count("=")


def _nonfinite_reason(path: str) -> str:
    if path.endswith("bandwidth_Bps"):
        return ("the fitted per-byte cost (beta) is zero: time does not grow with size over the sizes measured, "
                "so there is no finite bandwidth (sweep larger sizes)")
    return "the fit produced no finite number here"


def load(path: str | Path) -> Model:
    """A model file written by ``diag model fit`` (or a report's model.json)."""
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DiagError(f"cannot read model {p}: {exc}") from None
    if not isinstance(data, dict):
        raise DiagError(f"{p}: not a diag model file: make one with `diag model fit RUN_DIR -o model.json`")
    try:
        return Model.from_json(data)
    except DiagError as exc:
        raise DiagError(f"{p}: {exc}") from None
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
        raise DiagError(f"{p}: a damaged model file ({type(exc).__name__}: {exc}): fit it again with `diag model "
                        "fit RUN_DIR -o model.json`") from None

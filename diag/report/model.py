"""Latency/bandwidth models of collectives: T(S) = alpha + beta * S per (series, op, N), plus a
two-segment (continuous piecewise linear, fitted breakpoint) model where the data bends.

S is the per-rank input size in bytes (records' ``size_bytes``), T the time of one operation in seconds
(every timed sample, not only medians, so the fit sees the noise). Timing noise grows with T, so the fit
is weighted least squares on relative error (weight 1/T_median(S)^2): without it the largest sizes would
decide alpha alone. Fit error is the weighted (relative) RMS of the residuals.

The exported JSON (MODEL_SCHEMA) is meant for simulators: plain numbers in base units, covariance
included so a reader can compute its own uncertainty.

A model is one series (diag.records.series_label: transport + mechanism knobs): the raw-TCP reference, gloo's
protocol model (raw --emulate gloo) and a half-duplex ring (raw --io alternate) share a transport but never a
fit.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from diag.errors import DiagError
from diag.records import Record, transport_label

# Schema history: 1 - first version (linear + optional two_segment per transport/op/world_size). Strict JSON:
# a number that is not finite (a bandwidth where beta <= 0, a covariance the points cannot give) is written as
# null, and the document's "nonfinite" list says where and why (readers of schema 1 without it never saw a
# null, so it stayed schema 1: nulls only replace what was invalid JSON).
# 2 - one model per series (``series``: transport + mechanism knobs) rather than per transport, so two models
# may share a transport, op and N; schema 1 files read with the transport as their series.
MODEL_SCHEMA = 2
READABLE_SCHEMAS = (1, 2)
# Use the two-segment fit only when its relative RMS error is at most this fraction of the linear one's.
BEND_IMPROVEMENT = 0.6
# A segment needs at least this many distinct sizes to stand on (else a bend fits noise).
MIN_SIZES_PER_SEGMENT = 2
# z for the two-sided 95% interval printed by predict.
Z95 = 1.96


@dataclass(frozen=True)
class LinearFit:
    alpha_s: float
    beta_s_per_byte: float
    cov: list[list[float]]       # covariance of (alpha, beta)
    rel_rms: float               # weighted RMS of residuals / T

    @property
    def bandwidth_Bps(self) -> float:
        return 1.0 / self.beta_s_per_byte if self.beta_s_per_byte > 0 else math.inf

    def predict(self, size_bytes: float) -> tuple[float, float]:
        """(T, standard error of one new operation's time)."""
        x = np.array([1.0, float(size_bytes)])
        t = float(self.alpha_s + self.beta_s_per_byte * size_bytes)
        var_mean = float(x @ np.array(self.cov) @ x)
        return t, math.sqrt(max(var_mean, 0.0) + (self.rel_rms * t) ** 2)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "bandwidth_Bps": self.bandwidth_Bps,
                "alpha_se_s": math.sqrt(max(self.cov[0][0], 0.0)),
                "beta_se_s_per_byte": math.sqrt(max(self.cov[1][1], 0.0))}


@dataclass(frozen=True)
class TwoSegmentFit:
    """T = alpha + beta1*S for S <= b; alpha + beta1*b + beta2*(S - b) above (continuous at b)."""

    alpha_s: float
    beta1_s_per_byte: float
    beta2_s_per_byte: float
    breakpoint_bytes: float
    cov: list[list[float]]       # covariance of (alpha, beta1, beta2), breakpoint held fixed
    rel_rms: float

    def basis(self, size_bytes: float) -> np.ndarray:
        s = float(size_bytes)
        return np.array([1.0, min(s, self.breakpoint_bytes), max(s - self.breakpoint_bytes, 0.0)])

    def predict(self, size_bytes: float) -> tuple[float, float]:
        x = self.basis(size_bytes)
        t = float(x @ np.array([self.alpha_s, self.beta1_s_per_byte, self.beta2_s_per_byte]))
        var_mean = float(x @ np.array(self.cov) @ x)
        return t, math.sqrt(max(var_mean, 0.0) + (self.rel_rms * t) ** 2)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self),
                "bandwidth1_Bps": 1 / self.beta1_s_per_byte if self.beta1_s_per_byte > 0 else math.inf,
                "bandwidth2_Bps": 1 / self.beta2_s_per_byte if self.beta2_s_per_byte > 0 else math.inf}


@dataclass(frozen=True)
class GroupModel:
    backend: str
    algo: str
    op: str
    world_size: int
    n_samples: int
    sizes_bytes: list[int]
    linear: LinearFit
    two_segment: TwoSegmentFit | None
    best: str                    # "linear" | "two_segment"
    series: str = ""             # the series identity (diag.records.series_label); "" reads as the transport

    @property
    def transport(self) -> str:
        return transport_label(self.backend, self.algo)

    @property
    def label(self) -> str:
        """The series this model fits (its transport where a schema 1 file named none)."""
        return self.series or self.transport

    def predict(self, size_bytes: float) -> tuple[float, float]:
        fit = self.two_segment if self.best == "two_segment" and self.two_segment else self.linear
        return fit.predict(size_bytes)

    def to_json(self) -> dict[str, Any]:
        return {"series": self.label, "transport": self.transport, "backend": self.backend, "algo": self.algo,
                "op": self.op,
                "world_size": self.world_size, "n_samples": self.n_samples, "sizes_bytes": self.sizes_bytes,
                "linear": self.linear.to_json(),
                "two_segment": self.two_segment.to_json() if self.two_segment else None,
                "best": self.best}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> GroupModel:
        lin = data["linear"]
        two = data.get("two_segment")
        return cls(
            backend=data["backend"], algo=data["algo"], op=data["op"], world_size=int(data["world_size"]),
            n_samples=int(data.get("n_samples", 0)), sizes_bytes=list(data.get("sizes_bytes", [])),
            linear=LinearFit(lin["alpha_s"], lin["beta_s_per_byte"], _matrix(lin["cov"]), lin["rel_rms"]),
            two_segment=TwoSegmentFit(two["alpha_s"], two["beta1_s_per_byte"], two["beta2_s_per_byte"],
                                      two["breakpoint_bytes"], _matrix(two["cov"]), two["rel_rms"]) if two else None,
            best=data.get("best", "linear"), series=str(data.get("series") or ""),
        )


def _matrix(rows: list[list[float | None]]) -> list[list[float]]:
    """A covariance read back from strict JSON: null (no variance) is NaN again."""
    return [[math.nan if v is None else float(v) for v in row] for row in rows]


def _weighted_lstsq(design: np.ndarray, y: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """(coefficients, covariance, relative RMS) of a weighted least-squares fit."""
    sw = np.sqrt(weights)
    a = design * sw[:, None]
    b = y * sw
    coef, *_ = np.linalg.lstsq(a, b, rcond=None)
    resid = b - a @ coef
    dof = max(len(y) - design.shape[1], 1)
    sigma2 = float(resid @ resid) / dof
    try:
        cov = np.linalg.inv(a.T @ a) * sigma2
    except np.linalg.LinAlgError:
        cov = np.full((design.shape[1], design.shape[1]), np.nan)
    return coef, cov, math.sqrt(sigma2)


def _samples(records: Sequence[Record]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    xs: list[float] = []
    ys: list[float] = []
    ws: list[float] = []
    for r in records:
        times = [t for t in (r.times_s or [r.time_s]) if t > 0]
        if not times:
            continue
        median = float(np.median(times))
        for t in times:
            xs.append(float(r.size_bytes))
            ys.append(float(t))
            ws.append(1.0 / median**2)
    return np.array(xs), np.array(ys), np.array(ws)


def fit_linear(x: np.ndarray, y: np.ndarray, w: np.ndarray) -> LinearFit:
    design = np.column_stack([np.ones_like(x), x])
    coef, cov, rel_rms = _weighted_lstsq(design, y, w)
    return LinearFit(float(coef[0]), float(coef[1]), cov.tolist(), rel_rms)


def fit_two_segment(x: np.ndarray, y: np.ndarray, w: np.ndarray) -> TwoSegmentFit | None:
    """Search the breakpoint on a log grid between distinct sizes; None when too few sizes."""
    sizes = np.unique(x)
    if len(sizes) < 2 * MIN_SIZES_PER_SEGMENT:
        return None
    low, high = sizes[MIN_SIZES_PER_SEGMENT - 1], sizes[-MIN_SIZES_PER_SEGMENT]
    candidates = np.unique(np.concatenate([sizes[(sizes >= low) & (sizes <= high)],
                                           np.geomspace(max(low, 1.0), high, 64)]))
    best: TwoSegmentFit | None = None
    for b in candidates:
        design = np.column_stack([np.ones_like(x), np.minimum(x, b), np.maximum(x - b, 0.0)])
        coef, cov, rel_rms = _weighted_lstsq(design, y, w)
        if best is None or rel_rms < best.rel_rms:
            best = TwoSegmentFit(float(coef[0]), float(coef[1]), float(coef[2]), float(b), cov.tolist(), rel_rms)
    return best


def fit_group(records: Sequence[Record]) -> GroupModel | None:
    """Fit one (series, op, world_size) group; None when fewer than two sizes were measured."""
    series = {r.series for r in records}
    if len(series) > 1:
        raise ValueError(f"one model per series: these rows are of {len(series)} ({', '.join(sorted(series))})")
    x, y, w = _samples(records)
    if len(np.unique(x)) < 2:
        return None
    linear = fit_linear(x, y, w)
    two = fit_two_segment(x, y, w)
    bends = two is not None and two.rel_rms <= BEND_IMPROVEMENT * linear.rel_rms
    first = records[0]
    return GroupModel(first.backend, first.algo, first.op, first.world_size, len(x),
                      sorted({int(r.size_bytes) for r in records}), linear, two,
                      "two_segment" if bends else "linear", first.series)


def group_records(records: Iterable[Record]) -> dict[tuple[str, str, int], list[Record]]:
    """(series, op, N) -> its rows: one model each, never two series pooled."""
    groups: dict[tuple[str, str, int], list[Record]] = defaultdict(list)
    for r in records:
        groups[(r.series, r.op, r.world_size)].append(r)
    return groups


def fit_all(records: Iterable[Record]) -> list[GroupModel]:
    models = []
    for _key, group in sorted(group_records(records).items()):
        model = fit_group(group)
        if model is not None:
            models.append(model)
    return models


def nonfinite_reason(path: str) -> str:
    """Why a model number is not finite, from where it sits (models[i].linear.bandwidth_Bps, ...cov[0][1])."""
    name = path.rsplit(".", 1)[-1]
    if name.startswith("bandwidth"):
        return ("the fitted slope (beta) is zero or negative: time does not grow with size over the sizes "
                "measured, so there is no finite bandwidth (sweep larger sizes)")
    if name.startswith("cov") or name.endswith("_se_s") or name.endswith("_se_s_per_byte"):
        return "too few distinct sizes for the parameters to have a variance (sweep more sizes)"
    return "the fit produced no finite number here"


def models_to_json(models: Sequence[GroupModel], sources: Sequence[str]) -> dict[str, Any]:
    """model.json: strict JSON (no Infinity or NaN); ``nonfinite`` lists what was null'ed and why."""
    from diag.typedjson import strict_json

    models_json, notes = strict_json([m.to_json() for m in models], nonfinite_reason, "models")
    return {"schema": MODEL_SCHEMA, "kind": "diag-model", "created_ns": time.time_ns(),
            "sources": list(sources),
            "units": {"size": "bytes of per-rank input (records' size_bytes)", "time": "seconds per operation"},
            "formula": {"linear": "T = alpha_s + beta_s_per_byte * S",
                        "two_segment": "T = alpha_s + beta1*min(S,b) + beta2*max(S-b,0), b = breakpoint_bytes"},
            "models": models_json,
            "nonfinite": notes}


def models_from_json(data: dict[str, Any]) -> list[GroupModel]:
    if data.get("kind") != "diag-model" or data.get("schema") not in READABLE_SCHEMAS:
        raise DiagError(f"not a diag model file (schema {', '.join(map(str, READABLE_SCHEMAS))}): make one with "
                        "`diag model fit RUN_DIR -o model.json`")
    return [GroupModel.from_json(m) for m in data.get("models", [])]


def select(models: Sequence[GroupModel], op: str, world_size: int, backend: str | None = None,
           algo: str | None = None) -> list[GroupModel]:
    """Models for one question. ``backend`` may be "gloo", "raw", a transport "raw:ring" (every series of it),
    or a series "raw:ring [emulate=gloo]"."""
    series = backend if backend and any(m.label == backend for m in models) else None
    if backend and series is None and ":" in backend:
        kind, name = backend.split(":", 1)
        backend, algo = (name, algo) if kind == "torch" else ("raw", algo or name)
    hits = [m for m in models if m.op == op and m.world_size == world_size
            and (m.label == series if series else
                 (backend is None or m.backend == backend) and (algo is None or m.algo == algo))]
    if not hits:
        have = sorted({(m.label, m.op, m.world_size) for m in models})
        listing = ", ".join(f"{t} {o} N={n}" for t, o, n in have) or "none"
        raise DiagError(f"no model for {op} N={world_size}"
                        f"{' ' + (series or backend or '') if series or backend else ''}; the model file has: {listing}")
    return hits

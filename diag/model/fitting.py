"""Fit one model per series and op across N and size (diag/model/core.py has the terms), test it on data it
did not see, and say so.

How the fit works:
  - Rows are keyed by their series identity (transport + the mechanism knobs that change how bytes move,
    ``diag.records.series_label``) and op: two series are never pooled. Rows with wrong data (#wrong > 0)
    are left out and named. Rows of the same (N, S) (repeated launches) pool their samples into one cell.
  - Each cell's statistic is the mean of its per-iteration times (what a user's loop pays; a bimodal N=2 row
    counts with its slow share). The fit minimises the cells' relative errors, sum w (T(N,S)/mean - 1)^2,
    with w = 1/(NOISE_FLOOR^2 + relative standard error of the cell's mean^2): a cell known to 0.1% does
    not outweigh one known to 2% a hundredfold, a noisy (bimodal) cell counts less.
  - Every coefficient is non-negative (scipy's NNLS): alpha, beta, the N=2 term, and the ramp as two
    non-negative parts (slower below ramp_half, or faster there, never by more than beta*ramp_half), so no
    fitted model can return a non-positive time. The shape parameters ramp_half and n2_half (the size from
    which N=2 takes turns) are searched over log grids of the measured step sizes (RAMP_GRID, N2_GRID
    points; n2_half also 0: at every size), in turn.
  - Beyond alpha and beta, a term is kept only where leave-one-size-out says it predicts better than the
    model without it (TERM_CHOICE): first the N=2 term (where N=2 and N>=3 were both measured, and not for
    pairwise ops), then the ramp.
  - Held out: every measured N is left out in turn (leave-one-N-out) and every size (leave-one-size-out),
    the model refitted on the rest and its error on what was left out recorded. Leaving out the edge N is
    extrapolation in N: that error is what ``predict`` adds to its interval beyond the measured N.
  - Bootstrap: BOOTSTRAP_FITS refits on iterations resampled within each cell give the terms' intervals.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from diag.model.core import RATIO_LEVELS, Cell, HeldOut, Model, SeriesModel, Terms
from diag.model.structure import Structure, structure_of
from diag.records import Record, series_label  # the one series identity (Record.series)

# A cell's relative error never counts as smaller than this in the weights (model error dominates timer noise).
NOISE_FLOOR = 0.02
# ramp_half candidates: this many points, log-spaced over the measured bytes per step; n2_half: this many, and 0.
RAMP_GRID = 24
N2_GRID = 16
# The ramp needs this many distinct sizes. The ramp and the N=2 term must each bring the leave-one-size-out
# error to at most this share of the error without them (a simpler model wins ties).
MIN_SIZES_FOR_RAMP = 4
TERM_CHOICE = 0.9
# Refits on resampled iterations for the terms' intervals, and how many of them model.json keeps.
BOOTSTRAP_FITS = 200
BOOTSTRAP_KEPT = 64
# The error a model states for a mean is never below this (no mean is known better than the timer allows).
STATED_ERROR_FLOOR = 0.02
# The stated error covers this share of the fitted cells.
STATED_COVERAGE = 0.9
# Volumes within this ratio of each other are one D: D/(N-1) rounded down to whole elements makes N=4's
# "4 MiB" 4194300 bytes, and leaving D=4 MiB out must leave it out at every N.
SAME_VOLUME = 1.01


@dataclass(frozen=True)
class CellData:
    """One measured (N, S): its samples, their mean and the fit's weight."""

    world_size: int
    size_bytes: int
    samples: np.ndarray
    mean: float
    weight: float
    link_bytes: float

    @classmethod
    def of(cls, structure: Structure, world_size: int, size_bytes: int, samples: Sequence[float]) -> CellData:
        values = np.asarray(samples, dtype=float)
        mean = float(values.mean())
        sem = float(values.std(ddof=1)) / math.sqrt(values.size) / mean if values.size > 1 else 0.0
        link = float(structure.counts(np.array(world_size), np.array(size_bytes))[2])
        return cls(world_size, size_bytes, values, mean, 1.0 / (NOISE_FLOOR**2 + sem**2), link)


@dataclass(frozen=True)
class Variant:
    """Which terms a fit has."""

    ramp: bool
    n2: bool


def _columns(structure: Structure, cells: Sequence[CellData], variant: Variant, ramp_half: float,
             n2_half: float = 0.0) -> np.ndarray:
    n = np.array([c.world_size for c in cells], dtype=float)
    s = np.array([c.size_bytes for c in cells], dtype=float)
    steps, message, link = structure.counts(n, s)
    columns = [steps, link]
    if variant.ramp:
        rise = steps * message / (message + ramp_half)
        columns += [rise, link / ramp_half - rise]          # >= 0: V >= L*m for every structure
    if variant.n2:
        onset = message / (message + n2_half) if n2_half > 0 else 1.0
        columns.append(np.where(n == 2, link * onset, 0.0))
    return np.column_stack(columns)


def _solve(design: np.ndarray, means: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, float]:
    """NNLS on relative errors: (coefficients >= 0, weighted sum of squared relative errors)."""
    from scipy.optimize import nnls

    root = np.sqrt(weights)
    a = design / means[:, None] * root[:, None]
    norms = np.linalg.norm(a, axis=0)
    keep = norms > 0
    x = np.zeros(design.shape[1])
    if keep.any():
        solution, _ = nnls(a[:, keep] / norms[keep], root)
        x[keep] = solution / norms[keep]
    residual = a @ x - root
    return x, float(residual @ residual)


def _terms(x: np.ndarray, variant: Variant, ramp_half: float, n2_half: float = 0.0) -> Terms:
    alpha, beta = float(x[0]), float(x[1])
    ramp = 0.0
    i = 2
    if variant.ramp:
        beta += float(x[3]) / ramp_half
        ramp = float(x[2] - x[3])
        i = 4
    n2_beta = float(x[i]) if variant.n2 else 0.0
    return Terms(alpha, beta, ramp, ramp_half if variant.ramp else 0.0, n2_beta, n2_half if variant.n2 else 0.0)


def _grid(cells: Sequence[CellData], structure: Structure, points: int = RAMP_GRID) -> np.ndarray:
    n = np.array([c.world_size for c in cells], dtype=float)
    s = np.array([c.size_bytes for c in cells], dtype=float)
    _, message, _ = structure.counts(n, s)
    low, high = float(message.min()), float(message.max())
    return np.geomspace(max(low, 1.0), max(high, 1.0), points) if high > low else np.array([max(low, 1.0)])


def fit_terms(structure: Structure, cells: Sequence[CellData], variant: Variant,
              means: np.ndarray | None = None, halves: tuple[float, float] | None = None) -> tuple[Terms, float]:
    """The best terms of one variant and their weighted error. The two shape parameters (ramp_half; n2_half,
    0 = the N=2 penalty at every size) are searched on their grids in turn, twice (coordinate descent),
    unless ``halves`` fixes them (the bootstrap refits)."""
    means = np.array([c.mean for c in cells]) if means is None else means
    weights = np.array([c.weight for c in cells])

    def solve(ramp_half: float, n2_half: float) -> tuple[Terms, float]:
        x, sse = _solve(_columns(structure, cells, variant, ramp_half, n2_half), means, weights)
        return _terms(x, variant, ramp_half, n2_half), sse

    if halves is not None:
        return solve(halves[0] or 1.0, halves[1])
    ramp_grid = _grid(cells, structure) if variant.ramp else np.array([1.0])
    n2_grid = np.concatenate([[0.0], _grid(cells, structure, N2_GRID)]) if variant.n2 else np.array([0.0])
    ramp_half, n2_half = float(ramp_grid[len(ramp_grid) // 2]), 0.0
    best = solve(ramp_half, n2_half)
    for _ in range(2):
        for candidate_half in n2_grid[1:]:
            candidate = solve(ramp_half, float(candidate_half))
            if candidate[1] < best[1]:
                best = candidate
        n2_half = best[0].n2_half_bytes
        for candidate_half in ramp_grid if variant.ramp else ():
            candidate = solve(float(candidate_half), n2_half)
            if candidate[1] < best[1]:
                best = candidate
        ramp_half = best[0].ramp_half_bytes or ramp_half
    return best


def _variant_for(cells: Sequence[CellData], structure: Structure, wanted: Variant) -> Variant:
    """The wanted terms that these cells can carry: the ramp needs MIN_SIZES_FOR_RAMP sizes, the N=2 term N=2 and
    some N>=3 (and an op whose N matters)."""
    ns = {c.world_size for c in cells}
    return Variant(wanted.ramp and _distinct_sizes(cells) >= MIN_SIZES_FOR_RAMP,
                   wanted.n2 and not structure.pairwise and 2 in ns and any(n >= 3 for n in ns))


def _predict(structure: Structure, terms: Terms, cells: Sequence[CellData], n2: bool) -> np.ndarray:
    return terms.time_s(structure, np.array([c.world_size for c in cells]), np.array([c.size_bytes for c in cells]),
                        n2_penalty=n2)


def _distinct_sizes(cells: Sequence[CellData]) -> int:
    return len({c.size_bytes for c in cells})


def _volume_of(cells: Sequence[CellData]) -> dict[float, int]:
    """link bytes -> the D it stands for (the largest of a run of values within SAME_VOLUME of each other)."""
    values = sorted({c.link_bytes for c in cells})
    groups: list[list[float]] = []
    for v in values:
        if groups and v <= groups[-1][0] * SAME_VOLUME:
            groups[-1].append(v)
        else:
            groups.append([v])
    return {v: round(group[-1]) for group in groups for v in group}


def size_axis(cells: Sequence[CellData]) -> str:
    """The axis a sweep held equal across N: "size" (per-rank S) or "volume" (bytes through each link, D for
    all_gather, as diag's equal-D sweeps run): leave-one-size-out leaves one value of it out at every N."""
    sizes = len({c.size_bytes for c in cells})
    volumes = len(set(_volume_of(cells).values()))
    return "volume" if volumes < sizes else "size"


def _key(kind: str, cells: Sequence[CellData]):  # type: ignore[no-untyped-def]
    if kind == "world_size":
        return lambda c: c.world_size
    if kind == "volume":
        volume = _volume_of(cells)
        return lambda c: volume[c.link_bytes]
    return lambda c: c.size_bytes


def held_out(structure: Structure, cells: Sequence[CellData], wanted: Variant, kind: str
             ) -> list[tuple[HeldOut, list[float], list[float]]]:
    """Leave each world size (kind "world_size"), or each size on the sweep's axis ("size", "volume"), out in
    turn and refit the ``wanted`` terms on the rest: (summary, |errors|, weights) per left-out value."""
    key = _key(kind, cells)
    values = sorted({key(c) for c in cells})
    if len(values) < (2 if kind == "world_size" else 3):
        return []
    out = []
    for value in values:
        train = [c for c in cells if key(c) != value]
        test = [c for c in cells if key(c) == value]
        if _distinct_sizes(train) < 2 and len({c.world_size for c in train}) < 2:
            continue
        variant = _variant_for(train, structure, wanted)
        terms, _ = fit_terms(structure, train, variant)
        predicted = _predict(structure, terms, test, variant.n2)
        errors = [abs(p / c.mean - 1.0) for p, c in zip(predicted, test, strict=True)]
        rest = [key(c) for c in train]
        note = ""
        if kind == "world_size" and value == 2 and _variant_for(cells, structure, wanted).n2:
            note = "N=2 left out: its turn-taking term cannot be fitted without N=2 (this is the ring's own time)"
        out.append((HeldOut(kind, int(value), len(test), float(np.median(errors)), float(max(errors)),
                            value < min(rest) or value > max(rest), note),
                    errors, [c.weight for c in test]))
    return out


def _weighted_error(results: list[tuple[HeldOut, list[float], list[float]]]) -> float:
    if not results:
        return math.inf
    errors = np.concatenate([np.square(e) for _, e, _ in results])
    weights = np.concatenate([w for _, _, w in results])
    return float((errors * weights).sum() / weights.sum())


def fit_series(series: str, backend: str, algo: str, op: str, cells: Sequence[CellData],
               notes: Sequence[str] = (), seed: int = 0) -> SeriesModel:
    structure = structure_of(backend, algo, op)
    assert structure is not None
    # Terms beyond alpha and beta are kept only where leaving one size out says they predict better: first the
    # N=2 term, then the ramp (a term the data does not ask for is not fitted).
    axis = size_axis(cells)
    wanted = Variant(ramp=False, n2=False)
    by_size = held_out(structure, cells, wanted, axis)
    for term in ("n2", "ramp"):
        richer = Variant(ramp=wanted.ramp or term == "ramp", n2=wanted.n2 or term == "n2")
        if _variant_for(cells, structure, richer) == _variant_for(cells, structure, wanted):
            continue
        trial = held_out(structure, cells, richer, axis)
        if _weighted_error(trial) <= TERM_CHOICE * _weighted_error(by_size):
            wanted, by_size = richer, trial
    variant = _variant_for(cells, structure, wanted)
    ramp = variant.ramp
    terms, _ = fit_terms(structure, cells, variant)
    predicted = _predict(structure, terms, cells, variant.n2)
    fitted = tuple(Cell(c.world_size, c.size_bytes, int(c.samples.size), c.mean, float(p),
                        tuple(float(q) for q in np.quantile(c.samples / p, RATIO_LEVELS)), c.link_bytes)
                   for c, p in zip(cells, predicted, strict=True))
    errors = np.array([abs(c.error) for c in fitted])
    stated = max(float(np.quantile(errors, STATED_COVERAGE)), STATED_ERROR_FLOOR)

    rng = np.random.default_rng(seed)
    resampled = np.column_stack([c.samples[rng.integers(0, c.samples.size, (BOOTSTRAP_FITS, c.samples.size))]
                                 .mean(axis=1) for c in cells])          # [refit, cell] means
    refits = [fit_terms(structure, cells, variant, means, (terms.ramp_half_bytes, terms.n2_half_bytes))[0]
              for means in resampled]
    intervals: dict[str, tuple[float, float]] = {}
    for name, values in (("alpha_s", [t.alpha_s for t in refits]), ("beta_s_per_byte", [t.beta_s_per_byte for t in refits]),
                         ("ramp_s", [t.ramp_s for t in refits]),
                         ("n2_beta_s_per_byte", [t.n2_beta_s_per_byte for t in refits]),
                         ("n2_turn_share", [t.n2_turn_share for t in refits])):
        low, high = np.quantile(values, [0.025, 0.975])
        intervals[name] = (float(low), float(high))

    heldout = [h for h, _, _ in held_out(structure, cells, wanted, "world_size") + by_size]
    return SeriesModel(series, backend, algo, op, terms, intervals,
                       tuple(tuple(t.vector()) for t in refits[:BOOTSTRAP_KEPT]), fitted, variant.n2, ramp,
                       float(np.median(errors)), stated, tuple(heldout), tuple(notes))


def algo_of(record: Record) -> str:
    """The algorithm a row ran: raw's --algo; diag_tcp carries it as a knob (ring by default)."""
    return str(record.knobs.get("algo") or record.algo) if record.backend == "diag_tcp" else record.algo


def gather(records: Iterable[Record], world_sizes: Sequence[int] | None = None
           ) -> tuple[dict[tuple[str, str], tuple[Record, list[CellData], list[str]]], list[dict[str, str]]]:
    """(series, op) -> (a row of it, its cells, notes); and what cannot be modelled, with why."""
    rows: dict[tuple[str, str], list[Record]] = defaultdict(list)
    for r in records:
        if world_sizes is None or r.world_size in world_sizes:
            rows[(series_label(r), r.op)].append(r)
    out: dict[tuple[str, str], tuple[Record, list[CellData], list[str]]] = {}
    skipped: list[dict[str, str]] = []
    for (series, op), group in sorted(rows.items()):
        first = group[0]
        if structure_of(first.backend, algo_of(first), op) is None:
            skipped.append({"series": series, "op": op, "why": f"no step structure known for {op} over {first.transport} "
                                                                 "(diag/model/structure.py): not modelled"})
            continue
        notes = []
        wrong = [r for r in group if r.nwrong > 0]
        if wrong:
            notes.append(f"{len(wrong)} rows with wrong data left out (N, size: "
                         + ", ".join(f"{r.world_size}, {r.size_bytes}" for r in wrong[:5]) + ")")
        samples: dict[tuple[int, int], list[float]] = defaultdict(list)
        for r in group:
            if r.nwrong <= 0:
                samples[(r.world_size, r.size_bytes)] += [t for t in (r.times_s or [r.time_s]) if t > 0]
        structure = structure_of(first.backend, algo_of(first), op)
        assert structure is not None
        cells = [CellData.of(structure, n, s, times) for (n, s), times in sorted(samples.items()) if times and n >= 2]
        if not cells:
            skipped.append({"series": series, "op": op, "why": "no row with correct data and timed samples"})
            continue
        if len({c.size_bytes for c in cells}) < 2 and len({c.world_size for c in cells}) < 2:
            skipped.append({"series": series, "op": op, "why": "one (N, size) measured: sweep two or more sizes to fit "
                                                               "a latency and a per-byte cost"})
            continue
        out[(series, op)] = (first, cells, notes)
    return out, skipped


def fit(records: Iterable[Record], world_sizes: Sequence[int] | None = None, sources: Sequence[str] = ()) -> Model:
    """One model per series and op; ``world_sizes`` limits the fit to those N (e.g. to predict the others)."""
    groups, skipped = gather(records, world_sizes)
    models = []
    for (series, op), (first, cells, notes) in groups.items():
        model = fit_series(series, first.backend, algo_of(first), op, cells, notes)
        if model.terms.alpha_s <= 0 and model.terms.beta_s_per_byte <= 0 and model.terms.ramp_s <= 0:
            skipped.append({"series": series, "op": op, "why": "the fit found no positive latency or per-byte cost"})
            continue
        models.append(model)
    return Model(tuple(models), tuple(sources), tuple(skipped))

"""Fit every model to one measured sweep (one collective at one world size), score
it in-sample and held-out, and choose the one to predict with.

Held-out error is leave-one-out over the interior sizes: each interior point is
predicted by the model fitted without it (the end points are left in, so nothing
is extrapolated). The chosen model has the lowest held-out GMAE; ties and sweeps too
short to hold anything out (< 3 sizes) fall back to the order of `MODEL_NAMES`
(simplest first) and in-sample GMAE.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from types import ModuleType

import numpy as np

from paraplan.comm import fit_alpha_beta, fit_sigmoid, fit_table
from paraplan.comm.fit_errors import rel_err, summarize
from paraplan.core import busbw_factor

MODELS: dict[str, ModuleType] = {m.NAME: m for m in (fit_alpha_beta, fit_sigmoid, fit_table)}
MODEL_NAMES: tuple[str, ...] = tuple(MODELS)


def predict(model: str, params: dict, size_bytes: np.ndarray) -> np.ndarray:
    """Time in seconds of `model` with `params` at `size_bytes` (vectorised)."""
    return MODELS[model].predict(params, size_bytes)


@dataclass(frozen=True)
class FitEntry:
    """One model fitted to one sweep: an entry of comm_model.json's `fits`."""

    collective: str
    world_size: int
    nodes: int
    model: str
    params: dict
    size_range_bytes: tuple[int, int]
    gmae: float
    heldout_gmae: float
    mean_abs_rel_err: float
    std_abs_rel_err: float
    n_points: int
    chosen: bool = False
    # Not in the JSON: per-point errors for figures and summaries.
    rel_errors: tuple[float, ...] = field(default=(), compare=False, repr=False)
    heldout_rel_errors: tuple[float, ...] = field(default=(), compare=False, repr=False)

    @property
    def tier(self) -> str:
        return "intra" if self.nodes <= 1 else "inter"

    def to_dict(self) -> dict:
        def number(value: float) -> float | None:
            return None if value is None or not math.isfinite(value) else float(value)

        return {
            "collective": self.collective,
            "world_size": int(self.world_size),
            "nodes": int(self.nodes),
            "tier": self.tier,
            "model": self.model,
            "chosen": bool(self.chosen),
            "params": self.params,
            "size_range_bytes": [int(self.size_range_bytes[0]), int(self.size_range_bytes[1])],
            "gmae": number(self.gmae),
            "heldout_gmae": number(self.heldout_gmae),
            "mean_abs_rel_err": number(self.mean_abs_rel_err),
            "std_abs_rel_err": number(self.std_abs_rel_err),
            "n_points": int(self.n_points),
        }


def heldout_errors(model: str, size_bytes: np.ndarray, time_s: np.ndarray, factor: float) -> np.ndarray:
    """Leave-one-out relative errors over the interior points of a sorted sweep."""
    module = MODELS[model]
    n = size_bytes.size
    errors = np.empty(max(n - 2, 0))
    keep = np.ones(n, dtype=bool)
    for i in range(1, n - 1):
        keep[i] = False
        params = module.fit(size_bytes[keep], time_s[keep], factor)
        errors[i - 1] = rel_err(module.predict(params, size_bytes[i : i + 1]), time_s[i : i + 1])[0]
        keep[i] = True
    return errors


def _collapse(size_bytes: np.ndarray, time_s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted by size, one point per size (median time where a size repeats)."""
    sizes, inverse = np.unique(np.asarray(size_bytes, dtype=float), return_inverse=True)
    if sizes.size == inverse.size:
        return sizes, np.asarray(time_s, dtype=float)[np.argsort(size_bytes, kind="stable")]
    times = np.array([np.median(np.asarray(time_s, dtype=float)[inverse == k]) for k in range(sizes.size)])
    return sizes, times


def fit_sweep(
    collective: str, world_size: int, nodes: int, size_bytes: np.ndarray, time_s: np.ndarray
) -> list[FitEntry]:
    """All models fitted to one sweep, exactly one of them `chosen`.

    Needs at least two distinct positive sizes with positive times (raises ValueError).
    """
    sizes, times = _collapse(size_bytes, time_s)
    if sizes.size < 2:
        raise ValueError(f"{collective} n={world_size}: need at least 2 distinct sizes, got {sizes.size}")
    if not (np.all(sizes > 0) and np.all(np.isfinite(times)) and np.all(times > 0)):
        raise ValueError(f"{collective} n={world_size}: sizes and times must be positive and finite")
    factor = busbw_factor(collective, world_size)
    entries = []
    for name, module in MODELS.items():
        params = module.fit(sizes, times, factor)
        errors = rel_err(module.predict(params, sizes), times)
        held = heldout_errors(name, sizes, times, factor)
        summary = summarize(errors)
        entries.append(
            FitEntry(
                collective=collective,
                world_size=int(world_size),
                nodes=int(nodes),
                model=name,
                params=params,
                size_range_bytes=(int(sizes[0]), int(sizes[-1])),
                gmae=summary.gmae,
                heldout_gmae=summarize(held).gmae,
                mean_abs_rel_err=summary.mean_abs_rel_err,
                std_abs_rel_err=summary.std_abs_rel_err,
                n_points=summary.n_points,
                rel_errors=tuple(float(e) for e in errors),
                heldout_rel_errors=tuple(float(e) for e in held),
            )
        )
    best = min(range(len(entries)), key=lambda i: _choice_key(entries[i], i))
    return [replace(e, chosen=(i == best)) for i, e in enumerate(entries)]


def _choice_key(entry: FitEntry, order: int) -> tuple[float, float, int]:
    held = entry.heldout_gmae if math.isfinite(entry.heldout_gmae) else math.inf
    if math.isinf(held):
        # Nothing held out: never pick the interpolating table (exact in-sample by design).
        return (math.inf, entry.gmae if entry.model != "table" else math.inf, order)
    return (round(held, 6), 0.0, order)


def fit_frame(frame) -> list[FitEntry]:
    """Fit every (collective, world size, nodes) sweep of a bench-CSV frame checked by
    `paraplan.comm.fit_input` (the uneven all_to_allv samples are predicted, not fitted:
    `fit_a2av`). Where a sweep has both in-place and out-of-place rows, the out-of-place
    ones are fitted."""
    from paraplan.comm.fit_input import fitted_sweeps

    return [
        entry
        for (collective, world, nodes), rows in fitted_sweeps(frame)
        for entry in fit_sweep(
            collective, world, nodes, rows["size_bytes"].to_numpy(float), rows["time_us"].to_numpy(float) * 1e-6
        )
    ]

"""Fit the device model's efficiency parameters to measured iteration times, and
measure how well the fit predicts runs it has not seen.

The fit minimises the squared log ratio of predicted to measured iteration time
over all runs (relative errors, so a 50 ms and a 2 s run count alike) with
scipy's bounded trust-region least squares. Each parameter stays inside a
physical range (its declaration's fit range, `FIT_BOUNDS`): no GEMM beats 95% of the datasheet peak, no
kernel streams memory faster than 95% of the datasheet bandwidth, a kernel's fixed
cost is 1-10 us. A parameter that ends on a bound is reported as such.

With `layer_factors`, a second step fits one measured layer-time factor per layer
shape with at least `MIN_FACTOR_RUNS` runs (`paraplan.predict.layer_factors`), the
parameters above held at their fit (which never sees factors, so shapes without a
factor are predicted exactly as without the table).

Cross-validation leaves one group out at a time (by default a model shape: the
runs that share hidden size, layers, heads and sequence length), fits on the rest
and predicts the group; the errors reported for a calibration are those
out-of-fold predictions, never the in-sample ones.

Everything that does not depend on the parameters (the runs' kernels,
collectives, layer splits) is built once (`paraplan.predict.build.RunStructure`);
an evaluation prices all kernels in one vectorised call and sums them per pass many
passes at a time (`paraplan.predict.kernel_batch`), prices the plain runs of each
pipeline depth as rows of arrays (`paraplan.predict.price_batch`) and runs the
pipelines of each shape through the engine together (`paraplan.sim.engine_batch`):
byte-identical to pricing and running each run alone, about 10x faster.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import numpy as np

from paraplan.core.errors import ParaplanError
from paraplan.predict.build import KernelBatch, PassSums, RunStructure, kernel_times_by_pass, price
from paraplan.predict.device_model import PARAMETERS, DeviceEfficiency
from paraplan.predict.layer_factors import FACTOR_RANGE, NO_FACTORS, LayerTimeFactors
from paraplan.predict.price_batch import PlainRuns
from paraplan.sim.execution import iteration_times_s

FIT_BOUNDS: dict[str, tuple[float, float, float]] = {
    name: (declared.fit.low, declared.fit.high, declared.fit.scale)
    for name, declared in PARAMETERS.items() if declared.fit is not None}
"""name: (lower, upper, unit scale of the optimiser's variable): the fit range of each
fittable parameter's declaration (`DeviceEfficiency`), in field order."""
DEFAULT_FIT: tuple[str, ...] = tuple(FIT_BOUNDS)
PROFILE_FIT: tuple[str, ...] = tuple(name for name, declared in PARAMETERS.items() if declared.from_profile)
"""What a layer profile determines: its default parameters to fit."""
START = DeviceEfficiency(host_kernel_s=30e-6, host_collective_s=30e-6)


def predict_iteration_s(structures: Sequence[RunStructure], eff: DeviceEfficiency,
                        kernel_s: list[list[np.ndarray]] | None = None,
                        sums: Sequence[PassSums] | None = None) -> np.ndarray:
    """Predicted iteration time of every run; `kernel_s`: their kernels' times when
    already priced with `eff`'s parameters (`kernel_times_by_pass`), `sums` their sums
    per pass (`KernelBatch.priced`)."""
    if kernel_s is None:
        kernel_s = kernel_times_by_pass(list(structures), eff)
    if sums is None:
        return iteration_times_s([price(s, k, eff) for s, k in zip(structures, kernel_s, strict=True)])
    return iteration_times_s([price(s, k, eff, t) for s, k, t in zip(structures, kernel_s, sums, strict=True)])


class Measured(Protocol):
    """What a calibration fits to: measured times and how the device model predicts
    them (`predict(eff, idx)` for the measurements at `idx`)."""

    def __len__(self) -> int: ...

    def predict(self, eff: DeviceEfficiency, idx: np.ndarray) -> np.ndarray: ...


@dataclass(frozen=True, eq=False)
class IterationTimes:
    """Measured iteration times of whole runs (a run table)."""

    structures: tuple[RunStructure, ...]
    batches: dict[bytes, tuple[KernelBatch, PlainRuns]] = field(default_factory=dict, repr=False)
    """The merged kernels and plain runs of each subset predicted so far (a fit asks the
    same subsets at every evaluation; `KernelBatch`, `paraplan.predict.price_batch`)."""

    def __len__(self) -> int:
        return len(self.structures)

    def predict(self, eff: DeviceEfficiency, idx: np.ndarray) -> np.ndarray:
        runs = [self.structures[int(i)] for i in idx]
        key = np.asarray(idx, dtype=np.int64).tobytes()
        if key not in self.batches:
            self.batches[key] = (KernelBatch.of(runs), PlainRuns.of(runs))
        kernels, plain = self.batches[key]
        return plain.iteration_s(eff, *kernels.priced(eff))

    def layer_keys(self) -> tuple[str, ...]:
        return tuple(st.layer_key for st in self.structures)


def as_measured(data: Measured | Sequence[RunStructure]) -> Measured:
    return data if hasattr(data, "predict") else IterationTimes(tuple(data))


@dataclass(frozen=True)
class FitResult:
    efficiency: DeviceEfficiency
    fitted: tuple[str, ...]
    at_bound: tuple[str, ...]  # fitted parameters that ended on a bound
    evaluations: int


def fit_efficiency(data: Measured | Sequence[RunStructure], measured_s: np.ndarray,
                   fitted: Sequence[str] = DEFAULT_FIT, start: DeviceEfficiency = START,
                   max_evaluations: int = 400, idx: np.ndarray | None = None) -> FitResult:
    """The parameters `fitted` that minimise the squared log error over the
    measurements `idx` (default: all; see the module doc)."""
    from scipy.optimize import least_squares

    unknown = [n for n in fitted if n not in FIT_BOUNDS]
    if unknown:
        raise ParaplanError(f"cannot fit '{unknown[0]}'; fittable: {', '.join(FIT_BOUNDS)}")
    data = as_measured(data)
    measured_s = np.asarray(measured_s, dtype=float)
    if len(data) != measured_s.shape[0] or not len(data):
        raise ParaplanError("calibration needs at least one measured time")
    idx = np.arange(len(data)) if idx is None else np.asarray(idx)
    names = tuple(fitted)
    scale = np.array([FIT_BOUNDS[n][2] for n in names])
    lower = np.array([FIT_BOUNDS[n][0] for n in names]) / scale
    upper = np.array([FIT_BOUNDS[n][1] for n in names]) / scale
    x0 = np.clip(np.array([getattr(start, n) for n in names]) / scale, lower, upper)
    log_measured = np.log(measured_s[idx])

    def efficiency(x: np.ndarray) -> DeviceEfficiency:
        values: dict[str, Any] = {n: float(v) for n, v in zip(names, x * scale, strict=True)}
        return replace(start, **values)

    def residuals(x: np.ndarray) -> np.ndarray:
        return np.log(data.predict(efficiency(x), idx)) - log_measured

    # relative changes below 1e-5 of a run's predicted time are noise to a calibration
    result = least_squares(residuals, x0, bounds=(lower, upper), x_scale="jac", diff_step=1e-3,
                           max_nfev=max_evaluations, ftol=1e-5, xtol=1e-5, gtol=1e-5)
    span = upper - lower
    at_bound = tuple(n for n, x, lo, s in zip(names, result.x, lower, span, strict=True)
                     if min(x - lo, lo + s - x) <= 1e-6 * max(s, 1e-12))
    return FitResult(efficiency(result.x), names, at_bound, int(result.nfev))


MIN_FACTOR_RUNS = 3
"""Runs a layer shape needs before it gets a measured factor."""
FACTOR_PRIOR_RUNS = 1.0
"""The factor fit's pull towards 1 (no correction): as strong as this many runs it
predicts exactly."""


def fit_layer_factors(data: IterationTimes, measured_s: np.ndarray, efficiency: DeviceEfficiency,
                      idx: np.ndarray | None = None) -> LayerTimeFactors:
    """One factor per layer shape of the measurements `idx` (default: all): the one
    that minimises that shape's squared log errors (plus the prior), the device
    parameters held at `efficiency` (its own factors ignored)."""
    from scipy.optimize import minimize_scalar

    measured_s = np.asarray(measured_s, dtype=float)
    idx = np.arange(len(data)) if idx is None else np.asarray(idx)
    keys = np.asarray(data.layer_keys(), dtype=object)
    base = replace(efficiency, layer_time_factors=NO_FACTORS)
    lo, hi = np.log(FACTOR_RANGE[0]), np.log(FACTOR_RANGE[1])
    found: list[tuple[str, float, int]] = []
    for key in sorted(set(keys[idx].tolist())):
        members = idx[keys[idx] == key]
        if members.size < MIN_FACTOR_RUNS:
            continue
        log_measured = np.log(measured_s[members])
        runs = [data.structures[int(i)] for i in members]
        kernel_s = kernel_times_by_pass(runs, base)  # a factor scales pass times: priced once

        def loss(u: float, key: str = key, runs: list[RunStructure] = runs, kernel_s: list = kernel_s,
                 log_measured: np.ndarray = log_measured) -> float:
            table = LayerTimeFactors((key,), (float(np.exp(u)),), (len(runs),))
            r = np.log(predict_iteration_s(runs, replace(base, layer_time_factors=table), kernel_s)) - log_measured
            return float(r @ r + FACTOR_PRIOR_RUNS * u * u)

        best = minimize_scalar(loss, bounds=(lo, hi), method="bounded", options={"xatol": 1e-4})
        factor = float(np.clip(np.exp(best.x), *FACTOR_RANGE))
        found.append((key, factor, int(members.size)))
    return LayerTimeFactors(tuple(k for k, _, _ in found), tuple(f for _, f, _ in found),
                            tuple(n for _, _, n in found))


def fit_with_factors(data: Measured, measured_s: np.ndarray, fitted: Sequence[str] = DEFAULT_FIT,
                     start: DeviceEfficiency = START, idx: np.ndarray | None = None,
                     layer_factors: bool = True) -> FitResult:
    """`fit_efficiency` (without factors), then, for measured iterations and
    `layer_factors`, `fit_layer_factors` on the same measurements."""
    fit = fit_efficiency(data, measured_s, fitted, replace(start, layer_time_factors=NO_FACTORS), idx=idx)
    if not layer_factors or not isinstance(data, IterationTimes):
        return fit
    table = fit_layer_factors(data, measured_s, fit.efficiency, idx)
    return replace(fit, efficiency=replace(fit.efficiency, layer_time_factors=table))


@dataclass(frozen=True)
class CrossValidation:
    """Out-of-fold predictions: each group predicted by a fit on the other groups."""

    predicted_s: np.ndarray
    group_of_run: np.ndarray  # index into `groups`
    groups: tuple[str, ...]
    fits: tuple[DeviceEfficiency, ...]  # per group (fitted without it)


def cross_validate(data: Measured | Sequence[RunStructure], measured_s: np.ndarray, group_labels: Sequence[str],
                   fitted: Sequence[str] = DEFAULT_FIT, start: DeviceEfficiency = START,
                   progress: Callable[[str], None] | None = None, layer_factors: bool = False) -> CrossValidation:
    """Leave-one-group-out predictions (see the module doc); each fold starts from
    `start` (pass the all-data fit to converge in fewer evaluations) and, with
    `layer_factors`, fits its factors on its own training runs only."""
    data = as_measured(data)
    labels = np.asarray(list(group_labels))
    groups = tuple(dict.fromkeys(labels.tolist()))
    if len(groups) < 2:
        raise ParaplanError(f"cross-validation needs at least 2 groups of runs, got {len(groups)}")
    measured_s = np.asarray(measured_s, dtype=float)
    predicted = np.zeros(measured_s.shape[0])
    group_of = np.array([groups.index(g) for g in labels.tolist()])
    fits = []
    for i, group in enumerate(groups):
        test = np.flatnonzero(group_of == i)
        train = np.flatnonzero(group_of != i)
        fit = fit_with_factors(data, measured_s, fitted, start, idx=train, layer_factors=layer_factors)
        predicted[test] = data.predict(fit.efficiency, test)
        fits.append(fit.efficiency)
        if progress:
            err = np.abs(predicted[test] / measured_s[test] - 1).mean()
            progress(f"fold {i + 1}/{len(groups)} ({group}): MAPE {err:.1%}")
    return CrossValidation(predicted, group_of, groups, tuple(fits))


@dataclass(frozen=True)
class ErrorSummary:
    """Errors of predicted vs measured times (fractions: 0.05 = 5%)."""

    mape: float
    median_ape: float
    max_ape: float
    mean_error: float  # signed: > 0 predicts too slow
    spearman: float
    n: int

    @staticmethod
    def of(predicted: np.ndarray, measured: np.ndarray) -> ErrorSummary:
        from paraplan.predict.rank_correlation import spearman  # scipy.stats' number, without its import

        rel = np.asarray(predicted, float) / np.asarray(measured, float) - 1.0
        ape = np.abs(rel)
        rho = spearman(predicted, measured) if rel.size > 1 else float("nan")
        return ErrorSummary(float(ape.mean()), float(np.median(ape)), float(ape.max()), float(rel.mean()),
                            rho, int(rel.size))

    def as_dict(self) -> dict[str, float | None]:
        """The fields; a Spearman correlation that does not exist (one run, or every
        prediction equal) is None, as JSON has no NaN."""
        return {"mape": self.mape, "median_ape": self.median_ape, "max_ape": self.max_ape,
                "mean_error": self.mean_error, "spearman": self.spearman if math.isfinite(self.spearman) else None,
                "n": self.n}

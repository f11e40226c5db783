"""One whole calibration as a pure call: `calibrate(request, data)` fits the device
model to measured times (`paraplan.predict.calibrate`), cross-validates it, ranks
its predictions and returns a `CalibrationReport`: the calibration to write, the
errors as records, and the predictions behind them. `paraplan calibrate` reads the
measurements into a `CalibrationData`, calls it and writes what it returns."""

from __future__ import annotations

import platform
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from paraplan.predict import calibrate as cal
from paraplan.predict.calibration import Calibration
from paraplan.predict.ranking import RankingSummary, ranking_summary

NO_RANKING = ("no question has >= 2 runs (a question: one model, GPU count and global batch size; its runs "
              "differ in parallel settings only)")


@dataclass(frozen=True, eq=False)
class CalibrationData:
    """Measurements from either source (a run table or a layer profile), in the shape
    the fit and the reports need."""

    measured: cal.Measured
    seconds: np.ndarray
    groups: tuple[str, ...]
    """Cross-validation group of each measurement."""
    questions: tuple[str, ...] | None
    """Ranking question of each measurement (run tables only)."""
    tp: np.ndarray
    pp: np.ndarray
    kind: str
    """"runs" or "profile": the key of the data's path in the calibration file."""
    group_scheme: str
    default_fit: tuple[str, ...]


@dataclass(frozen=True)
class CalibrationSource:
    """Where the measurements came from, as the calibration file's `data` records it."""

    path: str
    sha256: str
    cluster: str
    comm_model: str | None
    kernel_ceilings: str | None
    """The kernel fit the GEMM and attention parameters were held at (None: none)."""


@dataclass(frozen=True)
class CalibrationRequest:
    """What to fit: the calibration's name and device, the parameters to fit, those
    held at a kernel fit, the intra-node communication fit, and the options."""

    name: str
    device: str
    fitted: tuple[str, ...]
    held: Mapping[str, float]
    intra_node_comm: Mapping | None
    source: CalibrationSource
    layer_factors: bool
    cross_validation: bool


@dataclass(frozen=True)
class CrossValidatedErrors:
    errors: cal.ErrorSummary
    scheme: str
    per_group_mape: Mapping[str, float]

    def as_dict(self) -> dict[str, object]:
        return {**self.errors.as_dict(), "scheme": self.scheme, "groups": len(self.per_group_mape),
                "per_group_mape": dict(self.per_group_mape)}


@dataclass(frozen=True)
class Ranking:
    """How well the predictions rank the runs of each question; `predictions` names
    the predictions ranked ("cross_validated" or "in_sample")."""

    summary: RankingSummary
    predictions: str

    def as_dict(self) -> dict[str, object]:
        if self.summary.groups == 0:
            return {"questions": 0, "measured_fastest_in_top_k": None, "predicted_fastest_within_5pct": None,
                    "why": NO_RANKING}
        return {"questions": self.summary.groups, "top_k": self.summary.top_k,
                "measured_fastest_in_top_k": self.summary.hit_fraction,
                "predicted_fastest_within_5pct": self.summary.pick_fraction, "predictions": self.predictions}


@dataclass(frozen=True)
class CalibrationErrors:
    in_sample: cal.ErrorSummary
    cross_validated: CrossValidatedErrors | None
    ranking: Ranking | None
    """None for a profile (no questions)."""

    def as_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"in_sample": self.in_sample.as_dict()}
        if self.cross_validated is not None:
            out["cross_validated"] = self.cross_validated.as_dict()
        if self.ranking is not None:
            out["ranking"] = self.ranking.as_dict()
        return out


@dataclass(frozen=True, eq=False)
class CalibrationReport:
    calibration: Calibration
    errors: CalibrationErrors
    measured_s: np.ndarray
    insample_s: np.ndarray
    cv_predicted_s: np.ndarray | None
    """Each measurement predicted by the fit that did not see its group (None: no
    cross-validation)."""
    group_scheme: str

    @property
    def honest_s(self) -> np.ndarray:
        """The predictions a reader should judge: cross-validated when there are some."""
        return self.cv_predicted_s if self.cv_predicted_s is not None else self.insample_s

    @property
    def honest_kind(self) -> str:
        return f"cross-validated ({self.group_scheme})" if self.cv_predicted_s is not None else "in-sample"

    @property
    def metrics(self) -> dict[str, float]:
        """Errors (`insample_*`, `cv_*`), ranking fractions and fitted parameters (`param_*`)."""
        out = _error_metrics("insample", self.errors.in_sample)
        if self.errors.cross_validated is not None:
            out.update(_error_metrics("cv", self.errors.cross_validated.errors))
        ranking = self.errors.ranking
        if ranking is not None and ranking.summary.groups:
            out.update(top3_fraction=ranking.summary.hit_fraction,
                       pick_within_5pct_fraction=ranking.summary.pick_fraction)
        out.update({f"param_{k}": v for k, v in self.calibration.efficiency.as_dict().items()})
        return out


def _error_metrics(prefix: str, errors: cal.ErrorSummary) -> dict[str, float]:
    return {f"{prefix}_{k}": float(v) for k, v in errors.as_dict().items() if k != "n" and v is not None}


def calibrate(request: CalibrationRequest, data: CalibrationData,
              progress: Callable[[str], None] | None = None) -> CalibrationReport:
    """Fit `request.fitted` to `data` (the rest at `cal.START`, or held), then
    cross-validate and rank (see the module doc); `progress` hears each step."""
    say = progress or (lambda _: None)
    started = time.perf_counter()
    measured, fitted = data.seconds, request.fitted
    held: dict[str, Any] = dict(request.held)
    start = replace(cal.START, **held) if held else cal.START
    factors = data.kind == "runs" and request.layer_factors
    say(f"fitting {len(fitted)} parameter(s) to {len(measured)} measured time(s) ...")
    fit = cal.fit_with_factors(data.measured, measured, fitted, start=start, layer_factors=factors)
    insample = data.measured.predict(fit.efficiency, np.arange(len(data.measured)))
    in_errors = cal.ErrorSummary.of(insample, measured)
    say(f"in-sample MAPE {in_errors.mape:.2%} ({fit.evaluations} evaluations, {time.perf_counter() - started:.0f} s)"
        + (f"; at a bound: {', '.join(fit.at_bound)}" if fit.at_bound else "")
        + (f"; {len(fit.efficiency.layer_time_factors)} layer shape(s) with a measured factor" if factors else ""))
    cv_pred, cv_errors = None, None
    if request.cross_validation and len(set(data.groups)) >= 2:
        cv_pred, cv_errors = _cross_validated(data, fitted, fit.efficiency, factors, say)
    elif request.cross_validation:
        say("one group only: no cross-validation")
    ranking = None
    if data.questions is not None:
        ranking = Ranking(ranking_summary(data.questions, cv_pred if cv_pred is not None else insample, measured),
                          "cross_validated" if cv_pred is not None else "in_sample")
        say(_ranking_line(ranking.summary))
    errors = CalibrationErrors(in_errors, cv_errors, ranking)
    calibration = Calibration(
        name=request.name, device=request.device, efficiency=fit.efficiency, fitted=fit.fitted,
        at_bound=fit.at_bound, intra_node_comm=request.intra_node_comm,
        data=_data_record(request.source, data.kind, len(measured)), errors=errors.as_dict(),
        assumptions={"bounds": {k: [lo, hi] for k, (lo, hi, _) in cal.FIT_BOUNDS.items() if k in fitted},
                     "not_fitted": {k: v for k, v in fit.efficiency.as_dict().items() if k not in fitted},
                     **({"held_at_kernel_fit": dict(request.held)} if request.held else {})},
    )
    return CalibrationReport(calibration, errors, measured, insample, cv_pred, data.group_scheme)


def _cross_validated(data: CalibrationData, fitted: tuple[str, ...], start: cal.DeviceEfficiency, factors: bool,
                     say: Callable[[str], None]) -> tuple[np.ndarray, CrossValidatedErrors]:
    measured = data.seconds
    cv = cal.cross_validate(data.measured, measured, data.groups, fitted, start, progress=say, layer_factors=factors)
    predicted = cv.predicted_s
    per_group = {g: float(np.abs(predicted[cv.group_of_run == i] / measured[cv.group_of_run == i] - 1).mean())
                 for i, g in enumerate(cv.groups)}
    errors = cal.ErrorSummary.of(predicted, measured)
    say(f"cross-validated MAPE {errors.mape:.2%} (median {errors.median_ape:.2%}, max {errors.max_ape:.2%}) over "
        f"{len(cv.groups)} groups")
    return predicted, CrossValidatedErrors(errors, data.group_scheme, per_group)


def _ranking_line(summary: RankingSummary) -> str:
    if summary.groups == 0:  # a ranking needs a question (same model, GPUs and global batch) asked of two runs
        return f"warning: no ranking metrics: {NO_RANKING}"
    return (f"the measured-fastest configuration is in the predicted top {summary.top_k} for {summary.hits}/"
            f"{summary.groups} questions ({summary.hit_fraction:.0%}); the predicted-fastest is within 5% of it "
            f"for {summary.pick_fraction:.0%}")


def _data_record(source: CalibrationSource, kind: str, measurements: int) -> dict[str, object]:
    import paraplan

    return {kind: source.path, "sha256": source.sha256, "measurements": measurements, "cluster": source.cluster,
            "comm_model": source.comm_model,
            **({"kernel_ceilings": source.kernel_ceilings} if source.kernel_ceilings else {}),
            "paraplan_version": paraplan.__version__, "python": platform.python_version()}


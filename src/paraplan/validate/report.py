"""A validation around its one impure step, the real run: `plan_validation` says what
to run and how to predict it (and predicts it without corrections, which fails early
on bad input); `paraplan.validate.runner.run_strategies` runs it; `validation_report`
compares what it measured with the corrected prediction (pure) and returns a
`ValidationReport`: the validation table, the notes printed beside it and what the
CLI logs."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from paraplan.core import Cluster, CommModel, Group, ModelProfile
from paraplan.validate.compare import Measurement, strategy_metrics, validation_metrics, validation_table
from paraplan.validate.load import LoadCheck
from paraplan.validate.predict import PredictionSetup, predict_step_times

if TYPE_CHECKING:
    import pandas as pd

    from paraplan.validate.runner import RunConfig, RunResult
    from paraplan.validate.workload import WorkloadSpec


@dataclass(frozen=True)
class ValidationOptions:
    """How to run: the command's options."""

    strategies: tuple[str, ...]
    global_batch_size: int
    num_microbatches: int
    steps: int
    warmup: int
    threads_per_rank: int
    backend: str
    timeout_s: float


@dataclass(frozen=True, eq=False)
class ValidationPlan:
    run: RunConfig
    setup: PredictionSetup
    """The prediction with its corrections (before the run's all-reduce probes)."""
    uncorrected: Mapping[str, float]
    """Each strategy's step time predicted without corrections."""
    saturated: bool
    """gloo ranks fill every core: no overlap predicted."""
    cores: int


def plan_validation(profile: ModelProfile, spec: WorkloadSpec, layers: Sequence[Any], options: ValidationOptions,
                    cluster: Cluster, comm: CommModel, cores: int) -> ValidationPlan:
    """The run of `options` on the model `spec` builds (`layers`, torch modules) and
    its predictions from `profile` (the pipeline cut where the profile balances it)."""
    from paraplan.validate.pipeline import balanced_boundary
    from paraplan.validate.runner import RunConfig
    from paraplan.validate.tensor_parallel import tp_allreduce_counts, tp_split_layers

    batch, microbatches = options.global_batch_size, options.num_microbatches
    micro = batch / microbatches
    cut = balanced_boundary(list(profile.fwd_s_at(micro) + profile.bwd_s_at(micro)))
    saturated = options.backend == "gloo" and options.threads_per_rank * 2 >= cores
    tp_counts = tp_allreduce_counts(layers)
    acts = profile.activation_bytes_at(batch)
    probe_bytes = tuple(sorted({round(float(a)) for a, c in zip(acts, tp_counts, strict=True) if c > 0})) \
        if "tp2" in options.strategies else ()
    run = RunConfig(spec, options.strategies, global_batch_size=batch, num_microbatches=microbatches,
                    steps=options.steps, warmup=options.warmup, threads_per_rank=options.threads_per_rank,
                    pipeline_boundary=cut, backend=options.backend, timeout_s=options.timeout_s,
                    allreduce_probe_bytes=probe_bytes)
    setup = PredictionSetup(batch, microbatches, cut, tuple(tp_counts), comm_uses_compute_cores=saturated,
                            tp_split=tuple(tp_split_layers(layers)), tp_splits_fixed_time=options.backend == "gloo",
                            pipeline_accumulation=True)
    plain = PredictionSetup(batch, microbatches, cut, setup.tp_allreduces)
    uncorrected = predict_step_times(profile, cluster, comm, options.strategies, plain)
    return ValidationPlan(run, setup, uncorrected, saturated, cores)


@dataclass(frozen=True, eq=False)
class ValidationReport:
    table: pd.DataFrame
    """The validation CSV (`paraplan.validate.compare.COLUMNS`)."""
    setup: PredictionSetup
    """The prediction's setup, with the measured all-reduce times."""
    measured: Mapping[str, Measurement]
    uncorrected: Mapping[str, float]
    extra: Mapping[str, float]
    """Further metrics; a name ending in `__<strategy>` belongs to that strategy."""
    notes: tuple[str, ...]
    """What the run showed beside the table (all-reduces, contention, drift)."""
    load: LoadCheck

    def table_lines(self) -> list[str]:
        """The table as printed: measured, corrected and uncorrected predictions."""
        lines = [f"{'strategy':<12}{'measured ms':>12}{'p10':>9}{'p90':>9}{'predicted ms':>14}{'rel_err':>9}"
                 f"{'uncorrected ms':>16}{'rel_err':>9}"]
        for row in self.table.itertuples(index=False):
            raw = self.uncorrected[row.strategy]
            lines.append(f"{row.strategy:<12}{row.measured_s * 1e3:12.2f}{row.measured_p10_s * 1e3:9.2f}"
                         f"{row.measured_p90_s * 1e3:9.2f}{row.predicted_s * 1e3:14.2f}{row.rel_err:+9.1%}"
                         f"{raw * 1e3:16.2f}{raw / row.measured_s - 1:+9.1%}")
        return lines

    def metrics(self) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
        """The run's metrics, and per strategy the same metric names (one table row each)."""
        per_strategy = strategy_metrics(self.table)
        for strategy, raw in self.uncorrected.items():
            per_strategy[strategy]["predicted_uncorrected_s"] = raw
            per_strategy[strategy]["rel_err_uncorrected"] = raw / self.measured[strategy].median_s - 1
        metrics = validation_metrics(self.table)
        for key, value in self.extra.items():
            base, _, strategy = key.rpartition("__")
            if strategy in per_strategy:
                per_strategy[strategy][base] = value
            else:
                metrics[key] = value
        return metrics, per_strategy


def validation_report(profile: ModelProfile, cluster: Cluster, comm: CommModel, plan: ValidationPlan,
                      result: RunResult, load: LoadCheck) -> ValidationReport:
    """Compare the run's `result` with the corrected prediction (the measured contention
    and, for tp2, the measured all-reduce times); the profile rescaled to the run's own
    compute speed is a diagnostic only."""
    setup, notes, extra = plan.setup, [], dict[str, float]()
    strategies = plan.run.strategies
    if result.allreduce_s:
        setup = replace(setup, tp_allreduce_s=tuple(
            (float(nb), statistics.fmean(times)) for nb, times in sorted(result.allreduce_s.items())))
        for nb, times in sorted(result.allreduce_s.items()):
            fit = float(comm.time_s("all_reduce", nb, Group(2, 1)))
            notes.append(f"all_reduce of {nb} B (tp2's activations), {len(times)} calls: mean "
                         f"{statistics.fmean(times) * 1e3:.2f} ms, median {statistics.median(times) * 1e3:.2f} ms "
                         f"(the fit says {fit * 1e3:.2f} ms): tp2 charged the mean")
            extra[f"allreduce_mean_s__{nb}"] = statistics.fmean(times)
            extra[f"allreduce_median_s__{nb}"] = statistics.median(times)
    predicted = predict_step_times(profile, cluster, comm, strategies, setup, result.contention_factor)
    if "tp2" in predicted and setup.tp_allreduce_s and result.together_drift_s > 0:
        _waiting_diagnostic(profile, cluster, comm, setup, result, notes, extra)
    if plan.saturated:
        notes.append(f"gloo ranks fill all {plan.cores} cores: dp_overlap predicted without overlap")
    half = setup.global_batch_size / 2
    profiled_s = float(profile.fwd_s_at(half).sum() + profile.bwd_s_at(half).sum())
    drift = statistics.median(result.alone_s) / profiled_s
    notes.append(f"contention: whole-model forward+backward at batch {half:g} alone {_ms(result.alone_s)} ms, "
                 f"all ranks at once {_ms(result.together_s)} ms: compute x {result.contention_factor:.3f} "
                 f"(the profile says {profiled_s * 1e3:.2f} ms alone: drift x {drift:.3f}, not corrected)")
    extra |= {"load_before_1m": load.load_before_1m, "load_after_1m": load.load_after_1m,
              "other_load_per_core": load.other_load_per_core, "machine_busy": float(load.busy)}
    sum_vs_whole = profile.meta.get("sum_vs_whole_rel_err")
    if isinstance(sum_vs_whole, int | float):
        extra["profile_sum_vs_whole_rel_err"] = float(sum_vs_whole)
    extra |= {"contention_factor": result.contention_factor, "profile_drift": drift,
              "calibration_alone_s": statistics.median(result.alone_s),
              "calibration_together_s": statistics.median(result.together_s)}
    # diagnostic only: the profile rescaled to the run's own compute speed, which
    # separates a stale profile (machine load when it was taken) from the model's error
    rescaled = predict_step_times(profile, cluster, comm, strategies, setup, result.contention_factor,
                                  profile_drift=drift)
    for strategy, value in rescaled.items():
        extra[f"predicted_rescaled_s__{strategy}"] = value
        extra[f"rel_err_rescaled__{strategy}"] = value / result.measured[strategy].median_s - 1
    notes.append("profile rescaled by the drift (diagnostic): "
                 + ", ".join(f"{k} {v * 1e3:.2f} ms ({extra[f'rel_err_rescaled__{k}']:+.1%})"
                             for k, v in rescaled.items()))
    table = validation_table(result.measured, predicted, load.other_load_per_core)
    return ValidationReport(table, setup, result.measured, plan.uncorrected, extra, tuple(notes), load)


def _waiting_diagnostic(profile: ModelProfile, cluster: Cluster, comm: CommModel, setup: PredictionSetup,
                        result: RunResult, notes: list[str], extra: dict[str, float]) -> None:
    """tp2 with its ranks' waiting for each other at every blocking all-reduce
    (`predict.skew_s`, from the run's contention pass) added to each all-reduce's
    measured time: printed and logged beside the prediction, not in it (the closed
    form assumes independent drift per segment; on the loaded machine it came to
    0.5-1.7x the waiting measured, docs/validation-load.md)."""
    from paraplan.validate.predict import skew_s, tp_backward_allreduces

    calls = sum(setup.tp_allreduces) + sum(tp_backward_allreduces(setup))
    waiting = skew_s(calls, result.together_drift_s)
    if calls <= 0 or waiting <= 0:
        return
    waited = replace(setup, tp_allreduce_s=tuple((nb, t + waiting / calls) for nb, t in setup.tp_allreduce_s))
    tp2 = predict_step_times(profile, cluster, comm, ("tp2",), waited, result.contention_factor)["tp2"]
    measured = result.measured["tp2"].median_s
    extra |= {"together_drift_s": result.together_drift_s, "tp_waiting_s": waiting,
              "predicted_waiting_s__tp2": tp2, "rel_err_waiting__tp2": tp2 / measured - 1}
    notes.append(f"ranks doing the same work at once end {result.together_drift_s * 1e3:.2f} ms apart (mean): with "
                 f"{waiting * 1e3:.2f} ms of waiting over its {calls:g} blocking all-reduces tp2 would take "
                 f"{tp2 * 1e3:.2f} ms ({tp2 / measured - 1:+.1%}; a diagnostic, not in the prediction)")


def _ms(values: Sequence[float]) -> str:
    return "/".join(f"{v * 1e3:.2f}" for v in values)

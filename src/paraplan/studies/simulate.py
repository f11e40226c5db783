"""Run a simulation study (`config/studies/simulate/<name>.yaml`): expand its series
into `Strategy`s, simulate each in the requested modes and return the rows of
`results.csv` (docs/design.md) with the simulation's wall time.

Modes:
- `distir-v0.1`: DistIR's own semantics and cost model (`sim/distir_compat.py`), to
  reproduce the DistIR paper's published figures.
- `corrected`: paraplan's physical engine (`paraplan.sim.simulate`) on the same MLP
  with physical costs (4 bytes per element, bandwidth in bits per second).

A `unit` model runs bare pipelines with unit costs (`paraplan.sim.simulate_pipeline`,
the reference charts of docs/pipeline-schedules.md).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from paraplan.core import (
    Cluster,
    ConfigError,
    ConstantBandwidthModel,
    Device,
    Link,
    ModelProfile,
    Strategy,
    StrategyError,
    Timeline,
)
from paraplan.core.limits import (
    DEVICES_WHY,
    MAX_DEVICES,
    MAX_NUM_MICROBATCHES,
    MAX_SIMULATED_OPS,
    MICROBATCHES_WHY,
)
from paraplan.sim import distir_compat as dc
from paraplan.sim.strategy_sim import RunConditions
from paraplan.studies.simulate_study import (
    CompatMode,
    CorrectedMode,
    ModeName,
    Series,
    SimulateStudy,
)
from paraplan.typed import Source, load_yaml

RESULT_COLUMNS: tuple[str, ...] = (
    "experiment", "mode", "series", "D", "T", "P", "microbatches", "schedule", "batch_size",
    "devices", "step_time_s", "throughput", "speedup", "bubble_fraction", "peak_mem_bytes",
)
BITS_PER_BYTE = 8
GBIT = 1e9
# Best of this many runs when one run of the whole study is cheap.
TIMING_REPEATS = 5
CHEAP_RUN_S = 2.0


MAX_CONFIGURATIONS = 100_000
"""Configurations one study may simulate (DistIR's Figure 4 grid has 111)."""
MAX_STUDY_OPS = 4 * MAX_SIMULATED_OPS
"""Pipeline operations of a whole study (one run of each mode): a few minutes at most."""


def load_study(path: str | Path) -> SimulateStudy:
    """A simulation study file (`paraplan.config_files.find_study` finds one by name),
    checked to be simulable in bounded time (`study_work_problem`)."""
    study = load_yaml(SimulateStudy, path, "a simulation study (config/studies/simulate/*.yaml)")
    problem = study_work_problem(study)
    if problem is not None:
        index, message = problem
        raise Source.file(path).error(("series", index) if index is not None else (), message)
    return study


def configuration_ops(strategy: Strategy) -> int:
    """Pipeline operations one simulation of `strategy` executes: forward, backward and
    weight-gradient ops per stage, micro-batch, model chunk and iteration."""
    s = strategy
    return (3 * s.pipeline_model_parallel_size * s.num_microbatches * s.virtual_pipeline_model_parallel_size
            * s.iterations)


def study_work_problem(study: SimulateStudy) -> tuple[int | None, str] | None:
    """Why `study` cannot be simulated in bounded time, as (series index or None, message);
    None when it can. Checked before anything is expanded: at most `MAX_CONFIGURATIONS`
    configurations, `MAX_NUM_MICROBATCHES` micro-batches and `MAX_SIMULATED_OPS`
    operations per configuration, `MAX_STUDY_OPS` in all."""
    total_configurations = 0
    for i, series in enumerate(study.series):
        micro = 20 if isinstance(series.num_microbatches, str) else len(series.num_microbatches)
        grid = 21 * 21 if series.parallelism == "grid" else 1  # D x T over powers of two up to 2^20
        upper = len(series.global_batch_sizes) * len(series.iterations) * len(series.devices) * micro * grid
        if upper > MAX_CONFIGURATIONS:
            return i, (f"series '{series.name}' sweeps up to {upper:,} configurations; expected at most "
                       f"{MAX_CONFIGURATIONS:,} per study")
        total_configurations += upper
    if total_configurations > MAX_CONFIGURATIONS:
        return None, f"up to {total_configurations:,} configurations; expected at most {MAX_CONFIGURATIONS:,}"
    total_ops = 0
    for i, series in enumerate(study.series):
        try:
            configurations = expand(series)
        except ConfigError as exc:
            return i, exc.reason
        except StrategyError as exc:
            return i, str(exc)
        for conf in configurations:
            s = conf.strategy
            where = (f"series '{series.name}' at global batch {conf.global_batch_size:,} on "
                     f"{s.num_devices:,} devices")
            if s.num_microbatches > MAX_NUM_MICROBATCHES:
                return i, (f"{where} has {s.num_microbatches:,} micro-batches; expected at most "
                           f"{MAX_NUM_MICROBATCHES:,}: {MICROBATCHES_WHY}")
            if s.num_devices > MAX_DEVICES:
                return i, f"{where}: expected at most {MAX_DEVICES:,} devices: {DEVICES_WHY}"
            ops = configuration_ops(s)
            if ops > MAX_SIMULATED_OPS:
                return i, (f"{where} is {ops:,} pipeline operations (3 x stages x micro-batches x chunks x "
                           f"iterations); expected at most {MAX_SIMULATED_OPS:,} per configuration")
            total_ops += ops * len(study.modes.names)
    if total_ops > MAX_STUDY_OPS:
        return None, f"{total_ops:,} pipeline operations in all; expected at most {MAX_STUDY_OPS:,} per study"
    return None


# ---------------------------------------------------------------- the sweep


@dataclass(frozen=True)
class Configuration:
    """One configuration of a series: the strategy and the global batch it runs."""

    series: str
    strategy: Strategy
    global_batch_size: int


def _power_of_two(n: int) -> bool:
    return n >= 1 and n & (n - 1) == 0


def expand(series: Series) -> list[Configuration]:
    """The configurations of a series, in figure order (schedules and gradient sync are
    the mode's business: `_for_mode` sets them)."""
    out = []
    for batch in series.global_batch_sizes:
        for iterations in series.iterations:
            for n in series.devices:
                for d, t, p, m in _degrees(series, batch, n):
                    strategy = Strategy(data_parallel_size=d, tensor_model_parallel_size=t,
                                        pipeline_model_parallel_size=p, num_microbatches=m, iterations=iterations,
                                        virtual_pipeline_model_parallel_size=series.virtual_pipeline_model_parallel_size)
                    out.append(Configuration(series.name, strategy, batch))
    return out


def _microbatch_list(series: Series, batch: int, d: int, p: int) -> list[int]:
    if series.micro_batch_size:
        return [max(1, batch // (d * series.micro_batch_size))]
    if isinstance(series.num_microbatches, str):  # "distir_rule": DistIR's Figure 4 rule
        return dc.microbatch_counts(batch, d, p)
    if p == 1:
        return [1]
    return list(series.num_microbatches)


def _degrees(series: Series, batch: int, n: int) -> list[tuple[int, int, int, int]]:
    """(D, T, P, M) of the series at `n` devices."""
    if series.parallelism == "data":
        return [(n, 1, 1, 1)]
    if series.parallelism == "tensor":
        return [(1, n, 1, 1)]
    if series.parallelism == "pipeline":
        return [(1, 1, n, m) for m in _microbatch_list(series, batch, 1, n)]
    # grid: every power-of-two D x T x P with D T P = n, ordered by D, T, M
    if not _power_of_two(n):
        raise ConfigError(f"series '{series.name}'.devices", f"grid sweeps need powers of two, got {n}")
    out: list[tuple[int, int, int, int]] = []
    d = 1
    while d <= n:
        t = 1
        while d * t <= n:
            p = n // (d * t)
            out.extend((d, t, p, m) for m in _microbatch_list(series, batch, d, p))
            t *= 2
        d *= 2
    return out


# ---------------------------------------------------------------- running one mode


def mlp_profile(num_layers: int, hidden_dim: int, global_batch_size: int) -> ModelProfile:
    """DistIR's MLP with physical costs (4 bytes per element, DistIR's device: 1e14
    FLOP/s, 1.2e12 B/s) from `paraplan.profile.analytic` (combine `sum`: the DistIR
    cost model; Loss and LossGrad on the last layer), at `global_batch_size` samples.

    Reading a weight matrix does not shrink with the micro-batch: each layer's fixed
    time is the intercept of its (exactly linear) time at the batch and half of it.
    """
    from paraplan.profile.analytic import analytic_profile
    from paraplan.profile.specs import MLPSpec

    batch = global_batch_size
    spec = MLPSpec(num_layers=num_layers, input_dim=hidden_dim, hidden_dim=hidden_dim, output_dim=hidden_dim,
                   bias=False)
    device = Device("distir-device", peak_flops=dc.TP_FLOPS, mem_bandwidth_Bps=dc.DRAM_BYTES_PER_S,
                    memory_bytes=0.0)
    full = analytic_profile(spec, batch, device, combine="sum", include_loss=True,
                            name=f"distir_mlp{num_layers}x{hidden_dim}")
    if batch < 2:
        return full
    half = analytic_profile(spec, batch // 2, device, combine="sum", include_loss=True)
    ratio = batch / (batch // 2)
    fixed_layers = []
    for lf, lh in zip(full.layers, half.layers, strict=True):
        # t(b) = fixed + slope b through the two points
        fwd_fixed = max(0.0, (ratio * lh.fwd_s - lf.fwd_s) / (ratio - 1))
        bwd_fixed = max(0.0, (ratio * lh.bwd_s - lf.bwd_s) / (ratio - 1))
        fixed_layers.append(replace(lf, fwd_fixed_s=min(fwd_fixed, lf.fwd_s),
                                    bwd_fixed_s=min(bwd_fixed, lf.bwd_s)))
    return replace(full, layers=tuple(fixed_layers))


def physical_cluster(num_devices: int, mode: CorrectedMode) -> tuple[Cluster, ConstantBandwidthModel]:
    """One node of `num_devices` DistIR devices, every pair linked at the mode's bandwidth."""
    # 0 Gbit/s is a study whose model moves no bytes (the reference charts' unit stages): free links
    bandwidth_Bps = mode.bandwidth_Gbit_per_s * GBIT / BITS_PER_BYTE or math.inf
    device = Device("distir-device", peak_flops=dc.TP_FLOPS, mem_bandwidth_Bps=dc.DRAM_BYTES_PER_S,
                    memory_bytes=mode.memory_GB * 1e9)
    link = Link(bandwidth_Bps, mode.latency_s)
    cluster = Cluster(f"distir-{mode.bandwidth_Gbit_per_s:g}gbps", 1, max(1, num_devices), device, link, link)
    comm = ConstantBandwidthModel(bandwidth_Bps, bandwidth_Bps, mode.latency_s, mode.latency_s)
    return cluster, comm


@dataclass(frozen=True)
class SimulatedConfiguration:
    """A configuration as one mode simulated it."""

    mode: ModeName
    configuration: Configuration  # its strategy as the mode ran it
    timeline: Timeline

    @property
    def schedule(self) -> str:
        """results.csv's `schedule`: the pipeline schedule, empty without a pipeline."""
        strategy = self.configuration.strategy
        return strategy.schedule if strategy.pipeline_model_parallel_size > 1 else ""


Progress = Callable[[int], object] | None
ModeConfigurations = list[tuple[Series, Configuration]]


def _run_compat(study: SimulateStudy, mode: CompatMode, points: ModeConfigurations,
                on_point: Progress = None) -> list[SimulatedConfiguration]:
    dc.clear_caches()  # time every repeat cold
    cm = dc.COST_MODELS[mode.cost_model]
    baselines: dict[int, float] = {}
    out = []
    for series, conf in points:
        batch = conf.global_batch_size
        program = dc.MlpProgram(batch, study.model.hidden_dim, study.model.num_layers)
        if batch not in baselines:
            if mode.baseline == "sequential":
                baselines[batch] = dc.sequential_time_s(program, cm)
            else:
                baselines[batch] = dc.simulate_distir(
                    program, Strategy(), mode.bandwidth_Gbit_per_s, cm, sends=series.distir_sends,
                    phase2=mode.phase2, record_events=False).step_time_s
        strategy = replace(conf.strategy, schedule="distir_greedy")
        tl = dc.simulate_distir(program, strategy, mode.bandwidth_Gbit_per_s, cm, sends=series.distir_sends,
                                phase2=mode.phase2, baseline_s=baselines[batch])
        out.append(SimulatedConfiguration("distir-v0.1", replace(conf, strategy=strategy), tl))
        if on_point is not None:
            on_point(1)
    return out


SHARDED_WEIGHT_READS = RunConditions(tp_splits_fixed_time=True)
"""How the corrected mode runs DistIR's MLP under tensor parallelism: in `mlp_profile`
a layer's fixed time is reading its weight matrix, and a tensor-parallel shard reads
only 1/T of it, so the fixed time splits over T like the rest."""


def _unit_pipeline(study: SimulateStudy, strategy: Strategy) -> Timeline:
    """The reference charts: unit costs per stage (split over the virtual stages), free transfers."""
    from paraplan.sim import simulate_pipeline

    v = strategy.virtual_pipeline_model_parallel_size
    return simulate_pipeline(
        strategy.schedule, strategy.pipeline_model_parallel_size, strategy.num_microbatches,
        study.model.fwd_s / v, study.model.bwd_s / v, iterations=strategy.iterations,
        virtual_stages=v, micro_batch_size=study.model.micro_batch_size,
    )


def _run_corrected(study: SimulateStudy, mode: CorrectedMode, points: ModeConfigurations,
                   on_point: Progress = None) -> list[SimulatedConfiguration]:
    from paraplan.sim import simulate

    profiles: dict[int, ModelProfile] = {}
    out = []
    for series, conf in points:
        s = conf.strategy
        strategy = replace(s, schedule=series.schedule or mode.schedule,
                           gradient_sync=series.gradient_sync or mode.gradient_sync)
        batch = conf.global_batch_size
        if study.model.kind == "unit":
            tl = _unit_pipeline(study, strategy)
        else:
            if s.pipeline_model_parallel_size == 1:
                strategy = replace(strategy, schedule="1f1b")
            if batch not in profiles:
                profiles[batch] = mlp_profile(study.model.num_layers, study.model.hidden_dim, batch)
            cluster, comm = physical_cluster(strategy.num_devices, mode)
            tl = simulate(profiles[batch], cluster, comm, strategy, batch, conditions=SHARDED_WEIGHT_READS)
        out.append(SimulatedConfiguration("corrected", replace(conf, strategy=strategy), tl))
        if on_point is not None:
            on_point(1)
    return out


@dataclass(frozen=True)
class StudyResult:
    study: SimulateStudy
    simulated: tuple[SimulatedConfiguration, ...]
    simulate_s: float  # best of `repeats` over the whole study
    simulate_s_by_mode: Mapping[str, float] = field(default_factory=dict)
    repeats: int = 1


def mode_configurations(study: SimulateStudy, mode: ModeName) -> ModeConfigurations:
    """The configurations one mode of `study` simulates, in figure order."""
    return [(s, c) for s in study.series if not s.modes or mode in s.modes for c in expand(s)]


def run_study(study: SimulateStudy, modes: tuple[ModeName, ...] = (), repeats: int = TIMING_REPEATS,
              on_point: Progress = None) -> StudyResult:
    """Simulate every configuration of `study` in each of its modes (or `modes`).

    The wall time covers simulation only; it is the best of `repeats` runs when one
    run takes under CHEAP_RUN_S. `on_point(1)` is called after each configuration of
    the first run (progress; the re-timings are quick by definition).
    """
    chosen = modes or study.modes.names
    for name in chosen:
        if name not in study.modes.names:
            raise ConfigError("modes", f"'{name}' is not a mode of study {study.name} "
                              f"({', '.join(study.modes.names)})")
    simulated: list[SimulatedConfiguration] = []
    by_mode: dict[str, float] = {}
    runs = 1
    for name in chosen:
        points = mode_configurations(study, name)
        if not points:
            continue
        best, result = math.inf, []
        for attempt in range(max(1, repeats)):
            progress = on_point if attempt == 0 else None
            start = time.perf_counter()
            mode = study.mode(name)
            if isinstance(mode, CompatMode):
                result = _run_compat(study, mode, points, progress)
            else:
                result = _run_corrected(study, mode, points, progress)
            elapsed = time.perf_counter() - start
            best = min(best, elapsed)
            runs = max(runs, attempt + 1)
            if elapsed > CHEAP_RUN_S:
                break
        by_mode[name] = best
        simulated.extend(result)
    return StudyResult(study, tuple(simulated), sum(by_mode.values()), by_mode, runs)


def result_rows(result: StudyResult) -> list[dict[str, object]]:
    """Rows of results.csv, columns RESULT_COLUMNS (docs/design.md's contract: D, T, P,
    `microbatches` and `batch_size` are the strategy's degrees, micro-batches and global
    batch); empty where a mode has no value."""
    rows = []
    for sim in result.simulated:
        tl, conf = sim.timeline, sim.configuration
        s = conf.strategy
        peak = max(tl.peak_mem_bytes) if tl.peak_mem_bytes else None
        rows.append({
            "experiment": result.study.name, "mode": sim.mode, "series": conf.series,
            "D": s.data_parallel_size, "T": s.tensor_model_parallel_size, "P": s.pipeline_model_parallel_size,
            "microbatches": s.num_microbatches, "schedule": sim.schedule, "batch_size": conf.global_batch_size,
            "devices": tl.num_devices, "step_time_s": tl.step_time_s, "throughput": tl.throughput,
            "speedup": tl.speedup, "bubble_fraction": tl.bubble_fraction, "peak_mem_bytes": peak,
        })
    return rows

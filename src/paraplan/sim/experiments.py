"""Named simulation studies (`config/experiments/<name>.yaml`): load and validate a
file, expand its sweep into configurations, simulate each in the requested modes and
return the rows of `results.csv` (DESIGN.md) with the simulation's wall time.

Modes:
- `distir-v0.1`: DistIR's own semantics and cost model (`sim/distir_compat.py`), to
  reproduce seed 000's published figures.
- `corrected`: paraplan's physical engine (`paraplan.sim.simulate`) on the same MLP
  with physical costs (4 bytes per element, bandwidth in bits per second).

A `unit` model runs bare pipelines with unit costs (`paraplan.sim.simulate_pipeline`,
seed 001's charts); an
experiment with `figure: gantt` draws every timeline as a Gantt chart and exports it
as a Chrome trace.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from paraplan.core import (
    SCHEDULES,
    Cluster,
    ConfigError,
    ConstantBandwidthModel,
    Device,
    Link,
    ModelProfile,
    Strategy,
    Timeline,
)
from paraplan.sim import distir_compat as dc

MODES: tuple[str, ...] = ("distir-v0.1", "corrected")
PARALLELISMS: tuple[str, ...] = ("data", "tensor", "pipeline", "grid")
MODEL_KINDS: tuple[str, ...] = ("mlp", "unit")
FIGURES: tuple[str, ...] = ("distir_fig3", "distir_fig4", "gantt", "none")
BASELINES: tuple[str, ...] = ("sequential", "one_device_run")
RESULT_COLUMNS: tuple[str, ...] = (
    "experiment", "mode", "series", "D", "T", "P", "microbatches", "schedule", "batch_size",
    "devices", "step_time_s", "throughput", "speedup", "bubble_fraction", "peak_mem_bytes",
)
BITS_PER_BYTE = 8
GBPS_TO_BITS_PER_S = 1e9
DISTIR_MICROBATCH_RULE = "distir_rule"
# Best of this many runs when one run of the whole experiment is cheap.
TIMING_REPEATS = 5
CHEAP_RUN_S = 2.0

_REQUIRED = object()


# ---------------------------------------------------------------- the experiment file


@dataclass(frozen=True)
class ModelSpec:
    """`mlp`: DistIR's MLP (`layers` square layers of `dim`). `unit`: `layers` layers of
    forward `fwd_s` and backward `bwd_s` per micro-batch of `microbatch_size` samples,
    free communication (seed 001's charts)."""

    kind: str
    layers: int
    dim: int = 0
    fwd_s: float = 1.0
    bwd_s: float = 2.0
    microbatch_size: int = 1


@dataclass(frozen=True)
class CompatMode:
    bandwidth_gbps: float
    cost_model: str = "v0.1"
    phase2: str = "v0.1"
    baseline: str = "sequential"


@dataclass(frozen=True)
class CorrectedMode:
    bandwidth_gbps: float
    schedule: str = "1f1b"
    overlap_grad_allreduce: bool = False
    latency_s: float = 0.0
    device_memory_bytes: float = 80e9


@dataclass(frozen=True)
class SeriesSpec:
    name: str
    parallelism: str
    batch_sizes: tuple[int, ...]
    devices: tuple[int, ...] = ()
    microbatches: tuple[int, ...] | str = (1,)
    microbatch_size: int = 0  # > 0: M = batch / microbatch_size (overrides microbatches)
    modes: tuple[str, ...] = ()  # empty: every mode of the file
    distir_sends: str = "none"
    schedule: str = ""  # corrected mode: overrides the mode's schedule
    overlap_grad_allreduce: bool | None = None
    iterations: tuple[int, ...] = (1,)
    virtual_stages: int = 1


@dataclass(frozen=True)
class PublishedSpec:
    file: str  # relative to the repository root (or absolute)
    format: str  # distir_fig3 | distir_fig4


@dataclass(frozen=True)
class Experiment:
    name: str
    path: str
    description: str
    model: ModelSpec
    modes: Mapping[str, CompatMode | CorrectedMode]
    series: tuple[SeriesSpec, ...]
    figure: str = "none"
    published: PublishedSpec | None = None


@dataclass(frozen=True)
class Point:
    """One configuration of a series: everything a row of results.csv identifies."""

    series: str
    D: int
    T: int
    P: int
    microbatches: int
    batch_size: int
    iterations: int = 1


def _fields(mapping: object, spec: Mapping[str, tuple[type | tuple[type, ...], object]], where: str,
            path: str) -> dict:
    """Check `mapping` against {key: (types, default)}; errors name the file and key."""
    if not isinstance(mapping, Mapping):
        raise ConfigError(where or "<top>", f"expected a mapping in {path}, got {type(mapping).__name__}")
    prefix = f"{where}." if where else ""
    for key in mapping:
        if key not in spec:
            raise ConfigError(
                f"{prefix}{key}", f"unknown key in {path}; expected one of {', '.join(spec)}"
            )
    out = {}
    for key, (types, default) in spec.items():
        if key not in mapping:
            if default is _REQUIRED:
                raise ConfigError(f"{prefix}{key}", f"missing in {path}")
            out[key] = default
            continue
        value = mapping[key]
        ok = isinstance(value, types) and not (isinstance(value, bool) and bool not in _as_tuple(types))
        if not ok:
            names = "/".join(t.__name__ for t in _as_tuple(types))
            raise ConfigError(f"{prefix}{key}", f"expected {names} in {path}, got {value!r}")
        out[key] = value
    return out


def _as_tuple(types) -> tuple[type, ...]:
    return types if isinstance(types, tuple) else (types,)


def _int_list(value: object, key: str, path: str, minimum: int = 1) -> tuple[int, ...]:
    values = value if isinstance(value, list) else [value]
    if not values or any(isinstance(v, bool) or not isinstance(v, int) or v < minimum for v in values):
        raise ConfigError(key, f"expected a list of integers >= {minimum} in {path}, got {value!r}")
    return tuple(values)


def _choice(value: str, allowed: tuple[str, ...], key: str, path: str) -> str:
    if value not in allowed:
        raise ConfigError(key, f"'{value}' in {path}; expected one of {', '.join(allowed)}")
    return value


def parse_experiment(data: object, path: str) -> Experiment:
    """Validate the parsed YAML of an experiment file."""
    top = _fields(data, {
        "name": (str, _REQUIRED),
        "description": (str, ""),
        "model": (dict, _REQUIRED),
        "modes": (dict, _REQUIRED),
        "series": (list, _REQUIRED),
        "figure": (str, "none"),
        "published": (dict, None),
    }, "", path)
    _choice(top["figure"], FIGURES, "figure", path)
    m = _fields(top["model"], {
        "kind": (str, _REQUIRED), "layers": (int, _REQUIRED), "dim": (int, 0),
        "fwd_s": ((int, float), 1.0), "bwd_s": ((int, float), 2.0), "microbatch_size": (int, 1),
    }, "model", path)
    _choice(m["kind"], MODEL_KINDS, "model.kind", path)
    if m["layers"] < 1:
        raise ConfigError("model.layers", f"must be >= 1 in {path}")
    if m["kind"] == "mlp" and m["dim"] < 1:
        raise ConfigError("model.dim", f"an mlp needs dim >= 1 in {path}")
    model = ModelSpec(**m)

    modes: dict[str, CompatMode | CorrectedMode] = {}
    if not top["modes"]:
        raise ConfigError("modes", f"needs at least one of {', '.join(MODES)} in {path}")
    for name, settings in top["modes"].items():
        _choice(name, MODES, f"modes.{name}", path)
        where = f"modes.{name}"
        if name == "distir-v0.1":
            if model.kind != "mlp":
                raise ConfigError(where, f"DistIR mode needs model.kind mlp in {path}")
            s = _fields(settings or {}, {
                "bandwidth_gbps": ((int, float), _REQUIRED), "cost_model": (str, "v0.1"),
                "phase2": (str, "v0.1"), "baseline": (str, "sequential"),
            }, where, path)
            _choice(s["cost_model"], tuple(dc.COST_MODELS), f"{where}.cost_model", path)
            _choice(s["phase2"], dc.PHASE2_MODES, f"{where}.phase2", path)
            _choice(s["baseline"], BASELINES, f"{where}.baseline", path)
            modes[name] = CompatMode(**s)
        else:
            s = _fields(settings or {}, {
                "bandwidth_gbps": ((int, float), 0.0 if model.kind == "unit" else _REQUIRED),
                "schedule": (str, "1f1b"),
                "overlap_grad_allreduce": (bool, False), "latency_s": ((int, float), 0.0),
                "device_memory_bytes": ((int, float), 80e9),
            }, where, path)
            _choice(s["schedule"], SCHEDULES, f"{where}.schedule", path)
            modes[name] = CorrectedMode(**s)
        if modes[name].bandwidth_gbps <= 0 and model.kind == "mlp":
            raise ConfigError(f"{where}.bandwidth_gbps", f"must be > 0 in {path}")

    series = []
    if not top["series"]:
        raise ConfigError("series", f"needs at least one entry in {path}")
    for i, entry in enumerate(top["series"]):
        where = f"series[{i}]"
        s = _fields(entry, {
            "name": (str, _REQUIRED), "parallelism": (str, _REQUIRED),
            "batch_sizes": ((list, int), _REQUIRED), "devices": ((list, int), []),
            "microbatches": ((list, int, str), [1]), "microbatch_size": (int, 0),
            "modes": (list, []), "distir_sends": (str, "none"), "schedule": (str, ""),
            "overlap_grad_allreduce": (bool, None), "iterations": ((list, int), [1]),
            "virtual_stages": (int, 1),
        }, where, path)
        _choice(s["parallelism"], PARALLELISMS, f"{where}.parallelism", path)
        s["batch_sizes"] = _int_list(s["batch_sizes"], f"{where}.batch_sizes", path)
        s["iterations"] = _int_list(s["iterations"], f"{where}.iterations", path)
        s["devices"] = _int_list(s["devices"], f"{where}.devices", path)
        if isinstance(s["microbatches"], str):
            _choice(s["microbatches"], (DISTIR_MICROBATCH_RULE,), f"{where}.microbatches", path)
        else:
            s["microbatches"] = _int_list(s["microbatches"], f"{where}.microbatches", path)
        for mode in s["modes"]:
            if mode not in modes:
                raise ConfigError(f"{where}.modes", f"'{mode}' is not a mode of {path} ({', '.join(modes)})")
        s["modes"] = tuple(s["modes"])
        _choice(s["distir_sends"], dc.SEND_FILTERS, f"{where}.distir_sends", path)
        if s["schedule"]:
            _choice(s["schedule"], SCHEDULES, f"{where}.schedule", path)
        series.append(SeriesSpec(**s))

    published = None
    if top["published"] is not None:
        p = _fields(top["published"], {"file": (str, _REQUIRED), "format": (str, _REQUIRED)},
                    "published", path)
        _choice(p["format"], ("distir_fig3", "distir_fig4"), "published.format", path)
        published = PublishedSpec(**p)
    return Experiment(top["name"], path, top["description"], model, modes, tuple(series),
                      top["figure"], published)


def load_experiment(path: str | Path) -> Experiment:
    """Read and validate `config/experiments/<name>.yaml`."""
    import yaml

    from paraplan.core import InputFileError

    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise InputFileError(path, "experiment file not found") from None
    except yaml.YAMLError as exc:
        raise InputFileError(path, f"not valid YAML: {exc}") from None
    return parse_experiment(data, str(path))


# ---------------------------------------------------------------- the sweep


def _power_of_two(n: int) -> bool:
    return n >= 1 and n & (n - 1) == 0


def expand(series: SeriesSpec) -> list[Point]:
    """The configurations of a series, in figure order."""
    points = []
    for batch in series.batch_sizes:
        for iterations in series.iterations:
            for n in series.devices:
                points.extend(_points(series, batch, n, iterations))
    return points


def _microbatch_list(series: SeriesSpec, batch: int, D: int, P: int) -> list[int]:
    if series.microbatch_size:
        return [max(1, batch // (D * series.microbatch_size))]
    if series.microbatches == DISTIR_MICROBATCH_RULE:
        return dc.microbatch_counts(batch, D, P)
    if P == 1:
        return [1]
    return list(series.microbatches)


def _points(series: SeriesSpec, batch: int, n: int, iterations: int) -> list[Point]:
    name = series.name
    if series.parallelism == "data":
        return [Point(name, n, 1, 1, 1, batch, iterations)]
    if series.parallelism == "tensor":
        return [Point(name, 1, n, 1, 1, batch, iterations)]
    if series.parallelism == "pipeline":
        return [Point(name, 1, 1, n, m, batch, iterations) for m in _microbatch_list(series, batch, 1, n)]
    # grid: every power-of-two D x T x P with D T P = n, ordered by D, T, M
    if not _power_of_two(n):
        raise ConfigError(f"series '{name}'.devices", f"grid sweeps need powers of two, got {n}")
    out = []
    d = 1
    while d <= n:
        t = 1
        while d * t <= n:
            p = n // (d * t)
            for m in _microbatch_list(series, batch, d, p):
                out.append(Point(name, d, t, p, m, batch, iterations))
            t *= 2
        d *= 2
    return out


# ---------------------------------------------------------------- running one mode


def mlp_profile(layers: int, dim: int, batch_size: int) -> ModelProfile:
    """DistIR's MLP with physical costs (4 bytes per element, DistIR's device: 1e14
    FLOP/s, 1.2e12 B/s) from `paraplan.profile.analytic` (combine `sum`: the DistIR
    cost model; Loss and LossGrad on the last layer), at `batch_size` samples.

    Reading a weight matrix does not shrink with the micro-batch: each layer's fixed
    time is the intercept of its (exactly linear) time at `batch_size` and half of it.
    """
    from paraplan.profile.analytic import analytic_profile
    from paraplan.profile.specs import MLPSpec

    spec = MLPSpec(layers=layers, input_dim=dim, hidden_dim=dim, output_dim=dim, bias=False)
    device = Device("distir-device", peak_flops=dc.TP_FLOPS, mem_bandwidth_Bps=dc.DRAM_BYTES_PER_S,
                    memory_bytes=0.0)
    full = analytic_profile(spec, batch_size, device, combine="sum", include_loss=True,
                            name=f"distir_mlp{layers}x{dim}")
    if batch_size < 2:
        return full
    half = analytic_profile(spec, batch_size // 2, device, combine="sum", include_loss=True)
    ratio = batch_size / (batch_size // 2)
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
    bandwidth_Bps = mode.bandwidth_gbps * GBPS_TO_BITS_PER_S / BITS_PER_BYTE
    device = Device("distir-device", peak_flops=dc.TP_FLOPS, mem_bandwidth_Bps=dc.DRAM_BYTES_PER_S,
                    memory_bytes=mode.device_memory_bytes)
    link = Link(bandwidth_Bps, mode.latency_s)
    cluster = Cluster(f"distir-{mode.bandwidth_gbps:g}gbps", 1, max(1, num_devices), device, link, link)
    comm = ConstantBandwidthModel(bandwidth_Bps, bandwidth_Bps, mode.latency_s, mode.latency_s)
    return cluster, comm


@dataclass(frozen=True)
class Simulated:
    mode: str
    point: Point
    schedule: str
    timeline: Timeline


def _run_compat(exp: Experiment, mode: CompatMode, points: list[tuple[SeriesSpec, Point]],
                on_point: Callable[[int], object] | None = None) -> list[Simulated]:
    dc.clear_caches()  # time every repeat cold
    cm = dc.COST_MODELS[mode.cost_model]
    baselines: dict[int, float] = {}
    out = []
    for series, pt in points:
        program = dc.MlpProgram(pt.batch_size, exp.model.dim, exp.model.layers)
        if pt.batch_size not in baselines:
            if mode.baseline == "sequential":
                baselines[pt.batch_size] = dc.sequential_time_s(program, cm)
            else:
                baselines[pt.batch_size] = dc.simulate_distir(
                    program, 1, 1, 1, 1, mode.bandwidth_gbps, cm, sends=series.distir_sends,
                    phase2=mode.phase2, record_events=False).step_time_s
        tl = dc.simulate_distir(
            program, pt.D, pt.T, pt.P, pt.microbatches, mode.bandwidth_gbps, cm,
            sends=series.distir_sends, phase2=mode.phase2, baseline_s=baselines[pt.batch_size],
        )
        out.append(Simulated("distir-v0.1", pt, "distir_greedy" if pt.P > 1 else "", tl))
        if on_point is not None:
            on_point(1)
    return out


def _run_corrected(exp: Experiment, mode: CorrectedMode, points: list[tuple[SeriesSpec, Point]],
                   on_point: Callable[[int], object] | None = None) -> list[Simulated]:
    from paraplan.sim import simulate, simulate_pipeline

    profiles: dict[int, ModelProfile] = {}
    out = []
    for series, pt in points:
        schedule = series.schedule or mode.schedule
        if exp.model.kind == "unit":
            # seed 001: unit costs per stage (split over the virtual stages), free transfers
            v = series.virtual_stages
            tl = simulate_pipeline(
                schedule, pt.P, pt.microbatches, exp.model.fwd_s / v, exp.model.bwd_s / v,
                iterations=pt.iterations, virtual_stages=v, micro_batch_size=exp.model.microbatch_size,
            )
            out.append(Simulated("corrected", pt, schedule, tl))
            if on_point is not None:
                on_point(1)
            continue
        overlap = mode.overlap_grad_allreduce if series.overlap_grad_allreduce is None else series.overlap_grad_allreduce
        if pt.batch_size not in profiles:
            profiles[pt.batch_size] = mlp_profile(exp.model.layers, exp.model.dim, pt.batch_size)
        strategy = Strategy(
            data_parallel_size=pt.D, tensor_model_parallel_size=pt.T, pipeline_model_parallel_size=pt.P, num_microbatches=pt.microbatches,
            schedule=schedule if pt.P > 1 else "1f1b", gradient_sync="overlap" if overlap else "end",
            virtual_pipeline_model_parallel_size=series.virtual_stages,
        )
        cluster, comm = physical_cluster(strategy.num_devices, mode)
        profile = profiles[pt.batch_size]
        tl = simulate(tensor_sharded_profile(profile, pt.T), cluster, comm, strategy, pt.batch_size)
        if pt.T > 1:  # speedup over one device running the unsharded model
            single_s = float(profile.fwd_s_at(pt.batch_size).sum() + profile.bwd_s_at(pt.batch_size).sum())
            tl = replace(tl, speedup=single_s / tl.step_time_s)
        out.append(Simulated("corrected", pt, schedule if pt.P > 1 else "", tl))
        if on_point is not None:
            on_point(1)
    return out


def tensor_sharded_profile(profile: ModelProfile, tensor_degree: int) -> ModelProfile:
    """The MLP profile as the engine's tensor-parallel model should see it.

    The engine divides a layer's batch-proportional time by T and keeps its fixed time
    (a per-call cost). In `mlp_profile` the fixed time is reading the weight matrix,
    and a tensor-parallel shard reads only 1/T of it; so the fixed part becomes
    fixed / T and the total is lowered to match: the engine then computes exactly
    fixed / T + (t - fixed) / T per shard.
    """
    if tensor_degree == 1:
        return profile
    t = tensor_degree
    layers = tuple(
        replace(la, fwd_s=la.fwd_s - la.fwd_fixed_s * (1 - 1 / t), fwd_fixed_s=la.fwd_fixed_s / t,
                bwd_s=la.bwd_s - la.bwd_fixed_s * (1 - 1 / t), bwd_fixed_s=la.bwd_fixed_s / t)
        for la in profile.layers
    )
    return replace(profile, layers=layers)


@dataclass(frozen=True)
class ExperimentResult:
    experiment: Experiment
    simulated: tuple[Simulated, ...]
    simulate_s: float  # best of `repeats` over the whole experiment
    simulate_s_by_mode: Mapping[str, float] = field(default_factory=dict)
    repeats: int = 1


def experiment_points(exp: Experiment, mode: str) -> list[tuple[SeriesSpec, Point]]:
    """The configurations one mode of `exp` simulates, in figure order."""
    return [(s, p) for s in exp.series if not s.modes or mode in s.modes for p in expand(s)]


def run_experiment(exp: Experiment, modes: tuple[str, ...] = (), repeats: int = TIMING_REPEATS,
                   on_point: Callable[[int], object] | None = None) -> ExperimentResult:
    """Simulate every configuration of `exp` in each of its modes (or `modes`).

    The wall time covers simulation only; it is the best of `repeats` runs when one
    run takes under CHEAP_RUN_S. `on_point(1)` is called after each configuration of
    the first run (progress; the re-timings are quick by definition).
    """
    chosen = modes or tuple(exp.modes)
    for mode in chosen:
        if mode not in exp.modes:
            raise ConfigError("modes", f"'{mode}' is not a mode of {exp.path} ({', '.join(exp.modes)})")
    simulated: list[Simulated] = []
    by_mode: dict[str, float] = {}
    runs = 1
    for name in chosen:
        mode = exp.modes[name]
        points = experiment_points(exp, name)
        if not points:
            continue
        runner = _run_compat if name == "distir-v0.1" else _run_corrected
        best, result = math.inf, []
        for attempt in range(max(1, repeats)):
            start = time.perf_counter()
            result = runner(exp, mode, points, on_point if attempt == 0 else None)  # type: ignore[arg-type]
            elapsed = time.perf_counter() - start
            best = min(best, elapsed)
            runs = max(runs, attempt + 1)
            if elapsed > CHEAP_RUN_S:
                break
        by_mode[name] = best
        simulated.extend(result)
    return ExperimentResult(exp, tuple(simulated), sum(by_mode.values()), by_mode, runs)


def result_rows(result: ExperimentResult) -> list[dict[str, object]]:
    """Rows of results.csv, columns RESULT_COLUMNS; empty where a mode has no value."""
    rows = []
    for sim in result.simulated:
        tl, pt = sim.timeline, sim.point
        peak = max(tl.peak_mem_bytes) if tl.peak_mem_bytes else None
        rows.append({
            "experiment": result.experiment.name, "mode": sim.mode, "series": pt.series,
            "D": pt.D, "T": pt.T, "P": pt.P, "microbatches": pt.microbatches,
            "schedule": sim.schedule, "batch_size": pt.batch_size, "devices": tl.num_devices,
            "step_time_s": tl.step_time_s, "throughput": tl.throughput, "speedup": tl.speedup,
            "bubble_fraction": tl.bubble_fraction, "peak_mem_bytes": peak,
        })
    return rows

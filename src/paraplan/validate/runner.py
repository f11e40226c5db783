"""Spawn the ranks, build every strategy's training step, and time them in rounds.

Each round times, after a barrier each, the contention calibration (the whole
model's forward + backward on each rank alone, then on all ranks at once), the
all-reduce calibration (`ALLREDUCE_PROBES_PER_ROUND` all-reduces of each size in
`RunConfig.allreduce_probe_bytes`, the sizes of tp2's activation all-reduces) and one
step of every strategy, in an order rotated by one each round, so all of them see the
same machine load and none holds a fixed place in the round; a step's time is
the slowest rank's, from the barrier to the end of its own work (after a device
synchronisation on GPUs). The optimiser update (SGD) follows each step outside the
timed region: the simulator predicts forward, backward and communication, not the
update. Every rank uses `threads_per_rank` threads (cores // ranks on a CPU).
"""

from __future__ import annotations

import copy
import functools
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from paraplan.core import ConfigError, Strategy, StrategyError
from paraplan.validate.compare import Measurement, summarise
from paraplan.validate.data_parallel import GradientBuffer
from paraplan.validate.pipeline import PipelineStage, stage_order
from paraplan.validate.ranks import report_progress, run_ranks
from paraplan.validate.strategies import PIPELINE_SCHEDULES, STRATEGIES, WORLD_SIZE, round_order, strategy_for
from paraplan.validate.tensor_parallel import tensor_parallel_layers
from paraplan.validate.workload import Workload, WorkloadSpec

LEARNING_RATE = 1e-4
ALLREDUCE_PROBES_PER_ROUND = 3


@dataclass(frozen=True)
class RunConfig:
    """What to run: `global_batch_size` samples per step over all ranks; `pipeline_boundary`
    is the first layer of pipeline stage 1."""

    workload: WorkloadSpec
    strategies: tuple[str, ...]
    global_batch_size: int
    num_microbatches: int
    steps: int
    warmup: int
    threads_per_rank: int
    pipeline_boundary: int
    backend: str = "gloo"
    seed: int = 0
    timeout_s: float = 600.0
    allreduce_probe_bytes: tuple[int, ...] = ()  # all-reduce sizes to time each round

    def __post_init__(self) -> None:
        unknown = [s for s in self.strategies if s not in STRATEGIES]
        if unknown:
            raise ConfigError("strategies", f"unknown strategy '{unknown[0]}'; known: {', '.join(STRATEGIES)}")
        if self.backend not in ("gloo", "nccl"):
            raise ConfigError("backend", f"expected gloo or nccl, got '{self.backend}'")
        for key in ("global_batch_size", "num_microbatches", "steps", "threads_per_rank"):
            if getattr(self, key) < 1:
                raise ConfigError(key, f"must be >= 1, got {getattr(self, key)}")
        if self.warmup < 0:
            raise ConfigError("warmup", f"must be >= 0, got {self.warmup}")
        if self.global_batch_size % WORLD_SIZE:
            raise ConfigError("global_batch_size", f"must divide by {WORLD_SIZE} ranks, got {self.global_batch_size}")
        if self.global_batch_size % self.num_microbatches:
            raise ConfigError(
                "num_microbatches",
                f"must divide the global batch size {self.global_batch_size}, got {self.num_microbatches}",
            )


# ---- one step per strategy: each builder returns (timed step, untimed update) ----

StepFns = tuple[Callable[[], None], Callable[[], None]]


def _sgd_update(params: list[nn.Parameter]) -> Callable[[], None]:
    opt = torch.optim.SGD(params, lr=LEARNING_RATE)

    def update() -> None:
        opt.step()
        opt.zero_grad(set_to_none=True)

    return update


def _data_parallel(work: Workload, cfg: RunConfig, rank: int, device, overlap: bool) -> StepFns:
    layers = [layer.to(device) for layer in copy.deepcopy(list(work.layers))]
    model = nn.Sequential(*layers)
    gen = torch.Generator().manual_seed(cfg.seed + 1 + rank)  # each replica its own data
    x, y = (t.to(device) for t in work.make_batch(cfg.global_batch_size // WORLD_SIZE, gen))
    grads = GradientBuffer(layers, overlap)
    opt = torch.optim.SGD(grads.params, lr=LEARNING_RATE)

    def step() -> None:
        (work.loss(model(x), y) / WORLD_SIZE).backward()
        grads.synchronise()

    def update() -> None:
        opt.step()
        grads.zero()

    return step, update


def _tensor_parallel(work: Workload, cfg: RunConfig, rank: int, device) -> StepFns:
    layers = tensor_parallel_layers(copy.deepcopy(list(work.layers)), rank, WORLD_SIZE)
    model = nn.Sequential(*layers).to(device)
    gen = torch.Generator().manual_seed(cfg.seed + 1)  # every shard sees the same batch
    x, y = (t.to(device) for t in work.make_batch(cfg.global_batch_size, gen))
    params = [p for p in model.parameters() if p.requires_grad]

    def step() -> None:
        work.loss(model(x), y).backward()

    return step, _sgd_update(params)


def _pipeline(work: Workload, cfg: RunConfig, rank: int, device, strategy: Strategy) -> StepFns:
    """Rank `rank`'s stage of the 2-stage `strategy`, run in its schedule's op order."""
    layers = copy.deepcopy(list(work.layers))
    (cut,) = strategy.stage_boundaries
    if not 0 < cut < len(layers):
        raise StrategyError(f"pipeline boundary {cut} must lie in 1..{len(layers) - 1}")
    stages = [nn.Sequential(*layers[:cut]).to(device), nn.Sequential(*layers[cut:]).to(device)]
    gen = torch.Generator().manual_seed(cfg.seed + 1)
    x, y = (t.to(device) for t in work.make_batch(cfg.global_batch_size, gen))
    xs, ys = x.chunk(strategy.num_microbatches), y.chunk(strategy.num_microbatches)
    with torch.no_grad():
        boundary = stages[0](xs[0])
    stage = PipelineStage(
        stages[rank], rank, WORLD_SIZE, work.loss,
        input_shape=boundary.shape, input_dtype=boundary.dtype,
        output_shape=boundary.shape, device=device,
    )
    order = stage_order(strategy.schedule, rank, strategy.pipeline_model_parallel_size, strategy.num_microbatches)
    params = [p for p in stages[rank].parameters() if p.requires_grad]

    def step() -> None:
        stage.run(order, xs, ys)

    return step, _sgd_update(params)


def build_step(name: str, work: Workload, cfg: RunConfig, rank: int, device) -> StepFns:
    if name == "dp":
        return _data_parallel(work, cfg, rank, device, overlap=False)
    if name == "dp_overlap":
        return _data_parallel(work, cfg, rank, device, overlap=True)
    if name == "tp2":
        return _tensor_parallel(work, cfg, rank, device)
    if name in PIPELINE_SCHEDULES:
        return _pipeline(work, cfg, rank, device, strategy_for(name, cfg.num_microbatches, cfg.pipeline_boundary))
    raise ConfigError("strategies", f"unknown strategy '{name}'; known: {', '.join(STRATEGIES)}")


# ---- the ranks ----


def _timed(fn: Callable[[], None], device) -> float:
    """Seconds from a barrier (all ranks start together) to the end of this rank's work."""
    cuda = device.type == "cuda"
    dist.barrier()
    if cuda:
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    fn()
    if cuda:
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def _compute_pass(work: Workload, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> Callable[[], None]:
    """One forward + backward of the whole model, no communication."""

    def run() -> None:
        work.loss(model(x), y).backward()

    return run


def _clear(model: nn.Module) -> None:
    for p in model.parameters():
        p.grad = None


def _rank_main(rank: int, world_size: int, cfg: RunConfig) -> dict:
    """One rank. Rounds of: the contention calibration (the whole model's forward +
    backward at batch / ranks samples on each rank alone while the others wait, then
    on all ranks at once), then one training step of every strategy. Interleaving
    makes every strategy and the calibration see the same machine load, which on a
    shared machine changes by the second; each round starts one strategy later than
    the last (round-robin), so none always runs first after the calibration or last
    before the next. The first `warmup` rounds are not kept."""
    device = torch.device("cuda", rank) if cfg.backend == "nccl" else torch.device("cpu")
    work = cfg.workload.build()
    steps = {name: build_step(name, work, cfg, rank, device) for name in cfg.strategies}
    model = nn.Sequential(*[layer.to(device) for layer in copy.deepcopy(list(work.layers))])
    gen = torch.Generator().manual_seed(cfg.seed + 1 + rank)
    x, y = (t.to(device) for t in work.make_batch(cfg.global_batch_size // world_size, gen))
    compute = _compute_pass(work, model, x, y)
    probes = {f"allreduce_{nb}": torch.zeros(max(1, nb // 4), dtype=torch.float32, device=device)
              for nb in cfg.allreduce_probe_bytes}
    times: dict[str, list[float]] = {name: [] for name in ("alone", "together", *probes, *cfg.strategies)}
    for i in range(cfg.warmup + cfg.steps):
        keep = i >= cfg.warmup
        for turn in range(world_size):
            if turn == rank:
                elapsed = _timed(compute, device)
                if keep:
                    times["alone"].append(elapsed)
            else:
                dist.barrier()
            _clear(model)
        elapsed = _timed(compute, device)
        _clear(model)
        if keep:
            times["together"].append(elapsed)
        for name, buf in probes.items():
            for _ in range(ALLREDUCE_PROBES_PER_ROUND):
                elapsed = _timed(functools.partial(dist.all_reduce, buf), device)
                if keep:
                    times[name].append(elapsed)
        for name in round_order(tuple(steps), i):
            step, update = steps[name]
            elapsed = _timed(step, device)
            update()
            if keep:
                times[name].append(elapsed)
        if rank == 0:
            report_progress(1)
    results: dict = {}
    for name, values in times.items():
        local = torch.tensor(values, dtype=torch.float64, device=device)
        gathered = [torch.empty_like(local) for _ in range(world_size)]
        dist.all_gather(gathered, local)
        results[name] = [g.cpu().tolist() for g in gathered]
    return results


@dataclass(frozen=True)
class RunResult:
    """Step times per strategy, and the compute slowdown when all ranks compute at
    once: per rank the median of its passes alone and together; the factor is the
    median over ranks of together / alone. `allreduce_s`: per probed size (bytes),
    every timed all-reduce of the calibration, each the slowest rank's."""

    measured: dict[str, Measurement]
    contention_factor: float
    alone_s: tuple[float, ...]
    together_s: tuple[float, ...]
    allreduce_s: dict[int, tuple[float, ...]] = field(default_factory=dict)
    together_drift_s: float = 0.0
    """Mean over rounds of the latest minus the earliest rank in the pass on all ranks at once: how far
    apart two ranks doing the same work at the same time end (`validate.predict.skew_s`)."""


def run_strategies(cfg: RunConfig, on_round: Callable[[int], object] | None = None) -> RunResult:
    """Spawn the ranks and run `cfg` (see `_rank_main`); step times are the slowest
    rank's per step, in the order of `cfg.strategies`. `on_round(1)` after each round
    (warm-up rounds included)."""
    per_rank = run_ranks(
        _rank_main, (cfg,), world_size=WORLD_SIZE, backend=cfg.backend,
        threads_per_rank=cfg.threads_per_rank, timeout_s=cfg.timeout_s, on_progress=on_round,
    )
    raw = per_rank[0]
    med = statistics.median
    alone = tuple(med(times) for times in raw["alone"])
    together = tuple(med(times) for times in raw["together"])
    factor = med(t / a for t, a in zip(together, alone, strict=True))
    drift = statistics.fmean(max(r) - min(r) for r in zip(*raw["together"], strict=True))
    allreduce = {nb: summarise("all_reduce", raw[f"allreduce_{nb}"]).step_times_s
                 for nb in cfg.allreduce_probe_bytes}
    return RunResult(
        {name: summarise(name, raw[name]) for name in cfg.strategies}, float(factor), alone, together,
        allreduce, float(drift),
    )

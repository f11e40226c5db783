"""Spawn the ranks, run each strategy's warm-up and timed steps, collect step times.

Each step is timed on every rank between a barrier and the end of its own work
(after a device synchronisation on GPUs); the step's time is the slowest rank's.
The optimiser update (SGD) follows each step outside the timed region: the
simulator predicts forward, backward and communication, not the update.
Every rank uses `threads_per_rank` threads (cores // ranks on a CPU machine).
"""

from __future__ import annotations

import copy
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from paraplan.core import ConfigError, StrategyError
from paraplan.validate.compare import Measurement, summarise
from paraplan.validate.data_parallel import GradientBuffer
from paraplan.validate.pipeline import PipelineStage, schedule_ops
from paraplan.validate.ranks import run_ranks
from paraplan.validate.strategies import PIPELINE_SCHEDULES, STRATEGIES, WORLD_SIZE
from paraplan.validate.tensor_parallel import tensor_parallel_layers
from paraplan.validate.workload import Workload, WorkloadSpec

LEARNING_RATE = 1e-4


@dataclass(frozen=True)
class RunConfig:
    """What to run: `batch_size` samples per step over all ranks; `pipeline_boundary`
    is the first layer of pipeline stage 1."""

    workload: WorkloadSpec
    strategies: tuple[str, ...]
    batch_size: int
    microbatches: int
    steps: int
    warmup: int
    threads_per_rank: int
    pipeline_boundary: int
    backend: str = "gloo"
    seed: int = 0
    timeout_s: float = 600.0

    def __post_init__(self) -> None:
        unknown = [s for s in self.strategies if s not in STRATEGIES]
        if unknown:
            raise ConfigError("strategies", f"unknown strategy '{unknown[0]}'; known: {', '.join(STRATEGIES)}")
        if self.backend not in ("gloo", "nccl"):
            raise ConfigError("backend", f"expected gloo or nccl, got '{self.backend}'")
        for key in ("batch_size", "microbatches", "steps", "threads_per_rank"):
            if getattr(self, key) < 1:
                raise ConfigError(key, f"must be >= 1, got {getattr(self, key)}")
        if self.warmup < 0:
            raise ConfigError("warmup", f"must be >= 0, got {self.warmup}")
        if self.batch_size % WORLD_SIZE:
            raise ConfigError("batch_size", f"must divide by {WORLD_SIZE} ranks, got {self.batch_size}")
        if self.batch_size % self.microbatches:
            raise ConfigError(
                "microbatches", f"must divide the batch size {self.batch_size}, got {self.microbatches}"
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
    x, y = (t.to(device) for t in work.make_batch(cfg.batch_size // WORLD_SIZE, gen))
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
    x, y = (t.to(device) for t in work.make_batch(cfg.batch_size, gen))
    params = [p for p in model.parameters() if p.requires_grad]

    def step() -> None:
        work.loss(model(x), y).backward()

    return step, _sgd_update(params)


def _pipeline(work: Workload, cfg: RunConfig, rank: int, device, schedule: str) -> StepFns:
    layers = copy.deepcopy(list(work.layers))
    cut = cfg.pipeline_boundary
    if not 0 < cut < len(layers):
        raise StrategyError(f"pipeline boundary {cut} must lie in 1..{len(layers) - 1}")
    stages = [nn.Sequential(*layers[:cut]).to(device), nn.Sequential(*layers[cut:]).to(device)]
    gen = torch.Generator().manual_seed(cfg.seed + 1)
    x, y = (t.to(device) for t in work.make_batch(cfg.batch_size, gen))
    xs, ys = x.chunk(cfg.microbatches), y.chunk(cfg.microbatches)
    with torch.no_grad():
        boundary = stages[0](xs[0])
    stage = PipelineStage(
        stages[rank], rank, WORLD_SIZE, work.loss,
        input_shape=boundary.shape, input_dtype=boundary.dtype,
        output_shape=boundary.shape, device=device,
    )
    ops = schedule_ops(schedule, rank, WORLD_SIZE, cfg.microbatches)
    params = [p for p in stages[rank].parameters() if p.requires_grad]

    def step() -> None:
        stage.run(ops, xs, ys)

    return step, _sgd_update(params)


def build_step(name: str, work: Workload, cfg: RunConfig, rank: int, device) -> StepFns:
    if name == "dp":
        return _data_parallel(work, cfg, rank, device, overlap=False)
    if name == "dp_overlap":
        return _data_parallel(work, cfg, rank, device, overlap=True)
    if name == "tp2":
        return _tensor_parallel(work, cfg, rank, device)
    if name in PIPELINE_SCHEDULES:
        return _pipeline(work, cfg, rank, device, PIPELINE_SCHEDULES[name])
    raise ConfigError("strategies", f"unknown strategy '{name}'; known: {', '.join(STRATEGIES)}")


# ---- the ranks ----


def _time_steps(step: Callable[[], None], update: Callable[[], None], cfg: RunConfig, device) -> list[float]:
    cuda = device.type == "cuda"
    times = []
    for i in range(cfg.warmup + cfg.steps):
        dist.barrier()
        if cuda:
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        step()
        if cuda:
            torch.cuda.synchronize(device)
        elapsed = time.perf_counter() - start
        update()
        if i >= cfg.warmup:
            times.append(elapsed)
    return times


CALIBRATION_WARMUP = 2
CALIBRATION_REPEATS = 5


def _compute_pass_s(work: Workload, x: torch.Tensor, y: torch.Tensor, device) -> float:
    """One forward + backward of the whole model, no communication."""
    model = nn.Sequential(*work.layers)
    cuda = device.type == "cuda"
    start = time.perf_counter()
    work.loss(model(x), y).backward()
    if cuda:
        torch.cuda.synchronize(device)
    elapsed = time.perf_counter() - start
    for p in model.parameters():
        p.grad = None
    return elapsed


def calibrate_contention(work: Workload, cfg: RunConfig, rank: int, world_size: int, device) -> dict:
    """How much slower compute gets when every rank computes at once: the whole
    model's forward + backward (at batch / ranks samples), first on each rank alone
    while the others wait, then on all ranks together. On a CPU the ranks share
    cores, caches and memory bandwidth, which the profile (one process) cannot see.
    Returns median times: {"alone_s", "together_s"} for this rank."""
    layers = [layer.to(device) for layer in copy.deepcopy(list(work.layers))]
    local = Workload(work.name, layers, work.make_batch, work.loss)
    gen = torch.Generator().manual_seed(cfg.seed + 1 + rank)
    x, y = (t.to(device) for t in work.make_batch(cfg.batch_size // world_size, gen))
    reps = CALIBRATION_WARMUP + CALIBRATION_REPEATS
    alone: list[float] = []
    for turn in range(world_size):
        dist.barrier()
        if turn == rank:
            alone = [_compute_pass_s(local, x, y, device) for _ in range(reps)]
        dist.barrier()
    together = []
    for _ in range(reps):
        dist.barrier()
        together.append(_compute_pass_s(local, x, y, device))
    med = statistics.median
    return {"alone_s": med(alone[CALIBRATION_WARMUP:]), "together_s": med(together[CALIBRATION_WARMUP:])}


def _rank_main(rank: int, world_size: int, cfg: RunConfig) -> dict:
    """One rank: the contention calibration, then every strategy in turn; returns
    the calibration and per strategy the step times of all ranks (gathered)."""
    device = torch.device("cuda", rank) if cfg.backend == "nccl" else torch.device("cpu")
    work = cfg.workload.build()
    results: dict = {"calibration": calibrate_contention(work, cfg, rank, world_size, device)}
    for name in cfg.strategies:
        step, update = build_step(name, work, cfg, rank, device)
        times = torch.tensor(_time_steps(step, update, cfg, device), dtype=torch.float64, device=device)
        gathered = [torch.empty_like(times) for _ in range(world_size)]
        dist.all_gather(gathered, times)
        results[name] = [g.cpu().tolist() for g in gathered]
    return results


@dataclass(frozen=True)
class RunResult:
    """Step times per strategy, and the compute slowdown when all ranks compute at
    once (median over ranks of together / alone)."""

    measured: dict[str, Measurement]
    contention_factor: float
    alone_s: tuple[float, ...]
    together_s: tuple[float, ...]


def run_strategies(cfg: RunConfig) -> RunResult:
    """Spawn the ranks, calibrate, run every strategy of `cfg`; step times are the
    slowest rank's per step, in the order of `cfg.strategies`."""
    per_rank = run_ranks(
        _rank_main, (cfg,), world_size=WORLD_SIZE, backend=cfg.backend,
        threads_per_rank=cfg.threads_per_rank, timeout_s=cfg.timeout_s,
    )
    raw = per_rank[0]
    alone = tuple(r["calibration"]["alone_s"] for r in per_rank)
    together = tuple(r["calibration"]["together_s"] for r in per_rank)
    factor = statistics.median(t / a for t, a in zip(together, alone, strict=True))
    return RunResult(
        {name: summarise(name, raw[name]) for name in cfg.strategies}, float(factor), alone, together
    )

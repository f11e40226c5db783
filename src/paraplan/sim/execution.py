"""An execution model and its one-iteration run: what a training step is made of, as
data, and the engine that executes it.

The builders (`paraplan.predict.build` for transformer runs) turn a model, a
cluster and run settings into an `ExecutionModel`; nothing here knows what a
transformer is. One pipeline is described (every data-parallel replica runs the
same ops at the same times), by pipeline rank:

- `costs`: per virtual stage, the forward and backward op durations of one
  micro-batch (backward includes recomputation; with a split-backward schedule,
  `wgt_s` is the weight-gradient part) and the transfer times between stages;
- `grad_sync`: the data-parallel gradient reduction of each rank, as buckets that
  become ready during the rank's last backward of the iteration (`ready_fraction`
  of that op's span, per model chunk); reduced one after another on the
  communication stream, either after all compute (`overlap_grad_reduce` off) or as
  soon as each bucket is ready;
- `after_sync_s`: what follows the reduction on each rank before the next iteration
  can start (tied-embedding gradient exchange, optimizer step, weight all-gather of
  a sharded optimizer that is not overlapped);
- memory per rank: weights, gradients and optimizer state, activations per
  micro-batch of each model chunk (held from its forward until its backward ends,
  so the schedule's order gives the peak), and a transient working set.

`run_iteration` runs the schedule's op orders through `paraplan.sim.engine.execute`
and adds the reduction and the tail; the iteration time is the latest rank's end.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from paraplan.core.errors import StrategyError
from paraplan.core.timeline import KINDS, Timeline
from paraplan.sim.engine import PipelineCosts, execute, execute_flushed
from paraplan.sim.pipeline import COMM, concat_columns, run_columns, transfer_columns
from paraplan.sim.schedules import BWD, FWD, WGT, OpOrder, cached_orders, get_schedule

ALLREDUCE = KINDS.index("allreduce")
OPTIMIZER = KINDS.index("optimizer")


@dataclass(frozen=True, eq=False)
class GradSync:
    """One pipeline rank's gradient reduction: bucket times in the order the buckets
    become ready, the model chunk each belongs to and when in that chunk's last
    backward op it is ready (0: at its start, 1: at its end)."""

    bucket_s: np.ndarray
    chunk: np.ndarray
    ready_fraction: np.ndarray

    @staticmethod
    def none() -> GradSync:
        return GradSync(np.zeros(0), np.zeros(0, dtype=np.int64), np.zeros(0))

    @property
    def total_s(self) -> float:
        return float(self.bucket_s.sum())


@dataclass(frozen=True, eq=False)
class RankMemory:
    """Bytes on one device of a pipeline rank."""

    weights_bytes: float
    gradients_bytes: float
    optimizer_bytes: float
    activation_bytes_per_chunk: np.ndarray  # per micro-batch, per model chunk
    working_bytes: float = 0.0  # transient peak on top (recomputed layer, logits, buffers)

    @property
    def weight_state_bytes(self) -> float:
        return self.weights_bytes + self.gradients_bytes + self.optimizer_bytes


@dataclass(frozen=True, eq=False)
class ExecutionModel:
    """One iteration of one pipeline, ready to execute (see the module doc)."""

    schedule: str
    pipeline_stages: int
    virtual_stages: int
    microbatches: int
    costs: PipelineCosts
    grad_sync: tuple[GradSync, ...]  # per pipeline rank
    overlap_grad_reduce: bool
    after_sync_s: np.ndarray  # per pipeline rank
    memory: tuple[RankMemory, ...]  # per pipeline rank
    samples_per_iteration: int
    num_devices: int

    def __post_init__(self) -> None:
        p, v = self.pipeline_stages, self.virtual_stages
        if self.costs.num_virtual_stages != p * v:
            raise StrategyError(f"costs describe {self.costs.num_virtual_stages} virtual stages, need {p * v}")
        if len(self.grad_sync) != p or len(self.memory) != p or self.after_sync_s.shape != (p,):
            raise StrategyError(f"grad_sync, memory and after_sync_s need one entry per pipeline rank ({p})")


@dataclass(frozen=True, eq=False)
class IterationResult:
    """The answer for one iteration."""

    iteration_s: float
    bubble_fraction: float  # idle share of the ranks' compute stream over the iteration
    peak_memory_bytes: np.ndarray  # per pipeline rank
    activation_peak_bytes: np.ndarray  # per pipeline rank
    inflight_microbatches: np.ndarray  # per pipeline rank: peak micro-batches held (chunks counted apart)
    exposed_sync_s: np.ndarray  # per pipeline rank: reduction time past the compute
    timeline: Timeline | None  # None when not asked for


def _activation_peak(order: OpOrder, chunk_bytes: np.ndarray, free_kind: int) -> tuple[float, int]:
    """Peak activation bytes and micro-batch count held as `order` runs."""
    if not len(order):
        return 0.0, 0
    is_fwd = order.kind == FWD
    is_free = order.kind == free_kind
    act = chunk_bytes[order.chunk]
    held = np.cumsum(np.where(is_fwd, act, np.where(is_free, -act, 0.0)))
    count = np.cumsum(np.where(is_fwd, 1, np.where(is_free, -1, 0)))
    return float(held.max()), int(count.max())


def _sync_end(run, rank: int, p: int, sync: GradSync, grad_kind: int, last_mb: int,
              compute_end: float, overlap: bool) -> tuple[float, list[tuple[float, float]]]:
    """When the rank's reduction ends, and its bucket events (start, end)."""
    if sync.bucket_s.size == 0:
        return compute_end, []
    if not overlap:
        ends = compute_end + np.cumsum(sync.bucket_s)
        starts = ends - sync.bucket_s
        return float(ends[-1]), list(zip(starts.tolist(), ends.tolist(), strict=True))
    ready = np.empty(sync.bucket_s.shape[0])
    for chunk in np.unique(sync.chunk):
        vs = int(chunk) * p + rank
        sel = (run.vstage == vs) & (run.kind == grad_kind) & (run.microbatch == last_mb)
        op_start, op_end = float(run.start_s[sel][0]), float(run.end_s[sel][0])
        mask = sync.chunk == chunk
        ready[mask] = op_start + (op_end - op_start) * sync.ready_fraction[mask]
    clock = -np.inf
    events = []
    for rdy, dur in sorted(zip(ready.tolist(), sync.bucket_s.tolist(), strict=True)):
        start = max(rdy, clock)
        clock = start + dur
        events.append((start, clock))
    return max(compute_end, clock), events


@dataclass(frozen=True, eq=False)
class _Tail:
    compute_end_s: np.ndarray  # per rank
    sync_end_s: np.ndarray
    end_s: np.ndarray
    events: tuple[tuple[int, int, float, float], ...]  # (rank, kind, start, end) on the comm stream


def _tail(model: ExecutionModel, run, grad_kind: int) -> _Tail:
    """Per rank: when its compute, its gradient reduction and its iteration end."""
    p, m = model.pipeline_stages, model.microbatches
    compute_end = np.zeros(p)
    np.maximum.at(compute_end, run.device, run.end_s)
    sync_end = np.zeros(p)
    events: list[tuple[int, int, float, float]] = []
    for s in range(p):
        sync_end[s], buckets = _sync_end(run, s, p, model.grad_sync[s], grad_kind, m - 1, float(compute_end[s]),
                                         model.overlap_grad_reduce)
        events.extend((s, ALLREDUCE, a, b) for a, b in buckets)
        if model.after_sync_s[s] > 0:
            events.append((s, OPTIMIZER, float(sync_end[s]), float(sync_end[s] + model.after_sync_s[s])))
    return _Tail(compute_end, sync_end, sync_end + model.after_sync_s, tuple(events))


RECURRENCE_MIN_OPS = 2048  # below this the event loop is as fast


def _execute(model: ExecutionModel):
    """The engine's run of one iteration: 1F1B and GPipe with one chunk per device as an
    array recurrence when large, every other schedule by the event loop."""
    p, m, v = model.pipeline_stages, model.microbatches, model.virtual_stages
    if v == 1 and p > 1 and model.schedule in ("1f1b", "gpipe") and 2 * p * m >= RECURRENCE_MIN_OPS:
        return execute_flushed(p, m, model.costs, gpipe=model.schedule == "gpipe")
    return execute(cached_orders(model.schedule, p, m, 1, v), model.costs, m)


def iteration_time_s(model: ExecutionModel) -> float:
    """The iteration time alone (what a calibration evaluates thousands of times)."""
    sched = get_schedule(model.schedule)
    return float(_tail(model, _execute(model), WGT if sched.split_backward else BWD).end_s.max())


def run_iteration(model: ExecutionModel, timeline: bool = True) -> IterationResult:
    """Execute one iteration (see the module doc); `timeline=False` skips building the
    events (a calibration evaluates thousands of iterations)."""
    p, v, m = model.pipeline_stages, model.virtual_stages, model.microbatches
    sched = get_schedule(model.schedule)
    orders = cached_orders(model.schedule, p, m, 1, v)
    run = _execute(model)
    grad_kind = WGT if sched.split_backward else BWD
    tail = _tail(model, run, grad_kind)
    exposed = tail.sync_end_s - tail.compute_end_s
    comm_events = tail.events
    iteration = float(tail.end_s.max())
    busy = run.busy_s()
    bubble = float(1.0 - busy.sum() / (p * iteration)) if iteration > 0 else 0.0

    free_kind = WGT if sched.split_backward else BWD
    act_peak = np.zeros(p)
    inflight = np.zeros(p, dtype=np.int64)
    peak = np.zeros(p)
    for s in range(p):
        mem = model.memory[s]
        act_peak[s], inflight[s] = _activation_peak(orders[s], np.asarray(mem.activation_bytes_per_chunk, float),
                                                    free_kind)
        peak[s] = mem.weight_state_bytes + act_peak[s] + mem.working_bytes

    if not timeline:
        return IterationResult(iteration, bubble, peak, act_peak, inflight, exposed, None)
    cols = concat_columns([run_columns(run, sched.split_backward), transfer_columns(run, model.costs)])
    if comm_events:
        ev = np.array(comm_events, dtype=float)
        n = ev.shape[0]
        cols = concat_columns([cols, {
            "device": ev[:, 0].astype(np.int32), "stream": np.full(n, COMM, dtype=np.int8),
            "kind": ev[:, 1].astype(np.int8), "stage": ev[:, 0].astype(np.int32),
            "microbatch": np.full(n, -1, dtype=np.int32), "start_s": ev[:, 2], "end_s": ev[:, 3],
        }])
    events = Timeline(
        **cols,
        step_time_s=iteration,
        batch_size=model.samples_per_iteration,
        num_devices=model.num_devices,
        speedup=float("nan"),
        bubble_fraction=bubble,
        peak_mem_bytes=tuple(float(x) for x in peak),
        schedule=model.schedule if p > 1 else "",
        microbatches=m,
    )
    return IterationResult(iteration, bubble, peak, act_peak, inflight, exposed, events)

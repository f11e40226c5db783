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
  soon as each bucket is ready, then slowing the compute beside them by
  the model's `grad_bucket_overlap_share` x the time they ran side by side (`overlap_cost`);
- `after_sync_s`: what follows the reduction on each rank before the next iteration
  can start (tied-embedding gradient exchange, optimizer step, weight all-gather of
  a sharded optimizer that is not overlapped);
- memory per rank: weights, gradients and optimizer state, activations per
  micro-batch of each model chunk (held from its forward until its backward ends,
  so the schedule's order gives the peak), and the working set each kind of op adds
  while it runs (`paraplan.sim.iteration_memory`: the peak is the largest moment).

`run_iteration` runs the schedule's op orders through `paraplan.sim.engine.execute`
and adds the reduction and the tail; the iteration time is the latest rank's end.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from paraplan.core.errors import StrategyError
from paraplan.core.glossary import NO_MICROBATCH, EventKindCode, StreamCode
from paraplan.core.timeline import Timeline, TimelineColumns, timeline_columns
from paraplan.sim.dualpipe import DualPipeCosts
from paraplan.sim.engine import PipelineCosts, PipelineRun, execute, execute_flushed
from paraplan.sim.engine_batch import execute_batch
from paraplan.sim.iteration_memory import MemoryAtPeak, memory_peaks
from paraplan.sim.overlap_cost import contended_end_s, overlap_with_ops_s, pair_added_s
from paraplan.sim.p3 import p3_steady_state
from paraplan.sim.param_gather_run import ChunkGathers, run_gathers
from paraplan.sim.pipeline import concat_columns, run_columns, transfer_columns
from paraplan.sim.schedules import BWD, WGT, Schedule, cached_orders, get_schedule


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
    working_bytes: float = 0.0
    """Transient bytes on top (recomputed layer, loss, buffers): the largest of
    `working_bytes_per_op` where given, else added at the activation peak."""
    lazy_gradient_bytes_per_chunk: np.ndarray | None = None
    """Per model chunk: gradients allocated by the chunk's first backward op and held to
    the iteration's end (autograd's unsharded gradients under FSDP, accumulated over the
    micro-batches: `paraplan.predict.fsdp_ops`; FSDP2's sharded ones, freed by `zero_grad`
    before the forward: `paraplan.predict.rank_state`); None: none beyond the weight state."""
    kept_output_bytes_per_chunk: np.ndarray | None = None
    """Per model chunk: bytes each micro-batch's forward allocates that stay held to the
    iteration's end, past its backward (`torch.distributed.pipelining` keeps every
    stage's outputs: `paraplan.predict.torch_pipelining`); None: none."""
    kept_input_grad_bytes_per_chunk: np.ndarray | None = None
    """Per model chunk: bytes each micro-batch's backward allocates that stay held to the
    iteration's end (the input gradients left in `torch.distributed.pipelining`'s
    receive buffers); None: none."""
    iteration_end_bytes: float = 0.0
    """Bytes beside the weight state alone for a moment after the last backward (no
    activation, the accumulated gradients reduced): `torch.distributed.pipelining`'s
    buffers, kept outputs and input gradients and the last stage's concatenated output
    (`paraplan.predict.torch_pipelining`)."""

    working_bytes_per_op: np.ndarray | None = None
    """[forward, backward] x model chunk: the working set while an op of that kind and
    chunk runs (a split backward's weight-gradient op counts as a backward), each at most
    `working_bytes`; the engine adds it to what the schedule holds at that op's ends
    (`paraplan.sim.rank_peak.peak_at_ops`). None: `working_bytes` on top of the activation peak, whenever that is."""

    @property
    def weight_state_bytes(self) -> float:
        return self.weights_bytes + self.gradients_bytes + self.optimizer_bytes


@dataclass(frozen=True, eq=False)
class P3Costs:
    """Per-layer times for P3 gradient synchronisation (`paraplan.sim.p3`): forward and
    backward of one micro-batch and each layer's gradient all-reduce."""

    layer_fwd_s: np.ndarray
    layer_bwd_s: np.ndarray
    layer_allreduce_s: np.ndarray


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
    iterations: int = 1  # iterations the timeline shows; no-flush schedules run >= 2 for their period
    p3: P3Costs | None = None  # P3 gradient synchronisation instead of grad_sync (one rank only)
    dualpipe: DualPipeCosts | None = None
    """DualPipe's per-stage costs (`paraplan.sim.dualpipe`): with them `costs` is unused
    and each rank's `memory` and `grad_sync` cover its two chunks."""
    grad_bucket_overlap_share: float = 0.0
    """The share of the time a gradient bucket runs beside the rank's compute that the
    compute loses to it (`paraplan.sim.overlap_cost`; the data-parallel group's occupancy
    share, `paraplan.predict.overlap_share`, or the calibration's `comm_overlap_contention`
    on a device without an SM count); 0: hidden for free."""
    param_gather: ChunkGathers | None = None
    """q9: the interleaved schedule's per-chunk weight all-gathers (`overlap_param_gather`),
    placed on the run (`paraplan.sim.param_gather_run`); their time lands on each rank's end."""

    def __post_init__(self) -> None:
        p, v = self.pipeline_stages, self.virtual_stages
        if self.iterations < 1:
            raise StrategyError(f"iterations must be >= 1, got {self.iterations}")
        if self.p3 is not None and (p != 1 or v != 1):
            raise StrategyError("P3 gradient synchronisation runs without pipelining (one rank, one chunk)")
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
    memory_at_peak: MemoryAtPeak  # per pipeline rank: the parts of peak_memory_bytes


def _sync_end(run, rank: int, p: int, sync: GradSync, last_grad_op: dict[int, int],
              compute_end: float, overlap: bool, with_events: bool = True,
              contention: float = 0.0) -> tuple[float, list[tuple[float, float]]]:
    """When the rank's reduction ends (with its compute slowed by `contention` x the time
    the buckets ran beside it, `overlap_cost`), and its bucket events (start, end;
    none unless `with_events`). `last_grad_op`: per virtual stage, the run's index of its
    last micro-batch's gradient op (`_last_grad_ops`)."""
    if sync.bucket_s.size == 0:
        return compute_end, []
    if not overlap:
        ends = compute_end + np.cumsum(sync.bucket_s)
        if not with_events:
            return float(ends[-1]), []
        starts = ends - sync.bucket_s
        return float(ends[-1]), list(zip(starts.tolist(), ends.tolist(), strict=True))
    ready = np.empty(sync.bucket_s.shape[0])
    for chunk in np.unique(sync.chunk):
        j = last_grad_op[int(chunk) * p + rank]
        op_start, op_end = float(run.start_s[j]), float(run.end_s[j])
        mask = sync.chunk == chunk
        ready[mask] = op_start + (op_end - op_start) * sync.ready_fraction[mask]
    clock = -np.inf
    events = []
    for rdy, dur in sorted(zip(ready.tolist(), sync.bucket_s.tolist(), strict=True)):
        start = max(rdy, clock)
        clock = start + dur
        events.append((start, clock))
    if contention <= 0.0:
        return max(compute_end, clock), events
    mine = run.device == rank
    span = np.array(events)
    beside = overlap_with_ops_s(span[:, 0], span[:, 1], run.start_s[mine], run.end_s[mine])
    return contended_end_s(clock, compute_end, beside, contention), events


def _last_grad_ops(run, grad_kind: int, last_mb: int) -> dict[int, int]:
    """Per virtual stage: the run's index of the first op of kind `grad_kind` on micro-batch
    `last_mb` (the op whose end makes the stage's gradients ready), found once per run."""
    out: dict[int, int] = {}
    hits = np.flatnonzero((run.kind == grad_kind) & (run.microbatch == last_mb))
    for j, vs in zip(hits.tolist(), run.vstage[hits].tolist(), strict=True):
        out.setdefault(vs, j)
    return out


@dataclass(frozen=True, eq=False)
class _Tail:
    compute_end_s: np.ndarray  # per rank
    sync_end_s: np.ndarray
    end_s: np.ndarray
    events: tuple[tuple[int, int, float, float], ...]  # (rank, kind, start, end) on the comm stream
    param_gather_s: np.ndarray | None = None  # q9: per rank, what the chunk gathers add (`param_gather_run`)


def _tail(model: ExecutionModel, run, grad_kind: int, iterations: int = 1, with_events: bool = True) -> _Tail:
    """Per rank: when its compute, its gradient reduction and its iteration end (after
    the last of `iterations` iterations); the comm stream's events unless not `with_events`."""
    p, m = model.pipeline_stages, model.microbatches * iterations
    compute_end = np.zeros(p)
    np.maximum.at(compute_end, run.device, run.end_s)
    sync_end = np.zeros(p)
    events: list[tuple[int, int, float, float]] = []
    last_grad_op = _last_grad_ops(run, grad_kind, m - 1)
    for s in range(p):
        sync_end[s], buckets = _sync_end(run, s, p, model.grad_sync[s], last_grad_op, float(compute_end[s]),
                                         model.overlap_grad_reduce, with_events, model.grad_bucket_overlap_share)
        if not with_events:
            continue
        events.extend((s, EventKindCode.ALLREDUCE, a, b) for a, b in buckets)
        if model.after_sync_s[s] > 0:
            events.append((s, EventKindCode.OPTIMIZER, float(sync_end[s]), float(sync_end[s] + model.after_sync_s[s])))
    if model.param_gather is None or iterations != 1:  # q9: the interleaved chunks' gathers, on the run
        return _Tail(compute_end, sync_end, sync_end + model.after_sync_s, tuple(events))
    placed = run_gathers(model.param_gather, run, p)
    gather = np.array([g.added_s for g in placed])
    if with_events:
        events.extend((s, EventKindCode.ALLGATHER, a, b) for s, g in enumerate(placed)
                      for a, b in zip(g.start_s.tolist(), g.end_s.tolist(), strict=True) if b > a)
    return _Tail(compute_end, sync_end, sync_end + model.after_sync_s + gather, tuple(events), gather)


RECURRENCE_MIN_OPS = 2048  # below this the event loop is as fast


def _execute(model: ExecutionModel, iterations: int = 1):
    """The engine's run of `iterations` iterations: 1F1B and GPipe with one chunk per
    device as an array recurrence when large, every other schedule by the event loop."""
    p, m, v = model.pipeline_stages, model.microbatches, model.virtual_stages
    if (iterations == 1 and v == 1 and p > 1 and model.schedule in ("1f1b", "gpipe")
            and 2 * p * m >= RECURRENCE_MIN_OPS):
        return execute_flushed(p, m, model.costs, gpipe=model.schedule == "gpipe")
    return execute(cached_orders(model.schedule, p, m, iterations, v), model.costs, m * iterations)


def iteration_time_s(model: ExecutionModel) -> float:
    """The iteration time alone (what a calibration evaluates thousands of times)."""
    if model.dualpipe is not None:  # v5-dualpipe
        return run_iteration(model, timeline=False).iteration_s
    sched = get_schedule(model.schedule)
    if model.p3 is not None or not sched.flush:
        return run_iteration(model, timeline=False).iteration_s
    return float(_tail(model, _execute(model), WGT if sched.split_backward else BWD, with_events=False).end_s.max())


BATCH_MIN_RUNS = 4
"""Pipelines of one shape that `iteration_times_s` runs together (fewer: one by one)."""


def iteration_times_s(models: Sequence[ExecutionModel]) -> np.ndarray:
    """`[iteration_time_s(m) for m in models]`, byte-identical, with the pipelines of
    each shape (schedule, stages, micro-batches, chunks) that the event loop runs
    executed together (`paraplan.sim.engine_batch`): what a calibration evaluates."""
    out = np.empty(len(models))
    shapes: dict[tuple[str, int, int, int], list[int]] = {}
    for i, model in enumerate(models):
        if _batchable(model):
            shapes.setdefault((model.schedule, model.pipeline_stages, model.microbatches, model.virtual_stages),
                              []).append(i)
        else:
            out[i] = iteration_time_s(model)
    for (schedule, p, m, v), members in shapes.items():
        if len(members) < BATCH_MIN_RUNS:
            for i in members:
                out[i] = iteration_time_s(models[i])
            continue
        grad_kind = WGT if get_schedule(schedule).split_backward else BWD
        runs = execute_batch(cached_orders(schedule, p, m, 1, v), [models[i].costs for i in members], m)
        for i, run in zip(members, runs, strict=True):
            out[i] = float(_tail(models[i], run, grad_kind, with_events=False).end_s.max())
    return out


def _batchable(model: ExecutionModel) -> bool:
    """Whether `iteration_time_s` runs the model's one iteration through the event loop
    (`_execute`) and times it from the run's tail."""
    if model.dualpipe is not None or model.p3 is not None or not get_schedule(model.schedule).flush:
        return False
    p, m, v = model.pipeline_stages, model.microbatches, model.virtual_stages
    return not (v == 1 and p > 1 and model.schedule in ("1f1b", "gpipe") and 2 * p * m >= RECURRENCE_MIN_OPS)


@dataclass(frozen=True, eq=False)
class RankEnds:
    """Per pipeline rank of a flushed schedule: compute time, and when its compute, its
    gradient reduction and its iteration end."""

    busy_s: np.ndarray
    compute_end_s: np.ndarray
    sync_end_s: np.ndarray
    end_s: np.ndarray
    param_gather_s: np.ndarray | None = None  # q9: in end_s, the interleaved chunk gathers (`param_gather_run`)


def rank_ends(model: ExecutionModel) -> RankEnds:
    """Where each rank's iteration time goes (what `paraplan predict --explain` splits);
    flushed schedules only (their iteration is the latest rank's end)."""
    if model.dualpipe is not None:  # v5-dualpipe
        from paraplan.sim.dualpipe_iteration import dualpipe_rank_ends
        return dualpipe_rank_ends(model)
    sched = get_schedule(model.schedule)
    if not sched.flush or model.p3 is not None:
        raise StrategyError(f"schedule '{model.schedule}' runs iterations as one stream; its time has no per-rank end")
    run = _execute(model)
    tail = _tail(model, run, WGT if sched.split_backward else BWD)
    return RankEnds(run.busy_s()[:model.pipeline_stages], tail.compute_end_s, tail.sync_end_s, tail.end_s,
                    tail.param_gather_s)


def run_iteration(model: ExecutionModel, timeline: bool = True) -> IterationResult:
    """Execute the model (see the module doc); `timeline=False` skips building the
    events (a calibration evaluates thousands of iterations).

    A flushed schedule's iteration is one run (with `iterations` > 1 the timeline
    repeats it, shifted by whole iterations). A no-flush schedule (2BW) runs
    max(2, `iterations`) iterations as one stream; its iteration time is the steady
    period ((makespan of K - makespan of one) / (K - 1)), its gradient reduction beside
    the next iteration, the pair max + contention x min (`overlap_cost`). With `p3`, the single rank
    runs P3's per-layer synchronisation (`paraplan.sim.p3`). DualPipe runs in its own
    engine (`paraplan.sim.dualpipe_iteration`)."""
    if model.dualpipe is not None:  # v5-dualpipe
        from paraplan.sim.dualpipe_iteration import run_dualpipe_iteration
        return run_dualpipe_iteration(model, timeline)
    sched = get_schedule(model.schedule)
    timing = _iteration_timing(model, sched)
    memory = memory_peaks(model, sched)
    exposed = timing.tail.sync_end_s - timing.tail.compute_end_s
    events = _iteration_timeline(model, sched, timing, memory.peak_bytes) if timeline else None
    return IterationResult(timing.iteration_s, timing.bubble_fraction, memory.peak_bytes, memory.activation_bytes,
                           memory.inflight_microbatches, exposed, events, memory.at_peak)


@dataclass(frozen=True, eq=False)
class _Timing:
    """What the engine's run of an iteration gives: the run, its tail, the iteration
    time and bubble, and the comm-stream events (P3's own columns instead, with `p3`)."""

    run: PipelineRun
    tail: _Tail
    iterations_run: int
    iteration_s: float
    bubble_fraction: float
    comm_events: tuple[tuple[int, int, float, float], ...]  # (rank, kind, start, end)
    p3_columns: TimelineColumns | None


def _iteration_timing(model: ExecutionModel, sched: Schedule) -> _Timing:
    """Run the iteration (a no-flush schedule: as many as its period needs, see
    `run_iteration`) and time it."""
    p, m = model.pipeline_stages, model.microbatches
    grad_kind = WGT if sched.split_backward else BWD
    iters = 1 if sched.flush else max(2, model.iterations)
    run = _execute(model, iters)
    tail = _tail(model, run, grad_kind, iters)
    comm_events = tail.events
    busy = run.busy_s()
    if sched.flush:
        iteration = float(tail.end_s.max())
        busy_per_iteration = busy
    else:
        one = _execute(model, 1).makespan_s
        period = (run.makespan_s - one) / (iters - 1)
        reduce_s = max(g.total_s for g in model.grad_sync)  # beside the next iteration's compute
        iteration = period + float(pair_added_s(reduce_s, period, model.grad_bucket_overlap_share))
        busy_per_iteration = busy / iters
    bubble = float(1.0 - busy_per_iteration.sum() / (p * iteration)) if iteration > 0 else 0.0
    p3_cols = None
    if model.p3 is not None:
        c = model.p3
        p3_cols, iteration = p3_steady_state(c.layer_fwd_s, c.layer_bwd_s, c.layer_allreduce_s, m,
                                             max(2, model.iterations))
        busy_one = m * float(c.layer_fwd_s.sum() + c.layer_bwd_s.sum())
        bubble = float(1.0 - busy_one / iteration) if iteration > 0 else 0.0
        comm_events = ()
    return _Timing(run, tail, iters, iteration, bubble, comm_events, p3_cols)


def _iteration_timeline(model: ExecutionModel, sched: Schedule, timing: _Timing, peak: np.ndarray) -> Timeline:
    """The iteration's events: compute ops and transfers (or P3's columns), the
    gradient buckets and after-sync steps on the comm stream, repeated over
    `model.iterations` for a flushed schedule."""
    p, m = model.pipeline_stages, model.microbatches
    if timing.p3_columns is not None:
        cols = timing.p3_columns
        shown = max(2, model.iterations)
    else:
        cols = concat_columns([run_columns(timing.run, sched.split_backward, model.costs),
                               transfer_columns(timing.run, model.costs)])
        shown = timing.iterations_run
    if timing.comm_events:
        ev = np.array(timing.comm_events, dtype=float)
        n = ev.shape[0]
        cols = concat_columns([cols, timeline_columns({
            "device": ev[:, 0].astype(np.int32), "stream": np.full(n, StreamCode.COMM, dtype=np.int8),
            "kind": ev[:, 1].astype(np.int8), "stage": ev[:, 0].astype(np.int32),
            "microbatch": np.full(n, NO_MICROBATCH, dtype=np.int32), "start_s": ev[:, 2], "end_s": ev[:, 3],
        })])
    if sched.flush and model.iterations > 1 and timing.p3_columns is None:
        cols = repeat_iterations(cols, model.iterations, timing.iteration_s, m)
        shown = model.iterations
    return Timeline(
        **cols,
        step_time_s=timing.iteration_s,
        batch_size=model.samples_per_iteration,
        num_devices=model.num_devices,
        speedup=float("nan"),
        bubble_fraction=timing.bubble_fraction,
        peak_mem_bytes=tuple(float(x) for x in peak),
        schedule=model.schedule if p > 1 else "",
        microbatches=m,
        iterations=shown,
    )


def repeat_iterations(cols: Mapping[str, Any], iterations: int, step_s: float, microbatches: int) -> TimelineColumns:
    """Flushed iterations are identical: iteration e is iteration 0 shifted by e steps
    (micro-batches renumbered e x M + i)."""
    n = cols["start_s"].shape[0]
    e = np.repeat(np.arange(iterations), n)
    out = {k: np.tile(a, iterations) for k, a in cols.items()}
    out["start_s"] = out["start_s"] + e * step_s
    out["end_s"] = out["end_s"] + e * step_s
    has_mb = out["microbatch"] >= 0
    out["microbatch"] = np.where(has_mb, out["microbatch"] + e * microbatches, NO_MICROBATCH).astype(np.int32)
    return timeline_columns(out)

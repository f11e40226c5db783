"""One training step of any D x T x P strategy on a layer profile: the profile's step
as an execution model (`profile_execution`), executed by `paraplan.sim.execution`
(the same runner transformer predictions use), its events copied to every device.
Facts of a real run that the profile cannot know (contention, reductions that cannot
overlap, which layers tensor parallelism splits, gradient accumulation) are
`RunConditions`: inputs of the execution model.

How each kind of parallelism is costed (all times from the profile and the
`CommModel`; nothing here knows DistIR's compatibility rules):

- Pipeline (P): layers split into stages (even, or `stage_boundaries`); with
  `interleaved_1f1b`, into P x v virtual stages (even only). The schedule's op
  orders run in `engine.execute`. A transfer between neighbouring stages moves
  the boundary activation (forward) and its gradient (backward) of one
  micro-batch and costs `comm.time_s("send_recv", bytes, Group(2, nodes))`, nodes
  = 2 when any replica pair of the two stages sits on different nodes; a
  CommModel that does not know `send_recv` falls back to the cluster's link.
  With T > 1 every tensor rank sends the full activation to its partner, in
  parallel; transfers never contend with each other.
- Data (D, or per-stage replicas r_s): every micro-batch is split over the
  stage's r_s replicas (DAPPLE), so a replica computes batch / (M r_s) samples
  per micro-batch. Gradients (the stage's parameters / T) are all-reduced over
  Group(r_s, nodes spanned): either once after the stage's last backward (no
  overlap; `strategy.gradient_sync == "end"`), or with `"overlap"` in buckets of
  `grad_bucket_bytes` that start as soon as the last micro-batch's backward has
  produced them (layers finish in reverse order, in proportion to their
  backward time) and run one after another on the comm stream.
- P3 (`"p3"`, priority-based parameter propagation; P = 1 only): every layer's
  gradient (parameters / T) is all-reduced on its own (one `all_reduce` of the
  layer's bytes, no buckets), ready when that layer's backward of the last
  micro-batch ends. The comm stream serves the lowest-numbered pending layer first
  and preempts at any point (preempt-resume: P3's parameter slices taken small
  enough that a layer never waits for a slice of a later layer in flight; each
  layer's latency is paid once). The next iteration's first forward runs layer by
  layer, layer l starting only once layers 0..l are synchronised (the later micro-
  batches of gradient accumulation follow it). The comm stream is empty when an
  iteration's last backward starts (every all-reduce gates some forward before
  it), so iterations repeat exactly from there: the step is the period of the last
  of max(2, `iterations`) simulated iterations, and the timeline shows them all,
  with per-layer compute folded into micro-batch ops (the gated forward is split
  where it waits). Backward is one op per layer here (a split-backward schedule's
  W is not separated; with P = 1 it changes no time).
- Tensor (T, Megatron): the batch-proportional part of every layer's time is
  divided by T (fixed per-call time stays). Each layer carries a count of
  activation all-reduces (`tp_allreduces`, per layer; default 1 on every second
  layer, i.e. one per 2-layer MLP pair; give 2 per layer for a transformer-block
  layer: attention and MLP); each costs one all_reduce of the layer's output
  activation over Group(T, nodes) in forward and one in backward, blocking the
  compute stream (they are folded into the F and B op times). The profile's
  `meta["tp_allreduces"]` (a list, one count per layer) is used when given.
- Memory per device: parameters x weight versions (2 for no-flush schedules) +
  gradients + optimizer state (`optimizer_state_factor` x parameters), all / T,
  plus the peak of activations in flight as the schedule orders them (a micro-
  batch's stage activations are held from its F until its last backward op).
- Speedup: the same batch on one device with no communication.

A flushed schedule's step is one iteration (with `strategy.iterations` > 1 the
events repeat it, shifted by whole steps); a no-flush schedule's (2BW) step is the
steady-state period ((makespan of K >= 2 iterations - makespan of one) / (K - 1)),
its gradient all-reduce hidden behind the next iteration except where it is longer
(the timeline then shows the all-reduce once, after the last iteration).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict, Unpack

import numpy as np

from paraplan.core.cluster import Cluster
from paraplan.core.comm import CommModel, Group
from paraplan.core.errors import StrategyError
from paraplan.core.profile import ModelProfile
from paraplan.core.strategy import Strategy
from paraplan.core.timeline import Timeline, TimelineColumns, timeline_columns
from paraplan.sim.builder.grad_buckets import filled_buckets
from paraplan.sim.builder.placement import (
    StageLayout,
    layout,
    replica_group,
    stages_cross_node,
    tensor_group,
)
from paraplan.sim.builder.rank_memory import ParamState, chunks_by_rank, rank_memory
from paraplan.sim.engine import PipelineCosts
from paraplan.sim.execution import ExecutionModel, GradSync, P3Costs, RankMemory, run_iteration
from paraplan.sim.schedules import Schedule, get_schedule


def default_tp_allreduces(num_layers: int) -> np.ndarray:
    """One all-reduce after every second layer (Megatron's column/row MLP pair)."""
    return (np.arange(num_layers) % 2 == 1).astype(float)


def _p2p_s(comm: CommModel, cluster: Cluster, nbytes: float, cross_node: bool) -> float:
    if nbytes <= 0:
        return 0.0
    try:
        return float(comm.time_s("send_recv", nbytes, Group(2, 2 if cross_node else 1)))
    except (ValueError, KeyError, NotImplementedError):
        link = cluster.inter if cross_node else cluster.intra
        return link.transfer_s(nbytes)


@dataclass(frozen=True)
class RunConditions:
    """Facts of a real run that its profile cannot know, measured or stated by the
    caller (the validate stage); they change what the execution model holds, never
    the engine's answer afterwards.

    - `compute_slowdown`: every compute op takes this factor longer (ranks that share
      a CPU's cores and memory bandwidth while they compute at once);
    - `comm_shares_compute`: gradient reductions cannot run beside compute (gloo
      reduces on the CPU cores the ranks' threads fill), so with `gradient_sync ==
      "overlap"` the buckets run after the last backward instead of beside it;
    - `tp_split`: per layer, whether tensor parallelism splits it (empty: every
      layer); a replicated layer runs its whole batch-proportional time on every rank;
    - `tp_splits_fixed_time`: a split layer's batch-independent time is divided by T
      too (on CPUs it is mostly per-parameter work);
    - `tp_backward_allreduces`: per layer, the tensor-parallel all-reduces its
      backward runs (empty: as many as its forward; the first Linear pair's input
      gradient is not all-reduced when that input is the data);
    - `accumulation_Bps`: > 0 charges each layer's backward its average gradient
      accumulation over the micro-batches, (M - 1) / M x 3 x parameter bytes at this
      bandwidth (read both, write one)."""

    compute_slowdown: float = 1.0
    comm_shares_compute: bool = False
    tp_split: tuple[bool, ...] = ()
    tp_splits_fixed_time: bool = False
    tp_backward_allreduces: tuple[float, ...] = ()
    accumulation_Bps: float = 0.0

    def __post_init__(self) -> None:
        if not self.compute_slowdown > 0 or not np.isfinite(self.compute_slowdown):
            raise StrategyError(f"compute_slowdown must be a finite number > 0, got {self.compute_slowdown}")
        if self.accumulation_Bps < 0 or not np.isfinite(self.accumulation_Bps):
            raise StrategyError(f"accumulation_Bps must be finite and >= 0, got {self.accumulation_Bps}")


@dataclass(frozen=True)
class StepOptions:
    """What a layer profile does not say about how its step trains (the keyword
    arguments of `simulate` and `profile_execution`)."""

    optimizer_state_factor: float = 2.0
    """Optimizer state in parameter bytes (momentum: 1; Adam: 2)."""
    grad_bucket_bytes: float = 25e6
    """Gradient bucket of the `overlap` sync (PyTorch DDP's bucket_cap_mb = 25)."""
    weight_grad_fraction: float = 0.5
    """Share of a backward that is the weight gradient (split-backward schedules)."""
    tp_allreduces: Sequence[float] | None = None
    """Tensor-parallel all-reduces per layer (None: the profile's meta, else every second layer)."""
    conditions: RunConditions = RunConditions()
    """Facts of the real run (`RunConditions`)."""


class StepOptionArgs(TypedDict, total=False):
    """`StepOptions` as keyword arguments."""

    optimizer_state_factor: float
    grad_bucket_bytes: float
    weight_grad_fraction: float
    tp_allreduces: Sequence[float] | None
    conditions: RunConditions


@dataclass(frozen=True, eq=False)
class ProfileExecution:
    """A profile's step as the engine runs it, and where its pipeline ranks live."""

    model: ExecutionModel
    layout: StageLayout
    single_device_s: float  # the same global batch on one device, no communication


@dataclass(frozen=True, eq=False)
class ProfileStep:
    """One step's inputs, checked and resolved: what every build phase reads."""

    profile: ModelProfile
    cluster: Cluster
    comm: CommModel
    strategy: Strategy
    global_batch_size: int
    options: StepOptions
    layout: StageLayout
    samples: np.ndarray  # per pipeline device: samples per replica per micro-batch
    tp_fwd: np.ndarray  # per layer: tensor-parallel all-reduces of its forward
    tp_bwd: np.ndarray  # ... and of its backward
    accumulation_s: np.ndarray  # per layer: gradient accumulation added to its backward

    @property
    def dev_of_vstage(self) -> np.ndarray:
        p = self.strategy.pipeline_model_parallel_size
        return np.arange(p * self.strategy.virtual_pipeline_model_parallel_size) % p


@dataclass(frozen=True, eq=False)
class StageCompute:
    """Per virtual stage and per layer: one micro-batch's compute on one tensor rank
    (tensor-parallel all-reduces folded in) and the activations it holds and sends."""

    fwd_s: np.ndarray  # per virtual stage
    bwd_s: np.ndarray
    layer_fwd_s: np.ndarray  # per layer, on its device (P3 needs layers)
    layer_bwd_s: np.ndarray
    activation_bytes: np.ndarray  # per virtual stage: held per micro-batch (all its layers, / T)
    boundary_bytes: np.ndarray  # per virtual stage: its output activation per replica


def _tp_allreduce_counts(profile: ModelProfile, options: StepOptions) -> tuple[np.ndarray, np.ndarray]:
    """Per layer: tensor-parallel all-reduces of its forward and of its backward."""
    nl = profile.num_layers
    counts: object = options.tp_allreduces
    if counts is None:
        meta_counts = profile.meta.get("tp_allreduces") if profile.meta else None
        counts = meta_counts if meta_counts is not None else default_tp_allreduces(nl)
    tp_fwd = np.asarray(counts, dtype=float)
    if tp_fwd.shape != (nl,):
        raise StrategyError(f"tp_allreduces needs one count per layer ({nl}), got {tp_fwd.shape}")
    backward = options.conditions.tp_backward_allreduces
    tp_bwd = np.asarray(backward, dtype=float) if backward else tp_fwd
    if tp_bwd.shape != (nl,):
        raise StrategyError(f"tp_backward_allreduces needs one count per layer ({nl}), got {tp_bwd.shape}")
    return tp_fwd, tp_bwd


def _micro_batch_samples(strategy: Strategy, global_batch_size: int) -> np.ndarray:
    """Per pipeline device: samples per replica per micro-batch (at least one)."""
    m = strategy.num_microbatches
    reps = np.array(strategy.replicas_per_stage, dtype=float)
    samples = global_batch_size / (m * reps)
    if samples.min() < 1:
        s = int(samples.argmin())
        raise StrategyError(
            f"global batch {global_batch_size} gives {samples[s]:.3g} samples per micro-batch per replica at stage {s} "
            f"({m} micro-batches x {int(reps[s])} replicas); need >= 1"
        )
    return samples


def profile_step(profile: ModelProfile, cluster: Cluster, comm: CommModel, strategy: Strategy,
                 global_batch_size: int, options: StepOptions) -> ProfileStep:
    """Check the step's inputs and resolve what the build phases share."""
    get_schedule(strategy.schedule).check(strategy.pipeline_model_parallel_size, strategy.num_microbatches,
                                          strategy.virtual_pipeline_model_parallel_size)
    nl = profile.num_layers
    lay = layout(strategy, cluster, nl)
    samples = _micro_batch_samples(strategy, global_batch_size)
    conditions = options.conditions
    if conditions.tp_split and len(conditions.tp_split) != nl:
        raise StrategyError(f"tp_split needs one entry per layer ({nl}), got {len(conditions.tp_split)}")
    tp_fwd, tp_bwd = _tp_allreduce_counts(profile, options)
    m = strategy.num_microbatches
    accumulation = np.zeros(nl)
    if conditions.accumulation_Bps > 0 and m > 1:
        accumulation = (m - 1) / m * 3.0 * profile.param_bytes / conditions.accumulation_Bps
    return ProfileStep(profile, cluster, comm, strategy, global_batch_size, options, lay, samples, tp_fwd, tp_bwd,
                       accumulation)


def _layer_times(profile: ModelProfile, batch: float, t: int, lo: int, hi: int,
                 conditions: RunConditions) -> tuple[np.ndarray, np.ndarray]:
    """Per-layer forward and backward time of layers [lo, hi) on one tensor rank at
    `batch` samples, compute only (see RunConditions for the layout rules)."""
    f_fix, b_fix = profile.fwd_fixed_s[lo:hi], profile.bwd_fixed_s[lo:hi]
    f_var = profile.fwd_s_at(batch)[lo:hi] - f_fix
    b_var = profile.bwd_s_at(batch)[lo:hi] - b_fix
    split = np.asarray(conditions.tp_split[lo:hi], dtype=bool) if conditions.tp_split else np.ones(hi - lo, bool)
    share = np.where(split, 1.0 / t, 1.0)
    fixed_share = np.where(split & conditions.tp_splits_fixed_time, 1.0 / t, 1.0)
    return f_fix * fixed_share + f_var * share, b_fix * fixed_share + b_var * share


def stage_compute(step: ProfileStep) -> StageCompute:
    """Phase 1: each virtual stage's forward and backward of one micro-batch (its
    layers' compute at the stage's samples, slowed and with gradient accumulation as
    the conditions say, plus the tensor-parallel all-reduces of their activations)."""
    profile, t = step.profile, step.strategy.tensor_model_parallel_size
    conditions, nl = step.options.conditions, profile.num_layers
    nv = len(step.layout.layer_ranges)
    out = StageCompute(np.zeros(nv), np.zeros(nv), np.zeros(nl), np.zeros(nl), np.zeros(nv), np.zeros(nv))
    for vs, (lo, hi) in enumerate(step.layout.layer_ranges):
        s = int(step.dev_of_vstage[vs])
        b = float(step.samples[s])
        f_l, b_l = _layer_times(profile, b, t, lo, hi, conditions)
        f_l = f_l * conditions.compute_slowdown
        b_l = (b_l + step.accumulation_s[lo:hi]) * conditions.compute_slowdown
        acts = profile.activation_bytes_at(b)[lo:hi]
        if t > 1:
            group = tensor_group(step.cluster, step.layout.devices[s], t)
            ar = np.array([step.comm.time_s("all_reduce", a, group) if max(cf, cb) > 0 else 0.0
                           for a, cf, cb in zip(acts, step.tp_fwd[lo:hi], step.tp_bwd[lo:hi], strict=True)])
            f_l = f_l + step.tp_fwd[lo:hi] * ar
            b_l = b_l + step.tp_bwd[lo:hi] * ar
        out.fwd_s[vs], out.bwd_s[vs] = f_l.sum(), b_l.sum()
        out.layer_fwd_s[lo:hi], out.layer_bwd_s[lo:hi] = f_l, b_l
        out.activation_bytes[vs] = acts.sum() / t
        out.boundary_bytes[vs] = acts[-1]
    return out


def pipeline_costs(step: ProfileStep, compute: StageCompute, schedule: Schedule) -> PipelineCosts:
    """Phase 2: the engine's op costs: compute per virtual stage (the backward split
    into input and weight gradients for a split-backward schedule) and the transfers
    between neighbouring stages (the larger share per link when replica counts differ;
    chunks on one device hand over in memory)."""
    nv = compute.fwd_s.shape[0]
    t, reps = step.strategy.tensor_model_parallel_size, step.strategy.replicas_per_stage
    devices, dev_of_v = step.layout.devices, step.dev_of_vstage
    send = np.zeros(max(nv - 1, 0))
    for vs in range(nv - 1):
        a, b = int(dev_of_v[vs]), int(dev_of_v[vs + 1])
        if a == b:
            continue
        nbytes = compute.boundary_bytes[vs] * float(reps[a]) / min(float(reps[a]), float(reps[b]))
        send[vs] = _p2p_s(step.comm, step.cluster, nbytes, stages_cross_node(step.cluster, devices[a], devices[b], t))
    wgt = compute.bwd_s * step.options.weight_grad_fraction if schedule.split_backward else np.zeros(nv)
    bwd_in = compute.bwd_s - wgt if schedule.split_backward else compute.bwd_s
    return PipelineCosts(compute.fwd_s, bwd_in, wgt, send, send.copy())


def stage_param_bytes(step: ProfileStep) -> np.ndarray:
    """Per pipeline device: parameter bytes one tensor rank holds (its chunks' layers / T)."""
    p, t = step.strategy.pipeline_model_parallel_size, step.strategy.tensor_model_parallel_size
    param_dev = np.zeros(p)
    for vs, (lo, hi) in enumerate(step.layout.layer_ranges):
        param_dev[step.dev_of_vstage[vs]] += step.profile.param_bytes[lo:hi].sum() / t
    return param_dev


def _bucketed_sync(step: ProfileStep, s: int, group: Group) -> GradSync:
    """A device's gradients in DDP buckets, later chunks first (they finish their backward first)."""
    p, t = step.strategy.pipeline_model_parallel_size, step.strategy.tensor_model_parallel_size
    sizes: list[float] = []
    chunks: list[int] = []
    fractions: list[float] = []
    for c in range(step.strategy.virtual_pipeline_model_parallel_size - 1, -1, -1):
        lo, hi = step.layout.layer_ranges[c * p + s]
        buckets = filled_buckets(step.profile.param_bytes[lo:hi] / t,
                                 step.profile.bwd_s_at(float(step.samples[s]))[lo:hi],
                                 step.options.grad_bucket_bytes)
        sizes.extend(buckets.size_bytes)
        chunks.extend([c] * buckets.size_bytes.shape[0])
        fractions.extend(buckets.ready_fraction)
    return GradSync(np.array([float(step.comm.time_s("all_reduce", nb, group)) for nb in sizes]),
                    np.array(chunks, dtype=np.int64), np.array(fractions))


def grad_syncs(step: ProfileStep, param_dev: np.ndarray) -> tuple[GradSync, ...]:
    """Phase 3: each pipeline device's gradient all-reduce over its replicas: one after
    the last backward (`end`), buckets during it (`overlap`), none here under P3."""
    t, mode = step.strategy.tensor_model_parallel_size, step.strategy.gradient_sync
    syncs = []
    for s, r in enumerate(step.strategy.replicas_per_stage):
        if r <= 1 or param_dev[s] <= 0 or mode == "p3":
            syncs.append(GradSync.none())
            continue
        group = replica_group(step.cluster, step.layout.devices[s], t)
        if mode == "end":
            syncs.append(GradSync(np.array([float(step.comm.time_s("all_reduce", param_dev[s], group))]),
                                  np.zeros(1, dtype=np.int64), np.ones(1)))
        else:
            syncs.append(_bucketed_sync(step, s, group))
    return tuple(syncs)


def p3_costs(step: ProfileStep, compute: StageCompute) -> P3Costs | None:
    """Phase 3 under P3: every layer's gradient all-reduced on its own."""
    if step.strategy.gradient_sync != "p3":
        return None
    t = step.strategy.tensor_model_parallel_size
    layer_ar = np.zeros(step.profile.num_layers)
    if step.strategy.replicas_per_stage[0] > 1:
        group = replica_group(step.cluster, step.layout.devices[0], t)
        layer_ar = np.array([float(step.comm.time_s("all_reduce", nb, group)) if nb > 0 else 0.0
                             for nb in step.profile.param_bytes / t])
    return P3Costs(compute.layer_fwd_s, compute.layer_bwd_s, layer_ar)


def rank_memories(step: ProfileStep, compute: StageCompute, param_dev: np.ndarray,
                  weight_versions: int) -> tuple[RankMemory, ...]:
    """Phase 4: per pipeline device, parameter bytes x the weight versions the schedule
    keeps, gradients as large, optimizer state `optimizer_state_factor` x them, and
    its chunks' activations per micro-batch."""
    acts = chunks_by_rank(compute.activation_bytes, step.strategy.pipeline_model_parallel_size)
    factor = step.options.optimizer_state_factor
    return tuple(rank_memory([ParamState(float(param_dev[s]), weight_versions, 1.0, factor)], acts[s])
                 for s in range(param_dev.shape[0]))


def profile_execution(profile: ModelProfile, cluster: Cluster, comm: CommModel, strategy: Strategy,
                      global_batch_size: int, **options: Unpack[StepOptionArgs]) -> ProfileExecution:
    """The execution model of one training step of `strategy` on a layer profile (see
    the module doc for how each kind of parallelism is costed), built phase by phase."""
    step = profile_step(profile, cluster, comm, strategy, global_batch_size, StepOptions(**options))
    sched = get_schedule(strategy.schedule)
    compute = stage_compute(step)
    param_dev = stage_param_bytes(step)
    p = strategy.pipeline_model_parallel_size
    model = ExecutionModel(
        schedule=strategy.schedule, pipeline_stages=p, virtual_stages=strategy.virtual_pipeline_model_parallel_size,
        microbatches=strategy.num_microbatches, costs=pipeline_costs(step, compute, sched),
        grad_sync=grad_syncs(step, param_dev),
        overlap_grad_reduce=strategy.gradient_sync == "overlap" and not step.options.conditions.comm_shares_compute,
        after_sync_s=np.zeros(p), memory=rank_memories(step, compute, param_dev, sched.weight_versions),
        samples_per_iteration=global_batch_size, num_devices=strategy.num_devices, iterations=strategy.iterations,
        p3=p3_costs(step, compute),
    )
    single = float(profile.fwd_s_at(global_batch_size).sum() + profile.bwd_s_at(global_batch_size).sum())
    return ProfileExecution(model, step.layout, single)


def simulate(profile: ModelProfile, cluster: Cluster, comm: CommModel, strategy: Strategy, global_batch_size: int,
             **options: Unpack[StepOptionArgs]) -> Timeline:
    """One training step of `strategy` at `global_batch_size` samples: its execution
    model (`profile_execution`) run by `paraplan.sim.execution.run_iteration`, the
    events copied to every device of each stage; see the module doc.

    Raises `StrategyError` for strategies that cannot run (too few devices, too small
    a batch for M x replicas, schedule limits such as 2BW with p > M)."""
    built = profile_execution(profile, cluster, comm, strategy, global_batch_size, **options)
    result = run_iteration(built.model)
    assert result.timeline is not None
    tl = result.timeline
    cols = timeline_columns({"device": tl.device, "stream": tl.stream, "kind": tl.kind, "stage": tl.stage,
                             "microbatch": tl.microbatch, "start_s": tl.start_s, "end_s": tl.end_s})
    devices = built.layout.devices
    cols = _expand_to_devices(cols, devices)
    peak_ids = np.zeros(max(max(ids) for ids in devices) + 1)
    for s, ids in enumerate(devices):
        peak_ids[list(ids)] = result.peak_memory_bytes[s]
    step = result.iteration_s
    return Timeline(
        **cols,
        step_time_s=step,
        batch_size=global_batch_size,
        num_devices=strategy.num_devices,
        speedup=built.single_device_s / step if step > 0 else 1.0,
        bubble_fraction=result.bubble_fraction,
        peak_mem_bytes=tuple(float(x) for x in peak_ids),
        schedule=strategy.schedule if strategy.pipeline_model_parallel_size > 1 else "",
        microbatches=strategy.num_microbatches,
        iterations=tl.iterations,
    )


def _expand_to_devices(cols: Mapping[str, Any],
                       devices: tuple[tuple[int, ...], ...]) -> TimelineColumns:
    """Copy each pipeline device's events to every physical device of its stage
    (replicas and tensor ranks run the same ops at the same times)."""
    pipe_dev = cols["device"]
    counts = np.array([len(ids) for ids in devices])
    per_event = counts[pipe_dev]
    rep = np.repeat(np.arange(pipe_dev.shape[0]), per_event)
    offsets = np.cumsum(counts) - counts
    flat_ids = np.array([d for ids in devices for d in ids], dtype=np.int32)
    # position of each copy within its stage's device list
    within = np.arange(rep.shape[0]) - np.repeat(np.cumsum(per_event) - per_event, per_event)
    out = {k: a[rep] for k, a in cols.items()}
    out["device"] = flat_ids[offsets[pipe_dev[rep]] + within]
    return timeline_columns(out)

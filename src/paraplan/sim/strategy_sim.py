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
from typing import Any

import numpy as np

from paraplan.core.cluster import Cluster
from paraplan.core.comm import CommModel, Group
from paraplan.core.errors import StrategyError
from paraplan.core.profile import ModelProfile
from paraplan.core.strategy import Strategy
from paraplan.core.timeline import Timeline, TimelineColumns, timeline_columns
from paraplan.sim.engine import PipelineCosts
from paraplan.sim.execution import ExecutionModel, GradSync, P3Costs, RankMemory, run_iteration
from paraplan.sim.schedules import get_schedule


@dataclass(frozen=True)
class StageLayout:
    """Where each pipeline device's replicas live and which layers it owns."""

    devices: tuple[tuple[int, ...], ...]  # per pipeline stage: r_s x T ids, replica-major
    layer_ranges: tuple[tuple[int, int], ...]  # per virtual stage: [start, stop)


def default_tp_allreduces(num_layers: int) -> np.ndarray:
    """One all-reduce after every second layer (Megatron's column/row MLP pair)."""
    return (np.arange(num_layers) % 2 == 1).astype(float)


def layout(strategy: Strategy, cluster: Cluster, num_layers: int) -> StageLayout:
    """Stage placement (given, or node-major packing stage by stage) and layer ranges."""
    p, t = strategy.pipeline_model_parallel_size, strategy.tensor_model_parallel_size
    v = strategy.virtual_pipeline_model_parallel_size
    reps = strategy.replicas_per_stage
    need = sum(reps) * t
    if need > cluster.num_devices:
        raise StrategyError(
            f"strategy needs {need} devices (replicas {list(reps)} x T={t}), "
            f"cluster '{cluster.name}' has {cluster.num_devices}"
        )
    if strategy.placement:
        devices = tuple(tuple(int(d) for d in ids) for ids in strategy.placement)
        for s, ids in enumerate(devices):
            if len(ids) != reps[s] * t:
                raise StrategyError(f"placement of stage {s} lists {len(ids)} devices, needs {reps[s] * t}")
        flat = [d for ids in devices for d in ids]
        if len(set(flat)) != len(flat) or min(flat) < 0 or max(flat) >= cluster.num_devices:
            raise StrategyError(
                f"placement must use distinct device ids in 0..{cluster.num_devices - 1}, got {devices}"
            )
    else:
        offsets = np.cumsum([0, *[r * t for r in reps]])
        devices = tuple(tuple(range(int(offsets[s]), int(offsets[s + 1]))) for s in range(p))
    if v == 1:
        ranges = strategy.stage_layer_ranges(num_layers)
    else:
        if strategy.stage_boundaries:
            raise StrategyError("interleaved stages split the layers evenly; drop stage_boundaries")
        nv = p * v
        if nv > num_layers:
            raise StrategyError(f"{p} stages x {v} chunks need at least {nv} layers, the model has {num_layers}")
        base, extra = divmod(num_layers, nv)
        starts = [i * base + min(i, extra) for i in range(nv)]
        ranges = list(zip(starts, [*starts[1:], num_layers], strict=True))
    return StageLayout(devices, tuple(ranges))


def _p2p_s(comm: CommModel, cluster: Cluster, nbytes: float, cross_node: bool) -> float:
    if nbytes <= 0:
        return 0.0
    try:
        return float(comm.time_s("send_recv", nbytes, Group(2, 2 if cross_node else 1)))
    except (ValueError, KeyError, NotImplementedError):
        link = cluster.inter if cross_node else cluster.intra
        return link.transfer_s(nbytes)


def _cross_node(cluster: Cluster, a: Sequence[int], b: Sequence[int], t: int) -> bool:
    """Whether any replica of stage a talks to its partner in stage b across nodes."""
    ra, rb = len(a) // t, len(b) // t
    for i in range(max(ra, rb)):
        for j in range(t):
            if cluster.node_of(a[(i % ra) * t + j]) != cluster.node_of(b[(i % rb) * t + j]):
                return True
    return False


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


@dataclass(frozen=True, eq=False)
class ProfileExecution:
    """A profile's step as the engine runs it, and where its pipeline ranks live."""

    model: ExecutionModel
    layout: StageLayout
    single_device_s: float  # the same global batch on one device, no communication


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


def profile_execution(
    profile: ModelProfile,
    cluster: Cluster,
    comm: CommModel,
    strategy: Strategy,
    global_batch_size: int,
    *,
    optimizer_state_factor: float = 2.0,
    grad_bucket_bytes: float = 25e6,
    weight_grad_fraction: float = 0.5,
    tp_allreduces: Sequence[float] | None = None,
    conditions: RunConditions = RunConditions(),
) -> ProfileExecution:
    """The execution model of one training step of `strategy` on a layer profile (see
    the module doc for how each kind of parallelism is costed)."""
    p, t, v, m = (strategy.pipeline_model_parallel_size, strategy.tensor_model_parallel_size,
                  strategy.virtual_pipeline_model_parallel_size, strategy.num_microbatches)
    sched = get_schedule(strategy.schedule)
    sched.check(p, m, v)
    nl = profile.num_layers
    lay = layout(strategy, cluster, nl)
    reps = np.array(strategy.replicas_per_stage, dtype=float)
    nv = p * v
    dev_of_v = np.arange(nv) % p
    samples = global_batch_size / (m * reps)  # per replica per micro-batch, by pipeline device
    if samples.min() < 1:
        s = int(samples.argmin())
        raise StrategyError(
            f"global batch {global_batch_size} gives {samples[s]:.3g} samples per micro-batch per replica at stage {s} "
            f"({m} micro-batches x {int(reps[s])} replicas); need >= 1"
        )
    if conditions.tp_split and len(conditions.tp_split) != nl:
        raise StrategyError(f"tp_split needs one entry per layer ({nl}), got {len(conditions.tp_split)}")

    counts: object = tp_allreduces
    if counts is None:
        meta_counts = profile.meta.get("tp_allreduces") if profile.meta else None
        counts = meta_counts if meta_counts is not None else default_tp_allreduces(nl)
    tp_counts = np.asarray(counts, dtype=float)
    if tp_counts.shape != (nl,):
        raise StrategyError(f"tp_allreduces needs one count per layer ({nl}), got {tp_counts.shape}")
    tp_back = np.asarray(conditions.tp_backward_allreduces, dtype=float) if conditions.tp_backward_allreduces \
        else tp_counts
    if tp_back.shape != (nl,):
        raise StrategyError(f"tp_backward_allreduces needs one count per layer ({nl}), got {tp_back.shape}")
    accumulation = np.zeros(nl)
    if conditions.accumulation_Bps > 0 and m > 1:
        accumulation = (m - 1) / m * 3.0 * profile.param_bytes / conditions.accumulation_Bps

    slow = conditions.compute_slowdown
    fwd = np.zeros(nv)
    bwd = np.zeros(nv)
    layer_fwd = np.zeros(nl)  # per layer per micro-batch on its device (P3 needs layers)
    layer_bwd = np.zeros(nl)
    act_mb = np.zeros(nv)  # activations held per micro-batch (all layers of the stage), per device
    out_act = np.zeros(nv)  # boundary activation per micro-batch per replica
    for vs, (lo, hi) in enumerate(lay.layer_ranges):
        s = int(dev_of_v[vs])
        b = float(samples[s])
        f_l, b_l = _layer_times(profile, b, t, lo, hi, conditions)
        f_l, b_l = f_l * slow, (b_l + accumulation[lo:hi]) * slow
        acts = profile.activation_bytes_at(b)[lo:hi]
        if t > 1:
            group = Group(t, cluster.nodes_spanned(lay.devices[s][:t]))
            ar = np.array([comm.time_s("all_reduce", a, group) if max(cf, cb) > 0 else 0.0
                           for a, cf, cb in zip(acts, tp_counts[lo:hi], tp_back[lo:hi], strict=True)])
            f_l = f_l + tp_counts[lo:hi] * ar
            b_l = b_l + tp_back[lo:hi] * ar
        fwd[vs], bwd[vs] = f_l.sum(), b_l.sum()
        layer_fwd[lo:hi], layer_bwd[lo:hi] = f_l, b_l
        act_mb[vs] = acts.sum() / t
        out_act[vs] = acts[-1]

    send = np.zeros(max(nv - 1, 0))
    for vs in range(nv - 1):
        a, b = int(dev_of_v[vs]), int(dev_of_v[vs + 1])
        if a == b:  # chunks on one device (interleaving with P = 1) hand over in memory
            continue
        # bytes per link: the larger share when replica counts differ
        nbytes = out_act[vs] * reps[a] / min(reps[a], reps[b])
        send[vs] = _p2p_s(comm, cluster, nbytes, _cross_node(cluster, lay.devices[a], lay.devices[b], t))
    if sched.split_backward:
        wgt = bwd * weight_grad_fraction
        bwd_in = bwd - wgt
    else:
        wgt = np.zeros(nv)
        bwd_in = bwd
    costs = PipelineCosts(fwd, bwd_in, wgt, send, send.copy())

    param_dev = np.zeros(p)
    for vs, (lo, hi) in enumerate(lay.layer_ranges):
        param_dev[dev_of_v[vs]] += profile.param_bytes[lo:hi].sum() / t
    mode = strategy.gradient_sync
    syncs = []
    for s in range(p):
        r = int(reps[s])
        if r <= 1 or param_dev[s] <= 0 or mode == "p3":
            syncs.append(GradSync.none())
            continue
        group = Group(r, cluster.nodes_spanned(lay.devices[s][0::t]))
        if mode == "end":
            syncs.append(GradSync(np.array([float(comm.time_s("all_reduce", param_dev[s], group))]),
                                  np.zeros(1, dtype=np.int64), np.ones(1)))
            continue
        sizes, chunks, fractions = [], [], []
        for c in range(v - 1, -1, -1):  # later chunks finish their backward first
            vs = c * p + s
            lo, hi = lay.layer_ranges[vs]
            b_l = profile.bwd_s_at(float(samples[s]))[lo:hi][::-1]
            frac = np.cumsum(b_l) / b_l.sum() if b_l.sum() > 0 else np.ones_like(b_l)
            acc = 0.0
            for ready, nb in zip(frac, profile.param_bytes[lo:hi][::-1] / t, strict=True):
                acc += nb
                if acc >= grad_bucket_bytes:
                    sizes.append(acc)
                    chunks.append(c)
                    fractions.append(float(ready))
                    acc = 0.0
            if acc > 0:
                sizes.append(acc)
                chunks.append(c)
                fractions.append(float(frac[-1]) if frac.size else 1.0)
        syncs.append(GradSync(np.array([float(comm.time_s("all_reduce", nb, group)) for nb in sizes]),
                              np.array(chunks, dtype=np.int64), np.array(fractions)))

    p3 = None
    if mode == "p3":
        layer_ar = np.zeros(nl)
        if int(reps[0]) > 1:
            group = Group(int(reps[0]), cluster.nodes_spanned(lay.devices[0][0::t]))
            layer_ar = np.array([float(comm.time_s("all_reduce", nb, group)) if nb > 0 else 0.0
                                 for nb in profile.param_bytes / t])
        p3 = P3Costs(layer_fwd, layer_bwd, layer_ar)

    chunk_act = np.zeros((p, v))
    for vs in range(nv):
        chunk_act[vs % p, vs // p] = act_mb[vs]
    memory = tuple(RankMemory(param_dev[s] * sched.weight_versions, param_dev[s],
                              param_dev[s] * optimizer_state_factor, chunk_act[s]) for s in range(p))
    model = ExecutionModel(
        schedule=strategy.schedule, pipeline_stages=p, virtual_stages=v, microbatches=m, costs=costs,
        grad_sync=tuple(syncs), overlap_grad_reduce=mode == "overlap" and not conditions.comm_shares_compute,
        after_sync_s=np.zeros(p), memory=memory, samples_per_iteration=global_batch_size,
        num_devices=strategy.num_devices, iterations=strategy.iterations, p3=p3,
    )
    single = float(profile.fwd_s_at(global_batch_size).sum() + profile.bwd_s_at(global_batch_size).sum())
    return ProfileExecution(model, lay, single)


def simulate(
    profile: ModelProfile,
    cluster: Cluster,
    comm: CommModel,
    strategy: Strategy,
    global_batch_size: int,
    *,
    optimizer_state_factor: float = 2.0,
    grad_bucket_bytes: float = 25e6,
    weight_grad_fraction: float = 0.5,
    tp_allreduces: Sequence[float] | None = None,
    conditions: RunConditions = RunConditions(),
) -> Timeline:
    """One training step of `strategy` at `global_batch_size` samples: its execution
    model (`profile_execution`) run by `paraplan.sim.execution.run_iteration`, the
    events copied to every device of each stage; see the module doc.

    Raises `StrategyError` for strategies that cannot run (too few devices, too small
    a batch for M x replicas, schedule limits such as 2BW with p > M)."""
    built = profile_execution(profile, cluster, comm, strategy, global_batch_size,
                              optimizer_state_factor=optimizer_state_factor, grad_bucket_bytes=grad_bucket_bytes,
                              weight_grad_fraction=weight_grad_fraction, tp_allreduces=tp_allreduces,
                              conditions=conditions)
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

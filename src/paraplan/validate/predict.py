"""The simulator's prediction of the strategies the validate stage runs.

Each strategy becomes a `Strategy` on the 2 devices of the cluster and goes through
`paraplan.sim.simulate` with the profile and the fitted communication model, with
the layout the real run uses (pipeline cut, micro-batches, one gradient bucket per
layer for the overlapped all-reduce, the model's tensor-parallel all-reduces).

These documented corrections are applied on top of the simulator, because they are
facts of the real run the simulator cannot know (the CLI also reports the
prediction without them, "uncorrected"):
- Contention (`compute_factor`): the profile times each layer in one process; in
  the real run every rank computes at the same time and on a CPU the ranks share
  cores, caches and memory bandwidth (and, on a shared machine, the other tenants'
  load). The validate stage measures the factor at run time (the whole model's
  forward + backward on all ranks at once over each rank alone, interleaved with
  the strategies' steps, see `runner._rank_main`). Compute slows down only while both ranks compute,
  so the profiled times are multiplied by 1 + (factor - 1) x overlap, where
  overlap is the share of a rank's compute time during which the other rank
  computes too, read from the simulated timeline (1 for dp and tp2, less for the
  pipelines' fill and drain); overlap and timeline are iterated to a fixed point.
  Without it (factor 1) the prediction is the simulator's as is; both are reported.
- Overlap on a saturated CPU (`comm_uses_compute_cores`): gloo reduces and copies
  with the CPU, so when the ranks' threads already fill every core, an all-reduce
  started during backward takes its cycles from backward instead of running beside
  it. `dp_overlap` is then predicted without overlap: the `dp` step with its one
  all-reduce replaced by the per-layer all-reduces the overlapped run issues.
- Pipelines, gradient accumulation: the profile times each backward with fresh
  gradients (the first micro-batch's case); every later micro-batch adds its weight
  gradients into the accumulated ones, one more pass over the gradient memory
  (read both, write one: 3 x parameter bytes at the device's memory bandwidth) that
  the simulator does not charge. It is added to each layer's backward, averaged over
  the M micro-batches ((M - 1) / M of it per backward).
- `tp2`, replicated layers: the simulator divides every layer's batch-proportional
  time by T; the real run splits only Linear pairs and transformer blocks and keeps
  the others (embedding, head, an odd last Linear) whole on every rank, so their
  profiled times are given to the simulator x T in the batch-proportional part.
- `tp2`, batch-independent time (`tp_splits_fixed_time`, on CPUs): the simulator
  keeps a layer's fixed part whole (a GPU's per-kernel launch cost). On a CPU the
  fixed part the profile fits is mostly per-parameter work (allocating and writing
  the weight gradients), which a split layer does for its 1/T of the weights, so a
  split layer's fixed part is divided by T as well.
- `tp2` layout (always applied): when the model's first layer starts a Linear pair, the pair's input is
  the data, which needs no gradient, so its backward all-reduce never runs
  (Megatron's "f" operator is a no-op there); the simulator charges one all-reduce
  per pair in both directions, so one all-reduce of the pair's input is removed.
- `tp2`, activation all-reduces at their mean time (`tp_allreduce_s`): the fitted
  model is fitted to each size's median time, but on a CPU a small gloo all-reduce
  has a long tail (the benchmark's all_reduce n2 at 128 KiB: p10 0.54 ms, median
  3.2 ms, p90 4.7 ms; the alpha-beta fit says 0.79 ms). One call per step (dp) costs
  about its median; tp2 issues many small synchronous all-reduces per step (3 for
  the MLP, 16 for the GPT), and a sum of many draws costs about their mean. The
  validate run times all-reduces of tp2's activation sizes in every round (after a
  barrier, as the benchmark does, see `runner._rank_main`); `tp2` is simulated with
  each such all-reduce at the mean of those times (`MeasuredAllReduce`), every other
  collective and strategy with the fit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from paraplan.core import Cluster, CommModel, Group, ModelProfile, StrategyError
from paraplan.validate.strategies import PIPELINE_SCHEDULES, WORLD_SIZE, strategy_for

# Each layer's gradients form their own bucket: the real overlapped run starts one
# all-reduce per layer as soon as backward has produced that layer's gradients.
PER_LAYER_BUCKET_BYTES = 1.0


@dataclass(frozen=True)
class PredictionSetup:
    """What the real run does, as far as the prediction needs it."""

    global_batch_size: int
    num_microbatches: int
    pipeline_boundary: int  # first layer of pipeline stage 1
    tp_allreduces: tuple[float, ...]  # per layer, see tensor_parallel.tp_allreduce_counts
    first_pair_input_needs_grad: bool = False
    comm_uses_compute_cores: bool = False  # gloo ranks x threads >= cores: no overlap
    tp_split: tuple[bool, ...] = ()  # per layer: split by tensor parallelism (empty: all)
    tp_splits_fixed_time: bool = False  # CPU: a split layer's fixed time shrinks by T too
    pipeline_accumulation: bool = False  # charge micro-batch gradient accumulation
    tp_allreduce_s: tuple[tuple[float, float], ...] = ()  # (bytes, measured mean s) per size


@dataclass(frozen=True)
class MeasuredAllReduce:
    """`comm`, except that an all-reduce on the validate run's 2 ranks of one of the
    `measured` sizes ((bytes, seconds) pairs) takes the measured time."""

    comm: CommModel
    measured: tuple[tuple[float, float], ...]

    def time_s(self, collective: str, nbytes: float, group: Group) -> float:
        if collective == "all_reduce" and group.size == WORLD_SIZE and group.nodes == 1:
            for size, seconds in self.measured:
                if abs(float(nbytes) - size) <= 1e-9 * max(size, 1.0):
                    return float(seconds)
        return float(self.comm.time_s(collective, nbytes, group))


def tp_comm(comm: CommModel, setup: PredictionSetup) -> CommModel:
    """The communication model `tp2` is simulated with (see the module doc)."""
    return MeasuredAllReduce(comm, setup.tp_allreduce_s) if setup.tp_allreduce_s else comm


def tp_unused_backward_allreduce_s(profile: ModelProfile, comm: CommModel, setup: PredictionSetup) -> float:
    """The backward all-reduce the simulator charges for the first Linear pair when
    the real run skips it (its input is the data); 0 otherwise."""
    counts = setup.tp_allreduces
    starts_with_pair = len(counts) > 1 and counts[0] == 0 and counts[1] == 1
    if not starts_with_pair or setup.first_pair_input_needs_grad:
        return 0.0
    nbytes = float(profile.activation_bytes_at(setup.global_batch_size)[1])
    return float(comm.time_s("all_reduce", nbytes, Group(WORLD_SIZE, 1)))


def scale_compute(profile: ModelProfile, factor: float) -> ModelProfile:
    """The profile with every forward and backward time (and fixed part) x `factor`."""
    if not factor > 0:
        raise ValueError(f"compute factor must be > 0, got {factor}")
    layers = tuple(
        replace(la, fwd_s=la.fwd_s * factor, bwd_s=la.bwd_s * factor,
                fwd_fixed_s=la.fwd_fixed_s * factor, bwd_fixed_s=la.bwd_fixed_s * factor)
        for la in profile.layers
    )
    return ModelProfile(profile.name, profile.batch_size, layers, meta=profile.meta)


CONTENTION_ITERATIONS = 4


def both_busy_fraction(timeline) -> float:
    """Share of the ranks' compute time (mean over ranks) during which every rank's
    compute stream is busy at once."""
    from paraplan.core.timeline import STREAMS

    compute = timeline.stream == STREAMS.index("compute")
    devices = np.unique(timeline.device[compute])
    if devices.size < 2:
        return 0.0
    points = np.unique(np.concatenate([timeline.start_s[compute], timeline.end_s[compute]]))
    if points.size < 2:
        return 0.0
    mids, widths = (points[:-1] + points[1:]) / 2, np.diff(points)
    busy = []
    for d in devices:
        sel = compute & (timeline.device == d)
        order = np.argsort(timeline.start_s[sel])
        starts, ends = timeline.start_s[sel][order], timeline.end_s[sel][order]
        idx = np.searchsorted(starts, mids, side="right") - 1
        busy.append((idx >= 0) & (mids < ends[np.clip(idx, 0, None)]))
    all_busy = np.logical_and.reduce(busy)
    per_rank = np.mean([widths[b].sum() for b in busy])
    return float(widths[all_busy].sum() / per_rank) if per_rank > 0 else 0.0


def predict_step_times(
    profile: ModelProfile,
    cluster: Cluster,
    comm: CommModel,
    strategies: Sequence[str],
    setup: PredictionSetup,
    compute_factor: float = 1.0,
) -> dict[str, float]:
    """Predicted step time (s) of each strategy at `setup.global_batch_size` samples, with
    compute slowed by `compute_factor` while both ranks compute (see the module doc)."""
    if cluster.num_devices < WORLD_SIZE:
        raise StrategyError(f"cluster '{cluster.name}' has {cluster.num_devices} devices, need {WORLD_SIZE}")
    out: dict[str, float] = {}
    for name in strategies:
        timeline = _simulate(profile, cluster, comm, name, setup, 1.0)
        if compute_factor != 1.0:
            for _ in range(CONTENTION_ITERATIONS):
                effective = 1.0 + (compute_factor - 1.0) * both_busy_fraction(timeline)
                timeline = _simulate(profile, cluster, comm, name, setup, effective)
        step_s = timeline.step_time_s
        if name == "dp_overlap" and setup.comm_uses_compute_cores:
            step_s = _serialised_overlap_s(profile, cluster, comm, setup, timeline, compute_factor)
        if name == "tp2":
            step_s -= tp_unused_backward_allreduce_s(profile, tp_comm(comm, setup), setup)
        out[name] = float(step_s)
    return out


def _serialised_overlap_s(profile, cluster, comm, setup, overlapped, compute_factor: float) -> float:
    """`dp_overlap` when communication cannot run beside compute: the `dp` step (same
    contention correction) minus its single all-reduce plus one all-reduce per layer."""
    dp = predict_step_times(profile, cluster, comm, ["dp"], setup, compute_factor)["dp"]
    group = Group(WORLD_SIZE, 1)
    whole = float(comm.time_s("all_reduce", profile.total_param_bytes, group))
    per_layer = sum(float(comm.time_s("all_reduce", nb, group)) for nb in profile.param_bytes if nb > 0)
    return dp - whole + per_layer


def tensor_parallel_profile(profile: ModelProfile, setup: PredictionSetup) -> ModelProfile:
    """The profile as the simulator must see it for `tp2` (see the module doc): it
    computes fixed + (t - fixed) x (b / B) / T per layer; replicated layers get
    t' = fixed + T (t - fixed), split layers with `tp_splits_fixed_time` get
    fixed' = fixed / T and t' = fixed / T + (t - fixed)."""
    split = setup.tp_split or (True,) * profile.num_layers
    if len(split) != profile.num_layers:
        raise StrategyError(f"tp_split needs one entry per layer ({profile.num_layers}), got {len(split)}")
    t = WORLD_SIZE
    layers = []
    for la, is_split in zip(profile.layers, split, strict=True):
        if not is_split:
            la = replace(la, fwd_s=la.fwd_fixed_s + t * (la.fwd_s - la.fwd_fixed_s),
                         bwd_s=la.bwd_fixed_s + t * (la.bwd_s - la.bwd_fixed_s))
        elif setup.tp_splits_fixed_time:
            la = replace(la, fwd_s=la.fwd_fixed_s / t + (la.fwd_s - la.fwd_fixed_s),
                         bwd_s=la.bwd_fixed_s / t + (la.bwd_s - la.bwd_fixed_s),
                         fwd_fixed_s=la.fwd_fixed_s / t, bwd_fixed_s=la.bwd_fixed_s / t)
        layers.append(la)
    return ModelProfile(profile.name, profile.batch_size, tuple(layers), meta=profile.meta)


def accumulation_profile(profile: ModelProfile, num_microbatches: int, mem_bandwidth_Bps: float) -> ModelProfile:
    """The profile with each layer's backward charged its average gradient
    accumulation: (M - 1) / M x 3 x param_bytes / mem_bandwidth (see the module doc)."""
    if num_microbatches <= 1:
        return profile
    share = (num_microbatches - 1) / num_microbatches * 3.0 / mem_bandwidth_Bps
    layers = tuple(
        replace(la, bwd_s=la.bwd_s + share * la.param_bytes, bwd_fixed_s=la.bwd_fixed_s + share * la.param_bytes)
        for la in profile.layers
    )
    return ModelProfile(profile.name, profile.batch_size, layers, meta=profile.meta)


def _simulate(profile, cluster, comm, name: str, setup: PredictionSetup, factor: float):
    from paraplan.sim import simulate

    if name == "tp2":
        profile = tensor_parallel_profile(profile, setup)
        comm = tp_comm(comm, setup)
    if name in PIPELINE_SCHEDULES and setup.pipeline_accumulation:
        profile = accumulation_profile(profile, setup.num_microbatches, cluster.device.mem_bandwidth_Bps)
    scaled = scale_compute(profile, factor) if factor != 1.0 else profile
    return simulate(
        scaled, cluster, comm, strategy_for(name, setup.num_microbatches, setup.pipeline_boundary),
        setup.global_batch_size,
        grad_bucket_bytes=PER_LAYER_BUCKET_BYTES, tp_allreduces=list(setup.tp_allreduces),
    )

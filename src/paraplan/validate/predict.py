"""The simulator's prediction of the strategies the validate stage runs.

Each strategy becomes a `Strategy` on the 2 devices of the cluster and goes through
`paraplan.sim.simulate` with the profile and the fitted communication model, with
the layout the real run uses (pipeline cut, micro-batches, one gradient bucket per
layer for the overlapped all-reduce, the model's tensor-parallel all-reduces).

These documented facts of the real run, which its profile cannot know, enter the
simulation as `paraplan.sim.RunConditions` (inputs of the execution model, never
adjustments of the engine's answer; the CLI also reports the prediction without the
measured contention, "uncorrected"):
- Contention (`compute_factor`): the profile times each layer in one process; in
  the real run every rank computes at the same time and on a CPU the ranks share
  cores, caches and memory bandwidth (and, on a shared machine, the other tenants'
  load). The validate stage measures the factor at run time (the whole model's
  forward + backward on all ranks at once over each rank alone, interleaved with
  the strategies' steps, see `runner._rank_main`). Compute slows down only while both ranks compute,
  so the profiled times are multiplied by 1 + (factor - 1) x overlap, where
  overlap is the share of a rank's compute time during which the other rank
  computes too, read from the simulated timeline (1 for dp and tp2, less for the
  pipelines' fill and drain); overlap and timeline are iterated to a fixed point
  (`compute_slowdown`). Without it (factor 1) the prediction is the simulator's as
  is; both are reported.
- Overlap on a saturated CPU (`comm_uses_compute_cores`): gloo reduces and copies
  with the CPU, so when the ranks' threads already fill every core, an all-reduce
  started during backward takes its cycles from backward instead of running beside
  it. `dp_overlap` is then simulated with its per-layer all-reduces after the last
  backward (`comm_shares_compute`).
- Pipelines, gradient accumulation: the profile times each backward with fresh
  gradients (the first micro-batch's case); every later micro-batch adds its weight
  gradients into the accumulated ones, one more pass over the gradient memory
  (read both, write one: 3 x parameter bytes at the device's memory bandwidth) that
  the profile does not hold. It is added to each layer's backward, averaged over
  the M micro-batches ((M - 1) / M of it per backward; `accumulation_Bps`).
- `tp2`, replicated layers: the real run splits only Linear pairs and transformer
  blocks and keeps the others (embedding, head, an odd last Linear) whole on every
  rank (`tp_split`).
- `tp2`, batch-independent time (`tp_splits_fixed_time`, on CPUs): the simulator
  keeps a layer's fixed part whole (a GPU's per-kernel launch cost). On a CPU the
  fixed part the profile fits is mostly per-parameter work (allocating and writing
  the weight gradients), which a split layer does for its 1/T of the weights, so a
  split layer's fixed part is divided by T as well (`tp_splits_fixed_time`).
- `tp2` layout (always applied): when the model's first layer starts a Linear pair, the pair's input is
  the data, which needs no gradient, so its backward all-reduce never runs
  (Megatron's "f" operator is a no-op there): that layer's backward runs one
  all-reduce fewer than its forward (`tp_backward_allreduces`).
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
- `tp2`, waiting for the partner (`skew_s`): those times are taken after a barrier,
  with both ranks arriving together. Inside a tp2 step nothing lines the ranks up:
  each blocking all-reduce starts when the later rank arrives, and two ranks doing
  the same work at the same time drift apart by chance (the validate run measures
  by how much: the latest minus the earliest rank's end of the contention pass,
  `RunResult.together_drift_s`). With independent drift per segment, the k
  all-reduces of a step wait sqrt(k) x half the whole pass's mean drift in all. The
  run prints and logs tp2 with that waiting beside the prediction
  (`predicted_waiting_s`), not in it: measured on the loaded 2-core machine, the
  closed form came to 0.5-1.7x the waiting measured inside tp2's all-reduces
  depending on the load (stalls of other processes, not independent small drifts,
  make most of the difference there); an idle machine has to settle it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from paraplan.core import Cluster, CommModel, Group, ModelProfile, StrategyError
from paraplan.sim.strategy_sim import RunConditions
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


def tp_backward_allreduces(setup: PredictionSetup) -> tuple[float, ...]:
    """Per layer, the tensor-parallel all-reduces each backward runs: the forward's
    counts, less the first Linear pair's input gradient when that input is the data
    (see the module doc)."""
    counts = list(setup.tp_allreduces)
    starts_with_pair = len(counts) > 1 and counts[0] == 0 and counts[1] == 1
    if starts_with_pair and not setup.first_pair_input_needs_grad:
        counts[1] -= 1
    return tuple(counts)


def run_conditions(name: str, setup: PredictionSetup, cluster: Cluster, compute_slowdown: float = 1.0) -> RunConditions:
    """What the real run of strategy `name` does that its profile cannot say."""
    tp = name == "tp2"
    accumulate = name in PIPELINE_SCHEDULES and setup.pipeline_accumulation
    return RunConditions(
        compute_slowdown=compute_slowdown,
        comm_shares_compute=setup.comm_uses_compute_cores,
        tp_split=setup.tp_split if tp else (),
        tp_splits_fixed_time=setup.tp_splits_fixed_time if tp else False,
        tp_backward_allreduces=tp_backward_allreduces(setup) if tp else (),
        accumulation_Bps=cluster.device.mem_bandwidth_Bps if accumulate else 0.0,
    )


def skew_s(sync_points: float, drift_s: float) -> float:
    """Expected time 2 ranks wait for each other at `sync_points` blocking collectives
    spread evenly over a pass whose two ranks, doing the same work at once without
    communicating, end `drift_s` apart on average (mean |difference|, the validate
    run's contention pass). Each collective waits for the later rank: E[max(a, b)] -
    E[a] = E|a - b| / 2 per segment; with independent, normal differences per segment
    the k segments' |differences| sum to sqrt(k) x the whole pass's. A diagnostic of
    tp2's blocking all-reduces (see the module doc), not part of the prediction."""
    if sync_points <= 0 or drift_s <= 0:
        return 0.0
    return float(np.sqrt(sync_points) * drift_s / 2.0)


CONTENTION_ITERATIONS = 4


def both_busy_fraction(timeline) -> float:
    """Share of the ranks' compute time (mean over ranks) during which every rank's
    compute stream is busy at once."""
    from paraplan.core.glossary import StreamCode

    compute = timeline.stream == StreamCode.COMPUTE
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
    profile_drift: float = 1.0,
) -> dict[str, float]:
    """Predicted step time (s) of each strategy at `setup.global_batch_size` samples, with
    compute slowed by `compute_factor` while both ranks compute (see the module doc) and
    by `profile_drift` throughout (the machine's speed now over when it was profiled:
    a diagnostic of stale profiles)."""
    if cluster.num_devices < WORLD_SIZE:
        raise StrategyError(f"cluster '{cluster.name}' has {cluster.num_devices} devices, need {WORLD_SIZE}")
    out: dict[str, float] = {}
    for name in strategies:
        timeline = _simulate(profile, cluster, comm, name, setup, profile_drift)
        if compute_factor != 1.0:
            for _ in range(CONTENTION_ITERATIONS):
                effective = 1.0 + (compute_factor - 1.0) * both_busy_fraction(timeline)
                timeline = _simulate(profile, cluster, comm, name, setup, profile_drift * effective)
        out[name] = float(timeline.step_time_s)
    return out


def _simulate(profile, cluster, comm, name: str, setup: PredictionSetup, slowdown: float):
    from paraplan.sim import simulate

    if name == "tp2":
        comm = tp_comm(comm, setup)
    return simulate(
        profile, cluster, comm, strategy_for(name, setup.num_microbatches, setup.pipeline_boundary),
        setup.global_batch_size, grad_bucket_bytes=PER_LAYER_BUCKET_BYTES, tp_allreduces=list(setup.tp_allreduces),
        conditions=run_conditions(name, setup, cluster, slowdown),
    )

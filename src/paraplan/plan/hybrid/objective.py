"""The planner's objective: DAPPLE's iteration latency of a hybrid plan.

HPGO form (what its code computes, and what paraplan minimises), with M micro-batches,
per-micro-batch stage times c_s (compute of the stage's layers on b / r_s samples, b the
micro-batch of one pipeline copy), boundary transfers x_s (2 x activation bytes / link)
and gradient all-reduces A_s of each stage's replicas:

    B       = max(max_s c_s, max_s x_s)                    (the pipeline's block)
    latency = (M - 1) B + sum_s c_s + sum_s x_s + max_s max(0, A_s - s B)

Stage s (0-based from the front) finishes its last backward s blocks before stage 0,
so its all-reduce hides behind s blocks. speedup = T / latency, T the single-device
time of the whole global batch.

The paper's form (DAPPLE, PPoPP'21) around a pivot stage Q (the slowest):
    warmup = sum_{s<=Q} F_s;  steady = (M - 1)(F_Q + B_Q);
    ending = the last micro-batch after Q and back, plus each stage's all-reduce minus
             the backward work (of the stages in front of it) that hides it
with transfers counted as stages of their own (`paper_latency_s`, for comparison). Its
compute part equals HPGO's (M - 1) B + path; the two differ in how much of an
all-reduce hides (HPGO: s blocks; paper: the backward of the stages in front).

A plan with one stage is data parallelism with M accumulation steps; its gradient
synchronisation may also overlap the computation (`data_parallel_latency_s`), as the
simulator's `gradient_sync` does:
- `end`: M c + A (the HPGO form with one stage);
- `overlap` (DDP): gradients in buckets of 25 MB from the last layer down; a bucket's
  all-reduce starts when the last step's backward has produced it, one after another
  on the network: max(M c, the last bucket's end);
- `p3` (priority-based parameter propagation): one all-reduce per layer, the network
  serving the lowest pending layer first (preempting); the next iteration's first
  forward runs layer l once layers 0..l are synchronised, so the iteration is M c plus
  that forward's stall. Only the last accumulation step's backward and the next
  iteration's first forward can hide the all-reduces (the gradients are complete only
  after the last step).
Pipelines (two or more stages) synchronise at the `end`.

A plan is feasible when every replica gets at least one sample per micro-batch and
every stage's device holds its model state and the activations
of its in-flight micro-batches: with 1F1B stage s holds min(M, S - s).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from paraplan.core import GradientSync, Strategy
from paraplan.plan.hybrid.problem import PlanProblem
from paraplan.plan.hybrid.records import HybridPlan, StageSlot
from paraplan.sim.builder.grad_buckets import filled_buckets
from paraplan.sim.p3 import p3_done_s


def hpgo_latency_s(block_s: float, microbatches: int, path_s: float, allreduce_s: Sequence[float]) -> float:
    """(M - 1) B + path + max_s max(0, A_s - s B); `path_s` = sum of stage times and transfers."""
    ending = max([0.0, *(a - s * block_s for s, a in enumerate(allreduce_s))])
    return (microbatches - 1) * block_s + path_s + ending


DDP_BUCKET_BYTES = 25e6
"""Gradient bucket of the `overlap` sync: PyTorch DDP's default (bucket_cap_mb = 25),
also the simulator's default `grad_bucket_bytes`."""


@dataclass(frozen=True)
class GroupAllReduce:
    """The gradient all-reduces of data parallelism over one device group: per layer
    (P3: one all-reduce per layer; 0 for a layer without parameters) and per DDP bucket
    (`overlap`: layers from the last one down filled into buckets of at least
    `DDP_BUCKET_BYTES`; `bucket_layer` is each bucket's lowest layer, whose gradient
    completes it)."""

    layer_s: np.ndarray
    bucket_layer: np.ndarray
    bucket_s: np.ndarray
    total_s: float  # one all-reduce of all parameters (`end`)


def group_allreduce(problem: PlanProblem, replicas: int, nodes: int) -> GroupAllReduce:
    """`GroupAllReduce` over `replicas` devices spanning `nodes` nodes."""
    params = problem.profile.param_bytes
    total = float(problem.allreduce_s(problem.param_prefix_bytes[-1], replicas, nodes))
    if replicas <= 1:
        none = np.zeros(0)
        return GroupAllReduce(np.zeros_like(params), none.astype(np.int64), none, total)
    times = np.atleast_1d(np.asarray(problem.allreduce_s(params, replicas, nodes), dtype=float))
    filled = filled_buckets(params, np.zeros_like(params), DDP_BUCKET_BYTES)
    sizes = filled.size_bytes
    buckets = np.asarray(problem.allreduce_s(sizes, replicas, nodes), dtype=float) if sizes.size else np.zeros(0)
    return GroupAllReduce(np.where(params > 0, times, 0.0), filled.lowest_layer, np.atleast_1d(buckets), total)


def data_parallel_latency_s(problem: PlanProblem, replicas: int, nodes: int, microbatches: int, samples: float,
                            gradient_sync: GradientSync, allreduce: GroupAllReduce | None = None) -> float:
    """One stage of all layers on `replicas` devices (spanning `nodes` nodes): M =
    `microbatches` accumulation steps of `samples` samples per device, then the
    gradients synchronised as `gradient_sync` says (module doc). `allreduce`: the
    group's all-reduce times when already known (`group_allreduce`)."""
    n_layers = problem.num_layers
    compute = float(problem.compute_s(0, n_layers, samples))
    ar = group_allreduce(problem, replicas, nodes) if allreduce is None else allreduce
    if gradient_sync == "end":
        return hpgo_latency_s(compute, microbatches, compute, [ar.total_s])
    span = microbatches * compute
    if replicas <= 1 or not ar.layer_s.any():
        return span
    bwd = problem.profile.bwd_s_at(samples)
    # layer l's gradient is complete when the last step's backward has passed it
    release = span - np.concatenate([[0.0], np.cumsum(bwd)[:-1]])
    if gradient_sync == "overlap":
        ready = release[ar.bucket_layer]
        return max(span, float(np.max(ready + np.cumsum(ar.bucket_s[::-1])[::-1])))
    # p3: the next iteration's first forward runs layer l once layers 0..l are synchronised
    done = p3_done_s(release, ar.layer_s)
    fwd = problem.profile.fwd_s_at(samples)
    before = np.concatenate([[0.0], np.cumsum(fwd)[:-1]])
    stall = max(0.0, float(np.max(done - span - before)))
    return span + stall


def paper_latency_s(fwd_s: Sequence[float], bwd_s: Sequence[float], microbatches: int,
                    allreduce_s: Sequence[float]) -> float:
    """DAPPLE paper's warm-up + steady + ending around the pivot Q (the slowest stage):
    warm-up = forward of the first micro-batch up to Q, steady = (M - 1)(F_Q + B_Q),
    ending = the last micro-batch through the stages after Q and back to stage 0, plus
    the part of each stage's all-reduce the backward of the stages in front of it cannot
    hide. Transfers may be passed as stages of their own (with no all-reduce). With
    uniform stages and no all-reduce: (M + S - 1)(F + B)."""
    q = max(range(len(fwd_s)), key=lambda s: (fwd_s[s] + bwd_s[s], s))
    warmup = sum(fwd_s[: q + 1])
    steady = (microbatches - 1) * (fwd_s[q] + bwd_s[q])
    ending = sum(fwd_s[q + 1:]) + sum(bwd_s)
    exposed = max([0.0, *(a - sum(bwd_s[:s]) for s, a in enumerate(allreduce_s))])
    return warmup + steady + ending + exposed


def layout_slots(widths_layers: Sequence[tuple[int, int, int]]) -> list[StageSlot]:
    """[(first, stop, width), ...] packed left to right inside a pipeline copy."""
    slots, offset = [], 0
    for first, stop, width in widths_layers:
        slots.append(StageSlot(first, stop, width, offset))
        offset += width
    return slots


def evaluate_layout(problem: PlanProblem, pipeline_devices: int, microbatches: int,
                    slots: Sequence[StageSlot], gradient_sync: GradientSync = "end") -> HybridPlan | None:
    """The latency of one layout, or None when it breaks a rule (memory, devices, more
    stages than micro-batches, a gradient sync other than `end` with two or more
    stages). Scalar reference for the searches."""
    n = problem.num_devices
    if n % pipeline_devices:
        return None
    copies = n // pipeline_devices
    if problem.global_batch_size % (copies * microbatches):
        return None
    b = problem.global_batch_size / (copies * microbatches)
    num_stages = len(slots)
    if num_stages == 0 or num_stages > microbatches:
        return None
    if num_stages > 1 and gradient_sync != "end":
        return None
    if slots[0].first != 0 or slots[-1].stop != problem.num_layers:
        return None
    block = 0.0
    path = 0.0
    allreduce = []
    for s, slot in enumerate(slots):
        if slot.width < 1 or slot.stop <= slot.first:
            return None
        if slot.offset + slot.width > pipeline_devices:
            return None
        if s > 0 and (slots[s - 1].stop != slot.first or slots[s - 1].offset + slots[s - 1].width != slot.offset):
            return None
        samples = b / slot.width
        if samples < 1:
            return None
        inflight = min(microbatches, num_stages - s)
        if problem.stage_max_inflight(slot.first, slot.stop, samples) < inflight:
            return None
        c = float(problem.compute_s(slot.first, slot.stop, samples))
        x = 0.0
        if s > 0:
            prev = slots[s - 1]
            intra = problem.in_one_node(prev.offset, slot.offset + slot.width - 1, pipeline_devices, copies)
            x = float(problem.transfer_s(problem.cut_bytes_per_sample[slot.first] * b, intra))
        nodes = problem.nodes_spanned(slot.offset, slot.width, pipeline_devices, copies)
        params = problem.param_prefix_bytes[slot.stop] - problem.param_prefix_bytes[slot.first]
        allreduce.append(float(problem.allreduce_s(params, copies * slot.width, nodes)))
        block = max(block, c, x)
        path += c + x
    if num_stages == 1 and gradient_sync != "end":
        slot = slots[0]
        nodes = problem.nodes_spanned(slot.offset, slot.width, pipeline_devices, copies)
        latency = data_parallel_latency_s(problem, copies * slot.width, nodes, microbatches, b / slot.width,
                                          gradient_sync)
    else:
        latency = hpgo_latency_s(block, microbatches, path, allreduce)
    return make_plan(problem, pipeline_devices, microbatches, slots, latency, gradient_sync)


def make_plan(problem: PlanProblem, pipeline_devices: int, microbatches: int,
              slots: Sequence[StageSlot], latency_s: float, gradient_sync: GradientSync = "end") -> HybridPlan:
    copies = problem.num_devices // pipeline_devices
    placement = tuple(
        tuple(sorted(c * pipeline_devices + slot.offset + k for c in range(copies) for k in range(slot.width)))
        for slot in slots
    )
    strategy = Strategy(
        pipeline_model_parallel_size=len(slots),
        num_microbatches=microbatches,
        stage_boundaries=tuple(slot.first for slot in slots[1:]),
        stage_replicas=tuple(len(devices) for devices in placement),
        placement=placement,
        gradient_sync=gradient_sync,
    )
    return HybridPlan(
        strategy=strategy,
        num_layers=problem.num_layers,
        copies=copies,
        pipeline_devices=pipeline_devices,
        micro_batch_size=problem.global_batch_size / (copies * microbatches),
        latency_s=latency_s,
        speedup=problem.single_device_s / latency_s,
    )

"""A bare pipeline: one schedule, per-stage costs, no data or tensor parallelism.

This is what the reference charts of docs/pipeline-schedules.md draw (unit costs, free
communication) and what the closed forms describe; `simulate` in `strategy_sim` builds on the same pieces.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict, Unpack

import numpy as np

from paraplan.core.glossary import EventKindCode, StreamCode
from paraplan.core.timeline import Timeline, TimelineColumns, timeline_columns
from paraplan.sim.engine import PipelineCosts, PipelineRun, execute
from paraplan.sim.schedules import BWD, FWD, get_schedule


def timeline_kinds(kind: np.ndarray, split_backward: bool) -> np.ndarray:
    """Engine op kinds (FWD, BWD, WGT) as Timeline kinds."""
    bwd = EventKindCode.BWD_INPUT if split_backward else EventKindCode.BWD
    table = np.array([EventKindCode.FWD, bwd, EventKindCode.BWD_WEIGHT], dtype=np.int8)
    return table[kind]


def blocked_s(run: PipelineRun, costs: PipelineCosts | None) -> np.ndarray:
    """Per op: the tail that is a blocking transfer (`PipelineCosts.blocked_fwd_s`)."""
    out = np.zeros(run.kind.shape[0])
    if costs is None:
        return out
    for kind, blocked in ((FWD, costs.blocked_fwd_s), (BWD, costs.blocked_bwd_s)):
        if blocked is not None:
            mask = run.kind == kind
            out[mask] = blocked[run.vstage[mask]]
    return out


def transfer_columns(run: PipelineRun, costs: PipelineCosts) -> dict[str, np.ndarray]:
    """Send events on the sender's comm stream for every pipeline transfer with a cost:
    F(vs) sends its activation to vs + 1, B(vs) its gradient to vs - 1; a blocking one
    as the tail of the op that waits for it."""
    nv = costs.num_virtual_stages
    fwd_cost = np.append(costs.send_fwd_s, 0.0)  # by sender vs
    bwd_cost = np.insert(costs.send_bwd_s, 0, 0.0)  # by sender vs: vs -> vs - 1
    cost = np.where(run.kind == FWD, fwd_cost[run.vstage], np.where(run.kind == BWD, bwd_cost[run.vstage], 0.0))
    sends = (cost > 0) & (((run.kind == FWD) & (run.vstage < nv - 1)) | ((run.kind == BWD) & (run.vstage > 0)))
    blocked = blocked_s(run, costs)
    waits = blocked > 0
    n = int(sends.sum() + waits.sum())
    return {
        "device": np.concatenate([run.device[sends], run.device[waits]]),
        "stream": np.full(n, StreamCode.COMM, dtype=np.int8),
        "kind": np.full(n, EventKindCode.SEND, dtype=np.int8),
        "stage": np.concatenate([run.vstage[sends], run.vstage[waits]]),
        "microbatch": np.concatenate([run.microbatch[sends], run.microbatch[waits]]),
        "start_s": np.concatenate([run.end_s[sends], run.end_s[waits] - blocked[waits]]),
        "end_s": np.concatenate([run.end_s[sends] + cost[sends], run.end_s[waits]]),
    }


def run_columns(run: PipelineRun, split_backward: bool, costs: PipelineCosts | None = None) -> dict[str, np.ndarray]:
    """The engine's compute ops as Timeline columns (without the blocking transfers they
    wait for, which `transfer_columns` draws)."""
    return {
        "device": run.device,
        "stream": np.full(run.kind.shape[0], StreamCode.COMPUTE, dtype=np.int8),
        "kind": timeline_kinds(run.kind, split_backward),
        "stage": run.vstage,
        "microbatch": run.microbatch,
        "start_s": run.start_s,
        "end_s": run.end_s - blocked_s(run, costs),
    }


def concat_columns(parts: Sequence[Mapping[str, Any]]) -> TimelineColumns:
    keys = ("device", "stream", "kind", "stage", "microbatch", "start_s", "end_s")
    dtypes = (np.int32, np.int8, np.int8, np.int32, np.int32, float, float)
    return timeline_columns(
        {k: np.concatenate([p[k] for p in parts]).astype(t, copy=False) for k, t in zip(keys, dtypes, strict=True)}
    )


@dataclass(frozen=True)
class PipelineOptions:
    """How a bare pipeline runs beyond its schedule and costs (the keyword arguments of
    `simulate_pipeline`)."""

    iterations: int = 1
    """Iterations run back to back (the step is the makespan divided by them)."""
    virtual_stages: int = 1
    """Model chunks per device (interleaved 1F1B)."""
    send_s: float = 0.0
    """Each transfer between neighbouring virtual stages."""
    weight_grad_fraction: float = 0.5
    """Share of a backward that is the weight gradient (split-backward schedules)."""
    micro_batch_size: int = 1
    """Samples per micro-batch (the timeline's batch size is M of them)."""


class PipelineOptionArgs(TypedDict, total=False):
    """`PipelineOptions` as keyword arguments."""

    iterations: int
    virtual_stages: int
    send_s: float
    weight_grad_fraction: float
    micro_batch_size: int


def simulate_pipeline(schedule: str, num_stages: int, num_microbatches: int, fwd_s: float | np.ndarray = 1.0,
                      bwd_s: float | np.ndarray = 2.0, **options: Unpack[PipelineOptionArgs]) -> Timeline:
    """Run `schedule` over `num_stages` devices with per-virtual-stage costs (scalars
    apply to every virtual stage; with v chunks per device, pass the cost of one
    chunk). With a split backward, B takes (1 - weight_grad_fraction) x bwd_s and W
    the rest. `step_time_s` is the makespan over `iterations`, divided by them."""
    opts = PipelineOptions(**options)
    iterations, virtual_stages = opts.iterations, opts.virtual_stages
    send_s, weight_grad_fraction, micro_batch_size = opts.send_s, opts.weight_grad_fraction, opts.micro_batch_size
    sched = get_schedule(schedule)
    nv = num_stages * virtual_stages
    fwd = np.broadcast_to(np.asarray(fwd_s, dtype=float), (nv,)).copy()
    bwd = np.broadcast_to(np.asarray(bwd_s, dtype=float), (nv,)).copy()
    if sched.split_backward:
        wgt = bwd * weight_grad_fraction
        bwd = bwd - wgt
    else:
        wgt = np.zeros(nv)
    sends = np.full(max(nv - 1, 0), float(send_s))
    costs = PipelineCosts(fwd, bwd, wgt, sends, sends)
    orders = sched.orders(num_stages, num_microbatches, iterations, virtual_stages)
    run = execute(orders, costs, num_microbatches * iterations)
    makespan = run.makespan_s
    serial = float((fwd.sum() + bwd.sum() + wgt.sum()) * num_microbatches * iterations)
    cols = concat_columns([run_columns(run, sched.split_backward), transfer_columns(run, costs)])
    return Timeline(
        **cols,
        step_time_s=makespan / iterations,
        batch_size=num_microbatches * micro_batch_size,
        num_devices=num_stages,
        speedup=serial / makespan if makespan > 0 else 1.0,
        bubble_fraction=run.bubble_fraction(),
        schedule=schedule,
        microbatches=num_microbatches,
        iterations=iterations,
    )

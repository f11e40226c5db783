"""One iteration of a DualPipe execution model (`ExecutionModel.dualpipe`): the ranks'
ops through `paraplan.sim.dualpipe.execute`, then each rank's gradient reduction and
tail as `paraplan.sim.execution` runs them for the other schedules, and its memory.

- Gradient buckets of a chunk become ready during the rank's last op that computes
  that chunk's weight gradient (a deferred W, a whole backward or a pair's backward),
  at their `ready_fraction` of it; they run one after another on the communication
  stream, after all compute unless `overlap_grad_reduce` (then slowing the compute
  beside them, `paraplan.sim.overlap_cost`); `after_sync_s` follows.
- Memory: the weight state, the activations of each chunk held from its forward to the
  end of its backward (a deferred one's W), at their peak over the rank's order, and the
  working set.
- Timeline: compute ops (a pair as its forward and backward), each transfer on the
  sender's communication stream, the buckets and after-sync steps.
"""

from __future__ import annotations

import numpy as np

from paraplan.core.glossary import NO_MICROBATCH, EventKindCode, StreamCode
from paraplan.core.timeline import Timeline, TimelineColumns
from paraplan.sim.dualpipe import DualOp, DualPipeCosts, DualPipeRun, Layout, execute, orders
from paraplan.sim.execution import ExecutionModel, IterationResult, RankEnds, repeat_iterations
from paraplan.sim.iteration_memory import MemoryAtPeak
from paraplan.sim.overlap_cost import contended_end_s, overlap_with_ops_s
from paraplan.sim.pipeline import concat_columns

_KIND = {DualOp.F: EventKindCode.FWD, DualOp.B: EventKindCode.BWD, DualOp.I: EventKindCode.BWD_INPUT,
         DualOp.W: EventKindCode.BWD_WEIGHT}


def _costs(model: ExecutionModel) -> DualPipeCosts:
    if model.dualpipe is None:
        raise ValueError("not a DualPipe execution model")
    return model.dualpipe


Events = list[tuple[int, int, float, float]]  # (rank, kind, start, end) on the comm stream


def _tails(model: ExecutionModel, run: DualPipeRun) -> tuple[np.ndarray, np.ndarray, Events]:
    """Per rank: when its compute and its reduction end, and the comm-stream events."""
    p = model.pipeline_stages
    compute_end = np.zeros(p)
    np.maximum.at(compute_end, run.rank, run.end_s)
    sync_end = compute_end.copy()
    events: Events = []
    for r in range(p):
        sync = model.grad_sync[r]
        if sync.bucket_s.size == 0:
            continue
        if model.overlap_grad_reduce:
            spans = {int(c): run.last_weight_grad(r, int(c)) for c in np.unique(sync.chunk)}
            ready = [spans[int(c)][0] + (spans[int(c)][1] - spans[int(c)][0]) * f
                     for c, f in zip(sync.chunk.tolist(), sync.ready_fraction.tolist(), strict=True)]
        else:
            ready = [float(compute_end[r])] * sync.bucket_s.size
        clock = -np.inf
        spans_s: list[tuple[float, float]] = []
        for rdy, dur in sorted(zip(ready, sync.bucket_s.tolist(), strict=True)):
            start = max(rdy, clock)
            clock = start + dur
            spans_s.append((start, clock))
            events.append((r, EventKindCode.ALLREDUCE, start, clock))
        beside = 0.0
        if model.grad_bucket_overlap_share > 0.0 and model.overlap_grad_reduce:  # z12: the compute it slows
            span, mine = np.array(spans_s), run.rank == r
            beside = overlap_with_ops_s(span[:, 0], span[:, 1], run.start_s[mine], run.end_s[mine])
        sync_end[r] = contended_end_s(clock, float(compute_end[r]), beside, model.grad_bucket_overlap_share)
    for r in range(p):
        if model.after_sync_s[r] > 0:
            events.append((r, EventKindCode.OPTIMIZER, float(sync_end[r]), float(sync_end[r] + model.after_sync_s[r])))
    return compute_end, sync_end, events


def _memory(model: ExecutionModel) -> tuple[np.ndarray, np.ndarray, MemoryAtPeak]:
    """Per rank: activation peak bytes, micro-batch chunks held then, and the peak's parts."""
    p = model.pipeline_stages
    act, held_n = np.zeros(p), np.zeros(p, dtype=np.int64)
    for r, order in enumerate(orders(model.schedule, p, model.microbatches)):
        chunk_bytes = np.asarray(model.memory[r].activation_bytes_per_chunk, dtype=float)
        held = count = 0.0
        for op in order:
            if op.kind in (DualOp.F, DualOp.P):
                held += chunk_bytes[op.chunk]
                count += 1
                if held > act[r]:
                    act[r], held_n[r] = held, int(count)
            if op.kind in (DualOp.B, DualOp.W):
                held -= chunk_bytes[op.chunk]
                count -= 1
            elif op.kind == DualOp.P:
                held -= chunk_bytes[op.chunk2]
                count -= 1
    state = np.array([m.weight_state_bytes for m in model.memory])
    working = np.array([m.working_bytes for m in model.memory])
    return act, held_n, MemoryAtPeak(state, working, np.zeros(p), act.copy())


def _columns(model: ExecutionModel, run: DualPipeRun, costs: DualPipeCosts,
             events: Events) -> TimelineColumns:
    p = model.pipeline_stages
    layout = Layout("dualpipe", p, model.microbatches)
    kind = np.array([_KIND[DualOp(k)] for k in run.kind.tolist()], dtype=np.int8)
    vstage = run.chunk * p + run.rank  # chunk c on rank r, paraplan's numbering
    stage = np.array([layout.place(int(r), int(c))[1] for r, c in zip(run.rank, run.chunk, strict=True)])
    forward = run.kind == DualOp.F
    backward = np.isin(run.kind, (DualOp.B, DualOp.I))
    sends = (forward & (stage < p - 1)) | (backward & (stage > 0))
    boundary = np.where(forward, stage, stage - 1)
    cost = np.where(sends, costs.send_s[np.clip(boundary, 0, p - 2)], 0.0)  # dualpipe: p >= 2
    sends &= cost > 0
    cols = [{"device": run.rank, "stream": np.full(run.rank.shape[0], StreamCode.COMPUTE, dtype=np.int8),
             "kind": kind, "stage": vstage, "microbatch": run.microbatch, "start_s": run.start_s, "end_s": run.end_s},
            {"device": run.rank[sends], "stream": np.full(int(sends.sum()), StreamCode.COMM, dtype=np.int8),
             "kind": np.full(int(sends.sum()), EventKindCode.SEND, dtype=np.int8), "stage": vstage[sends],
             "microbatch": run.microbatch[sends], "start_s": run.end_s[sends],
             "end_s": run.end_s[sends] + cost[sends]}]
    if events:
        ev = np.array(events, dtype=float)
        n = ev.shape[0]
        cols.append({"device": ev[:, 0].astype(np.int32), "stream": np.full(n, StreamCode.COMM, dtype=np.int8),
                     "kind": ev[:, 1].astype(np.int8), "stage": ev[:, 0].astype(np.int32),
                     "microbatch": np.full(n, NO_MICROBATCH, dtype=np.int32), "start_s": ev[:, 2],
                     "end_s": ev[:, 3]})
    return concat_columns(cols)


def run_dualpipe_iteration(model: ExecutionModel, timeline: bool = True) -> IterationResult:
    """The iteration's time, bubble, memory and (with `timeline`) events (module doc)."""
    costs = _costs(model)
    p = model.pipeline_stages
    run = execute("dualpipe", p, model.microbatches, costs)
    compute_end, sync_end, events = _tails(model, run)
    end = sync_end + model.after_sync_s
    iteration = float(end.max())
    bubble = float(1.0 - run.busy_s().sum() / (p * iteration)) if iteration > 0 else 0.0
    act, held, at_peak = _memory(model)
    peak = at_peak.state_bytes + at_peak.working_bytes + act
    shown = None
    if timeline:
        cols = _columns(model, run, costs, events)
        if model.iterations > 1:
            cols = repeat_iterations(cols, model.iterations, iteration, model.microbatches)
        shown = Timeline(**cols, step_time_s=iteration,
                         batch_size=model.samples_per_iteration, num_devices=model.num_devices,
                         speedup=float("nan"), bubble_fraction=bubble, peak_mem_bytes=tuple(float(x) for x in peak),
                         schedule="dualpipe", microbatches=model.microbatches, iterations=model.iterations)
    return IterationResult(iteration, bubble, peak, act, held, sync_end - compute_end, shown, at_peak)


def dualpipe_rank_ends(model: ExecutionModel) -> RankEnds:
    """Per rank: compute time, and when its compute, its reduction and its iteration end."""
    run = execute("dualpipe", model.pipeline_stages, model.microbatches, _costs(model))
    compute_end, sync_end, _ = _tails(model, run)
    return RankEnds(run.busy_s(), compute_end, sync_end, sync_end + model.after_sync_s)

"""One training step of any D x T x P strategy on a cluster: the physical engine.

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
from paraplan.core.timeline import KINDS, Timeline, TimelineColumns, timeline_columns
from paraplan.sim.engine import PipelineCosts, execute
from paraplan.sim.pipeline import COMM, COMPUTE, concat_columns, run_columns, transfer_columns
from paraplan.sim.schedules import BWD, FWD, WGT, OpOrder, get_schedule

ALLREDUCE = KINDS.index("allreduce")


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


def _activation_peak_bytes(order: OpOrder, chunk_act_bytes: np.ndarray, split_backward: bool) -> float:
    """Peak activation bytes held on one device as its order runs."""
    free_kind = WGT if split_backward else BWD
    act = chunk_act_bytes[order.chunk]
    delta = np.where(order.kind == FWD, act, np.where(order.kind == free_kind, -act, 0.0))
    return float(np.cumsum(delta).max()) if delta.size else 0.0


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
) -> Timeline:
    """One training step of `strategy` at `global_batch_size` samples; see the module doc.

    Raises `StrategyError` for strategies that cannot run (too few devices, too small
    a batch for M x replicas, schedule limits such as 2BW with p > M)."""
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

    counts: object = tp_allreduces
    if counts is None:
        meta_counts = profile.meta.get("tp_allreduces") if profile.meta else None
        counts = meta_counts if meta_counts is not None else default_tp_allreduces(nl)
    tp_counts = np.asarray(counts, dtype=float)
    if tp_counts.shape != (nl,):
        raise StrategyError(f"tp_allreduces needs one count per layer ({nl}), got {tp_counts.shape}")

    # per virtual stage costs
    fwd = np.zeros(nv)
    bwd = np.zeros(nv)
    layer_fwd = np.zeros(nl)  # per layer per micro-batch on its device (P3 needs layers)
    layer_bwd = np.zeros(nl)
    act_mb = np.zeros(nv)  # activations held per micro-batch (all layers of the stage), per device
    out_act = np.zeros(nv)  # boundary activation per micro-batch per replica
    for vs, (lo, hi) in enumerate(lay.layer_ranges):
        s = int(dev_of_v[vs])
        b = float(samples[s])
        f_fix, b_fix = profile.fwd_fixed_s[lo:hi], profile.bwd_fixed_s[lo:hi]
        f_l = f_fix + (profile.fwd_s_at(b)[lo:hi] - f_fix) / t
        b_l = b_fix + (profile.bwd_s_at(b)[lo:hi] - b_fix) / t
        acts = profile.activation_bytes_at(b)[lo:hi]
        if t > 1:
            ids = lay.devices[s][:t]
            group = Group(t, cluster.nodes_spanned(ids))
            ar = np.array([comm.time_s("all_reduce", a, group) if c > 0 else 0.0
                           for a, c in zip(acts, tp_counts[lo:hi], strict=True)])
            f_l = f_l + tp_counts[lo:hi] * ar
            b_l = b_l + tp_counts[lo:hi] * ar
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

    iters = 1 if sched.flush else max(2, strategy.iterations)
    orders = sched.orders(p, m, iters, v)
    run = execute(orders, costs, m * iters)

    # gradient synchronisation per pipeline device
    param_dev = np.zeros(p)
    for vs, (lo, hi) in enumerate(lay.layer_ranges):
        param_dev[dev_of_v[vs]] += profile.param_bytes[lo:hi].sum() / t
    sync_events: list[tuple[int, float, float]] = []  # (pipeline device, start, end)
    compute_end = np.zeros(p)
    np.maximum.at(compute_end, run.device, run.end_s)
    step_end = compute_end.copy()
    sync_s = np.zeros(p)
    grad_kind = WGT if sched.split_backward else BWD
    last_mb = m * iters - 1
    mode = strategy.gradient_sync
    for s in range(p):
        r = int(reps[s])
        if r <= 1 or param_dev[s] <= 0 or mode == "p3":
            continue
        group = Group(r, cluster.nodes_spanned(lay.devices[s][0::t]))
        if mode == "end":
            dur = float(comm.time_s("all_reduce", param_dev[s], group))
            sync_events.append((s, compute_end[s], compute_end[s] + dur))
            sync_s[s] = dur
            step_end[s] = compute_end[s] + dur
            continue
        buckets: list[tuple[float, float]] = []  # (ready time, bytes)
        for vs in range(s, nv, p):
            lo, hi = lay.layer_ranges[vs]
            sel = (run.vstage == vs) & (run.kind == grad_kind) & (run.microbatch == last_mb)
            op_start, op_end = float(run.start_s[sel][0]), float(run.end_s[sel][0])
            b_l = profile.bwd_s_at(float(samples[s]))[lo:hi][::-1]
            frac = np.cumsum(b_l) / b_l.sum() if b_l.sum() > 0 else np.ones_like(b_l)
            ready = op_start + (op_end - op_start) * frac
            sizes = profile.param_bytes[lo:hi][::-1] / t
            acc = 0.0
            for rdy, nb in zip(ready, sizes, strict=True):
                acc += nb
                if acc >= grad_bucket_bytes:
                    buckets.append((float(rdy), acc))
                    acc = 0.0
            if acc > 0:
                buckets.append((float(ready[-1]), acc))
        clock = 0.0
        for rdy, nb in sorted(buckets):
            start = max(rdy, clock)
            clock = start + float(comm.time_s("all_reduce", nb, group))
            sync_events.append((s, start, clock))
            sync_s[s] += clock - start
        step_end[s] = max(compute_end[s], clock)

    busy = run.busy_s()
    if sched.flush:
        step = float(step_end.max())
        busy_per_step = busy
    else:
        one = execute(sched.orders(p, m, 1, v), costs, m).makespan_s
        period = (run.makespan_s - one) / (iters - 1)
        step = float(max(period, sync_s.max()))
        busy_per_step = busy / iters
    bubble = float(1.0 - busy_per_step.sum() / (p * step)) if step > 0 else 0.0

    # memory per pipeline device
    chunk_act = np.zeros((p, v))
    for vs in range(nv):
        chunk_act[vs % p, vs // p] = act_mb[vs]
    one_iter = sched.orders(p, m, 1, v)
    peak = np.array([
        param_dev[s] * (sched.weight_versions + 1 + optimizer_state_factor)
        + _activation_peak_bytes(one_iter[s], chunk_act[s], sched.split_backward)
        for s in range(p)
    ])

    single = float(profile.fwd_s_at(global_batch_size).sum() + profile.bwd_s_at(global_batch_size).sum())
    if mode == "p3":
        r = int(reps[0])
        layer_ar = np.zeros(nl)
        if r > 1:
            group = Group(r, cluster.nodes_spanned(lay.devices[0][0::t]))
            grads = profile.param_bytes / t
            layer_ar = np.array([float(comm.time_s("all_reduce", nb, group)) if nb > 0 else 0.0
                                 for nb in grads])
        iters = max(2, strategy.iterations)
        cols, step = p3_steady_state(layer_fwd, layer_bwd, layer_ar, m, iters)
        busy_one = m * float(layer_fwd.sum() + layer_bwd.sum())
        bubble = float(1.0 - busy_one / step) if step > 0 else 0.0
    else:
        cols = concat_columns([run_columns(run, sched.split_backward), transfer_columns(run, costs)])
    if sync_events:
        ev = np.array(sync_events, dtype=float)
        n = ev.shape[0]
        cols = concat_columns([cols, {
            "device": ev[:, 0].astype(np.int32), "stream": np.full(n, COMM, dtype=np.int8),
            "kind": np.full(n, ALLREDUCE, dtype=np.int8), "stage": ev[:, 0].astype(np.int32),
            "microbatch": np.full(n, -1, dtype=np.int32), "start_s": ev[:, 1], "end_s": ev[:, 2],
        }])
    if sched.flush and strategy.iterations > 1 and mode != "p3":
        cols = _repeat_steps(cols, strategy.iterations, step, m)
        iters = strategy.iterations
    cols = _expand_to_devices(cols, lay.devices)
    num_ids = max(max(ids) for ids in lay.devices) + 1
    peak_ids = np.zeros(num_ids)
    for s, ids in enumerate(lay.devices):
        peak_ids[list(ids)] = peak[s]
    return Timeline(
        **cols,
        step_time_s=step,
        batch_size=global_batch_size,
        num_devices=strategy.num_devices,
        speedup=single / step if step > 0 else 1.0,
        bubble_fraction=bubble,
        peak_mem_bytes=tuple(float(x) for x in peak_ids),
        schedule=strategy.schedule if p > 1 else "",
        microbatches=m,
        iterations=iters,
    )


def p3_comm_segments(release_s: np.ndarray, work_s: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Preempt-resume priority service of per-layer all-reduces on one comm stream.

    Layer l is released at `release_s[l]` and needs `work_s[l]` seconds; the stream
    always serves the lowest-numbered pending layer. Releases must not increase with
    the layer index (the backward produces the last layer's gradient first), so the
    newest pending layer is the one served: a stack, O(layers). Returns the service
    segments as (layer, start_s, end_s) arrays in time order."""
    release_s = np.asarray(release_s, dtype=float)
    work_s = np.asarray(work_s, dtype=float)
    if np.any(np.diff(release_s) > 0):
        raise StrategyError("P3 releases must come from the last layer to the first")
    segs: list[tuple[int, float, float]] = []
    stack: list[list] = []  # [layer, remaining seconds]
    clock = -np.inf
    for layer in range(release_s.shape[0] - 1, -1, -1):
        ready = float(release_s[layer])
        while stack and clock < ready:
            top = stack[-1]
            if top[1] <= ready - clock:
                segs.append((top[0], clock, clock + top[1]))
                clock += top[1]
                stack.pop()
            else:
                segs.append((top[0], clock, ready))
                top[1] -= ready - clock
                clock = ready
        clock = max(clock, ready)
        if work_s[layer] > 0:
            stack.append([layer, float(work_s[layer])])
    while stack:
        top = stack.pop()
        segs.append((top[0], clock, clock + top[1]))
        clock += top[1]
    if not segs:
        return np.zeros(0, dtype=np.int64), np.zeros(0), np.zeros(0)
    arr = np.array(segs, dtype=float)
    return arr[:, 0].astype(np.int64), arr[:, 1], arr[:, 2]


def p3_steady_state(fwd_s: np.ndarray, bwd_s: np.ndarray, allreduce_s: np.ndarray, microbatches: int,
                    iterations: int = 2) -> tuple[TimelineColumns, float]:
    """Data parallelism with P3 gradient synchronisation on one (pipeline) device.

    `fwd_s`, `bwd_s`: per layer and micro-batch; `allreduce_s`: per layer (0: nothing
    to synchronise); `microbatches`: gradient accumulation steps k (micro-batch i of an
    iteration runs F then B; only the first forward of an iteration waits for the
    previous iteration's all-reduces). Simulates `iterations` (>= 2) iterations and
    returns the timeline columns (device 0, stage 0) and the period of the last one
    (from the start of one iteration's last backward to the next's)."""
    if iterations < 2:
        raise StrategyError(f"P3's steady state needs >= 2 iterations, got {iterations}")
    f = np.asarray(fwd_s, dtype=float)
    b = np.asarray(bwd_s, dtype=float)
    k = int(microbatches)
    f_tot, b_tot = float(f.sum()), float(b.sum())
    f_cum = np.cumsum(f)
    f_before = f_cum - f
    b_from = np.cumsum(b[::-1])[::-1]  # backward from the last layer down to layer l
    fk, bk, ck = KINDS.index("fwd"), KINDS.index("bwd"), ALLREDUCE
    # the ops between an iteration's first forward and its last backward:
    # B0, F1, B1, ..., F(k-1); then B(k-1)
    mid_dur = np.tile([b_tot, f_tot], k - 1)
    mid_kind = np.tile([bk, fk], k - 1)
    mid_mb = np.repeat(np.arange(k - 1), 2) + np.tile([0, 1], k - 1)
    parts: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []

    def add(stream: int, kind, mb, start, end) -> None:
        start = np.atleast_1d(np.asarray(start, dtype=float))
        n = start.shape[0]
        parts.append((np.full(n, stream), np.broadcast_to(kind, (n,)), np.broadcast_to(mb, (n,)),
                      start, np.atleast_1d(np.asarray(end, dtype=float))))

    fwd0_end = f_tot  # iteration 0: nothing to wait for
    add(COMPUTE, fk, 0, 0.0, f_tot)
    last_bwd = np.zeros(iterations)
    for e in range(iterations):
        base = e * k
        mid_start = fwd0_end + np.cumsum(mid_dur) - mid_dur
        add(COMPUTE, mid_kind, base + mid_mb, mid_start, mid_start + mid_dur)
        s = fwd0_end + (k - 1) * (f_tot + b_tot)
        last_bwd[e] = s
        add(COMPUTE, bk, base + k - 1, s, s + b_tot)
        release = s + b_from
        layer, seg_start, seg_end = p3_comm_segments(release, allreduce_s)
        add(COMM, ck, -1, seg_start, seg_end)
        if e == iterations - 1:
            break
        synced = release.copy()
        np.maximum.at(synced, layer, seg_end)
        gate = np.maximum.accumulate(np.maximum(s + b_tot, np.maximum.accumulate(synced) - f_before))
        # layer l of the next forward runs in [gate_l + f_before_l, gate_l + f_cum_l]; gate
        # rises where it waits: one op per stretch without waiting
        first = np.flatnonzero(np.concatenate(([True], gate[1:] > gate[:-1])))
        last = np.append(first[1:] - 1, f.shape[0] - 1)
        add(COMPUTE, fk, base + k, gate[first] + f_before[first], gate[last] + f_cum[last])
        fwd0_end = float(gate[-1] + f_cum[-1])
    stream, kind, mb, start, end = (np.concatenate(c) for c in zip(*parts, strict=True))
    n = start.shape[0]
    cols = TimelineColumns(device=np.zeros(n, dtype=np.int32), stream=stream.astype(np.int8),
                           kind=kind.astype(np.int8), stage=np.zeros(n, dtype=np.int32),
                           microbatch=mb.astype(np.int32), start_s=start, end_s=end)
    return cols, float(last_bwd[-1] - last_bwd[-2])


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


def _repeat_steps(cols: Mapping[str, Any], iterations: int, step_s: float,
                  microbatches: int) -> TimelineColumns:
    """Flushed iterations are identical: iteration e is iteration 0 shifted by e steps
    (micro-batches renumbered e x M + i)."""
    n = cols["start_s"].shape[0]
    e = np.repeat(np.arange(iterations), n)
    out = {k: np.tile(a, iterations) for k, a in cols.items()}
    out["start_s"] = out["start_s"] + e * step_s
    out["end_s"] = out["end_s"] + e * step_s
    has_mb = out["microbatch"] >= 0
    out["microbatch"] = np.where(has_mb, out["microbatch"] + e * microbatches, -1).astype(np.int32)
    return timeline_columns(out)

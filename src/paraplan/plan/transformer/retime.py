"""Re-timing the transformer planner's best candidates with the exact engine
(`paraplan.predict`), skipping those a lower bound proves slower than every plan the
answer can hold.

Every pipeline rank runs its ops one after another and its iteration ends no earlier
than its last op (the gradient reduction and the optimizer step only add to it), so
the iteration is at least the busiest rank's compute: M x the sum of its chunks'
forward and backward (and weight-gradient) op times (`busy_lower_bound_s`), after (for
a flushed schedule) the first forward has reached it (`costs_lower_bound_s`). Priced
execution models are cheap next to running them; a candidate whose bound exceeds the
`keep`-th best iteration time (distinct settings that fit) re-timed so far cannot be
among the `keep` plans answered, which therefore stay exactly those of re-timing
every candidate. Candidates go in order of their estimate, so the best come first.
A DualPipe rank runs two stages (r and p - 1 - r), M / 2 micro-batches' forward and
backward on each, each pass alone or in a pair at no more than its pair share: its bound
is M / 2 x the sum over both stages of the lesser of each pass's two costs."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from paraplan.core.cluster import Cluster
from paraplan.core.comm import CommModel
from paraplan.core.run_settings import RunSettings
from paraplan.core.transformer import TransformerModel
from paraplan.predict.build import kernel_times_by_pass, pipeline_costs, price, run_structure
from paraplan.predict.device_model import DeviceEfficiency
from paraplan.predict.pass_times import pass_times
from paraplan.sim.engine import PipelineCosts
from paraplan.sim.execution import ExecutionModel, IterationResult, run_iteration
from paraplan.sim.schedules import get_schedule

_TOL = 1 + 1e-9  # relative slack of the bound (the engine sums op times in another order)


def busy_lower_bound_s(model: ExecutionModel) -> float:
    """The busiest pipeline rank's compute per iteration, s: rank r runs virtual stages
    r, r + p, ... (chunk c is virtual stage c p + r), each micro-batch once (DualPipe:
    module doc)."""
    p, v, m = model.pipeline_stages, model.virtual_stages, model.microbatches
    dual = model.dualpipe
    if dual is not None:
        stage = np.minimum(dual.fwd_s, dual.pair_fwd_s) + np.minimum(dual.bwd_s, dual.pair_bwd_s)
        return float(m / 2 * (stage + stage[::-1]).max())
    return costs_lower_bound_s(model.costs, model.schedule, p, v, m)


def costs_lower_bound_s(costs: PipelineCosts, schedule: str, p: int, v: int, m: int) -> float:
    """`busy_lower_bound_s` of a schedule other than DualPipe, from its pipeline costs
    alone (p stages, v chunks each, m micro-batches). A flushed schedule's rank r also
    starts no earlier than the forward of micro-batch 0 has crossed virtual stages 0 to
    r - 1 (every op of rank r waits on a forward of a virtual stage >= r, which waits on
    theirs and their transfers): its busy time counts from there (op times and
    transfers >= 0; the iteration ends no earlier than the last rank's compute)."""
    sched = get_schedule(schedule)
    per_stage = costs.fwd_s + costs.bwd_s
    if sched.split_backward:
        per_stage = per_stage + costs.wgt_s
    busy = m * per_stage.reshape(v, p).sum(axis=0)
    fill = costs.fwd_s[:p - 1] + costs.send_fwd_s[:p - 1]
    if sched.flush and p > 1 and (costs.fwd_s >= 0).all() and (costs.send_fwd_s >= 0).all():
        busy = busy + np.concatenate([[0.0], np.cumsum(fill)])
    return float(busy.max())


def retime(model: TransformerModel, settings: Sequence[RunSettings], cluster: Cluster, comm: CommModel,
           efficiency: DeviceEfficiency, keep: int, estimate_s: np.ndarray,
           known_s: Sequence[float] = ()) -> list[tuple[IterationResult, RunSettings] | None]:
    """The exact iteration of each of `settings`, in their order; None where the bound
    proves it slower than the `keep` best that fit. `estimate_s`: the order to time
    them in; -inf for settings that must be timed whatever their bound (the baselines,
    which the answer reports). `known_s`: iteration times of plans re-timed before,
    other settings than these, that fit (the post-pass's: `search.py`)."""
    structures = [run_structure(model, s, cluster, comm) for s in settings]
    kernel_s = kernel_times_by_pass(structures, efficiency)
    capacity = float(cluster.device.usable_memory_bytes)
    out: list[tuple[IterationResult, RunSettings] | None] = [None] * len(settings)
    best: dict[RunSettings, float] = {}  # distinct settings that fit: their iteration, s
    kept = sorted(known_s)[:keep]  # the `keep` least of `best` and `known_s`, sorted
    for i in np.argsort(estimate_s, kind="stable").tolist():
        st, s = structures[i], settings[i]
        bounded = estimate_s[i] != -np.inf and len(kept) >= keep
        if bounded and s.pipeline_schedule != "dualpipe":
            # the bound from the pipeline costs alone: a skipped candidate's gradient
            # buckets and memory are never built (`RunStructure`)
            times = pass_times(st, kernel_s[i], efficiency)
            costs = pipeline_costs(st, times, efficiency)
            if costs_lower_bound_s(costs, s.pipeline_schedule, s.pipeline_model_parallel_size,
                                   s.virtual_pipeline_model_parallel_size, s.num_microbatches) > kept[keep - 1] * _TOL:
                continue
            execution = price(st, kernel_s[i], efficiency, priced=(times, costs))
        else:
            execution = price(st, kernel_s[i], efficiency)
            if bounded and busy_lower_bound_s(execution) > kept[keep - 1] * _TOL:
                continue
        result = run_iteration(execution, timeline=False)
        out[i] = (result, settings[i])
        if float(result.peak_memory_bytes.max()) <= capacity:
            seconds = min(result.iteration_s, best.get(settings[i], np.inf))
            best[settings[i]] = seconds
            kept = sorted([*best.values(), *known_s])[:keep]
    return out

"""The best parallel strategy for training a transformer on N GPUs of a cluster: one
search over TP, PP (even or balanced uneven layer splits), DP, micro-batch size,
interleaving, schedule, recomputation, sequence parallelism and ZeRO stage, and for
mixture-of-experts models expert parallelism (EP) and expert tensor parallelism (ETP).

1. Enumerate every candidate that can run (`space.enumerate_candidates`) and
   estimate its iteration time and peak memory in closed form, vectorised
   (`estimate.estimate`).
2. Keep the candidates whose estimated memory fits (with a small margin: the
   estimate is not exact); re-time the `retime` fastest by estimate of each
   schedule, and the data-parallel baselines, with the exact engine
   (`paraplan.predict`), which also checks memory exactly; a candidate whose lower
   bound (its busiest rank's compute) already exceeds the `top_k`-th best re-timed
   plan is skipped, since it cannot be answered (`retime.py`).
3. Post-pass (`variants.py`): the fastest 1F1B candidates that fit as DualPipe, then
   the best re-timed plans again with each valid combination of the overlap flags the
   estimate does not price (`tp_comm_overlap`, `overlap_moe_expert_parallel_comm`,
   `moe_shared_expert_overlap`), all re-timed with the exact engine (with the same
   bound, against the plans already re-timed).
4. Answer the fastest re-timed plans that fit, best first. The baselines (pure data
   parallelism with and without overlapped gradient reduction, and with ZeRO stages
   1-3) are candidates of the same search, so the answer is never slower than any
   of them.

A model that fits nowhere is an error that names the least memory any candidate
needs and the candidate that needs it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

import numpy as np

from paraplan.core.comm import CommModel
from paraplan.core.errors import StrategyError
from paraplan.core.limits import MAX_SIMULATED_OPS
from paraplan.core.run_settings import RunSettings
from paraplan.core.transformer import TransformerModel
from paraplan.plan.transformer.estimate import estimate
from paraplan.plan.transformer.experts import flex_layouts
from paraplan.plan.transformer.memory_text import fits_nowhere_advice, peak_parts_text
from paraplan.plan.transformer.request import TransformerPlanRequest
from paraplan.plan.transformer.retime import retime
from paraplan.plan.transformer.space import Candidates, enumerate_candidates
from paraplan.plan.transformer.variants import (
    VARIANT_PLANS,
    block_recompute_variants,
    dualpipe_estimate_s,
    dualpipe_settings,
    flag_variants,
)
from paraplan.predict.build import Precision
from paraplan.predict.device_model import DeviceEfficiency
from paraplan.predict.peak_memory import PeakMemory
from paraplan.predict.predictor import RunPrediction, predict_settings, summarize

MEMORY_MARGIN = 1.05  # estimated peak may exceed the device by this factor and still be re-timed


@dataclass(frozen=True)
class PlanResult:
    plans: tuple[RunPrediction, ...]  # best first; every one fits
    baselines: dict[str, RunPrediction | None]  # name -> exact prediction (None: cannot run)
    candidates: int
    estimated_fitting: int
    retimed: int
    search_s: float
    not_simulated: int = 0  # candidates that fit by estimate beyond `MAX_SIMULATED_OPS`: not re-timed
    proven_slower: int = 0  # chosen for re-timing, skipped: a lower bound proves them slower than the plans answered
    post_pass: int = 0  # settings of the post-pass (flag variants, DualPipe) re-timed (`variants.py`)


BASELINES: dict[str, dict[str, object]] = {
    "dp_no_overlap": {"overlap_grad_reduce": False},
    "dp_overlap": {"overlap_grad_reduce": True},
    "dp_zero1": {"overlap_grad_reduce": True, "use_distributed_optimizer": True, "overlap_param_gather": True},
    "dp_zero2": {"overlap_grad_reduce": True, "zero_stage": 2, "overlap_param_gather": True},
    "dp_zero3": {"overlap_grad_reduce": True, "zero_stage": 3},
}


def baseline_settings(request: TransformerPlanRequest) -> dict[str, RunSettings | None]:
    """Pure data parallelism over every GPU, the micro-batch that fits best found by
    the search below: here micro-batch 1 with full recomputation (the smallest
    memory), so a baseline exists whenever data parallelism can run at all (None
    where those settings cannot run the model)."""
    base = request.base_settings()
    n = request.num_gpus
    out: dict[str, RunSettings | None] = {}
    for name, extra in BASELINES.items():
        if request.global_batch_size % n:
            out[name] = None
            continue
        settings = replace(base, data_parallel_size=n, micro_batch_size=1, recompute_granularity="full",
                           **extra)  # type: ignore[arg-type]
        try:
            settings.check(request.model)
        except StrategyError:  # e.g. ZeRO-3 with mixture-of-experts layers
            out[name] = None
            continue
        out[name] = settings
    return out


def model_state_bytes(model: TransformerModel, dtype: str) -> tuple[float, float]:
    """(parameters, bytes of weights, gradients and optimizer state) of `model` in
    `dtype`'s `Precision`, multi-token-prediction layers included: what every split
    holds in total, so no split of it over n devices needs less than 1/n of it each."""
    params = model.num_parameters + model.mtp_parameters
    per_param = Precision.of(dtype)
    return params, params * (per_param.weight_bytes + per_param.grad_bytes + per_param.optimizer_bytes)


def check_model_state_fits(model: TransformerModel, num_gpus: int, dtype: str, capacity_bytes: float) -> None:
    """Raise `StrategyError` when the weights, gradients and optimizer state alone
    (`model_state_bytes`) exceed the devices' memory even sharded evenly over all
    `num_gpus`: no split can fit."""
    params, state = model_state_bytes(model, dtype)
    if state / num_gpus > capacity_bytes:
        raise StrategyError(
            f"model '{model.name}' does not fit on {num_gpus:,} GPUs: {params / 1e9:,.1f}B parameters x "
            f"{state / params:.0f} bytes of weights, gradients and optimizer state ({dtype}) = {_size(state)}, "
            f"{state / num_gpus / 1e9:,.0f} GB per GPU even sharded over all of them; each has "
            f"{capacity_bytes / 1e9:,.1f} GB usable (at least {math.ceil(state / capacity_bytes):,} GPUs, "
            "before activations)")


def _mtp_share(model: TransformerModel) -> str:
    """', 11.6B of them multi-token prediction,' where the model has such layers: the
    count above is then more than its `num_parameters` (the plan CSV's column)."""
    return f", {model.mtp_parameters / 1e9:,.1f}B of them multi-token prediction," if model.mtp_num_layers else ""


def _size(nbytes: float) -> str:
    return f"{nbytes / 1e12:,.2f} TB" if nbytes >= 1e12 else f"{nbytes / 1e9:,.1f} GB"


def search(request: TransformerPlanRequest, comm: CommModel, efficiency: DeviceEfficiency,
           progress: Callable[[str], None] | None = None) -> PlanResult:
    """The best plans for `request` (see the module doc)."""
    started = time.perf_counter()
    model, cluster = request.model, request.cluster
    if request.num_gpus < 1:
        raise StrategyError(f"--gpus must be >= 1, got {request.num_gpus}")
    base = request.base_settings()
    cand = enumerate_candidates(model, request.num_gpus, request.global_batch_size, cluster.devices_per_node,
                                request.space, base.use_flash_attn, flex_layouts(model, base, cluster))
    capacity = cluster.device.usable_memory_bytes
    est = estimate(model, cand, base, cluster, comm, efficiency, fits_bytes=capacity * MEMORY_MARGIN)
    fits = est.peak_memory_bytes <= capacity * MEMORY_MARGIN
    if progress:
        within = int(fits.sum()) - int((est.peak_memory_bytes <= capacity).sum())  # w3: the margin apart
        progress(f"{len(cand)} candidates estimated, {int(fits.sum()) - within} fit in memory by estimate"
                 + (f" ({within} more within its {MEMORY_MARGIN - 1:.0%} margin, re-timed)" if within else ""))
    # the exact engine's memory and time grow with a candidate's pipeline operations:
    # beyond the bound every stage and tool keeps to, a candidate is estimated only
    too_long = pipeline_ops(cand, request.global_batch_size) > MAX_SIMULATED_OPS
    beyond = fits & too_long
    if beyond.any() and progress:
        fastest = float(est.iteration_s[beyond].min())
        progress(f"note: {int(beyond.sum())} candidates that fit by estimate (the fastest estimated at "
                 f"{fastest:.3g} s) have more than {MAX_SIMULATED_OPS:,} pipeline operations (3 x stages x "
                 "micro-batches x model chunks), more than paraplan simulates exactly: not re-timed, not answered")
    fits &= ~too_long
    # the fastest by estimate of each schedule: a schedule's estimate may be biased,
    # its best candidates are re-timed all the same
    order = np.flatnonzero(fits)[np.argsort(est.iteration_s[fits], kind="stable")]
    chosen = np.concatenate([order[cand.schedule[order] == k][: request.retime]
                             for k in np.unique(cand.schedule[order])]) if order.size else order
    settings = [cand.settings(int(i), base) for i in chosen]
    predictions, base_pred = _retime(request, settings, est.iteration_s[chosen], comm, efficiency)
    unique = _distinct_fastest(p for p in predictions if p is not None)
    if not unique:
        _raise_fits_nowhere(request, cand, est, base, comm, efficiency, ~too_long)
    dualpipe_fits = (est.dualpipe_peak_memory_bytes <= capacity * MEMORY_MARGIN) & fits
    dualpipe_s = dualpipe_estimate_s(cand, est.iteration_s, est.bubble_fraction)
    post = _post_pass(request, unique, cand, base, dualpipe_fits, dualpipe_s, comm, efficiency)
    unique = _distinct_fastest([*unique, *(p for p in post if p is not None)])
    retimed = sum(p is not None for p in predictions)
    timed_post = sum(p is not None for p in post)
    return PlanResult(tuple(unique[: request.top_k]), base_pred, len(cand), int(fits.sum()), retimed + timed_post,
                      time.perf_counter() - started, int(beyond.sum()),
                      len(predictions) - retimed + len(post) - timed_post, timed_post)


def _post_pass(request: TransformerPlanRequest, plans: list[RunPrediction], cand: Candidates, base: RunSettings,
               dualpipe_fits: np.ndarray, dualpipe_s: np.ndarray, comm: CommModel,
               efficiency: DeviceEfficiency) -> list[RunPrediction | None]:
    """The exact predictions of the post-pass's settings (module doc, step 3; None:
    proven slower than the `top_k` plans): DualPipe runs of the 1F1B candidates of least
    estimated DualPipe time (`dualpipe_s`) that fit as DualPipe, then the best `VARIANT_PLANS`
    plans so far (at least `top_k`) with each valid combination of overlap flags."""
    model, cluster, space = request.model, request.cluster, request.space
    out: list[RunPrediction | None] = []
    if "dualpipe" in space.schedules:
        picked = dualpipe_settings(cand, base, model, dualpipe_fits, dualpipe_s)
        out += _retime_pool(request, [s for _, s in picked], [float(dualpipe_s[i]) for i, _ in picked], plans,
                            comm, efficiency)
        plans = _distinct_fastest([*plans, *(p for p in out if p is not None)])
    pool: list[RunSettings] = []
    order_s: list[float] = []
    for plan in plans[:max(VARIANT_PLANS, request.top_k)]:
        variants = [*flag_variants(plan.settings, model, cluster, space),
                    *block_recompute_variants(plan.settings, model, space)]
        pool += variants
        order_s += [plan.iteration_s] * len(variants)
    return out + _retime_pool(request, pool, order_s, plans, comm, efficiency)


def _retime_pool(request: TransformerPlanRequest, pool: list[RunSettings], order_s: list[float],
                 plans: list[RunPrediction], comm: CommModel,
                 efficiency: DeviceEfficiency) -> list[RunPrediction | None]:
    """`retime` of `pool` in the order of `order_s`, against the `plans` re-timed before."""
    if not pool:
        return []
    known = [p.iteration_s for p in plans[:request.top_k]]
    model, cluster = request.model, request.cluster
    results = retime(model, pool, cluster, comm, efficiency, request.top_k, np.array(order_s), known)
    return [None if rs is None else summarize(model, rs[1], rs[0], cluster) for rs in results]


def _retime(request: TransformerPlanRequest, settings: list[RunSettings], estimate_s: np.ndarray, comm: CommModel,
            efficiency: DeviceEfficiency) -> tuple[list[RunPrediction | None], dict[str, RunPrediction | None]]:
    """The exact predictions of the chosen candidates (None: proven slower than the
    `top_k` answered, `retime.retime`) and of the baselines that can run."""
    model, cluster = request.model, request.cluster
    baselines = baseline_settings(request)
    runnable = {k: s for k, s in baselines.items()
                if s is not None and 3 * s.num_microbatches <= MAX_SIMULATED_OPS}
    pool = settings + list(runnable.values())
    order_s = np.concatenate([estimate_s, np.full(len(runnable), -np.inf)])  # the baselines: always
    results = retime(model, pool, cluster, comm, efficiency, request.top_k, order_s) if pool else []
    predictions = [None if rs is None else summarize(model, rs[1], rs[0], cluster) for rs in results]
    base_pred: dict[str, RunPrediction | None] = dict.fromkeys(baselines)
    for name, pred in zip(runnable, predictions[len(settings):], strict=True):
        base_pred[name] = pred
    return predictions, base_pred


def _distinct_fastest(predictions: Iterable[RunPrediction]) -> list[RunPrediction]:
    """The predictions that fit, fastest first (ties: in their order), one per settings."""
    fitting = sorted((p for p in predictions if p.fits_memory), key=lambda p: p.iteration_s)
    unique: list[RunPrediction] = []
    seen = set()
    for p in fitting:
        key = p.settings
        if key not in seen:
            seen.add(key)
            unique.append(p)
    return unique


def pipeline_ops(cand: Candidates, global_batch_size: int) -> np.ndarray:
    """Operations the exact engine simulates per candidate, counted as `paraplan
    predict` counts a run-table row: 3 x stages x micro-batches x model chunks."""
    microbatches = global_batch_size // (cand.d * cand.b)
    return 3 * cand.p * microbatches * cand.v


def _raise_fits_nowhere(request: TransformerPlanRequest, cand: Candidates, est, base: RunSettings, comm: CommModel,
                        efficiency: DeviceEfficiency, simulable: np.ndarray) -> None:
    """Re-time the simulable candidates of least estimated memory exactly and say how
    much the smallest needs."""
    if not simulable.any():
        raise StrategyError(
            f"{request.model.name} on {request.num_gpus} GPUs at global batch {request.global_batch_size}: every "
            f"candidate has more than {MAX_SIMULATED_OPS:,} pipeline operations (3 x stages x micro-batches x model "
            "chunks), more than paraplan simulates exactly; a smaller global batch would do")
    index = np.flatnonzero(simulable)
    smallest = index[np.argsort(est.peak_memory_bytes[index], kind="stable")[:8]]
    settings = [cand.settings(int(i), base) for i in smallest]
    results = predict_settings(request.model, settings, request.cluster, comm, efficiency)
    best = min(results, key=lambda rs: float(rs[0].peak_memory_bytes.max()))
    need = float(best[0].peak_memory_bytes.max())
    s = best[1]
    experts = (f"EP {s.expert_model_parallel_size}, ETP {s.expert_tensor_parallel}, "
               if request.model.is_moe else "")
    needs = (
        f"the smallest plan needs {need / 1e9:.1f} GB per device ({peak_parts_text(PeakMemory.of(best[0]))}; "
        f"TP {s.tensor_model_parallel_size}, "
        + (f"CP {s.context_parallel_size}, " if s.context_parallel_size > 1 else "")
        + f"PP {s.pipeline_model_parallel_size}, DP {s.data_parallel_size}, {experts}micro-batch {s.micro_batch_size}, "
        f"recompute {s.recompute_granularity}, ZeRO {s.zero_stage or ('1' if s.use_distributed_optimizer else 0)})")
    device, n = request.cluster.device, request.num_gpus
    where = f"{request.model.name} fits nowhere on {n:,} x {device.name} at global batch {request.global_batch_size}"
    usable = f"{device.capacity_text()} each"
    params, state = model_state_bytes(request.model, request.dtype)
    if state / n > device.usable_memory_bytes:
        # the more specific reason first: the model state alone, sharded over every GPU,
        # is the least any split needs, and it says how many GPUs it would take
        raise StrategyError(
            f"{where}: its weights, gradients and optimizer state alone are {_size(state)} ({params / 1e9:,.1f}B "
            f"parameters{_mtp_share(request.model)} x {state / params:.0f} bytes, {request.dtype}), "
            f"{_size(state / n)} per GPU even "
            f"sharded over all {n:,}, against {usable}; {needs}. It takes at least "
            f"{math.ceil(state / device.usable_memory_bytes):,} GPUs (the model state alone, before activations), "
            "a smaller model or a device with more memory")
    raise StrategyError(f"{where}: {needs}, against {usable}; "
                        f"{fits_nowhere_advice(PeakMemory.of(best[0]), request.model, int(cand.cp.max()))}")

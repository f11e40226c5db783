"""The space of parallel strategies an LLM planner searches, and a closed-form
estimate of every candidate's iteration time and peak memory, vectorised with numpy.

A candidate is (TP t, CP c, PP p, DP d, micro-batch b, virtual stages v, schedule,
recomputation, sequence parallelism, ZeRO stage) with t x c x p x d = the GPUs. Context
parallelism (ring attention, `cp_comm_type` p2p) is searched only for sequences of
`MIN_CP_SEQ_LENGTH` tokens and more, over the powers of two that divide the GPUs and
meet Megatron's rules. What a layer costs depends only on (t, c, b, sequence
parallelism, recomputation): those few
combinations are priced once with the exact device model (`paraplan.predict.build`);
everything else is closed form over the candidate arrays:

- stage op times: layers per stage x the layer's device and host time (smooth
  maximum, as the exact model), the embedding on the first stage, the head on the last;
- pipeline: 1F1B and GPipe sum of the stages' (F + B) + (M - 1) x the slowest stage's
  (exact for uniform stages); interleaved M x the busiest rank's (F + B) over its v
  chunks + (p - 1) x one middle chunk's (with an even split: (M v + p - 1) x one
  chunk's plus the first or last device's extra per micro-batch); a v that does not
  divide the layers over the stages uses Megatron's uneven first/last stages; ZB-H1 as 1F1B less (p - 1) W
  (the weight gradients leave the fill and drain); plus the fill/drain transfers;
- the gradient reduction over the d x c ranks that hold the same weights, exposed past
  the last backward, the optimizer step and a sharded optimizer's weight all-gather
  (none with overlap_param_gather);
- memory of the first and the last stage: weights, gradients and optimizer state as
  sharded, activations x micro-batches in flight (1F1B and ZB-H1: min(p, M) on the
  first stage; GPipe: M; interleaved: Megatron's warm-up count).

Mixture-of-experts models add expert parallelism (EP) and expert tensor parallelism
(ETP) to the candidate: EP over the divisors of `num_experts` with EP x ETP dividing
t x d, ETP 1 or t (Megatron-Core's default) unless the space names others. A layer is
then priced per kind (dense, MoE) and a stage's layers at the model's mean layer
(the share of MoE layers times the MoE layer, the rest dense): exact for uniform
models (Mixtral, Qwen3-MoE), an average for mixed ones (the exact re-timing counts
each stage's own layers). Expert weights are split over EP x ETP and their state
sharded over the expert-data-parallel group, which also reduces their gradients.

Dominated settings are not enumerated (each is never faster and never smaller in
the model): gradient reduction and weight all-gather are always overlapped when they
can be. The estimate ranks; the planner re-times its best candidates with the exact
engine.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import numpy as np

from paraplan.core.cluster import Cluster
from paraplan.core.comm import CommModel, Group
from paraplan.core.errors import StrategyError
from paraplan.core.run_settings import (
    DTYPE_BYTES,
    PipelineSchedule,
    RecomputeGranularity,
    RunSettings,
    interleaved_uneven_split,
)
from paraplan.core.transformer import TransformerModel
from paraplan.plan.llm_experts import expert_layouts, mixed_stage_params, probe_data_parallel, probe_structures
from paraplan.predict.build import (
    GRAD_BUCKET_PARAMS,
    LAYER_PASSES,
    MOE_LAYER_PASSES,
    OPTIMIZER_KERNELS,
    Pass,
    Precision,
    kernel_times_by_pass,
    mtp_expert_params,
    pass_times,
)
from paraplan.predict.device_model import DeviceEfficiency, DeviceSpeed, host_bound_s
from paraplan.predict.fsdp_ops import paired_s
from paraplan.predict.moe_ops import moe_activation_bytes
from paraplan.predict.mtp_ops import last_stage_work
from paraplan.predict.ops import embedding_work, layer_activation_bytes
from paraplan.predict.predictor import divisors
from paraplan.sim.engine import inflight_peak
from paraplan.sim.schedules import get_schedule

SCHEDULES: tuple[PipelineSchedule, ...] = ("1f1b", "interleaved_1f1b", "zb_h1", "gpipe")
RECOMPUTE: tuple[RecomputeGranularity, ...] = ("none", "selective", "full")
ZERO: tuple[int, ...] = (0, 1, 2, 3)  # 1: Megatron's distributed optimizer (ZeRO-1)
MIN_CP_SEQ_LENGTH = 16384
"""Shortest sequence for which context parallelism is searched (when the search space
does not list CP sizes): below it the attention is a small share of a layer and
splitting the sequence only adds transfers, so the search stays as small as it was."""
MIN_CP_CHUNK_TOKENS = 1024
"""Fewest tokens in each of a CP rank's two sequence chunks for a searched CP degree
(s / 2c >= this; 128K tokens: c <= 64): shorter blocks leave each ring step too little
attention to hide its transfer behind, and the bound keeps the search small."""


@dataclass(frozen=True)
class SearchSpace:
    """What the planner may choose from."""

    tensor_sizes: tuple[int, ...] = ()
    """TP degrees; empty: every divisor of the node's GPU count that the model allows."""
    allow_cross_node_tensor: bool = False
    """Let TP groups span nodes (degrees above the node's GPU count)."""
    schedules: tuple[str, ...] = SCHEDULES
    recompute: tuple[str, ...] = RECOMPUTE
    zero_stages: tuple[int, ...] = ZERO
    sequence_parallel: tuple[bool, ...] = (False, True)
    max_micro_batch_size: int = 64
    max_virtual_stages: int = 32
    context_parallel_sizes: tuple[int, ...] = ()
    """CP degrees; empty: 1, and for sequences of `MIN_CP_SEQ_LENGTH` tokens or more
    every power of two that divides the GPUs (`context_degrees`). (1,): no CP."""
    expert_model_sizes: tuple[int, ...] = ()
    """EP degrees for a mixture-of-experts model; empty: every divisor of num_experts."""
    expert_tensor_sizes: tuple[int, ...] = ()
    """ETP degrees; empty: 1 and the candidate's TP (Megatron-Core's default)."""

    def __post_init__(self) -> None:
        bad = [s for s in self.schedules if s not in SCHEDULES]
        if bad:
            raise StrategyError(f"unknown schedule '{bad[0]}' in the search space; known: {', '.join(SCHEDULES)}")
        bad_rc = [r for r in self.recompute if r not in RECOMPUTE]
        if bad_rc:
            raise StrategyError(f"unknown recompute_granularity '{bad_rc[0]}'; known: {', '.join(RECOMPUTE)}")
        bad_z = [z for z in self.zero_stages if z not in ZERO]
        if bad_z:
            raise StrategyError(f"unknown zero_stage {bad_z[0]}; known: 0, 1, 2, 3")
        bad_cp = [c for c in self.context_parallel_sizes if isinstance(c, bool) or not isinstance(c, int) or c < 1]
        if bad_cp:
            raise StrategyError(f"context_parallel_size {bad_cp[0]!r} in the search space; expected an integer >= 1")
        if not (self.schedules and self.recompute and self.zero_stages and self.sequence_parallel):
            raise StrategyError("every dimension of the search space needs at least one value")


@dataclass(frozen=True, eq=False)
class Candidates:
    """Aligned integer columns, one entry per candidate."""

    t: np.ndarray
    p: np.ndarray
    d: np.ndarray
    b: np.ndarray
    v: np.ndarray
    schedule: np.ndarray  # index into SCHEDULES
    recompute: np.ndarray  # index into RECOMPUTE
    sp: np.ndarray  # 0/1
    zero: np.ndarray  # 0..3
    first: np.ndarray  # decoder_first_pipeline_num_layers (0: even split)
    last: np.ndarray  # decoder_last_pipeline_num_layers (0: even split)
    cp: np.ndarray  # context_parallel_size
    ep: np.ndarray  # expert_model_parallel_size (1 for a dense model)
    etp: np.ndarray  # expert_tensor_parallel_size (0 for a dense model: Megatron's default)

    def __len__(self) -> int:
        return int(self.t.shape[0])

    def take(self, idx: np.ndarray) -> Candidates:
        return Candidates(*(getattr(self, f)[idx] for f in _FIELDS))

    def settings(self, i: int, base: RunSettings) -> RunSettings:
        """Candidate i as run settings (the base gives batch, dtype and attention kernel)."""
        zero = int(self.zero[i])
        replicas = int(self.d[i]) * int(self.cp[i])  # the ranks a gradient is reduced over
        return replace(
            base,
            tensor_model_parallel_size=int(self.t[i]), pipeline_model_parallel_size=int(self.p[i]),
            data_parallel_size=int(self.d[i]), micro_batch_size=int(self.b[i]),
            virtual_pipeline_model_parallel_size=int(self.v[i]), schedule=SCHEDULES[int(self.schedule[i])],
            recompute_granularity=RECOMPUTE[int(self.recompute[i])], sequence_parallel=bool(self.sp[i]),
            use_distributed_optimizer=zero == 1, zero_stage=0 if zero == 1 else zero,
            overlap_grad_reduce=replicas > 1, overlap_param_gather=zero in (1, 2) and replicas > 1,
            decoder_first_pipeline_num_layers=int(self.first[i]), decoder_last_pipeline_num_layers=int(self.last[i]),
            context_parallel_size=int(self.cp[i]), cp_comm_type="p2p",
            expert_model_parallel_size=int(self.ep[i]), expert_tensor_parallel_size=int(self.etp[i]),
        )


_FIELDS = ("t", "p", "d", "b", "v", "schedule", "recompute", "sp", "zero", "first", "last", "cp", "ep", "etp")


def context_degrees(model: TransformerModel, num_gpus: int, space: SearchSpace, flash: bool) -> list[int]:
    """CP degrees to search: the space's, else 1 and, for sequences of at least
    `MIN_CP_SEQ_LENGTH` tokens run with flash attention, the powers of two that divide
    the GPUs and leave chunks of `MIN_CP_CHUNK_TOKENS` or more; each must divide the GPUs
    and split the sequence into 2c chunks."""
    if space.context_parallel_sizes:
        options = space.context_parallel_sizes
    elif model.seq_length >= MIN_CP_SEQ_LENGTH and flash:
        options = tuple(1 << k for k in range(num_gpus.bit_length())
                        if model.seq_length >= 2 * MIN_CP_CHUNK_TOKENS << k)
    else:
        options = (1,)
    return [c for c in options if num_gpus % c == 0 and (c == 1 or (model.seq_length % (2 * c) == 0 and flash))]


def tensor_degrees(model: TransformerModel, devices_per_node: int, num_gpus: int, space: SearchSpace) -> list[int]:
    limit = num_gpus if space.allow_cross_node_tensor else devices_per_node
    options = space.tensor_sizes or tuple(divisors(limit))
    return [t for t in options if num_gpus % t == 0 and t <= limit and model.num_attention_heads % t == 0
            and model.query_groups % t == 0 and model.ffn_size % t == 0]


def enumerate_candidates(model: TransformerModel, num_gpus: int, global_batch_size: int, devices_per_node: int,
                         space: SearchSpace, flash: bool = True) -> Candidates:
    """Every candidate that can run (divisibility, schedule rules); memory is checked later.
    `flash`: the run's attention is fused (context parallelism needs it)."""
    rows: list[tuple[int, ...]] = []
    sched_idx: dict[str, int] = {s: i for i, s in enumerate(SCHEDULES)}
    rc_idx = [RECOMPUTE.index(r) for r in space.recompute]
    layouts = [(c, t) for c in context_degrees(model, num_gpus, space, flash)
               for t in tensor_degrees(model, devices_per_node, num_gpus // c, space)]
    for c, t in layouts:
        sps = sorted({bool(x) and t > 1 and model.seq_length % (t * c) == 0 for x in space.sequence_parallel})
        for p in divisors(num_gpus // (t * c)):
            if p > model.num_layers:
                break
            d = num_gpus // (t * c * p)
            if global_batch_size % d:
                continue
            splits: dict[int, tuple[int, int] | None] = {}
            experts = {sp: expert_layouts(model, t, c * d, sp, space) for sp in sps}
            per_replica = global_batch_size // d
            for b in divisors(per_replica):
                if b > space.max_micro_batch_size:
                    break
                m = per_replica // b
                pipes: list[tuple[int, int, int, int]] = []  # schedule, v, first and last stage's layers
                for schedule in space.schedules:
                    if schedule == "interleaved_1f1b":
                        if p < 2 or m % p:
                            continue
                        for v in range(2, space.max_virtual_stages + 1):
                            if v not in splits:
                                splits[v] = interleaved_uneven_split(model.num_layers, p, v)
                            split = splits[v]
                            if split is not None:
                                pipes.append((sched_idx[schedule], v, *split))
                    elif schedule in ("gpipe", "zb_h1") and p < 2:
                        continue
                    else:
                        pipes.append((sched_idx[schedule], 1, 0, 0))
                zeros = [z for z in space.zero_stages if not (z >= 2 and p > 1) and not (z >= 1 and d * c == 1)
                         and not (z == 3 and model.is_moe)]
                for s_i, v, first, last in pipes:
                    for rc in rc_idx:
                        for sp in sps:
                            for z in zeros:
                                for ep, etp in experts[sp]:
                                    rows.append((t, p, d, b, v, s_i, rc, int(sp), z, first, last, c, ep, etp))
    if not rows:
        raise StrategyError(
            f"no parallel layout of {model.name} fits the divisibility rules on {num_gpus} GPUs at global batch "
            f"{global_batch_size} (TP must divide the heads, groups and MLP width; DP the global batch)")
    cols = np.array(rows, dtype=np.int64).T
    return Candidates(*cols)


@dataclass(frozen=True, eq=False)
class LayerTable:
    """Per (t, b, sp, recompute, cp, EP, ETP): device and host time of a layer's forward and
    backward (with recomputation), of the embedding and head passes, the weight-grad
    part, and activation bytes; a mixture-of-experts model's layer is its mean layer
    (module doc)."""

    index: dict[tuple[int, ...], int]  # (t, b, sp, recompute, cp, EP, ETP)
    fwd_dev: np.ndarray
    fwd_host: np.ndarray
    bwd_dev: np.ndarray
    bwd_host: np.ndarray
    wgt_dev: np.ndarray
    emb_fwd: np.ndarray  # (dev, host) pairs
    emb_bwd: np.ndarray
    head_fwd: np.ndarray
    head_bwd: np.ndarray
    act_layer: np.ndarray
    act_full_layer: np.ndarray  # a layer's activations without recomputation (full recompute's working set)
    act_emb: np.ndarray
    act_head: np.ndarray


def layer_table(model: TransformerModel, cand: Candidates, base: RunSettings, cluster: Cluster, comm: CommModel,
                eff: DeviceEfficiency) -> LayerTable:
    keys = sorted(set(_table_keys(cand)))
    # the probe's data-parallel size only has to let EP x ETP divide t x c x d
    probes = [replace(base, tensor_model_parallel_size=t, pipeline_model_parallel_size=1,
                      data_parallel_size=probe_data_parallel(t * c, ep * etp), micro_batch_size=b,
                      global_batch_size=b * probe_data_parallel(t * c, ep * etp),
                      virtual_pipeline_model_parallel_size=1,
                      schedule="", sequence_parallel=bool(sp), recompute_granularity=RECOMPUTE[rc], zero_stage=0,
                      use_distributed_optimizer=False, overlap_grad_reduce=False, overlap_param_gather=False,
                      context_parallel_size=c, cp_comm_type="p2p", expert_model_parallel_size=ep,
                      expert_tensor_parallel_size=etp)
              for t, b, sp, rc, c, ep, etp in keys]
    moe_share = model.num_moe_layers / model.num_layers
    structures = probe_structures(model, probes, cluster, comm)
    kernel_s = kernel_times_by_pass(structures, eff)
    n = len(keys)
    out = {k: np.zeros(n) for k in ("fd", "fh", "bd", "bh", "w", "al", "af", "ae", "ah")}
    pairs = {k: np.zeros((n, 2)) for k in ("ef", "eb", "hf", "hb")}
    for i, (st, ks, s) in enumerate(zip(structures, kernel_s, probes, strict=True)):
        times = pass_times(st, ks, eff)
        dev, host = times.device_s, times.host_s
        fwd, rec, bwd = LAYER_PASSES
        out["fd"][i], out["fh"][i] = dev[fwd], host[fwd]
        out["bd"][i], out["bh"][i] = dev[rec] + dev[bwd], host[rec] + host[bwd]
        out["w"][i] = times.layer_weight_grad_s
        if moe_share:
            def mean(dense: float, moe: float) -> float:
                return (1.0 - moe_share) * dense + moe_share * moe
            mf, mr, mb = MOE_LAYER_PASSES
            out["fd"][i], out["fh"][i] = mean(dev[fwd], dev[mf]), mean(host[fwd], host[mf])
            out["bd"][i], out["bh"][i] = mean(dev[rec] + dev[bwd], dev[mr] + dev[mb]), mean(host[rec] + host[bwd],
                                                                                             host[mr] + host[mb])
            out["w"][i] = mean(times.layer_weight_grad_s, times.moe_layer_weight_grad_s)
        if st.attention_mix is not None:  # sliding windows: the mean layer's attention core, not layer 0's
            factor = eff.layer_time_factors.factor(st.layer_key)
            added_fwd, added_bwd = st.attention_mix.added_s(st.speed, eff)
            out["fd"][i] += factor * float(added_fwd.sum()) / model.num_layers
            out["bd"][i] += factor * float(added_bwd.sum()) / model.num_layers
        pairs["ef"][i] = dev[Pass.EMBEDDING_FWD], host[Pass.EMBEDDING_FWD]
        pairs["eb"][i] = dev[Pass.EMBEDDING_BWD], host[Pass.EMBEDDING_BWD]
        pairs["hf"][i] = dev[Pass.HEAD_FWD], host[Pass.HEAD_FWD]
        pairs["hb"][i] = dev[Pass.HEAD_BWD], host[Pass.HEAD_BWD]
        out["al"][i] = layer_activation_bytes(model, s)
        out["af"][i] = layer_activation_bytes(model, replace(s, recompute_granularity="none"))
        if moe_share:
            out["al"][i] = (1.0 - moe_share) * out["al"][i] + moe_share * moe_activation_bytes(model, s)
            out["af"][i] = max(out["af"][i], moe_activation_bytes(model, replace(s, recompute_granularity="none")))
        out["ae"][i] = embedding_work(model, s).activation_bytes
        out["ah"][i] = last_stage_work(model, s).activation_bytes
    return LayerTable({k: i for i, k in enumerate(keys)}, out["fd"], out["fh"], out["bd"], out["bh"], out["w"],
                      pairs["ef"], pairs["eb"], pairs["hf"], pairs["hb"], out["al"], out["af"], out["ae"], out["ah"])


def _table_keys(cand: Candidates) -> list[tuple[int, ...]]:
    return [(int(t), int(b), int(sp), int(rc), int(c), int(ep), int(etp)) for t, b, sp, rc, c, ep, etp in
            zip(cand.t, cand.b, cand.sp, cand.recompute, cand.cp, cand.ep, cand.etp, strict=True)]


@functools.lru_cache(maxsize=4096)
def _held(schedule: str, p: int, m: int, v: int) -> tuple[int, int]:
    """(micro-batch, chunk) pairs the first and the last stage hold at their peak, from
    the schedule's own op orders; the count stops growing after a few p micro-batches,
    so long runs are counted on a shorter one."""
    if p == 1:
        return (1, 1)
    if schedule == "gpipe":
        return (m, m)
    if schedule == "1f1b":
        return (min(p, m), 1)
    step = p if v > 1 else 1
    short = min(m, max(4 * p, step))
    short -= short % step
    sched = get_schedule(schedule)
    ends = [sched.stage_order(p, max(short, step), v, stage) for stage in (0, p - 1)]  # not all p stages
    peaks = inflight_peak(ends, sched.split_backward)
    return (int(peaks[0]), int(peaks[-1]))


def inflight(schedules: np.ndarray, p: np.ndarray, m: np.ndarray, v: np.ndarray) -> np.ndarray:
    keys = list(zip(schedules.tolist(), p.tolist(), m.tolist(), v.tolist(), strict=True))
    return np.array([_held(str(sc), int(pp), int(mm), int(vv)) for sc, pp, mm, vv in keys], dtype=float)


@dataclass(frozen=True, eq=False)
class Estimates:
    iteration_s: np.ndarray
    peak_memory_bytes: np.ndarray
    bubble_fraction: np.ndarray


def estimate(model: TransformerModel, cand: Candidates, base: RunSettings, cluster: Cluster, comm: CommModel,
             eff: DeviceEfficiency) -> Estimates:
    """Closed-form iteration time and peak memory of every candidate (module doc)."""
    table = layer_table(model, cand, base, cluster, comm, eff)
    row = np.array([table.index[k] for k in _table_keys(cand)])
    t, p, d, b, v = (cand.t.astype(float), cand.p.astype(float), cand.d.astype(float), cand.b.astype(float),
                     cand.v.astype(float))
    c = cand.cp.astype(float)
    L = float(model.num_layers)
    m = base.global_batch_size / (d * b)
    dc = d * c  # the ranks that hold the same weights: gradients reduced, state sharded over them
    zero3 = cand.zero == 3
    prec = Precision.of(base.dtype)
    gpn = cluster.devices_per_node
    layer_params = model.layer_params / t
    # a mixture-of-experts model: per mean layer, the non-expert weights over t and the
    # routed experts' over EP x ETP, their state sharded over the expert-data-parallel group
    ep, etp = cand.ep.astype(float), np.where(cand.etp > 0, cand.etp, cand.t).astype(float)
    edp = t * dc / (ep * etp)
    expert_layer = np.zeros(len(cand))
    if model.is_moe:
        experts = model.num_moe_layers * model.num_experts * model.expert_params
        layer_params = (model.transformer_params - experts) / L / t
        expert_layer = experts / L / (ep * etp)
    vocab_params = np.array([model.padded_vocab_size(int(x)) for x in cand.t]) * model.hidden_size / t
    positions = model.seq_length * model.hidden_size if model.position_embedding_type == "learned_absolute" else 0
    tied_copy = (~np.asarray(model.untie_embeddings_and_output_weights, bool)) & (p > 1)
    head_params = model.norm_params + np.where(model.untie_embeddings_and_output_weights | (p > 1), vocab_params, 0.0)
    # multi-token-prediction layers on the last stage (a MoE one's experts over EP x ETP: below)
    head_params = head_params + (model.mtp_parameters - mtp_expert_params(model)) / t

    # stages: v = 1 splits the layers as evenly as possible (the first L mod p stages
    # take one more); interleaving splits each rank's layers evenly over its v chunks,
    # the first and last rank holding `first` / `last` layers where set (Megatron's
    # uneven split, `interleaved_uneven_split`), the middle ranks sharing the rest
    n_big = np.ceil(L / p)
    n_small = np.floor(L / p)
    count_big = np.where(np.mod(L, p) == 0, p, np.mod(L, p))
    set_first, set_last = cand.first.astype(float), cand.last.astype(float)
    uneven = (set_first > 0) | (set_last > 0)
    per_middle = np.where(uneven, (L - set_first - set_last) / np.maximum(p - (set_first > 0) - (set_last > 0), 1),
                          L / p)
    n_chunk = np.where(v > 1, np.where(set_first > 0, set_first, per_middle) / v, n_big)  # the first rank's
    n_mid = np.where(v > 1, per_middle / v, n_big)
    zero3_gather = np.zeros(len(cand))
    zero3_scatter = np.zeros(len(cand))
    # Megatron's rank order tp-cp-dp-pp: the dp-cp group is every t-th rank, so it
    # spans t d c / gpn nodes (each member on its own node once t >= gpn)
    dp_nodes = np.maximum(1, np.ceil(t * dc / np.maximum(gpn, t))).astype(np.int64)
    for i in np.flatnonzero(zero3 & (dc > 1)):
        group = Group(int(dc[i]), int(dp_nodes[i]))
        zero3_gather[i] = comm.time_s("all_gather", layer_params[i] * prec.weight_bytes, group)
        zero3_scatter[i] = comm.time_s("reduce_scatter", layer_params[i] * prec.grad_bytes, group)
    # ZeRO-3 (`paraplan.predict.fsdp_ops`): each layer beside the next one's gather, the
    # reduce-scatter beside the backward too (the engine's per-layer buckets)
    kappa = eff.comm_overlap_contention
    lf_dev = paired_s(zero3_gather, table.fwd_dev[row], kappa)
    lb_dev = paired_s(zero3_gather + zero3_scatter, table.bwd_dev[row], kappa)
    lf_host, lb_host = table.fwd_host[row], table.bwd_host[row]
    ef, eb, hf, hb = table.emb_fwd[row], table.emb_bwd[row], table.head_fwd[row], table.head_bwd[row]

    def op(n_layers, layer_dev, layer_host, extra=None):
        dev, host = n_layers * layer_dev, n_layers * layer_host + eff.host_microbatch_s
        if extra is not None:
            dev, host = dev + extra[:, 0], host + extra[:, 1]
        return host_bound_s(dev, host, eff)

    mid = op(n_mid, lf_dev, lf_host) + op(n_mid, lb_dev, lb_host)  # one (virtual) stage, F + B
    mid_small = op(n_small, lf_dev, lf_host) + op(n_small, lb_dev, lb_host)
    n_last = np.where(v > 1, np.where(set_last > 0, set_last, per_middle) / v,
                      np.where(count_big == p, n_big, n_small))
    first = op(n_chunk, lf_dev, lf_host, ef) + op(n_chunk, lb_dev, lb_host, eb)
    last = op(n_last, lf_dev, lf_host, hf) + op(n_last, lb_dev, lb_host, hb)
    single = p == 1
    whole = op(L, lf_dev, lf_host, ef + hf) + op(L, lb_dev, lb_host, eb + hb)
    w_mid = n_chunk * table.wgt_dev[row]

    e = 2 if base.dtype == "fp8" else DTYPE_BYTES[base.dtype]
    boundary = b * model.seq_length * model.hidden_size * e / (t * c)
    cross = (t * c * d) >= gpn
    send = np.zeros(len(cand))
    for i in np.flatnonzero(p > 1):
        send[i] = comm.time_s("send_recv", boundary[i], Group(2, 2 if cross[i] else 1))

    sched = np.array(SCHEDULES)[cand.schedule]
    # 1F1B and GPipe: every stage once (the fill and drain) + M - 1 times the slowest
    stages_sum = (first + last + np.maximum(count_big - 2, 0) * mid
                  + np.maximum(p - count_big - (count_big < p), 0) * mid_small)
    slowest = np.maximum(np.maximum(first, last), mid)
    flushed = stages_sum + (m - 1) * slowest + 2 * (p - 1) * send
    # interleaved: M x the busiest rank's work per micro-batch (its v chunks, the
    # embedding or the head on the first / last) + the fill and drain of one chunk
    rank_first = (v - 1) * (op(n_chunk, lf_dev, lf_host) + op(n_chunk, lb_dev, lb_host)) + first
    rank_last = (v - 1) * (op(n_last, lf_dev, lf_host) + op(n_last, lb_dev, lb_host)) + last
    busiest = np.maximum(np.maximum(rank_first, rank_last), v * mid)
    interleaved = m * busiest + (p - 1) * mid + 2 * (p - 1) * send
    zb = flushed - (p - 1) * w_mid  # each stage's weight gradients leave the fill/drain path
    pipe = np.where(sched == "interleaved_1f1b", interleaved, np.where(sched == "zb_h1", zb, flushed))
    pipe = np.where(single, m * whole, pipe)
    busy = m * np.where(single, whole, (first + last + (p - 2) * np.where(v > 1, v * mid, mid)) / np.maximum(p, 1))

    # parameters on the first and the last stage's ranks
    first_params = np.where(single, L, np.where(v > 1, n_chunk * v, n_big)) * layer_params + vocab_params + positions
    first_params = first_params + np.where(single, head_params, 0.0)
    last_params = np.where(single, first_params, n_last * np.where(v > 1, v, 1) * layer_params + head_params)
    first_experts = np.where(single, L, np.where(v > 1, n_chunk * v, n_big)) * expert_layer
    last_experts = np.where(single, first_experts, n_last * np.where(v > 1, v, 1) * expert_layer)
    if model.is_moe and model.num_moe_layers < L:  # mixed kinds: the first and last stage's own MoE layers
        first_params, last_params, first_experts, last_experts = mixed_stage_params(
            model, t, v, ep * etp, n_big, n_chunk, n_last, single, vocab_params + positions, head_params,
            (first_params, last_params, first_experts, last_experts))
    if mtp_expert_params(model):  # a MoE multi-token-prediction layer's experts, on the last stage
        extra = mtp_expert_params(model) / (ep * etp)
        first_experts = first_experts + np.where(single, extra, 0.0)
        last_experts = last_experts + extra
    sharded = cand.zero >= 1
    shards = np.where(sharded, dc, 1.0)
    expert_shards = np.where(sharded, edp, 1.0)
    # gradient reduction, overlapped with the first stage's last backward op
    sync = np.zeros(len(cand))
    for i in np.flatnonzero((dc > 1) & ~zero3):
        group = Group(int(dc[i]), int(dp_nodes[i]))
        collective = "reduce_scatter" if sharded[i] else "all_reduce"
        buckets = max(1, int(np.ceil(first_params[i] / GRAD_BUCKET_PARAMS)))
        one = comm.time_s(collective, first_params[i] / buckets * prec.grad_bytes, group)
        window = whole[i] if single[i] else first[i]  # beside the first stage's last backward
        sync[i] = max(one, buckets * one - 0.5 * window)
    # the experts' gradients over the expert-data-parallel group (stride EP x ETP)
    edp_nodes = np.maximum(1, np.ceil(t * dc / np.maximum(gpn, ep * etp))).astype(np.int64)
    for i in np.flatnonzero((edp > 1) & (first_experts > 0)):
        group = Group(int(edp[i]), int(edp_nodes[i]))
        collective = "reduce_scatter" if sharded[i] else "all_reduce"
        buckets = max(1, int(np.ceil(first_experts[i] / GRAD_BUCKET_PARAMS)))
        one = comm.time_s(collective, first_experts[i] / buckets * prec.grad_bytes, group)
        window = whole[i] if single[i] else first[i]
        sync[i] += max(one, buckets * one - 0.5 * window)
    speed = DeviceSpeed.of(cluster.device, base.dtype)
    opt = ((first_params / shards + first_experts / expert_shards) * prec.optimizer_step_bytes
           / (speed.mem_bandwidth_Bps * eff.memory_efficiency) + OPTIMIZER_KERNELS * eff.kernel_latency_s)
    exchange = np.zeros(len(cand))
    for i in np.flatnonzero(tied_copy):
        exchange[i] = comm.time_s("all_reduce", vocab_params[i] * prec.grad_bytes, Group(2, 2 if cross[i] else 1))
    iteration = pipe + sync + opt + exchange
    bubble = np.clip(1.0 - busy / np.maximum(iteration, 1e-30), 0.0, 1.0)

    # memory of the first and the last stage
    weights_b = np.where(zero3, prec.weight_bytes / dc, prec.weight_bytes)
    grads_b = np.where(cand.zero >= 2, prec.grad_bytes / dc, prec.grad_bytes)
    state_b = weights_b + grads_b + prec.optimizer_bytes / shards
    state_e = (np.where(zero3, prec.weight_bytes / edp, prec.weight_bytes)
               + np.where(cand.zero >= 2, prec.grad_bytes / edp, prec.grad_bytes)
               + prec.optimizer_bytes / expert_shards)
    held = inflight(sched, cand.p, np.round(m).astype(np.int64), cand.v)  # (candidates, 2): first, last stage
    act_chunk = n_chunk * table.act_layer[row]
    act_first = held[:, 0] * np.where(v > 1, act_chunk, n_big * table.act_layer[row])
    act_first = act_first + np.ceil(held[:, 0] / v) * table.act_emb[row]  # the embedding: chunk 0 only
    act_first = act_first + np.where(single, table.act_head[row], 0.0)
    working = np.where(cand.recompute == RECOMPUTE.index("full"), table.act_full_layer[row], 0.0)
    root = vocab_params + positions + head_params  # ZeRO-3 runs one stage: its root unit (`fsdp_working_bytes`)
    unsharded = np.where(m > 1, first_params + first_experts, np.maximum(layer_params, root))  # gradients
    working = working + np.where(zero3, (root + 2 * layer_params) * prec.weight_bytes + unsharded * prec.grad_bytes,
                                 0.0)
    mem_first = first_params * state_b + first_experts * state_e + act_first + working
    head_held = np.where(sched == "gpipe", m, np.where(sched == "zb_h1", held[:, 1], 1.0))  # the last chunk only
    mem_last = (last_params * state_b + last_experts * state_e + held[:, 1] * n_last * table.act_layer[row]
                + head_held * table.act_head[row] + working)
    peak = np.where(single, mem_first, np.maximum(mem_first, mem_last))
    return Estimates(iteration, peak, bubble)

"""The space of parallel strategies the transformer planner searches: every candidate
that can run, as aligned integer columns (`Candidates`); `estimate.py` prices them.

A candidate is (TP t, CP c, PP p, DP d, micro-batch b, virtual stages v, schedule,
recomputation, sequence parallelism, ZeRO stage) with t x c x p x d = the GPUs. Context
parallelism (ring attention, `cp_comm_type` p2p) is searched only for sequences of
`MIN_CP_SEQ_LENGTH` tokens and more, over the powers of two that divide the GPUs and
meet Megatron's rules. Interleaving v that does not divide the layers over the stages
uses Megatron's uneven first/last stages (`interleaved_uneven_split`); from 3 stages the
embedding and / or the loss may also count as a layer in the split (Megatron-Core's
`account_for_*_in_pipeline_split`, `split_options`). ZeRO-3 runs with or without
pipelines; with them as Meta ran Llama 3 405B (`ZERO3_PIPELINED`).

Mixture-of-experts models add expert parallelism (EP) and expert tensor parallelism
(ETP) to the candidate: EP over the divisors of `num_experts` with EP x ETP dividing
t x d, ETP 1 or t (Megatron-Core's default) unless the space names others
(`experts.expert_layouts`).

Dominated settings are not enumerated (each is never faster and never smaller in
the model): gradient reduction and weight all-gather are always overlapped when they
can be, and so are the interleaved schedule's pipeline transfers (`overlap_p2p_comm`,
Megatron's default, which it turns off for the other schedules).

Settings the closed-form estimate does not price (DualPipe, `tp_comm_overlap`,
`overlap_moe_expert_parallel_comm`) are not enumerated either: they are tried on the
best candidates after the search and re-timed with the exact engine (`variants.py`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from paraplan.core.errors import StrategyError
from paraplan.core.run_settings import (
    PipelineSchedule,
    RecomputeGranularity,
    RunSettings,
    interleaved_uneven_split,
)
from paraplan.core.run_settings_checks import context_parallel_unpriced
from paraplan.core.sharding import GradReduce, ReshardAfterForward
from paraplan.core.transformer import TransformerModel
from paraplan.plan.transformer.experts import expert_layouts
from paraplan.predict.predictor import divisors

SCHEDULES: tuple[PipelineSchedule, ...] = ("1f1b", "interleaved_1f1b", "zb_h1", "gpipe")
"""The schedules of the enumerated candidates (the closed-form estimate prices each)."""
POST_PASS_SCHEDULES: tuple[PipelineSchedule, ...] = ("dualpipe",)
"""Schedules tried on the best candidates after the search, re-timed by the exact
engine only (`variants.py`): DeepSeek-V3's DualPipe."""
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
    schedules: tuple[str, ...] = (*SCHEDULES, *POST_PASS_SCHEDULES)
    """Pipeline schedules; `dualpipe` is tried on the best 1F1B candidates (`variants.py`)."""
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
    tp_comm_overlap: tuple[bool, ...] = (False, True)
    """Transformer Engine's userbuffers overlap of tensor-parallel communication, tried on
    the best plans where it can run (`variants.tp_comm_overlap_runs`); (False,): never."""
    overlap_moe_expert_parallel_comm: tuple[bool, ...] = (False, True)
    """Megatron-Core's expert-parallel all-to-all overlap, tried on the best plans where
    it can run (`variants.a2a_overlap_runs`); (False,): never."""
    moe_shared_expert_overlap: tuple[bool, ...] = (False, True)
    """Megatron-Core's shared experts beside the all-to-alls, tried on the best plans where
    it can run (`variants.shared_overlap_runs`); (False,): never."""
    recompute_block: tuple[bool, ...] = (False, True)
    """Megatron-LM's `recompute_method block`, tried on the best plans with full
    recomputation: only the first N layers of each model chunk recomputed
    (`variants.block_recompute_variants`); (False,): never."""

    def __post_init__(self) -> None:
        known = (*SCHEDULES, *POST_PASS_SCHEDULES)
        bad = [s for s in self.schedules if s not in known]
        if bad:
            raise StrategyError(f"unknown schedule '{bad[0]}' in the search space; known: {', '.join(known)}")
        bad_rc = [r for r in self.recompute if r not in RECOMPUTE]
        if bad_rc:
            raise StrategyError(f"unknown recompute_granularity '{bad_rc[0]}'; known: {', '.join(RECOMPUTE)}")
        bad_z = [z for z in self.zero_stages if z not in ZERO]
        if bad_z:
            raise StrategyError(f"unknown zero_stage {bad_z[0]}; known: 0, 1, 2, 3")
        bad_cp = [c for c in self.context_parallel_sizes if isinstance(c, bool) or not isinstance(c, int) or c < 1]
        if bad_cp:
            raise StrategyError(f"context_parallel_size {bad_cp[0]!r} in the search space; expected an integer >= 1")
        if "dualpipe" in self.schedules and "1f1b" not in self.schedules:
            raise StrategyError("schedule dualpipe in the search space needs 1f1b beside it: DualPipe is tried on "
                                "the best 1F1B candidates")
        if not (self.schedules and self.recompute and self.zero_stages and self.sequence_parallel
                and self.tp_comm_overlap and self.overlap_moe_expert_parallel_comm and self.moe_shared_expert_overlap
                and self.recompute_block):
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
    acc: np.ndarray  # the embedding (bit 1) / loss (bit 2) counted as a layer in the split (`ACCOUNT_FOR`)

    def __len__(self) -> int:
        return int(self.t.shape[0])

    def take(self, idx: np.ndarray) -> Candidates:
        return Candidates(*(getattr(self, f)[idx] for f in _FIELDS))

    def settings(self, i: int, base: RunSettings) -> RunSettings:
        """Candidate i as run settings (the base gives batch, dtype and attention kernel)."""
        zero, acc = int(self.zero[i]), int(self.acc[i])
        replicas = int(self.d[i]) * int(self.cp[i])  # the ranks a gradient is reduced over
        # ZeRO-3 under pipelines as Meta ran Llama 3 405B (`ZERO3_PIPELINED`); alone, the defaults
        pipelined_zero3 = zero == 3 and int(self.p[i]) > 1
        return replace(
            base,
            tensor_model_parallel_size=int(self.t[i]), pipeline_model_parallel_size=int(self.p[i]),
            data_parallel_size=int(self.d[i]), micro_batch_size=int(self.b[i]),
            virtual_pipeline_model_parallel_size=int(self.v[i]), schedule=SCHEDULES[int(self.schedule[i])],
            recompute_granularity=RECOMPUTE[int(self.recompute[i])], sequence_parallel=bool(self.sp[i]),
            use_distributed_optimizer=zero == 1, zero_stage=0 if zero == 1 else zero,
            overlap_grad_reduce=replicas > 1,
            overlap_param_gather=(zero in (1, 2) or pipelined_zero3) and replicas > 1,
            fsdp_reshard_after_forward=ZERO3_PIPELINED.fsdp_reshard_after_forward if pipelined_zero3 else "default",
            sharded_grad_reduce=ZERO3_PIPELINED.sharded_grad_reduce if pipelined_zero3 else "default",
            account_for_embedding_in_pipeline_split=bool(acc & 1), account_for_loss_in_pipeline_split=bool(acc & 2),
            decoder_first_pipeline_num_layers=int(self.first[i]), decoder_last_pipeline_num_layers=int(self.last[i]),
            context_parallel_size=int(self.cp[i]), cp_comm_type="p2p",
            expert_model_parallel_size=int(self.ep[i]), expert_tensor_parallel_size=int(self.etp[i]),
        )


_FIELDS = ("t", "p", "d", "b", "v", "schedule", "recompute", "sp", "zero", "first", "last", "cp", "ep", "etp", "acc")
ACCOUNT_FOR: tuple[int, ...] = (1, 2, 3)
"""Megatron-Core's `account_for_embedding_in_pipeline_split` (1), `..._loss_...` (2) and
both (3) as `Candidates.acc`: the embedding / loss take one layer's slot in the split."""


@dataclass(frozen=True)
class PipelinedZero3:
    """The ZeRO-3 settings the planner gives a candidate with pipeline parallelism."""

    fsdp_reshard_after_forward: ReshardAfterForward = "never"
    sharded_grad_reduce: GradReduce = "last_microbatch"


ZERO3_PIPELINED = PipelinedZero3()
"""ZeRO-3 with pipeline parallelism is searched as Meta ran Llama 3 405B (Dubey et al.
2024, Section 3.3.2) and as PyTorch's pipeline stages run FSDP2: each stage's weights
gathered once per iteration and kept (not resharded after the forward), gradients
accumulated unsharded over the micro-batches and reduce-scattered after the last. The
other two ZeRO-3 x PP settings predict prices are not searched: resharding after the
forward gathers every layer twice per micro-batch, and reducing every micro-batch
(Megatron-FSDP) gathers every micro-batch; each trades time for the memory of the
gathered stage, which the planner reaches with recomputation or more stages instead.
Mixture-of-experts models of MoE layers alone (Mixtral, Qwen3-MoE) are searched with it,
not those with dense layers beside the MoE ones or multi-token prediction (DeepSeek-V3:
the estimate reads their stages at the model's mean layer, -9% to +7% of the engine's
memory), nor ZeRO-3 with experts and no pipeline (their per-layer gathers are not
estimated)."""


def split_options(num_layers: int, p: int, v: int, uneven: tuple[int, int] | None) -> list[tuple[int, int, int]]:
    """(decoder_first, decoder_last, acc) splits of `num_layers` over p stages x v chunks:
    the even or `interleaved_uneven_split` one (`uneven`, None: none), and each
    `ACCOUNT_FOR` choice whose slots (layers + the embedding / loss) Megatron-Core can
    split (`pipeline_split._check_embedding_loss_split`: divisible by p, each rank's
    share by v; a virtual stage of one slot may hold the embedding or the loss alone,
    as in Meta's 16 x 8 chunks of Llama 3 405B). Searched from 3 stages: with 2 there is
    no middle stage to balance the ends against."""
    out = [] if uneven is None else [(*uneven, 0)]
    if p < 3:  # no middle stage to balance the ends against
        return out
    for acc in ACCOUNT_FOR:
        slots = num_layers + (acc & 1) + (acc >> 1)
        if slots % p == 0 and (slots // p) % v == 0:
            out.append((0, 0, acc))
    return out


def context_degrees(model: TransformerModel, num_gpus: int, space: SearchSpace, flash: bool) -> list[int]:
    """CP degrees to search: the space's, else 1 and, for sequences of at least
    `MIN_CP_SEQ_LENGTH` tokens run with flash attention, the powers of two that divide
    the GPUs and leave chunks of `MIN_CP_CHUNK_TOKENS` or more; each must divide the GPUs
    and split the sequence into 2c chunks. A model whose attention context parallelism is
    not priced for (`context_parallel_unpriced`) is searched without it; naming CP
    sizes above 1 for it is an error."""
    unpriced = context_parallel_unpriced(model)
    if space.context_parallel_sizes:
        options = space.context_parallel_sizes
        if unpriced and max(options) > 1:
            raise StrategyError(f"context_parallel_size {max(options)} with {unpriced} is not modelled (the "
                                "context-parallel attention core prices full causal attention with one head "
                                "width); search context_parallel_size 1 only "
                                "(--context-parallel-sizes 1)")
    elif model.seq_length >= MIN_CP_SEQ_LENGTH and flash and not unpriced:
        options = tuple(1 << k for k in range(num_gpus.bit_length())
                        if model.seq_length >= 2 * MIN_CP_CHUNK_TOKENS << k)
    else:
        options = (1,)
    runnable = [c for c in options if num_gpus % c == 0 and (c == 1 or (model.seq_length % (2 * c) == 0 and flash))]
    if space.context_parallel_sizes and len(runnable) < len(options):
        bad = next(c for c in options if c not in runnable)
        why = (f"does not divide the {num_gpus} GPUs" if num_gpus % bad else
               "needs flash attention" if not flash else
               f"does not split seq_length {model.seq_length} into 2 x {bad} chunks")
        raise StrategyError(f"context_parallel_size {bad} {why}; expected sizes that do")
    return runnable


def tensor_degrees(model: TransformerModel, devices_per_node: int, num_gpus: int, space: SearchSpace) -> list[int]:
    limit = num_gpus if space.allow_cross_node_tensor else devices_per_node
    options = space.tensor_sizes or tuple(divisors(limit))
    return [t for t in options if num_gpus % t == 0 and t <= limit and model.num_attention_heads % t == 0
            and model.query_groups % t == 0 and model.ffn_size % t == 0]


def enumerate_candidates(model: TransformerModel, num_gpus: int, global_batch_size: int, devices_per_node: int,
                         space: SearchSpace, flash: bool = True,
                         priced: Callable[[int, int], bool] | None = None) -> Candidates:
    """Every candidate that can run (divisibility, schedule rules); memory is checked later.
    `flash`: the run's attention is fused (context parallelism needs it); `priced`: the
    (EP, ETP) layouts the run's token dispatcher can be priced for (`experts.flex_layouts`)."""
    rows, layouts = _candidate_rows(model, num_gpus, global_batch_size, devices_per_node, space, flash, priced)
    if not rows:
        dispatcher = (" and the expert layouts the flex dispatcher's kernels were measured for (ETP 1; DeepEP "
                      "and HybridEP: docs/moe.md)" if priced is not None else "")
        raise StrategyError(
            f"no parallel layout of {model.name} fits the divisibility rules{dispatcher} on {num_gpus} GPUs at "
            f"global batch {global_batch_size} (TP must divide the heads, groups and MLP width; DP the global batch)"
            + _fewest_replicas_text(model, num_gpus, devices_per_node, space, flash, layouts, priced))
    cols = np.array(rows, dtype=np.int64).T
    return Candidates(*cols)


def _candidate_rows(model: TransformerModel, num_gpus: int, global_batch_size: int, devices_per_node: int,
                    space: SearchSpace, flash: bool,
                    priced: Callable[[int, int], bool] | None = None) -> tuple[list[tuple[int, ...]],
                                                                               list[tuple[int, int]]]:
    """`enumerate_candidates`'s rows, and the (CP, TP) layouts they were built from."""
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
            splits: dict[int, list[tuple[int, int, int]]] = {}
            experts = {sp: expert_layouts(model, t, c * d, sp, space, priced) for sp in sps}
            per_replica = global_batch_size // d
            for b in divisors(per_replica):
                if b > space.max_micro_batch_size:
                    break
                m = per_replica // b
                pipes: list[tuple[int, int, int, int, int]] = []  # schedule, v, first/last stage's layers, acc
                for schedule in space.schedules:
                    if schedule in POST_PASS_SCHEDULES:
                        continue
                    if schedule == "interleaved_1f1b":
                        if p < 2 or m % p:
                            continue
                        for v in range(2, space.max_virtual_stages + 1):
                            if v not in splits:
                                splits[v] = split_options(model.num_layers, p, v,
                                                          interleaved_uneven_split(model.num_layers, p, v))
                            pipes += [(sched_idx[schedule], v, *split) for split in splits[v]]
                    elif schedule in ("gpipe", "zb_h1") and p < 2:
                        continue
                    else:
                        if 1 not in splits:
                            splits[1] = split_options(model.num_layers, p, 1, (0, 0))
                        pipes += [(sched_idx[schedule], 1, *split) for split in splits[1]]
                # ZeRO-2 with pipelines: gradients reduce-scattered after every micro-batch (Megatron-FSDP
                # `optim_grads`); not with experts (`check_sharding`). ZeRO-3 with pipelines: `ZERO3_PIPELINED`.
                # experts: ZeRO-3 only under pipelines (their gathers per layer are not estimated), and only
                # for models of MoE layers alone (`ZERO3_PIPELINED`)
                mixed = model.is_moe and (model.num_moe_layers < model.num_layers or model.mtp_num_layers > 0)
                zeros = [z for z in space.zero_stages if not (z >= 1 and d * c == 1) and not (z == 2 and model.is_moe)
                         and not (z == 3 and (mixed or (model.is_moe and p == 1)))]
                for s_i, v, first, last, acc in pipes:
                    for rc in rc_idx:
                        for sp in sps:
                            for z in zeros:
                                for ep, etp in experts[sp]:
                                    rows.append((t, p, d, b, v, s_i, rc, int(sp), z, first, last, c, ep, etp, acc))
    return rows, layouts


def _fewest_replicas_text(model: TransformerModel, num_gpus: int, devices_per_node: int, space: SearchSpace,
                          flash: bool, layouts: list[tuple[int, int]],
                          priced: Callable[[int, int], bool] | None = None) -> str:
    """'; the fewest data-parallel replicas of a layout that runs are 4 (TP 8, PP 32): a
    global batch divisible by 4 would do' for a global batch that no layout's DP divides: the fewest
    replicas with which some candidate runs (checked by enumerating at that batch); ''
    when none does at any batch."""
    replicas = sorted({num_gpus // (t * c * p) for c, t in layouts for p in divisors(num_gpus // (t * c))
                       if p <= model.num_layers})
    for d in replicas:
        rows = _candidate_rows(model, num_gpus, d, devices_per_node, space, flash, priced)[0]
        if not rows:
            continue
        t, p, d, c = (min(rows, key=lambda row: row[2])[i] for i in (0, 1, 2, 11))
        cp = f", CP {c}" if c > 1 else ""
        return (f"; the fewest data-parallel replicas of a layout that runs are {d} (TP {t}{cp}, PP {p}): a "
                f"global batch divisible by {d} would do")
    return ""

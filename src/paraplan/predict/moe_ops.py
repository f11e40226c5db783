"""What one mixture-of-experts layer runs on one rank for one micro-batch: the
attention half of `paraplan.predict.ops` followed by Megatron-Core's MoE block with
the all-to-all token dispatcher (`moe_token_dispatcher_type alltoall`), or the flex
dispatcher with DeepEP's or HybridEP's kernels (`flex`, `moe_flex_dispatcher_backend`:
`paraplan.predict.moe_deepep`; each token sent once per destination rank, ordered by
local expert there and its experts' outputs summed there before the combine); the allgather dispatcher is not modelled.

Forward of the MoE block (T tokens routed by this rank, k = `moe_router_topk`, E
experts, EP / ETP the expert-parallel / expert-tensor-parallel sizes; the block's sizes
on one rank: `paraplan.predict.moe_shape`):

- the pre-MLP norm; the shared experts, a dense MLP of
  `moe_shared_expert_intermediate_size` split over the tensor-parallel ranks like the
  dense MLP (before the router; after it, beside the all-to-alls, with
  `moe_shared_expert_overlap`);
- the router: a (T x h) @ (h x E) GEMM, then its score function, top-k, losses and
  forced balancing kernel by kernel (`paraplan.predict.moe_router`);
- token permutation: each token copied to its k experts' order (memory-bound);
- with EP > 1, each rank's token count per expert all-gathered over the EP group (the
  all-to-all's split sizes; int64); the preprocessing's small kernels, the copies of the
  counts to the host and the host's wait for them (`paraplan.predict.moe_host`);
- dispatch all-to-all over the EP group: T k h bytes-per-element per rank, scaled by
  the busiest rank's share over the mean (all ranks wait for it): `moe_load_imbalance`
  with EP > 1, capped by `moe_expert_capacity_factor` (dropped tokens), or the
  capacity factor itself with `moe_pad_expert_input_to_capacity` (`moe_shape.load_factor`);
  then a second all-to-all of the tokens' fp32 routing probabilities (T k x 4 bytes);
- with ETP > 1 and tokens not already replicated over the ETP group: an all-gather of
  the dispatched tokens over it (and a reduce-scatter of the experts' output);
- with more than one local expert, `sort_chunks_by_idxs`: the received tokens (and
  probabilities) reordered from source-rank order to local-expert order, and back
  before the combine (memory-bound: read and write T k (h e + 4) bytes each);
- the local experts, E / EP of them, as one grouped GEMM per projection: each expert
  gets T k EP ETP / E tokens on average (ETP only when gathered), times the imbalance,
  priced by the device model's GEMM curve at that real m (small GEMMs run less
  efficiently than the dense MLP's), the experts' tiles sharing the SMs, and the kernel
  latency once per local expert (`Kernels.launches`: Transformer Engine's grouped
  linear layer launches one cuBLAS GEMM per expert over four streams; measured on an
  H100 with `benchmarks/gpu/grouped_gemm.py`, `benchmarks/bench_grouped_gemm.py`);
- combine all-to-all (the same volume) and unpermute (the sum of each token's k
  outputs; the routing probabilities are applied inside the experts' activation,
  Megatron-Core's experts.py `bias_act_func`); around the experts GPT-OSS's clamps,
  fc2's bias per local expert and FP8 row padding (`moe_activation`, `moe_bias`, `moe_padding`).

T is the sequence-parallel shard b s / t with sequence parallelism, else b s. Without
sequence parallelism and t > 1 (Megatron allows it only with EP 1 and ETP = t) the
tokens are replicated over the tensor-parallel ranks, each expert is split over them
and the MoE output is all-reduced like the dense MLP's.

Backward: every GEMM twice (input and weight gradient), the element-wise kernels'
backward, the same all-to-alls in reverse, the ETP all-gather / reduce-scatter
swapped. Full recomputation repeats the forward (all-to-alls included); selective
recomputation repeats its `recompute_modules` (`moe_recompute`: the dense layer's on the
attention half, `mlp` skipped as Megatron-Core applies it to dense MLPs only, and the MoE
modules `moe_act`, `shared_experts`, `moe`). `overlap_moe_expert_parallel_comm` hides
the token all-to-alls beside another micro-batch's compute (`a2a_overlap`).
"""

from __future__ import annotations

from dataclasses import replace

from paraplan.core.run_settings import DTYPE_BYTES, MOE_RECOMPUTE_MODULES, RunSettings
from paraplan.core.transformer import TransformerModel
from paraplan.predict.layer_shape import _Shape, _shape
from paraplan.predict.moe_activation import clamp_backward, clamp_forward, clamp_saved_bytes
from paraplan.predict.moe_bias import expert_bias_backward, expert_bias_forward, probs_bytes
from paraplan.predict.moe_deepep import (
    DEEPEP_COMBINE,
    DEEPEP_DISPATCH,
    DeepEpTransfer,
    deepep_host_work,
    hybridep_host_work,
)
from paraplan.predict.moe_host import chunk_sort_map, dispatch_preprocess, permute_row_map
from paraplan.predict.moe_padding import fp8_padding, fp8_unpadding, pads_fp8_rows
from paraplan.predict.moe_router import fake_balanced_gate, router_passes
from paraplan.predict.moe_shape import MoeShape, moe_shape, router_shape
from paraplan.predict.ops import (  # the dense layer's pieces, shared by both layer kinds
    FP8_OPERAND_BYTES,
    FP32_BYTES,
    KERNEL_FIELDS_ORDER,
    Collective,
    LayerWork,
    PassWork,
    _attention_backward,
    _attention_forward,
    _Builder,
    _column_backward,
    _enter_tp,
    _leave_tp,
    _norm_backward,
    _norm_forward,
    _residual_backward,
    _residual_forward,
    _row_backward,
    _selective_recompute,
    accumulate_bytes_per_param,
    layer_activation_bytes,
)
from paraplan.predict.work import NOT_HIDDEN

COUNT_BYTES = 8  # a token count per expert (int64)


def _sort_chunks(w: _Builder, x: _Shape, m: MoeShape, forward: bool = False) -> None:
    """Megatron-Core's `sort_chunks_by_idxs` between the all-to-all and the experts
    (with more than one local expert): read and write every dispatched token (and its
    fp32 probability); the forward first builds its row map (`moe_host.chunk_sort_map`)."""
    if m.local_experts > 1:
        if forward:
            chunk_sort_map(w, m.expert_tokens)
        w.memory(2 * m.expert_tokens * (x.e * x.h + FP32_BYTES))


def _act_forward(w: _Builder, gated: bool, e: int, tokens: float, width: float, probs: bool = False,
                 fp8_store: bool = False) -> None:
    """The activation (the routed experts': times each token's fp32 routing probability;
    `fp8_store`: its input cast to FP8 for the backward, `activation_func_fp8_input_store`)."""
    inputs = 2 if gated else 1
    w.memory((inputs + 1) * e * tokens * width + (FP32_BYTES * tokens if probs else 0.0)
             + ((e + FP8_OPERAND_BYTES) * inputs * tokens * width if fp8_store else 0.0))


def _act_backward(w: _Builder, gated: bool, e: int, tokens: float, width: float, probs: bool = False,
                  fp8_store: bool = False) -> None:
    """Its backward (the routed experts': also the probabilities' gradient; `fp8_store`:
    the FP8 input cast back)."""
    inputs = 2 if gated else 1
    w.memory((2 * inputs + 1) * e * tokens * width + (2 * FP32_BYTES * tokens if probs else 0.0)
             + ((e + FP8_OPERAND_BYTES) * inputs * tokens * width if fp8_store else 0.0))


def _routed_act_forward(w: _Builder, model: TransformerModel, x: _Shape, m: MoeShape) -> None:
    """The routed experts' activation; GPT-OSS's clamps and offset copy first (`moe_activation`)."""
    if model.activation_func_clamp_value:
        clamp_forward(w, m.expert_tokens, m.expert_ffn, x.e, x.e)
    _act_forward(w, model.gated_mlp, x.e, m.expert_tokens, m.expert_ffn, probs=True, fp8_store=x.fp8_act_store)


def _shared_forward(w: _Builder, model: TransformerModel, x: _Shape, m: MoeShape, overlap: bool) -> tuple[int, int]:
    """The shared experts as a tensor-parallel dense MLP; their two GEMMs' indices."""
    _enter_tp(w, x, overlap, len(w.rows))
    fc1 = w.gemm(x.tokens, x.h, m.shared_in)
    _act_forward(w, model.gated_mlp, x.e, x.tokens, m.shared_ffn, fp8_store=x.fp8_act_store)
    fc2 = w.gemm(x.tokens, m.shared_ffn, x.h)
    _leave_tp(w, x, fc2, overlap)
    return fc1, fc2


def _shared_backward(w: _Builder, model: TransformerModel, x: _Shape, m: MoeShape, overlap: bool,
                     async_reduce: bool) -> tuple[int, int]:
    fc2 = len(w.rows)
    _row_backward(w, x, m.shared_ffn, x.h, overlap)
    _act_backward(w, model.gated_mlp, x.e, x.tokens, m.shared_ffn, fp8_store=x.fp8_act_store)
    fc1 = len(w.rows)
    _column_backward(w, x, x.h, m.shared_in, async_reduce)
    return fc1, fc2


def _moe_forward(w: _Builder, model: TransformerModel, settings: RunSettings, x: _Shape,
                 m: MoeShape) -> tuple[int, int, int]:
    _norm_forward(w, x)
    marks = _moe_block_forward(w, model, settings, x, m)
    _residual_forward(w, model, x)
    return marks


def _alltoall_dispatch(w: _Builder, settings: RunSettings, x: _Shape, m: MoeShape, hide: int) -> None:
    """The alltoall dispatcher from the routed tokens to the experts' input (module doc)."""
    T, k = m.routed_tokens, m.topk
    if m.ep > 1:  # every rank's token count per expert, gathered for the all-to-all splits
        w.comm("all_gather", m.ep * m.experts * COUNT_BYTES, group="ep")
    counts = dispatch_preprocess(w, settings, T, m.experts)  # counts per expert, copied to the host
    counts.wait(w, "before_permutation_1")  # the host waits for them at one of three points
    permute_row_map(w, T, m.experts)
    w.memory((1 + k) * x.e * T * x.h)  # permute
    counts.wait(w, "before_ep_alltoall")
    if m.ep > 1:
        w.comm("all_to_all", m.a2a_bytes, hide, "ep")
        w.comm("all_to_all", m.probs_a2a_bytes, group="ep")  # the routing probabilities
    if m.gathered:
        w.comm("all_gather", m.etp * m.a2a_bytes, group="etp")
    _sort_chunks(w, x, m, forward=True)  # permutation 2: received tokens in local-expert order
    counts.wait(w, "before_finish")


def _alltoall_combine(w: _Builder, x: _Shape, m: MoeShape, hide: int) -> None:
    """The alltoall dispatcher from the experts' output back to the routed tokens."""
    _sort_chunks(w, x, m, forward=True)  # unpermutation 2: back in source-rank order
    if m.gathered:
        w.comm("reduce_scatter", m.etp * m.a2a_bytes, group="etp")
    if m.ep > 1:
        w.comm("all_to_all", m.a2a_bytes, hide, "ep")
    w.memory((m.topk + 1) * x.e * m.routed_tokens * x.h)  # unpermute: sum of the k outputs


def _deepep(w: _Builder, settings: RunSettings, m: MoeShape, kind: str, hide: int, cached: bool = True) -> None:
    """A flex-dispatcher call: its transfer, and the kernels and wait its backend adds
    (`moe_deepep.deepep_host_work`, `hybridep_host_work`)."""
    if m.ep > 1:
        backend = settings.moe_flex_dispatcher_backend
        if backend == "hybridep":
            hybridep_host_work(w, m.routed_tokens, m.experts, m.ep, cached)
        else:
            deepep_host_work(w, m.routed_tokens, m.topk, m.experts, m.ep, cached)
        groups, group_topk = m.router_groups
        w.collectives.append(DeepEpTransfer(kind, m.a2a_bytes / m.topk, hide, "ep", experts=m.experts, topk=m.topk,
                                            groups=groups, group_topk=group_topk, backend=backend,
                                            num_sms=settings.moe_flex_dispatcher_num_sms))


def _moe_block_forward(w: _Builder, model: TransformerModel, settings: RunSettings, x: _Shape,
                       m: MoeShape) -> tuple[int, int, int]:
    """Megatron-Core's MoELayer forward: shared experts, router, dispatch, experts, combine.
    Returns the kernel counts at the dispatch and before and after the experts' GEMMs."""
    overlap_tp = settings.tp_comm_overlap
    shared = m.shared_ffn > 0
    beside = settings.moe_shared_expert_overlap
    if shared and not beside:
        _shared_forward(w, model, x, m, overlap_tp)
    T = m.routed_tokens
    if settings.fake_balanced_gate:  # v6-router: NeMo AutoModel's gate, no GEMM (`moe_router`)
        fake_balanced_gate(router_shape(model, settings, m)).add_to(w)
    else:
        w.gemm(T, x.h, m.experts, high_precision=True)  # router logits (not a Transformer Engine module: no FP8)
        router_passes(settings, router_shape(model, settings, m))[0].add_to(w)  # v6-router: `moe_router`
    hide = (NOT_HIDDEN, NOT_HIDDEN)
    if shared and beside:
        hide = _shared_forward(w, model, x, m, overlap_tp)
    flex = settings.moe_token_dispatcher_type == "flex"
    dispatch_at = len(w.rows)
    if flex:  # DeepEP: tokens sent once per destination rank, then ordered by local expert there
        _deepep(w, settings, m, DEEPEP_DISPATCH, hide[0], cached=False)
        w.memory((m.received_tokens + m.expert_tokens) * x.e * x.h)
    else:
        _alltoall_dispatch(w, settings, x, m, hide[0])
    n, batch = m.tokens_per_expert, m.local_experts
    experts_from = len(w.rows)
    q, pad = probs_bytes(settings), pads_fp8_rows(settings, m.routed_tokens, m.topk, m.experts, m.ranks)
    if pad:  # Transformer Engine's FP8 row padding per local expert (`moe_padding`)
        fp8_padding(w, m.expert_tokens, x.h, x.e, q)
    w.gemm(n, x.h, m.expert_in, batch, grouped=True)
    _routed_act_forward(w, model, x, m)
    w.gemm(n, m.expert_ffn, x.h, batch, grouped=True)
    if pad:
        fp8_unpadding(w, m.expert_tokens, x.h, x.e)
    if model.add_bias_linear:  # fc2's bias, one local expert at a time (`moe_bias`)
        expert_bias_forward(w, m.expert_tokens, round(m.local_experts), x.h, x.e, q)
    experts_to = len(w.rows)
    if flex:  # each received token's local experts summed, then sent back
        w.memory((m.expert_tokens + m.received_tokens) * x.e * x.h)
        _deepep(w, settings, m, DEEPEP_COMBINE, hide[1])
    else:
        _alltoall_combine(w, x, m, hide[1])
    if m.etp > 1 and not m.gathered:  # tokens replicated over the tensor-parallel ranks
        w.comm("all_reduce", T * x.h * x.e, group="etp")
    return dispatch_at, experts_from, experts_to


def _moe_backward(w: _Builder, model: TransformerModel, settings: RunSettings, x: _Shape,
                  m: MoeShape) -> tuple[int, int]:
    """The MoE half's backward; the kernel counts before and after the experts' backward."""
    overlap_tp, async_reduce = settings.tp_comm_overlap, settings.async_tensor_model_parallel_allreduce
    shared = m.shared_ffn > 0
    hide = (NOT_HIDDEN, NOT_HIDDEN)
    if shared:
        hide = _shared_backward(w, model, x, m, overlap_tp, async_reduce)
    if not settings.moe_shared_expert_overlap:
        hide = (NOT_HIDDEN, NOT_HIDDEN)
    T, k = m.routed_tokens, m.topk
    _residual_backward(w, model, x)
    flex = settings.moe_token_dispatcher_type == "flex"
    if flex:  # combine's backward: DeepEP's dispatch kernel, then each token's gradient to its local experts
        _deepep(w, settings, m, DEEPEP_DISPATCH, hide[1])
        w.memory((m.received_tokens + m.expert_tokens) * x.e * x.h)
    else:
        w.memory((k + 1) * x.e * T * x.h)  # unpermute backward: each token's gradient copied to its k outputs
        if m.ep > 1:
            w.comm("all_to_all", m.a2a_bytes, hide[1], "ep")
        if m.gathered:
            w.comm("all_gather", m.etp * m.a2a_bytes, group="etp")
        _sort_chunks(w, x, m)  # unpermutation 2's backward
    n, batch = m.tokens_per_expert, m.local_experts
    experts_from = len(w.rows)
    q, pad = probs_bytes(settings), pads_fp8_rows(settings, m.routed_tokens, m.topk, m.experts, m.ranks)
    if model.add_bias_linear:  # fc2's bias, one local expert at a time (`moe_bias`)
        expert_bias_backward(w, m.expert_tokens, round(m.local_experts), x.h, x.e, q)
    if pad:  # the unpadding's backward (`moe_padding`)
        fp8_unpadding(w, m.expert_tokens, x.h, x.e)
    w.gemm(n, x.h, m.expert_ffn, batch, grouped=True)  # fc2 input gradient
    w.gemm(m.expert_ffn, n, x.h, batch, weight_grad=True, grouped=True)
    _act_backward(w, model.gated_mlp, x.e, m.expert_tokens, m.expert_ffn, probs=True, fp8_store=x.fp8_act_store)
    if model.activation_func_clamp_value:  # GPT-OSS's clamps (`moe_activation`)
        clamp_backward(w, m.expert_tokens, m.expert_ffn, x.e)
    w.gemm(n, m.expert_in, x.h, batch, grouped=True)  # fc1 input gradient
    w.gemm(x.h, n, m.expert_in, batch, weight_grad=True, grouped=True)
    if pad:  # the paddings' backward
        fp8_padding(w, m.expert_tokens, x.h, x.e, q)
    experts_to = len(w.rows)
    if flex:  # dispatch's backward: the local experts' gradients summed per token, DeepEP's combine kernel
        w.memory((m.expert_tokens + m.received_tokens) * x.e * x.h)
        _deepep(w, settings, m, DEEPEP_COMBINE, hide[0])
    else:
        _sort_chunks(w, x, m)  # permutation 2's backward
        if m.gathered:
            w.comm("reduce_scatter", m.etp * m.a2a_bytes, group="etp")
        if m.ep > 1:
            w.comm("all_to_all", m.a2a_bytes, hide[0], "ep")
            w.comm("all_to_all", m.probs_a2a_bytes, group="ep")  # the probabilities' gradient
        w.memory((k + 1) * x.e * T * x.h)  # permute backward: sum each token's k gradients
    if m.etp > 1 and not m.gathered:
        w.comm("all_reduce", T * x.h * x.e, group="etp")
    if not settings.fake_balanced_gate:  # v6-router: `moe_router`
        router_passes(settings, router_shape(model, settings, m))[1].add_to(w)
        w.gemm(T, m.experts, x.h, high_precision=True)
        w.gemm(x.h, T, m.experts, weight_grad=True, high_precision=True)
    _norm_backward(w, x)
    return experts_from, experts_to


def moe_activation_bytes(model: TransformerModel, settings: RunSettings) -> float:
    """Activations one MoE layer keeps per micro-batch until its backward, per rank:
    the attention half and the norm/router inputs as a dense layer
    (`ops.layer_activation_bytes` without its MLP), the router's fp32 probabilities
    (T x E), and per dispatched token (T k with the ETP gather and imbalance) what
    Megatron-Core's grouped experts save: fc1's input (the dispatched token, h), fc1's
    output (the activation's input, 2 f with a gate) and fc2's input (the activation's
    output, f). The routing probabilities are applied inside the activation
    (experts.py `bias_act_func`), so the combine's unpermute is an unweighted sum that
    saves nothing. The shared experts keep their fc1 output and fc2 input. In an fp8
    run fc1's and fc2's inputs are their FP8 copies (1 byte), as the dense layer's.

    Recomputation: full keeps only the layer's input; selective drops what its modules
    recompute (`recompute_modules`): the dense layer's modules act on the attention half
    and the norms (`mlp` skips MoE layers), `moe_act` drops fc2's input (the activation
    is recomputed from fc1's output; in fp8 Megatron saves fc2's original input for
    it, `set_save_original_input`, and discards it), `shared_experts` the shared
    experts' inner activations, `moe` the whole block's (router, dispatched tokens,
    experts, shared experts): only its input (the pre-MLP norm's output) is kept."""
    x = _shape(model, settings)
    whole = layer_activation_bytes(model, settings)
    if settings.recompute_granularity == "full":
        return whole
    recomputed = settings.recompute_modules if settings.recompute_granularity == "selective" else ()
    lin = FP8_OPERAND_BYTES if settings.dtype == "fp8" else x.e  # a linear layer's saved input
    act_in = FP8_OPERAND_BYTES if x.fp8_act_store else x.e  # `activation_func_fp8_input_store`
    dense_inner = 0.0 if "mlp" in recomputed else ((2 if model.gated_mlp else 1) * act_in + lin) * x.tokens * x.ffn
    if "moe" in recomputed:
        return float(whole - dense_inner)  # the block's input is the norm output `whole` already counts
    m = moe_shape(model, settings)
    router = FP32_BYTES * m.routed_tokens * m.experts
    fc2_input = 0.0 if "moe_act" in recomputed else lin * m.expert_ffn
    expert_act_in = x.e if "moe_act" in recomputed else act_in  # moe_act's checkpoint keeps the bf16 input
    experts = m.expert_tokens * (lin * x.h + expert_act_in * m.expert_in + fc2_input)
    if model.activation_func_clamp_value and "moe_act" not in recomputed:  # fc1's output kept (`moe_activation`)
        experts += clamp_saved_bytes(m.expert_tokens, m.expert_in, x.e)
    shared = 0.0 if "shared_experts" in recomputed else x.tokens * (act_in * m.shared_in + lin * m.shared_ffn)
    return float(whole - dense_inner + router + experts + shared)


def moe_recompute(model: TransformerModel, settings: RunSettings, x: _Shape, m: MoeShape, flash: bool,
                  gemm_bytes: int) -> PassWork:
    """What the backward of a MoE layer recomputes with `recompute_granularity:
    selective`: the dense modules on the attention half (Megatron-Core's `mlp` module
    recomputes dense MLPs only), then `moe` the whole block's forward but its norm and
    residual (router, permutation, both all-to-alls, experts, shared experts), else
    `shared_experts` the shared experts' forward and `moe_act` the experts' activation
    on their T k tokens (memory-bound)."""
    modules = settings.recompute_modules
    dense = tuple(name for name in modules if name not in ("mlp", *MOE_RECOMPUTE_MODULES))
    base = _selective_recompute(model, x, flash, settings.tp_comm_overlap, gemm_bytes, dense)
    w = _Builder(gemm_bytes)
    w.rows.extend(zip(*(getattr(base.kernels, f).tolist() for f in KERNEL_FIELDS_ORDER), strict=True))
    w.collectives.extend(base.collectives)
    if "moe" in modules:
        _moe_block_forward(w, model, settings, x, m)
        return w.build()
    if "shared_experts" in modules:
        _shared_forward(w, model, x, m, settings.tp_comm_overlap)
    if "moe_act" in modules:
        _routed_act_forward(w, model, x, m)
    return w.build()


def a2a_overlap(forward: PassWork, backward: PassWork, a2a_bytes: float, forward_spans: tuple[range, range],
                backward_spans: tuple[range, range]) -> tuple[PassWork, PassWork]:
    """`overlap_moe_expert_parallel_comm`: Megatron-Core's combined 1F1B
    (`schedule_layer_1f1b`, models/common/model_chunk_schedule_plan.py) runs micro-batch
    i+1's forward and micro-batch i's backward of a layer together, each all-to-all on the
    communication stream beside a whole module of the other: i's combine backward beside
    i+1's attention forward (up to the dispatch), i+1's dispatch beside i's experts'
    backward, i's dispatch backward beside i+1's experts' forward, i+1's combine beside
    i's attention backward. The pair of passes is priced exactly by moving the forward's
    two transfers into the backward (beside its experts and its attention) and the
    backward's two into the forward (beside its attention and its experts), each beside
    the run of kernels of its module (`forward_spans`: attention, experts of the forward;
    `backward_spans`: experts, attention of the backward), with the rule every
    overlapped collective follows (max + contention x min)."""
    def split(work: PassWork) -> tuple[list[Collective], list[Collective]]:  # (token transfers, the others)
        tokens = [c for c in work.collectives if c.group == "ep" and (
            isinstance(c, DeepEpTransfer) or (c.collective == "all_to_all" and c.nbytes == a2a_bytes))]
        return tokens, [c for c in work.collectives if c not in tokens]

    def beside(c: Collective, kernels: range) -> Collective:
        return replace(c, hidden_by=kernels.start, hidden_span=max(len(kernels), 1))

    (dispatch, combine), fwd_others = split(forward)
    (combine_bwd, dispatch_bwd), bwd_others = split(backward)
    attention_fwd, experts_fwd = forward_spans
    experts_bwd, attention_bwd = backward_spans
    fwd = [*fwd_others, beside(combine_bwd, attention_fwd), beside(dispatch_bwd, experts_fwd)]
    bwd = [*bwd_others, beside(dispatch, experts_bwd), beside(combine, attention_bwd)]
    return replace(forward, collectives=tuple(fwd)), replace(backward, collectives=tuple(bwd))


def moe_layer_work(model: TransformerModel, settings: RunSettings) -> LayerWork:
    """The work of one mixture-of-experts layer (see the module doc)."""
    x = _shape(model, settings)
    m = moe_shape(model, settings)
    flash = settings.use_flash_attn
    gemm_bytes = DTYPE_BYTES[settings.dtype]
    w = _Builder(gemm_bytes)
    _attention_forward(w, model, x, flash, settings.tp_comm_overlap)
    dispatch_at, experts_from, experts_to = _moe_forward(w, model, settings, x, m)
    forward = w.build()
    w = _Builder(gemm_bytes, accumulate_bytes_per_param(settings))
    experts_bwd = range(*_moe_backward(w, model, settings, x, m))
    moe_end = len(w.rows)
    _attention_backward(w, model, x, flash, settings.tp_comm_overlap, settings.async_tensor_model_parallel_allreduce)
    backward = w.build()
    if settings.overlap_moe_expert_parallel_comm and m.ep > 1:
        forward, backward = a2a_overlap(forward, backward, m.a2a_bytes,
                                        (range(0, dispatch_at), range(experts_from, experts_to)),
                                        (experts_bwd, range(moe_end, len(w.rows))))
    granularity = settings.recompute_granularity
    if granularity == "full":
        recompute = forward
    elif granularity == "selective":
        recompute = moe_recompute(model, settings, x, m, flash, gemm_bytes)
    else:
        recompute = PassWork(_Builder(gemm_bytes).build().kernels)
    return LayerWork(forward, backward, recompute, moe_activation_bytes(model, settings))

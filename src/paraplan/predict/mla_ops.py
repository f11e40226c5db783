"""Multi-latent attention (DeepSeek-V2/V3) on one tensor-parallel rank: the
projections around the attention core, as Megatron-Core's `MLASelfAttention` runs
them (`paraplan.predict.ops` runs the core, the output projection and the MLP).

Forward: the query down projection h -> q_lora_rank (or, without a query latent, a
column-parallel h -> a (qk + rope) projection), its norm and the column-parallel up
projection to the query heads; the key/value down projection h -> kv_lora_rank +
qk_pos_emb_head_dim (the rotary key part, shared by all heads), the latent's norm and
the column-parallel up projection to a (qk_head_dim + v_head_dim); rotary positions on
the query and key rope parts and the concatenation into heads of qk_head_dim +
qk_pos_emb_head_dim.

Tensor parallelism splits the heads: the up projections are column-parallel (a / t
heads per rank); the down projections are replicated on every rank (Megatron-Core's
`duplicated` linear layers). Without sequence parallelism each rank runs them on all
b s tokens; with it, on its b s / t tokens, and the latents (and the rotary key part)
are all-gathered before the up projections, whose input gradients are reduce-scattered
back. The down projections' input gradients need no collective (their latents'
gradients were summed by the up projections' backward).

Not priced: with sequence parallelism the replicated down projections' weight
gradients differ per rank and Megatron all-reduces them over the tensor-parallel
group once per iteration (h (q_lora_rank + kv_lora_rank + qk_pos_emb_head_dim)
parameters per layer), like the norms' weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from paraplan.predict.work import NOT_HIDDEN

if TYPE_CHECKING:
    from paraplan.core.transformer import TransformerModel
    from paraplan.predict.layer_shape import _Shape
    from paraplan.predict.ops import _Builder


@dataclass(frozen=True)
class _Mla:
    """MLA sizes on one rank."""

    down_tokens: float  # tokens the replicated down projections run on
    q_lora: float
    kv_lora: float
    rope: float
    q_heads_width: float  # a/t (qk_head_dim + rope): the query up projection's output
    kv_up_width: float  # a/t (qk_head_dim + v_head_dim)


def _mla(model: TransformerModel, x: _Shape) -> _Mla:
    return _Mla(
        down_tokens=x.sp_tokens, q_lora=float(model.q_lora_rank), kv_lora=float(model.kv_lora_rank),
        rope=float(model.qk_pos_emb_head_dim), q_heads_width=x.heads * x.qk_d,
        kv_up_width=x.heads * (model.qk_head_dim + model.v_head_dim),
    )


def _gather(w: _Builder, x: _Shape, width: float, overlap: bool, next_gemm: int = NOT_HIDDEN) -> None:
    """With sequence parallelism: all-gather a b s / t x width tensor before a
    column-parallel projection."""
    if x.sp:
        w.comm("all_gather", x.tokens * width * x.e, next_gemm if overlap else NOT_HIDDEN)


def mla_forward(w: _Builder, model: TransformerModel, x: _Shape, overlap: bool) -> None:
    """The MLA projections from the normed input to the attention core's Q, K, V."""
    m = _mla(model, x)
    if m.q_lora:
        w.gemm(m.down_tokens, x.h, m.q_lora)  # q down (replicated)
        w.memory(2 * x.e * m.down_tokens * m.q_lora)  # q latent norm
    w.gemm(m.down_tokens, x.h, m.kv_lora + m.rope)  # kv down with the rotary key part (replicated)
    w.memory(2 * x.e * m.down_tokens * m.kv_lora)  # kv latent norm
    mla_up_forward(w, model, x, overlap)


def _column_backward(w: _Builder, x: _Shape, tokens_in: float, k_in: float, n_out: float, width: float,
                     async_reduce: bool) -> None:
    """Backward of a column-parallel up projection (k_in -> n_out per rank) whose input
    is `width` wide: input gradient summed over the group (all-reduce, or reduce-scatter
    with sequence parallelism, beside the weight gradient), the input re-gathered with
    sequence parallelism."""
    dgrad = w.gemm(tokens_in, n_out, k_in)
    if x.sp:
        w.comm("all_gather", x.tokens * width * x.e, dgrad)
    wgrad = w.gemm(k_in, tokens_in, n_out, weight_grad=True)
    if x.t > 1:
        hidden = wgrad if (x.sp or async_reduce) else NOT_HIDDEN
        w.comm("reduce_scatter" if x.sp else "all_reduce", x.tokens * width * x.e, hidden)


def _replicated_backward(w: _Builder, tokens: float, k_in: float, n_out: float) -> None:
    w.gemm(tokens, n_out, k_in)
    w.gemm(k_in, tokens, n_out, weight_grad=True)


def mla_backward(w: _Builder, model: TransformerModel, x: _Shape, async_reduce: bool) -> None:
    """Backward of `mla_forward`, from the gradients of Q, K, V to the normed input."""
    m = _mla(model, x)
    w.memory(2 * x.e * x.tokens * 2 * x.heads * x.qk_d)  # split q and k heads (sum k's rope gradient)
    w.memory(2 * x.e * x.tokens * (x.heads + 1) * m.rope)  # rotary positions
    _column_backward(w, x, x.tokens, m.kv_lora, m.kv_up_width, m.kv_lora, async_reduce)  # kv up
    if x.sp and x.t > 1:
        w.comm("reduce_scatter", x.tokens * m.rope * x.e)  # rotary key part
    w.memory(3 * x.e * m.down_tokens * m.kv_lora)  # kv latent norm
    _replicated_backward(w, m.down_tokens, x.h, m.kv_lora + m.rope)  # kv down
    if m.q_lora:
        _column_backward(w, x, x.tokens, m.q_lora, m.q_heads_width, m.q_lora, async_reduce)  # q up
        w.memory(3 * x.e * m.down_tokens * m.q_lora)  # q latent norm
        _replicated_backward(w, m.down_tokens, x.h, m.q_lora)  # q down
    else:
        _column_backward(w, x, x.tokens, x.h, m.q_heads_width, x.h, async_reduce)  # q projection


def mla_up_forward(w: _Builder, model: TransformerModel, x: _Shape, overlap: bool) -> None:
    """From the latents to Q, K, V: the column-parallel up projections (or the direct
    query projection) with their sequence-parallel gathers, and the rotary parts; what
    Megatron-Core's `mla_up_proj` recomputation runs again before the core's backward."""
    m = _mla(model, x)
    if m.q_lora:
        _gather(w, x, m.q_lora, overlap, len(w.rows))
        w.gemm(x.tokens, m.q_lora, m.q_heads_width)  # q up (column-parallel)
    else:
        _gather(w, x, x.h, overlap, len(w.rows))
        w.gemm(x.tokens, x.h, m.q_heads_width)  # q projection (column-parallel)
    _gather(w, x, m.rope, overlap)  # rotary key part
    _gather(w, x, m.kv_lora, overlap, len(w.rows))
    w.gemm(x.tokens, m.kv_lora, m.kv_up_width)  # kv up (column-parallel)
    w.memory(2 * x.e * x.tokens * (x.heads + 1) * m.rope)  # rotary positions on q's and k's rope parts
    w.memory(2 * x.e * x.tokens * 2 * x.heads * x.qk_d)  # concatenate q and k heads (k's rope part expanded)


def mla_activation_bytes(model: TransformerModel, x: _Shape, keep_qkv: bool = True) -> float:
    """What the MLA projections keep for the backward (Megatron-Core): the latents
    before and after their norms (the norms' and up projections' inputs, on the
    sequence-parallel tokens), the rotary key part, and the attention core's Q, K, V
    (a / t heads of qk + rope, qk + rope and v_head_dim) unless `mla_up_proj`
    recomputation drops them (`keep_qkv` False). The normed layer input that the down
    projections share is counted with the layer."""
    m = _mla(model, x)
    latents = 2 * x.e * m.down_tokens * (m.q_lora + m.kv_lora) + x.e * m.down_tokens * m.rope
    qkv = x.e * x.tokens * x.heads * (2 * x.qk_d + x.v_d) if keep_qkv else 0.0
    return float(latents + qkv)

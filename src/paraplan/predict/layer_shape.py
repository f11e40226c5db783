"""The sizes one tensor-parallel rank sees of a transformer layer for one micro-batch
(`_Shape`, built by `_shape` from the model and the run settings): its tokens (split by
context parallelism, and by sequence parallelism in the norms and dropouts), the query
and key/value heads and widths per rank, the projections' widths per rank, and how many
(query, key) pairs a causal attention kernel computes with sliding windows or chunked
attention (`causal_scores`) and the length its ceilings price it at
(`kernel_seq_length`). The layer builders (`paraplan.predict.ops`, `moe_ops`, `mla_ops`,
`edge_ops`, `mtp_ops`, `loss_ops`) and the memory models read it.
"""

from __future__ import annotations

from dataclasses import dataclass

from paraplan.core.run_settings import DTYPE_BYTES, RunSettings
from paraplan.core.transformer import TransformerModel
from paraplan.core.transformer_blocks import attention_head_widths
from paraplan.predict.cp_ops import AttentionShape


@dataclass(frozen=True)
class _Shape:
    """The sizes one rank sees."""

    tokens: float  # b s / c: the tokens of this rank (c context-parallel ranks split the sequence)
    sp_tokens: float  # tokens in the sequence-parallel regions (b s / (c t) with SP)
    b: float
    s: float  # the whole sequence
    h: float
    t: int
    heads: float  # query heads per rank
    groups: float  # key/value heads per rank
    d: float  # head width
    qk_d: float  # query/key head width (d; MLA: qk_head_dim + qk_pos_emb_head_dim)
    v_d: float  # value head width (d; MLA: v_head_dim)
    causal_scores: float  # (query, key) pairs per sequence a causal kernel computes
    kernel_seq: float  # the length the fused kernel's ceilings price it at (`kernel_seq_length`)
    qkv: float  # QKV output width per rank
    ffn: float  # f per rank
    mlp_in: float  # first MLP projection's output width per rank
    e: int  # activation bytes
    sp: bool
    cp: int = 1
    cp_comm_type: str = "p2p"
    eager: bool = False  # `elementwise_kernels eager`: PyTorch's unfused ops (`paraplan.predict.eager_ops`)
    fp8_act_store: bool = False  # `activation_func_fp8_input_store`: the SwiGLU input kept as an FP8 cast

    def attention_shape(self) -> AttentionShape:
        return AttentionShape(self.b, self.s, self.heads, self.groups, self.d, self.e, self.cp,
                              compiled=not self.eager)  # torch_*: torch.compile unless eager


def causal_scores(s: float, window: int = 0, chunked: bool = False) -> float:
    """(query, key) pairs of one sequence a causal flash kernel computes: s^2 / 2 (the
    masked half skipped); with a sliding window w < s each query sees at most w keys,
    s w - w^2 / 2; with aligned chunks of w (`chunked_attention`) each query sees its
    chunk's prefix, floor(s / w) w^2 / 2 + r^2 / 2 with r = s mod w."""
    if chunked and window:
        full, rest = divmod(s, window)
        return (full * window * window + rest * rest) / 2
    if window and window < s:
        return s * window - window * window / 2
    return s * s / 2


def kernel_seq_length(s: float, window: int = 0, chunked: bool = False) -> float:
    """The length whose causal kernel does a windowed row's work: the fused ceilings'
    s / (s + attention_seq_half) prices each row's fixed work against the s / 2 keys a
    causal row of length s sees; a window w < s row sees w keys, as at length 2w; a
    chunked layer's rows see 2 causal_scores / s keys on average (w when w divides s)."""
    if chunked and window:
        return 2.0 * causal_scores(s, window, chunked) / s
    return min(s, 2.0 * window) if window else s


def _shape(model: TransformerModel, settings: RunSettings, layer: int = 0) -> _Shape:
    t = settings.tensor_model_parallel_size
    b, s = float(settings.micro_batch_size), float(model.seq_length)
    sp = settings.sequence_parallel and t > 1
    cp = settings.context_parallel_size
    tokens = b * s / cp if cp > 1 else b * s
    qk_d, v_d = attention_head_widths(model)
    window = model.window_size if model.windowed_layers[layer] else 0
    chunked = model.chunked_attention
    mla = model.multi_latent_attention
    return _Shape(
        tokens=tokens, sp_tokens=tokens / t if sp else tokens, b=b, s=s, h=float(model.hidden_size), t=t,
        heads=model.num_attention_heads / t, groups=(model.num_attention_heads if mla else model.query_groups) / t,
        d=float(model.kv_channels), qk_d=float(qk_d), v_d=float(v_d), causal_scores=causal_scores(s, window, chunked),
        kernel_seq=kernel_seq_length(s, window, chunked),
        qkv=model.qkv_size / t, ffn=model.ffn_size / t, mlp_in=model.mlp_in_size / t,
        e=2 if settings.dtype == "fp8" else DTYPE_BYTES[settings.dtype], sp=sp, cp=cp,
        cp_comm_type=settings.cp_comm_type, eager=settings.elementwise_kernels == "eager",
        fp8_act_store=settings.activation_func_fp8_input_store,
    )

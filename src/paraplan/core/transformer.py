"""A GPT/Llama-style decoder-only transformer, described by its architecture numbers.

Field names are Megatron-LM's arguments (`num_layers`, `hidden_size`,
`num_attention_heads`, `num_query_groups`, `ffn_hidden_size`, `swiglu`,
`seq_length`, `vocab_size`, `untie_embeddings_and_output_weights`, ...), the
vocabulary the people who train these models already speak.

Beyond GPT and Llama the description covers what the models trained today add, in
Megatron-Core's names: a head width of its own (`kv_channels`, Qwen3, Gemma),
QKV biases (`add_qkv_bias`, Qwen2), QK normalisation (`qk_layernorm`), learnable
attention sinks (`softmax_type`), gated MLPs with another activation
(`gated_linear_unit`, GeGLU), sliding-window layers (`window_size`,
`window_attn_skip_freq`), mixture-of-experts layers (`num_experts`,
`moe_router_topk`, `moe_ffn_hidden_size`, `moe_shared_expert_intermediate_size`,
`moe_layer_freq`, group-limited routing `moe_router_num_groups`,
`moe_router_group_topk`, and the model's own router, `moe_router_score_function`,
`moe_router_enable_expert_bias`, `moe_router_topk_scaling_factor`, `moe_router_pre_softmax`:
a run's defaults), multi-latent attention (`multi_latent_attention`, `q_lora_rank`,
`kv_lora_rank`, `qk_head_dim`, `qk_pos_emb_head_dim`, `v_head_dim`) and
multi-token-prediction layers (`mtp_num_layers`).

Counts here are closed forms per transformer layer and per model; the kernels a
layer runs (and their shapes) live in `paraplan.predict.ops`, whose sums equal
these counts. `num_parameters` counts every weight of the main model once (not the
multi-token-prediction layers: `mtp_parameters`); `active_parameters` the weights a
token passes through: everything but the experts it is not routed to (the input
embedding and the LM head included).

Conventions (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training
on GPU Clusters Using Megatron-LM"): a matrix product (m x k) @ (k x n) is 2mkn
FLOPs; attention scores and the attention-weighted values are counted over the full
s x s matrix (causal masking saves nothing in the kernels these models ran); the
backward pass is twice the forward.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Literal

from paraplan.core.limits import LAYERS_WHY, MAX_LAYERS, MAX_WIDTH, WIDTH_WHY
from paraplan.core.moe_router_model import ScoreFunction, check_model_router
from paraplan.core.transformer_blocks import (
    FLAGS,
    OPTIONAL_SIZES,
    SoftmaxType,
    attention_head_widths,
    attention_params,
    check_extensions,
    mlp_params,
    moe_layer_pattern,
    window_keys,
)

Normalization = Literal["LayerNorm", "RMSNorm"]
PositionEmbedding = Literal["learned_absolute", "rope"]
NORMALIZATIONS: tuple[str, ...] = ("LayerNorm", "RMSNorm")
POSITION_EMBEDDINGS: tuple[str, ...] = ("learned_absolute", "rope")


@dataclass(frozen=True)
class TransformerModel:
    """Architecture of a decoder-only transformer language model."""

    name: str
    num_layers: int
    """Transformer layers (blocks of attention + MLP)."""
    hidden_size: int
    """h: the model width."""
    num_attention_heads: int
    """a: query heads."""
    seq_length: int
    """s: tokens per sequence."""
    vocab_size: int
    """V: vocabulary entries before Megatron pads them (see `padded_vocab_size`)."""
    num_query_groups: int = 0
    """g: key/value heads (grouped-query attention); 0 means g = a (multi-head)."""
    ffn_hidden_size: int = 0
    """f: MLP width; 0 means Megatron's default (4h, or 4h x 2/3 rounded down to a
    multiple of 64 with SwiGLU)."""
    swiglu: bool = False
    """Gated MLP (SiLU(x W1) * x W3) W2: three weight matrices instead of two."""
    untie_embeddings_and_output_weights: bool = False
    """True: the LM head has weights of its own (Llama); False: it reuses the input
    embedding (GPT)."""
    normalization: Normalization = "LayerNorm"
    position_embedding_type: PositionEmbedding = "learned_absolute"
    add_bias_linear: bool = True
    """Biases on the linear layers (GPT: yes; Llama: no)."""
    hidden_dropout: float = 0.1
    """Dropout after the attention and MLP outputs (0: none, as Llama trains)."""
    attention_dropout: float = 0.1
    """Dropout on the attention probabilities."""
    make_vocab_size_divisible_by: int = 128
    kv_channels: int = 0
    """d: the width of one attention head; 0 means h / a. After construction it
    always holds the resolved width."""
    add_qkv_bias: bool = False
    """Biases on the QKV projection only (Qwen2), whatever `add_bias_linear` says."""
    qk_layernorm: bool = False
    """A normalisation of each query and key head (Qwen3, Gemma 3, OLMo 2)."""
    sandwich_norm: bool = False
    """A normalisation of each sublayer's output too, before its residual add (Gemma 2
    and 3: four norms per layer, Hugging Face's `post_attention_layernorm` and
    `post_feedforward_layernorm` beside the two input norms)."""
    softmax_type: SoftmaxType = "vanilla"
    """`learnable`: one learnable attention sink per head (GPT-OSS)."""
    gated_linear_unit: bool = False
    """Gated MLP with an activation other than SiLU (GeGLU: Gemma); same shapes as
    `swiglu`."""
    window_size: int = 0
    """Sliding-window attention: each token attends to the previous `window_size`
    tokens (0: full causal attention in every layer)."""
    window_attn_skip_freq: int = 0
    """With a window: every `window_attn_skip_freq`-th layer (1-based) attends to the
    full sequence (Gemma 3: 6, GPT-OSS: 2); 0: every layer is windowed."""
    chunked_attention: bool = False
    """With a window: the windowed layers attend within aligned chunks of `window_size`
    tokens instead of a sliding window (Llama 4's `attention_chunk_size`): a token sees
    the keys from its chunk's first token to itself."""
    num_experts: int = 0
    """Routed experts of a mixture-of-experts layer (0: a dense model)."""
    moe_router_topk: int = 2
    """Experts each token is routed to."""
    moe_ffn_hidden_size: int = 0
    """Width of one routed expert's MLP; 0 means `ffn_hidden_size`."""
    moe_shared_expert_intermediate_size: int = 0
    """Total width of the shared experts every token passes through (0: none)."""
    moe_layer_freq: int | tuple[int, ...] = 1
    """Which layers are mixture-of-experts layers: every k-th layer (an integer), or
    one 0/1 entry per layer (DeepSeek-V3: three dense layers, then 58 MoE layers)."""
    moe_router_num_groups: int = 0
    """Group-limited routing (DeepSeek-V3: 8): the experts in this many groups of
    consecutive experts, a token's experts taken from `moe_router_group_topk` of them
    (0: no group limit)."""
    moe_router_group_topk: int = 0
    """Groups a token's experts are taken from (DeepSeek-V3: 4), with
    `moe_router_num_groups`."""
    moe_router_score_function: ScoreFunction = "softmax"
    """The model's own router (`paraplan.core.moe_router_model`; a run's default):
    `softmax` (Megatron-Core's default) or `sigmoid` (DeepSeek-V3, Kimi K2, Llama 4)."""
    moe_router_enable_expert_bias: bool = False
    """The model's router adds a per-expert bias to the scores for the choice
    (DeepSeek-V3's aux-loss-free balancing, `topk_method noaux_tc`); sigmoid only."""
    moe_router_topk_scaling_factor: float = 0.0
    """The model's router scales the chosen experts' weights (DeepSeek-V3: 2.5,
    `routed_scaling_factor`); 0: none."""
    moe_router_pre_softmax: bool = False
    """The model's softmax router normalises over all experts before the top-k (Qwen's
    `norm_topk_prob false`), not over the k chosen."""
    multi_latent_attention: bool = False
    """Multi-latent attention (DeepSeek-V2/V3): queries and keys/values projected
    through low-rank latents; heads of `qk_head_dim` + `qk_pos_emb_head_dim` for
    scores and `v_head_dim` for values."""
    q_lora_rank: int = 0
    """MLA: rank of the query latent (0: queries projected directly)."""
    kv_lora_rank: int = 0
    """MLA: rank of the key/value latent."""
    qk_head_dim: int = 0
    """MLA: query/key head width without rotary positions."""
    qk_pos_emb_head_dim: int = 0
    """MLA: query/key head width that carries the rotary positions (shared by heads
    for keys)."""
    v_head_dim: int = 0
    """MLA: value head width."""
    mtp_num_layers: int = 0
    """Multi-token-prediction layers after the main model (DeepSeek-V3: 1)."""
    attn_logit_softcapping: float = 0.0
    """Gemma 2's soft-cap of the attention logits, cap x tanh(logit / cap) (Megatron-LM's
    `attn_logit_softcapping`, Hugging Face's key of the same name; 0: none). It changes no
    count; Transformer Engine runs it on FlashAttention, never on cuDNN's fused kernel
    (`paraplan.kernels.attention_backends`)."""
    activation_func_clamp_value: float = 0.0
    """GPT-OSS's gated activation as Megatron-Core runs it (Megatron-Bridge's GPT-OSS
    provider: `quick_gelu`, `glu_linear_offset` 1, this clamp 7.0; Hugging Face's
    `swiglu_limit`): the gate clamped above and the linear half on both sides at this
    value before the fused activation (0: none). Its kernels are priced in the routed
    experts (`paraplan.predict.moe_activation`), so it needs every layer a MoE layer
    without shared experts, as GPT-OSS is."""

    def __post_init__(self) -> None:
        for key in ("num_layers", "hidden_size", "num_attention_heads", "seq_length", "vocab_size",
                    "make_vocab_size_divisible_by"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"model '{self.name}': {key} must be an integer >= 1, got {value!r}")
        for key in ("num_query_groups", "ffn_hidden_size", *OPTIONAL_SIZES):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"model '{self.name}': {key} must be an integer >= 0, got {value!r}")
        if self.num_layers > MAX_LAYERS:
            raise ValueError(f"model '{self.name}': num_layers {self.num_layers:,} is above {MAX_LAYERS:,}: "
                             f"{LAYERS_WHY}")
        for key in ("hidden_size", "num_attention_heads", "num_query_groups", "ffn_hidden_size", "seq_length",
                    "vocab_size", "make_vocab_size_divisible_by", *OPTIONAL_SIZES):
            if getattr(self, key) > MAX_WIDTH:
                raise ValueError(f"model '{self.name}': {key} {getattr(self, key):,} is above {MAX_WIDTH:,}: "
                                 f"{WIDTH_WHY}")
        for key in ("swiglu", "untie_embeddings_and_output_weights", "add_bias_linear", *FLAGS):
            if not isinstance(getattr(self, key), bool):
                raise ValueError(f"model '{self.name}': {key} must be true or false, got {getattr(self, key)!r}")
        for key in ("hidden_dropout", "attention_dropout"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1:
                raise ValueError(f"model '{self.name}': {key} must be a number in [0, 1), got {value!r}")
        if not self.kv_channels:
            if self.hidden_size % self.num_attention_heads:
                raise ValueError(
                    f"model '{self.name}': hidden_size {self.hidden_size} is not divisible by "
                    f"num_attention_heads {self.num_attention_heads} (give kv_channels, the head width)"
                )
            object.__setattr__(self, "kv_channels", self.hidden_size // self.num_attention_heads)
        cap = self.attn_logit_softcapping
        if isinstance(cap, bool) or not isinstance(cap, int | float) or not 0 <= cap < float("inf"):
            raise ValueError(f"model '{self.name}': attn_logit_softcapping must be a finite number >= 0 "
                             f"(0: none), got {cap!r}")
        check_extensions(self)
        check_model_router(self)
        if self.num_attention_heads % self.query_groups:
            raise ValueError(
                f"model '{self.name}': num_attention_heads {self.num_attention_heads} is not divisible "
                f"by num_query_groups {self.query_groups}"
            )
        if self.normalization not in NORMALIZATIONS:
            raise ValueError(f"model '{self.name}': normalization must be one of {NORMALIZATIONS}")
        if self.position_embedding_type not in POSITION_EMBEDDINGS:
            raise ValueError(
                f"model '{self.name}': position_embedding_type must be one of {POSITION_EMBEDDINGS}"
            )

    # ---- derived sizes -------------------------------------------------------------
    @property
    def query_groups(self) -> int:
        """g, with 0 resolved to a."""
        return self.num_query_groups or self.num_attention_heads

    @property
    def ffn_size(self) -> int:
        """f, with 0 resolved to Megatron's default."""
        if self.ffn_hidden_size:
            return self.ffn_hidden_size
        if self.swiglu:
            return int(4 * self.hidden_size * 2 / 3 / 64) * 64
        return 4 * self.hidden_size

    @property
    def attention_size(self) -> int:
        """a d: the width of all query heads (h unless `kv_channels` says otherwise)."""
        return self.num_attention_heads * self.kv_channels

    @property
    def qkv_size(self) -> int:
        """Output width of the fused QKV projection: a d + 2 g d."""
        return self.attention_size + 2 * self.query_groups * self.kv_channels

    @property
    def gated_mlp(self) -> bool:
        """The MLP has a gate (SwiGLU or another gated linear unit): 3 matrices."""
        return self.swiglu or self.gated_linear_unit

    @property
    def mlp_in_size(self) -> int:
        """Output width of the first MLP projection (2f with a gate)."""
        return 2 * self.ffn_size if self.gated_mlp else self.ffn_size

    @property
    def moe_ffn_size(self) -> int:
        """Width of one routed expert (`moe_ffn_hidden_size`, else f)."""
        return self.moe_ffn_hidden_size or self.ffn_size

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def router_groups(self) -> tuple[int, int]:
        """(groups, groups chosen per token) of the routing: (1, 1) without a group limit."""
        return (self.moe_router_num_groups or 1, self.moe_router_group_topk or 1)

    @functools.cached_property
    def moe_layers(self) -> tuple[bool, ...]:
        """For each layer: is it a mixture-of-experts layer? (Computed once: the FLOP
        counts ask it for every layer.)"""
        return moe_layer_pattern(self)

    @property
    def windowed_layers(self) -> tuple[bool, ...]:
        """For each layer: does it attend through the sliding window?"""
        if not self.window_size:
            return (False,) * self.num_layers
        k = self.window_attn_skip_freq
        return tuple(not (k and (i + 1) % k == 0) for i in range(self.num_layers))

    def padded_vocab_size(self, tensor_model_parallel_size: int = 1) -> int:
        """V rounded up to a multiple of make_vocab_size_divisible_by x TP (Megatron)."""
        multiple = self.make_vocab_size_divisible_by * tensor_model_parallel_size
        return int(math.ceil(self.vocab_size / multiple) * multiple)

    # ---- parameters ----------------------------------------------------------------
    @property
    def norm_params(self) -> int:
        """Parameters of one normalisation layer (LayerNorm: scale and shift)."""
        return 2 * self.hidden_size if self.normalization == "LayerNorm" else self.hidden_size

    @property
    def attention_params(self) -> int:
        """Parameters of one attention block (projections, biases, QK norms, sinks)."""
        return attention_params(self)

    @property
    def dense_mlp_params(self) -> int:
        """Parameters of one dense MLP block."""
        return mlp_params(self.hidden_size, self.ffn_size, self.gated_mlp, self.add_bias_linear)

    @property
    def expert_params(self) -> int:
        """Parameters of one routed expert."""
        return mlp_params(self.hidden_size, self.moe_ffn_size, self.gated_mlp, self.add_bias_linear)

    @property
    def moe_always_params(self) -> int:
        """Parameters of a mixture-of-experts layer every token uses: the router and
        the shared experts."""
        h = self.hidden_size
        router = h * self.num_experts + (self.num_experts if self.add_bias_linear else 0)
        shared = 0
        if self.moe_shared_expert_intermediate_size:
            shared = mlp_params(h, self.moe_shared_expert_intermediate_size, self.gated_mlp, self.add_bias_linear)
        return router + shared

    @property
    def layer_norms(self) -> int:
        """Normalisation layers of one transformer layer: the two input norms, and with
        `sandwich_norm` the two output norms."""
        return 4 if self.sandwich_norm else 2

    @property
    def dense_layer_params(self) -> int:
        """Parameters of one layer with a dense MLP (GPT with biases: 12h^2 + 13h)."""
        return self.attention_params + self.dense_mlp_params + self.layer_norms * self.norm_params

    @property
    def moe_layer_params(self) -> int:
        """Parameters of one mixture-of-experts layer (all its experts)."""
        return (self.attention_params + self.num_experts * self.expert_params + self.moe_always_params
                + self.layer_norms * self.norm_params)

    @property
    def moe_layer_active_params(self) -> int:
        """Parameters of one mixture-of-experts layer that one token uses."""
        return (self.attention_params + self.moe_router_topk * self.expert_params + self.moe_always_params
                + self.layer_norms * self.norm_params)

    @property
    def num_moe_layers(self) -> int:
        return sum(self.moe_layers)

    @property
    def layer_params(self) -> int:
        """Parameters of one transformer layer: of a dense model exactly; of a
        mixture-of-experts model the mean over its layers (rounded down)."""
        if not self.is_moe:
            return self.dense_layer_params
        return self.transformer_params // self.num_layers

    @property
    def transformer_params(self) -> int:
        """Parameters of all transformer layers of the main model."""
        moe = self.num_moe_layers
        return moe * self.moe_layer_params + (self.num_layers - moe) * self.dense_layer_params

    def embedding_params(self, tensor_model_parallel_size: int = 1) -> int:
        """Word embedding (padded vocabulary) plus learned positions."""
        h = self.hidden_size
        positions = self.seq_length * h if self.position_embedding_type == "learned_absolute" else 0
        return self.padded_vocab_size(tensor_model_parallel_size) * h + positions

    def output_params(self, tensor_model_parallel_size: int = 1) -> int:
        """Final normalisation plus the LM head when it is not tied to the embedding."""
        head = self.padded_vocab_size(tensor_model_parallel_size) * self.hidden_size
        return self.norm_params + (head if self.untie_embeddings_and_output_weights else 0)

    def _outside_layers_params(self) -> int:
        h = self.hidden_size
        positions = self.seq_length * h if self.position_embedding_type == "learned_absolute" else 0
        embedding = self.vocab_size * h + positions
        head = self.vocab_size * h if self.untie_embeddings_and_output_weights else 0
        return embedding + self.norm_params + head

    @property
    def num_parameters(self) -> int:
        """All parameters of the main model (unpadded vocabulary), each counted once;
        multi-token-prediction layers not included (`mtp_parameters`)."""
        return self.transformer_params + self._outside_layers_params()

    @property
    def active_parameters(self) -> int:
        """Parameters one token passes through: all but the routed experts it is not
        sent to (the input embedding and the LM head included). A dense model's
        `num_parameters`."""
        moe = self.num_moe_layers
        layers = moe * self.moe_layer_active_params + (self.num_layers - moe) * self.dense_layer_params
        return layers + self._outside_layers_params()

    @property
    def mtp_parameters(self) -> int:
        """Parameters of the multi-token-prediction layers (DeepSeek-V3): each a
        transformer layer like the last one, a projection of [h; h] to h and two
        norms of its inputs plus its output norm; embedding and head shared."""
        if not self.mtp_num_layers:
            return 0
        last = self.moe_layer_params if self.moe_layers[-1] else self.dense_layer_params
        h = self.hidden_size
        return self.mtp_num_layers * (last + 2 * h * h + 3 * self.norm_params)

    # ---- FLOPs ---------------------------------------------------------------------
    def layer_forward_flops(self, sequences: float, layer: int = 0) -> float:
        """Forward FLOPs of transformer layer `layer` on `sequences` sequences of s
        tokens: matrix products only (GPT: 24bsh^2 + 4bs^2h). A mixture-of-experts
        layer counts the experts each token is routed to; a windowed layer scores
        each query against min(s, window) keys (`window_keys`)."""
        b, s, h = sequences, self.seq_length, self.hidden_size
        tokens = b * s
        if self.moe_layers[layer]:
            mlp = self.moe_router_topk * mlp_params(h, self.moe_ffn_size, self.gated_mlp, False) + h * self.num_experts
            if self.moe_shared_expert_intermediate_size:
                mlp += mlp_params(h, self.moe_shared_expert_intermediate_size, self.gated_mlp, False)
        else:
            mlp = mlp_params(h, self.ffn_size, self.gated_mlp, False)
        projections = 2 * tokens * (self.attention_matmul_params + mlp)
        keys = window_keys(s, self.window_size, self.chunked_attention) if self.windowed_layers[layer] else s
        qk, v = attention_head_widths(self)
        attention = 2 * b * s * keys * self.num_attention_heads * (qk + v)  # scores and values, all heads
        return float(projections + attention)

    def layers_forward_flops(self, sequences: float) -> float:
        """Forward FLOPs of all transformer layers of the main model."""
        first = self.layer_forward_flops(sequences, 0)
        if not (self.is_moe or self.window_size):
            return self.num_layers * first
        return float(sum(self.layer_forward_flops(sequences, i) for i in range(self.num_layers)))

    @property
    def attention_matmul_params(self) -> int:
        """Weights of the attention block's matrix products (no biases or norms)."""
        return attention_params(self, matmul_only=True)

    def head_forward_flops(self, sequences: float) -> float:
        """Forward FLOPs of the LM head (logits over the unpadded vocabulary): 2bshV."""
        return float(2 * sequences * self.seq_length * self.hidden_size * self.vocab_size)

    def model_flops_per_iteration(self, global_batch_size: int, recomputed_share: float) -> float:
        """FLOPs of one training iteration as Megatron-LM's paper counts them: forward,
        backward (2x) and, with full recomputation, the recomputed forward of that
        share of the layers (1: every layer; a `recompute_method block` run recomputes
        fewer); the head is never recomputed. GPT with full recomputation:
        96 B s l h^2 (1 + s / 6h + V / 16 l h)."""
        passes = 3.0 + recomputed_share
        return (passes * self.layers_forward_flops(global_batch_size)
                + 3.0 * self.head_forward_flops(global_batch_size))

    def mfu_flops_per_iteration(self, global_batch_size: int) -> float:
        """6 x active parameters x tokens: the model-FLOPs-utilisation convention (no
        recomputation, no attention-score term; a dense model's active parameters
        are all of them)."""
        return 6.0 * self.active_parameters * global_batch_size * self.seq_length


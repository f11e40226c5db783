"""A GPT/Llama-style decoder-only transformer, described by its architecture numbers.

Field names are Megatron-LM's arguments (`num_layers`, `hidden_size`,
`num_attention_heads`, `num_query_groups`, `ffn_hidden_size`, `swiglu`,
`seq_length`, `vocab_size`, `untie_embeddings_and_output_weights`, ...), the
vocabulary the people who train these models already speak.

Counts here are closed forms per transformer layer and per model; the kernels a
layer runs (and their shapes) live in `paraplan.predict.ops`, whose sums equal
these counts.

Conventions (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training
on GPU Clusters Using Megatron-LM"): a matrix product (m x k) @ (k x n) is 2mkn
FLOPs; attention scores and the attention-weighted values are counted over the full
s x s matrix (causal masking saves nothing in the kernels these models ran); the
backward pass is twice the forward.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from paraplan.core.limits import LAYERS_WHY, MAX_LAYERS, MAX_WIDTH, WIDTH_WHY

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

    def __post_init__(self) -> None:
        for key in ("num_layers", "hidden_size", "num_attention_heads", "seq_length", "vocab_size",
                    "make_vocab_size_divisible_by"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"model '{self.name}': {key} must be an integer >= 1, got {value!r}")
        for key in ("num_query_groups", "ffn_hidden_size"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"model '{self.name}': {key} must be an integer >= 0, got {value!r}")
        if self.num_layers > MAX_LAYERS:
            raise ValueError(f"model '{self.name}': num_layers {self.num_layers:,} is above {MAX_LAYERS:,}: "
                             f"{LAYERS_WHY}")
        for key in ("hidden_size", "num_attention_heads", "num_query_groups", "ffn_hidden_size", "seq_length",
                    "vocab_size", "make_vocab_size_divisible_by"):
            if getattr(self, key) > MAX_WIDTH:
                raise ValueError(f"model '{self.name}': {key} {getattr(self, key):,} is above {MAX_WIDTH:,}: "
                                 f"{WIDTH_WHY}")
        for key in ("swiglu", "untie_embeddings_and_output_weights", "add_bias_linear"):
            if not isinstance(getattr(self, key), bool):
                raise ValueError(f"model '{self.name}': {key} must be true or false, got {getattr(self, key)!r}")
        for key in ("hidden_dropout", "attention_dropout"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1:
                raise ValueError(f"model '{self.name}': {key} must be a number in [0, 1), got {value!r}")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"model '{self.name}': hidden_size {self.hidden_size} is not divisible by "
                f"num_attention_heads {self.num_attention_heads}"
            )
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
    def kv_channels(self) -> int:
        """d = h / a: the width of one head."""
        return self.hidden_size // self.num_attention_heads

    @property
    def ffn_size(self) -> int:
        """f, with 0 resolved to Megatron's default."""
        if self.ffn_hidden_size:
            return self.ffn_hidden_size
        if self.swiglu:
            return int(4 * self.hidden_size * 2 / 3 / 64) * 64
        return 4 * self.hidden_size

    @property
    def qkv_size(self) -> int:
        """Output width of the fused QKV projection: h + 2 g d."""
        return self.hidden_size + 2 * self.query_groups * self.kv_channels

    @property
    def mlp_in_size(self) -> int:
        """Output width of the first MLP projection (2f with SwiGLU's gate)."""
        return 2 * self.ffn_size if self.swiglu else self.ffn_size

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
    def layer_params(self) -> int:
        """Parameters of one transformer layer (GPT with biases: 12h^2 + 13h)."""
        h, bias = self.hidden_size, self.add_bias_linear
        attention = h * self.qkv_size + h * h + (self.qkv_size + h if bias else 0)
        mlp = h * self.mlp_in_size + self.ffn_size * h + (self.mlp_in_size + h if bias else 0)
        return attention + mlp + 2 * self.norm_params

    def embedding_params(self, tensor_model_parallel_size: int = 1) -> int:
        """Word embedding (padded vocabulary) plus learned positions."""
        h = self.hidden_size
        positions = self.seq_length * h if self.position_embedding_type == "learned_absolute" else 0
        return self.padded_vocab_size(tensor_model_parallel_size) * h + positions

    def output_params(self, tensor_model_parallel_size: int = 1) -> int:
        """Final normalisation plus the LM head when it is not tied to the embedding."""
        head = self.padded_vocab_size(tensor_model_parallel_size) * self.hidden_size
        return self.norm_params + (head if self.untie_embeddings_and_output_weights else 0)

    @property
    def num_parameters(self) -> int:
        """All parameters (unpadded vocabulary), each counted once."""
        h = self.hidden_size
        positions = self.seq_length * h if self.position_embedding_type == "learned_absolute" else 0
        embedding = self.vocab_size * h + positions
        head = self.vocab_size * h if self.untie_embeddings_and_output_weights else 0
        return self.num_layers * self.layer_params + embedding + self.norm_params + head

    # ---- FLOPs ---------------------------------------------------------------------
    def layer_forward_flops(self, sequences: float) -> float:
        """Forward FLOPs of one transformer layer on `sequences` sequences of s tokens:
        matrix products only (GPT: 24bsh^2 + 4bs^2h)."""
        b, s, h = sequences, self.seq_length, self.hidden_size
        tokens = b * s
        projections = 2 * tokens * h * (self.qkv_size + h + self.mlp_in_size) + 2 * tokens * self.ffn_size * h
        attention = 4 * b * s * s * h  # scores (QK^T) and values (PV), over all query heads
        return float(projections + attention)

    def head_forward_flops(self, sequences: float) -> float:
        """Forward FLOPs of the LM head (logits over the unpadded vocabulary): 2bshV."""
        return float(2 * sequences * self.seq_length * self.hidden_size * self.vocab_size)

    def model_flops_per_iteration(self, global_batch_size: int, full_recompute: bool) -> float:
        """FLOPs of one training iteration as Megatron-LM's paper counts them: forward,
        backward (2x) and, with full recomputation, the recomputed forward of every
        layer; the head is never recomputed. GPT with full recomputation:
        96 B s l h^2 (1 + s / 6h + V / 16 l h)."""
        passes = 4.0 if full_recompute else 3.0
        return (passes * self.num_layers * self.layer_forward_flops(global_batch_size)
                + 3.0 * self.head_forward_flops(global_batch_size))

    def mfu_flops_per_iteration(self, global_batch_size: int) -> float:
        """6 x parameters x tokens: the model-FLOPs-utilisation convention (no
        recomputation, no attention-score term)."""
        return 6.0 * self.num_parameters * global_batch_size * self.seq_length

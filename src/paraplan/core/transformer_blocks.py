"""Blocks of a transformer layer beyond GPT/Llama (`paraplan.core.transformer`):
the interlocks of their fields and their parameter counts."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from paraplan.core.transformer import TransformerModel

SoftmaxType = Literal["vanilla", "learnable"]
SOFTMAX_TYPES: tuple[str, ...] = ("vanilla", "learnable")

OPTIONAL_SIZES = ("kv_channels", "window_size", "window_attn_skip_freq", "num_experts", "moe_ffn_hidden_size",
                   "moe_shared_expert_intermediate_size", "q_lora_rank", "kv_lora_rank", "qk_head_dim",
                   "qk_pos_emb_head_dim", "v_head_dim", "mtp_num_layers", "moe_router_num_groups",
                   "moe_router_group_topk")
FLAGS = ("add_qkv_bias", "qk_layernorm", "sandwich_norm", "gated_linear_unit", "multi_latent_attention",
         "chunked_attention")


def check_extensions(m: TransformerModel) -> None:
    """The interlocks of the fields beyond GPT/Llama (see the module doc)."""
    where = f"model '{m.name}'"
    if m.swiglu and m.gated_linear_unit:
        raise ValueError(f"{where}: swiglu and gated_linear_unit are two names of a gated MLP; set one")
    if m.softmax_type not in SOFTMAX_TYPES:
        raise ValueError(f"{where}: softmax_type must be one of {SOFTMAX_TYPES}, got {m.softmax_type!r}")
    if m.window_attn_skip_freq and not m.window_size:
        raise ValueError(f"{where}: window_attn_skip_freq needs a window_size")
    if m.chunked_attention and not m.window_size:
        raise ValueError(f"{where}: chunked_attention needs a window_size (the chunk's length in tokens)")
    if m.is_moe:
        k = m.moe_router_topk
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= m.num_experts:
            raise ValueError(f"{where}: moe_router_topk must be an integer in [1, num_experts {m.num_experts}], "
                             f"got {k!r}")
        moe_layer_pattern(m)  # checks moe_layer_freq
        check_group_limited_routing(m)
    elif isinstance(m.moe_router_topk, bool) or not isinstance(m.moe_router_topk, int):
        # q4-hostile: a dense model's top-k is not read, but a text or list there was a TypeError later
        raise ValueError(f"{where}: moe_router_topk must be an integer, got {m.moe_router_topk!r}")
    elif set_moe := [key for key in MOE_ONLY if getattr(m, key)]:
        raise ValueError(f"{where}: {', '.join(f'{key} {getattr(m, key)}' for key in set_moe)} "
                         f"{'needs' if len(set_moe) == 1 else 'need'} num_experts > 0, got {m.num_experts}")
    check_activation_clamp(m)
    mla = ("q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim")
    if m.multi_latent_attention:
        for key in mla[1:]:
            if getattr(m, key) < 1:
                raise ValueError(f"{where}: multi_latent_attention needs {key} >= 1")
    elif any(getattr(m, key) for key in mla):
        raise ValueError(f"{where}: {', '.join(mla)} need multi_latent_attention")


def check_activation_clamp(m: TransformerModel) -> None:
    """`activation_func_clamp_value`: a number >= 0; when set, a gated MLP in routed experts
    only (every layer a MoE layer, no shared experts: where paraplan prices it)."""
    value, where = m.activation_func_clamp_value, f"model '{m.name}'"
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ValueError(f"{where}: activation_func_clamp_value must be a number >= 0, got {value!r}")
    if value and not (m.gated_mlp and m.is_moe and all(m.moe_layers) and not m.moe_shared_expert_intermediate_size):
        raise ValueError(f"{where}: activation_func_clamp_value {value} is priced in the routed experts' gated "
                         "activation only: it needs a gated MLP, every layer a MoE layer and no shared experts "
                         "(GPT-OSS)")


def window_keys(s: int, window: int, chunked: bool) -> float:
    """Keys per query a windowed layer scores, counted as the FLOP conventions count a
    full layer's s (masked pairs included): min(s, w) in a sliding window; with aligned
    chunks of w tokens (`chunked_attention`), the chunks' squares over s,
    (floor(s / w) w^2 + r^2) / s with r = s mod w (w when w divides s)."""
    if not chunked:
        return float(min(s, window))
    full, rest = divmod(s, window)
    return (full * window * window + rest * rest) / s


MOE_ONLY = ("moe_ffn_hidden_size", "moe_shared_expert_intermediate_size", "moe_router_num_groups",
            "moe_router_group_topk")
"""What only a mixture-of-experts model (num_experts > 0) may set."""


def check_group_limited_routing(m: TransformerModel) -> None:
    """`moe_router_num_groups` G and `moe_router_group_topk` g as Megatron-Core's
    `group_limited_topk` needs them: G divides the experts, g <= G divides top-k (each
    chosen group is scored by its best k / g experts), k / g <= E / G."""
    groups, chosen, k, experts = m.moe_router_num_groups, m.moe_router_group_topk, m.moe_router_topk, m.num_experts
    where = f"model '{m.name}'"
    if not groups:
        if chosen:
            raise ValueError(f"{where}: moe_router_group_topk {chosen} needs moe_router_num_groups (group-limited "
                             "routing), got none")
        return
    if not 1 <= chosen <= groups:
        got = chosen or "none"
        problem = (f"moe_router_group_topk (how many of the moe_router_num_groups {groups} groups each token's "
                   f"experts come from) must be in [1, {groups}], got {got}")
    elif experts % groups:
        problem = f"moe_router_num_groups {groups} does not divide num_experts {experts}"
    elif k % chosen:
        problem = f"moe_router_topk {k} is not divisible by moe_router_group_topk {chosen}"
    elif k // chosen > experts // groups:
        problem = (f"each of the moe_router_group_topk {chosen} chosen groups holds {experts // groups} experts "
                   f"(num_experts {experts} / moe_router_num_groups {groups}), fewer than moe_router_topk {k} / "
                   f"{chosen} = {k // chosen}")
    else:
        return
    raise ValueError(f"{where}: group-limited routing: {problem}")


def moe_layer_pattern(m: TransformerModel) -> tuple[bool, ...]:
    """Which layers are mixture-of-experts layers (`moe_layer_freq`)."""
    n = m.num_layers
    if not m.is_moe:
        return (False,) * n
    freq = m.moe_layer_freq
    if isinstance(freq, tuple):
        if len(freq) != n or any(v not in (0, 1) or isinstance(v, bool) for v in freq):
            raise ValueError(f"model '{m.name}': moe_layer_freq as a list needs one 0 or 1 per layer "
                             f"({n} entries), got {len(freq)} entries")
        return tuple(bool(v) for v in freq)
    if isinstance(freq, bool) or not isinstance(freq, int) or freq < 1:
        raise ValueError(f"model '{m.name}': moe_layer_freq must be an integer >= 1 or a list of 0/1 per layer, "
                         f"got {freq!r}")
    return tuple(i % freq == 0 for i in range(n))


def mlp_params(hidden: int, ffn: int, gated: bool, bias: bool) -> int:
    """An MLP h -> f (2f with a gate) -> h, with or without biases."""
    inner = 2 * ffn if gated else ffn
    return hidden * inner + ffn * hidden + ((inner + hidden) if bias else 0)


def attention_head_widths(m: TransformerModel) -> tuple[int, int]:
    """(query/key, value) width of one head."""
    if m.multi_latent_attention:
        return m.qk_head_dim + m.qk_pos_emb_head_dim, m.v_head_dim
    return m.kv_channels, m.kv_channels


def attention_params(m: TransformerModel, matmul_only: bool = False) -> int:
    """Parameters of one attention block; `matmul_only`: the projection weights
    alone. MLA (DeepSeek-V2 section 2.1): queries through a rank-q_lora latent (with
    its norm) or directly, keys and values through a shared rank-kv_lora latent
    (plus the rotary key part, shared by all heads), output from a v_head_dim x a."""
    h, a = m.hidden_size, m.num_attention_heads
    norms = 0 if matmul_only else 1
    if m.multi_latent_attention:
        qk = m.qk_head_dim + m.qk_pos_emb_head_dim
        direct = h * a * qk
        query = (h + a * qk + norms) * m.q_lora_rank if m.q_lora_rank else direct
        kv = h * (m.kv_lora_rank + m.qk_pos_emb_head_dim) + m.kv_lora_rank * a * (m.qk_head_dim + m.v_head_dim)
        kv += norms * m.kv_lora_rank
        out = a * m.v_head_dim * h + (h if m.add_bias_linear and not matmul_only else 0)
        return query + kv + out
    weights = h * m.qkv_size + m.attention_size * h
    if matmul_only:
        return weights
    qkv_bias = m.qkv_size if (m.add_bias_linear or m.add_qkv_bias) else 0
    out_bias = h if m.add_bias_linear else 0
    qk_norm = 2 * m.kv_channels if m.qk_layernorm else 0
    sinks = a if m.softmax_type == "learnable" else 0
    return weights + qkv_bias + out_bias + qk_norm + sinks

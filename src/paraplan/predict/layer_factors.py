"""Measured layer-time factors: what the analytic model misses for the layer shapes a
device was measured at.

The device model prices a GEMM from its shape with one smooth efficiency curve
(`device_model`), a collective from a fitted curve and the host from per-kernel
costs. Real libraries pick among many kernels per shape (tile sizes, split-K,
epilogues; NCCL's algorithms and protocols), so at a given shape a layer runs a few
percent to 20% off those curves, up or down, and not smoothly in the shape: on the shared A100 runs the
residual changes sign between micro-batch 2 and 4 at one hidden size and tensor
degree. Those irregularities are larger than the gaps between the best parallel
configurations, so no smooth curve ranks them reliably.

A factor scales the time of one transformer layer's passes (forward, recomputation,
backward: their kernels, tensor-parallel collectives and the host's time to issue
them, so the whole op whichever bounds it) for one *layer shape*: the device, dtype
and everything that sets a layer's kernels and collectives on one rank (widths,
heads, sequence length, micro-batch size, tensor-parallel degree and node span,
sequence parallelism, communication overlap, fused attention). It is a property of
the device and the shape, not of a model or a run: the same layer shape in a model
with more layers, another pipeline split or another data-parallel degree runs the
same kernels and collectives. `paraplan calibrate` fits one factor per shape with
enough measured runs (`predict.calibrate.fit_layer_factors`), after the device
model's parameters, which are fitted without factors; a shape with no factor (every
shape never measured, e.g. every large model on a cluster you only have datasheets
for) is priced by the analytic model alone, exactly as without a table.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from paraplan.core.errors import InputFileError
from paraplan.core.run_settings import RunSettings
from paraplan.core.transformer import TransformerModel

FACTOR_RANGE = (0.5, 2.0)
"""A measured layer is at most 2x faster or slower than the analytic model: beyond
that the model, not the kernel choice, is wrong (and the fit stops at the bound)."""


def layer_shape_key(model: TransformerModel, settings: RunSettings, device: str, tp_nodes: int = 1) -> str:
    """The layer shape a factor belongs to (see the module doc), as a stable string;
    `tp_nodes`: the nodes a tensor-parallel group spans."""
    t = settings.tensor_model_parallel_size
    parts = {
        "device": device,
        "dtype": settings.dtype,
        "hidden": model.hidden_size,
        "ffn": model.ffn_size,
        "heads": model.num_attention_heads,
        "groups": model.query_groups,
        "kv": model.kv_channels,
        "seq": model.seq_length,
        "mbs": settings.micro_batch_size,
        "tp": t,
        "tp_nodes": tp_nodes,
        "sp": int(settings.sequence_parallel and t > 1),
        "tp_overlap": int(settings.tp_comm_overlap and t > 1),
        "flash": int(settings.use_flash_attn),
        "swiglu": int(model.gated_mlp),
        "norm": model.normalization,
        "pos": model.position_embedding_type,
        "bias": int(model.add_bias_linear),
        "dropout": int(model.hidden_dropout > 0 or model.attention_dropout > 0),
    }
    if settings.context_parallel_size > 1:  # keys of runs without context parallelism stay as they were
        parts["cp"] = f"{settings.context_parallel_size}{settings.cp_comm_type}"
    if settings.recompute_granularity == "selective" and settings.recompute_modules != ("core_attn",):
        parts["recompute_modules"] = "+".join(settings.recompute_modules)
    if settings.elementwise_kernels != "fused" or settings.selective_ac_option:  # torchtitan's (absent otherwise)
        parts["torchtitan"] = f"{settings.elementwise_kernels}/{settings.selective_ac_option}"
    if model.multi_latent_attention:  # (absent otherwise, so the keys of earlier factors stay valid)
        parts["mla"] = "/".join(str(getattr(model, k)) for k in (
            "q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim"))
    if model.window_size:
        parts["window"] = f"{model.window_size}/{model.window_attn_skip_freq}" + (
            "chunked" if model.chunked_attention else "")  # a chunk's layer is not a sliding window's
    if model.is_moe:  # a factor measured on a dense layer of the same widths never scales experts
        parts["experts"] = (f"{model.num_experts}x{model.moe_ffn_size}top{model.moe_router_topk}"
                            f"shared{model.moe_shared_expert_intermediate_size}"
                            f"ep{settings.expert_model_parallel_size}etp{settings.expert_tensor_parallel}")
    return ",".join(f"{k}={v}" for k, v in parts.items())


@dataclass(frozen=True)
class LayerTimeFactors:
    """Factors by layer shape key, with the number of measured runs behind each."""

    keys: tuple[str, ...] = ()
    factors: tuple[float, ...] = ()
    runs: tuple[int, ...] = ()
    _by_key: dict[str, float] = field(init=False, repr=False, compare=False, default_factory=dict)

    def __post_init__(self) -> None:
        if not len(self.keys) == len(self.factors) == len(self.runs):
            raise ValueError("LayerTimeFactors: keys, factors and runs must have one entry each")
        lo, hi = FACTOR_RANGE
        for key, factor in zip(self.keys, self.factors, strict=True):
            if not lo <= factor <= hi:
                raise ValueError(f"LayerTimeFactors: factor {factor!r} of {key} outside [{lo}, {hi}]")
        if len(set(self.keys)) != len(self.keys):
            raise ValueError("LayerTimeFactors: a layer shape is listed twice")
        self._by_key.update(zip(self.keys, self.factors, strict=True))

    def factor(self, key: str) -> float:
        """The factor of a layer shape; 1 for a shape never measured."""
        return self._by_key.get(key, 1.0)

    def __len__(self) -> int:
        return len(self.keys)

    def to_list(self) -> list[dict]:
        return [{"shape": k, "factor": f, "runs": n} for k, f, n in zip(self.keys, self.factors, self.runs,
                                                                        strict=True)]

    @staticmethod
    def from_list(data: object, source: str, key_name: str = "layer_time_factors") -> LayerTimeFactors:
        """The `to_list` form read back; anything else is an `InputFileError` naming the entry."""
        if not isinstance(data, list):
            raise InputFileError(source, f"expected a list of {{shape, factor, runs}} objects, got {data!r}",
                                 field=key_name)
        keys, factors, runs = [], [], []
        lo, hi = FACTOR_RANGE
        for i, entry in enumerate(data):
            where = f"{key_name}[{i}]"
            if not isinstance(entry, dict) or set(entry) != {"shape", "factor", "runs"}:
                raise InputFileError(source, f"expected an object with keys shape, factor, runs, got {entry!r}",
                                     field=where)
            shape, factor, count = entry["shape"], entry["factor"], entry["runs"]
            if not isinstance(shape, str) or "=" not in shape:
                raise InputFileError(source, f"expected a layer shape key (name=value,...), got {shape!r}",
                                     field=f"{where}.shape")
            if shape in keys:
                raise InputFileError(source, f"layer shape listed twice: {shape}", field=f"{where}.shape")
            if isinstance(factor, bool) or not isinstance(factor, int | float) or not lo <= factor <= hi:
                raise InputFileError(source, f"expected a factor in [{lo}, {hi}], got {factor!r}",
                                     field=f"{where}.factor")
            if isinstance(count, bool) or not isinstance(count, int) or count < 1:
                raise InputFileError(source, f"expected a whole number of runs >= 1, got {count!r}",
                                     field=f"{where}.runs")
            keys.append(shape)
            factors.append(float(factor))
            runs.append(count)
        return LayerTimeFactors(tuple(keys), tuple(factors), tuple(runs))


NO_FACTORS = LayerTimeFactors()

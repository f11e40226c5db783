"""What a run stores in less than its dtype, in Megatron-LM's names (`RunSettings`
inherits them): the precision-aware optimizer (`--use-precision-aware-optimizer`,
`--main-grads-dtype`, `--main-params-dtype`, `--exp-avg-dtype`, `--exp-avg-sq-dtype`)
and the SwiGLU input kept in FP8 for the backward (`--activation-func-fp8-input-store`).
What the optimizer's stores and moves per parameter is
`paraplan.predict.optimizer_precision`, the activation's `paraplan.predict.ops` and
`moe_ops`; which combinations Megatron-LM refuses (megatron/training/arguments.py,
megatron/core/optimizer/optimizer_config.py, `get_megatron_optimizer` and
`TransformerConfig.__post_init__` at NVIDIA/Megatron-LM d98e8a64) is
`check_low_precision_storage`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from paraplan.core.errors import StrategyError

MainGradsDtype = Literal["fp32", "bf16"]
MainParamsDtype = Literal["fp32", "fp16"]
StateDtype = Literal["fp32", "fp16", "bf16", "fp8"]
MAIN_GRADS_DTYPES: tuple[str, ...] = ("fp32", "bf16")
"""Megatron-LM's `--main-grads-dtype` choices."""
MAIN_PARAMS_DTYPES: tuple[str, ...] = ("fp32", "fp16")
"""Megatron-LM's `--main-params-dtype` choices."""
STATE_DTYPES: tuple[str, ...] = ("fp32", "fp16", "bf16", "fp8")
"""Megatron-LM's `--exp-avg-dtype` / `--exp-avg-sq-dtype` choices (fp8: Transformer
Engine's E4M3 with one fp32 scale per tensor)."""
LOW_PRECISION_COLUMNS: tuple[str, ...] = (
    "use_precision_aware_optimizer", "main_grads_dtype", "main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype",
    "activation_func_fp8_input_store",
)
"""The run-table columns of `LowPrecisionStorageSettings`."""


@dataclass(frozen=True)
class LowPrecisionStorageSettings:
    """The low-precision storage columns of a run table, in Megatron-LM's names
    (module doc; docs/fp8.md, "Low-precision storage")."""

    use_precision_aware_optimizer: bool = False
    """Megatron-LM's `--use-precision-aware-optimizer`: Transformer Engine's FusedAdam
    holds the optimizer state in the dtypes below (only with use_distributed_optimizer).
    Unless an fp8 run uses a recipe other than `delayed` with fp32 main params, FusedAdam
    also holds the main params (for bf16 weights only the 16 bits an fp32 copy adds to
    them, Megatron-Core's `store_param_remainders`) and reads the gradient buffer in
    place (no fp32 copy of it)."""
    main_grads_dtype: MainGradsDtype = "fp32"
    """Megatron-LM's `--main-grads-dtype`: `bf16` accumulates, holds and reduces the
    main gradients in bf16 (as `grad_reduce_in_bf16`); needs the precision-aware optimizer."""
    main_params_dtype: MainParamsDtype = "fp32"
    """Megatron-LM's `--main-params-dtype`: `fp16` keeps the main params in fp16 with one
    fp32 scale per tensor; needs the precision-aware optimizer."""
    exp_avg_dtype: StateDtype = "fp32"
    """Megatron-LM's `--exp-avg-dtype`: Adam's first moment in fp32, fp16, bf16 or fp8;
    needs the precision-aware optimizer."""
    exp_avg_sq_dtype: StateDtype = "fp32"
    """Megatron-LM's `--exp-avg-sq-dtype`: Adam's second moment, as `exp_avg_dtype`."""
    activation_func_fp8_input_store: bool = False
    """Megatron-LM's `--activation-func-fp8-input-store` (SwiGLU models): the fused
    bias-SwiGLU keeps its input (fc1's output, 2 x ffn per token) for the backward as an
    FP8 E4M3 cast, 1 byte instead of 2, in the dense MLP, the routed and the shared
    experts. No effect where the activation is recomputed (`recompute_modules` mlp,
    moe_act, shared_experts, or full): Megatron's checkpoint then keeps the bf16 input."""


def check_low_precision_storage(settings: LowPrecisionStorageSettings, dtype: str, use_distributed_optimizer: bool,
                                zero_stage: int, fp8_recipe: str, swiglu: bool, fused_activation: bool) -> None:
    """Raise `StrategyError` for the combinations Megatron-LM refuses, and for those
    paraplan does not price (module doc). `swiglu`: the model's MLP is SwiGLU;
    `fused_activation`: Megatron's fused kernels run it (`elementwise_kernels fused`)."""
    s = settings
    if s.activation_func_fp8_input_store and not swiglu:
        raise StrategyError("activation_func_fp8_input_store needs a SwiGLU model (Megatron-LM: storing activation "
                            "input in FP8 is supported only for SwiGLU)")
    if s.activation_func_fp8_input_store and not fused_activation:
        raise StrategyError("activation_func_fp8_input_store needs elementwise_kernels fused (Megatron-LM's fused "
                            "bias-SwiGLU keeps the FP8 copy; eager PyTorch ops keep their bf16 input)")
    for key, choices in (("main_grads_dtype", MAIN_GRADS_DTYPES), ("main_params_dtype", MAIN_PARAMS_DTYPES),
                         ("exp_avg_dtype", STATE_DTYPES), ("exp_avg_sq_dtype", STATE_DTYPES)):
        value = getattr(s, key)
        if value not in choices:
            raise StrategyError(f"{key} '{value}' is not one of {', '.join(choices)}")
        if value != "fp32" and not s.use_precision_aware_optimizer:
            raise StrategyError(f"{key} {value} needs use_precision_aware_optimizer (Megatron-LM: {key} can only "
                                "be fp32 when not using precision-aware optimizer)")
    if not s.use_precision_aware_optimizer:
        return
    if not use_distributed_optimizer:
        raise StrategyError("use_precision_aware_optimizer needs use_distributed_optimizer (Megatron-LM: "
                            "--use-precision-aware-optimizer only supported with distributed optimizer)")
    if zero_stage:
        raise StrategyError(f"use_precision_aware_optimizer with zero_stage {zero_stage}: expected zero_stage 0 "
                            "(Megatron-Bridge turns it off under FSDP; Megatron-FSDP has its own main-param and "
                            "main-grad dtypes, not modelled)")
    if fp8_recipe == "torchao_tensorwise":
        raise StrategyError("use_precision_aware_optimizer with fp8_recipe torchao_tensorwise: the precision-aware "
                            "optimizer is Megatron-LM's (Transformer Engine's FusedAdam), not torchtitan's")
    if dtype == "fp32":
        raise StrategyError("use_precision_aware_optimizer with dtype fp32: expected bf16, fp16 or fp8 (fp32 "
                            "weights are their own main params; FusedAdam would keep a second, unused copy)")
    if s.main_grads_dtype == "bf16" and dtype not in ("bf16", "fp8"):
        raise StrategyError(f"main_grads_dtype bf16 with dtype {dtype}: expected dtype bf16 or fp8 (Megatron-LM "
                            f"keeps the gradients of {dtype} weights in {dtype})")

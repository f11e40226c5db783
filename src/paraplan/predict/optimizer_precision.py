"""Bytes per parameter of Megatron-LM's precision-aware optimizer
(`paraplan.core.precision_settings`): what the distributed optimizer's shard holds and
what one step moves, read from Megatron-LM (d98e8a64: `get_megatron_optimizer`,
`DistributedOptimizer`, `OptimizerConfig`) and Transformer Engine (d0067d0d:
`te.optimizers.FusedAdam`).

Who holds the main params. Megatron-Core hands them to FusedAdam (`master_weights`,
`use_decoupled_grad`) unless the run is fp8 with a recipe other than `delayed` and fp32
main params (`use_precision_aware_optimizer_no_fp8_or_ds_fp8` false): then it keeps its
own fp32 shard, casts the gradient shard to fp32 when it is bf16, and FusedAdam holds the
two moments only.

- FusedAdam's main params: fp32 ones for bf16 weights are stored as the 16 bits the bf16
  weight lacks (`store_param_remainders`, Megatron-Core's default since TE 2.1): 2 bytes;
  fp32 ones for fp16 weights 4; `main_params_dtype fp16` 2. The gradient is the buffer's
  shard, read in place (`decoupled_grad`): no copy.
- Moments: 4 (fp32), 2 (fp16, bf16), 1 (fp8) bytes each.

A step's memory traffic per sharded parameter, in the manner of `Precision.of`: the
gradient read by the kernel, by the norm and by the zeroing (fp16 also its overflow
check); the main params read and written (FusedAdam's remainder kernel reads and writes
the bf16 weight and its remainder, 8 bytes); each moment read and written. FusedAdam
fuses bf16 moments into its kernel only when both are bf16 (`fuse_unscale`); any other
non-fp32 state is unscaled into an fp32 temporary before the kernel and scaled back
after (`get_unscaled_state`, `_apply_scale`): fp16 `.float()` and `mul_` (14 bytes),
`aminmax`, `mul_` and the copy back (18); fp8 dequantise (5), `aminmax` and quantise
(9); bf16 `.float()` (6), `.bfloat16()` and the copy back (10); each plus the kernel's
fp32 read and write (8).

Not priced: those per-tensor scaling kernels' launches (only their bytes), and the fp32
temporaries they allocate during the step (4 bytes per sharded parameter per scaled
state, alive while no activations are held).
"""

from __future__ import annotations

from paraplan.core.precision_settings import LowPrecisionStorageSettings

STATE_BYTES: dict[str, int] = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1}
"""Bytes of one stored moment or main param per dtype."""
SCALED_STATE_STEP_BYTES: dict[str, int] = {"fp16": 14 + 8 + 18, "fp8": 5 + 8 + 9, "bf16": 6 + 8 + 10}
"""A state FusedAdam unscales into fp32 and scales back: its traffic per step (module doc)."""
PARAM_REMAINDER_BYTES = 2
"""The low 16 bits of an fp32 main param kept beside its bf16 weight."""
PARAM_REMAINDER_STEP_BYTES = 2 * (2 + PARAM_REMAINDER_BYTES)
"""FusedAdam's remainder kernel reads and writes the bf16 weight and its remainder."""


def te_holds_main_params(settings: LowPrecisionStorageSettings, dtype: str, fp8_recipe: str) -> bool:
    """FusedAdam holds the main params and reads the gradients in place (Megatron-Core's
    `use_precision_aware_optimizer_no_fp8_or_ds_fp8`, with the recipe resolved)."""
    return (settings.use_precision_aware_optimizer
            and (settings.main_params_dtype != "fp32" or dtype != "fp8" or fp8_recipe == "delayed"))


def _moment_step_bytes(dtype: str, fused_bf16: bool) -> int:
    if dtype == "fp32":
        return 2 * 4
    if dtype == "bf16" and fused_bf16:
        return 2 * 2
    return SCALED_STATE_STEP_BYTES[dtype]


def precision_aware_bytes(settings: LowPrecisionStorageSettings, dtype: str, fp8_recipe: str,
                          grad_bytes: int) -> tuple[int, int]:
    """(optimizer state bytes, optimizer step bytes) per sharded parameter of a
    precision-aware run whose gradient buffer holds `grad_bytes` per parameter (module
    doc); `fp8_recipe` resolved (Megatron's default for an empty one); dtype bf16, fp16 or
    fp8 (`check_optimizer_precision` refuses fp32)."""
    s = settings
    fused = s.exp_avg_dtype == s.exp_avg_sq_dtype == "bf16"
    moments = STATE_BYTES[s.exp_avg_dtype] + STATE_BYTES[s.exp_avg_sq_dtype]
    moment_step = _moment_step_bytes(s.exp_avg_dtype, fused) + _moment_step_bytes(s.exp_avg_sq_dtype, fused)
    weight_write = 2  # the 16-bit weights updated from the main params
    overflow_check = grad_bytes if dtype == "fp16" else 0
    if not te_holds_main_params(s, dtype, fp8_recipe):  # Megatron-Core's fp32 shard, gradients cast to fp32
        copy = 4 if grad_bytes < 4 else 0
        state = 4 + copy + moments
        grads_step = (grad_bytes + 4 if copy else 0) + 4 + 4 + grad_bytes
        main_read = 4  # its copy to the model weights reads the fp32 shard (`shard_model_param.data.copy_`)
        return state, grads_step + 2 * 4 + main_read + weight_write + moment_step + overflow_check
    if s.main_params_dtype == "fp16":
        main, main_step = STATE_BYTES["fp16"], SCALED_STATE_STEP_BYTES["fp16"] + weight_write
    elif dtype in ("bf16", "fp8"):  # bf16 weights: the remainder
        main, main_step = PARAM_REMAINDER_BYTES, PARAM_REMAINDER_STEP_BYTES
    else:  # fp16 weights: a whole fp32 copy
        main, main_step = 4, 2 * 4 + weight_write
    return main + moments, 3 * grad_bytes + main_step + moment_step + overflow_check

"""FP8 training as Megatron-LM runs it with Transformer Engine (`--fp8-format`,
`--fp8-recipe`): which GEMMs run in FP8, what they cost, the scaling kernels around
them and the FP8 weight copies each rank keeps (docs/fp8.md says why each rule holds).

- **Which GEMMs.** The linear layers' GEMMs (QKV, output projection, MLP fc1/fc2,
  multi-latent attention's projections, the routed and shared experts, the MTP
  projection): forward, input gradient and weight gradient. The attention core (flash
  or unfused), the embedding, the LM head (Megatron's output layer is not a Transformer
  Engine module), the MoE router, the norms and the softmax stay in 16 bits
  (`paraplan.predict.ops`: `FP8_GEMM` kernels, the others `GEMM` with 2-byte operands).
- **Their speed.** An FP8 GEMM is priced as a BF16 one (the same wave and k-loop
  factors) against the device's FP8 dense peak, at the FP8 GEMM ceiling measured by
  kernel micro-benchmarks (`config/kernels/<device>.json`, its `fp8` section,
  `paraplan fit --kind kernels`), never the datasheet alone. Everything else runs at
  the BF16 peak with the calibration's efficiencies.
- **Scaling kernels** (memory-bound, `quantise_bytes_per_element`): each FP8 GEMM
  operand is cast from BF16 into FP8 in both orientations (Hopper's FP8 tensor cores
  take only the TN layout, so the backward needs transposed copies; MXFP8 on Blackwell
  needs a row-wise and a column-wise copy because its scales run along one direction):
  the forward casts the input and the backward the output gradient of every linear
  layer, once per micro-batch; the weights are cast once per iteration (Transformer
  Engine caches them over the micro-batches) and that work is spread over the
  micro-batches' forwards. Per recipe: `delayed` takes the scale from the amax history
  and fuses the amax into the cast (one kernel); `tensorwise` (current scaling) first
  reduces the tensor's amax (one more read, one more kernel); `blockwise` (1 x 128
  activation and gradient tiles, 128 x 128 weight blocks, DeepSeek-V3's) and `mxfp8`
  (1 x 32 blocks, E8M0 scales) compute each block's scale inside the cast kernel and
  write the scales beside the data. Launches (each a kernel latency on the device;
  `QuantiseCost.launches`): a grouped GEMM's input arrives as one tensor split by expert,
  and Transformer Engine's `split_quantize` (GroupedLinear, `csrc/extensions/cast.cpp`,
  v2.9) fuses the splits into one launch only for `delayed` (`nvte_multi_cast_transpose`);
  every other recipe quantises each split alone, `tensorwise` with three launches per
  split (`Float8CurrentScalingQuantizer::quantize_impl`: amax, scale from amax, cast), so
  128 experts over EP 8 cost 48 launches per cast where a dense layer's costs 3.
- **Memory**: each rank keeps its linear weights in FP8 twice (row-wise and transposed
  or column-wise), with the recipe's scales, beside the BF16 weights
  (`weight_copy_bytes_per_element`).

`fp8_recipe torchao_tensorwise` (torchao's Float8Linear as torchtitan runs it) has its
own casts and memory (`paraplan.predict.torchao_fp8`); the GEMMs and their ceiling are
the same.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np

from paraplan.core.cluster import Device
from paraplan.core.errors import StrategyError
from paraplan.core.run_settings import DEFAULT_FP8_RECIPE, FP8_RECIPES, RunSettings
from paraplan.predict import torchao_fp8
from paraplan.predict.device_model import DeviceSpeed, Fp8GemmCeiling
from paraplan.predict.ops import FP8_GEMM, MEMORY, Kernels, PassWork

BF16_BYTES = 2
FP8_BYTES = 1
FP32_SCALE_BYTES = 4  # a blockwise scale (fp32)
E8M0_SCALE_BYTES = 1  # an MXFP8 scale (a power of two)
ACTIVATION_BLOCK = 128  # blockwise: 1 x 128 tiles of activations and gradients (per orientation)
WEIGHT_BLOCK = 128 * 128  # blockwise: 128 x 128 blocks of weights (one scale serves both orientations)
MX_BLOCK = 32  # mxfp8: 32 consecutive elements share a scale (per orientation)
MXFP8_PEAK_NAME = "mxfp8"
"""The `peak_tflops_by_dtype` key a cluster file lists for a device with MXFP8 tensor
cores (Blackwell); without it `fp8_recipe mxfp8` is refused."""


@dataclass(frozen=True)
class QuantiseCost:
    """One BF16 tensor's cast into FP8 (both orientations): bytes per element, kernels
    (memory passes, each one host issue), and the device launches per split of a tensor
    cut into splits (`fused_splits`: all splits in one launch)."""

    bytes_per_element: float
    kernels: int
    launches_per_split: int = 1
    fused_splits: bool = False

    def launches(self, splits: np.ndarray) -> np.ndarray:
        """Device launches of one cast of a tensor in `splits` splits (a grouped GEMM's
        experts; 1 for a dense linear layer)."""
        s = np.asarray(splits, dtype=float)
        return np.full(s.shape, float(self.launches_per_split)) if self.fused_splits else self.launches_per_split * s


def quantise_cost(recipe: str, weight: bool = False) -> QuantiseCost:
    """The cast of one BF16 tensor into FP8 in both orientations (module doc): read 2
    bytes, write 1 + 1, plus the recipe's amax pass or scales. `weight`: a weight
    tensor (blockwise: 128 x 128 blocks instead of 1 x 128 tiles)."""
    base = BF16_BYTES + 2 * FP8_BYTES
    if recipe == "delayed":
        return QuantiseCost(base, 1, fused_splits=True)
    if recipe == "tensorwise":  # the amax reduction reads the tensor first; amax, scale, cast launches
        return QuantiseCost(base + BF16_BYTES, 2, launches_per_split=3)
    if recipe == "blockwise":
        scales = FP32_SCALE_BYTES / WEIGHT_BLOCK if weight else 2 * FP32_SCALE_BYTES / ACTIVATION_BLOCK
        return QuantiseCost(base + scales, 1)
    if recipe == "mxfp8":
        return QuantiseCost(base + 2 * E8M0_SCALE_BYTES / MX_BLOCK, 1)
    raise StrategyError(f"fp8_recipe '{recipe}' is not one of {', '.join(FP8_RECIPES)}")


def weight_copy_bytes_per_element(recipe: str) -> float:
    """FP8 copies of one linear weight element kept on its rank: row-wise and
    transposed (or column-wise) data, plus the recipe's scales (module doc)."""
    data = 2 * FP8_BYTES
    if recipe == "blockwise":
        return data + FP32_SCALE_BYTES / WEIGHT_BLOCK
    if recipe == "mxfp8":
        return data + 2 * E8M0_SCALE_BYTES / MX_BLOCK
    quantise_cost(recipe)  # an unknown recipe is an error here too
    return float(data)


def fp8_recipe(settings: RunSettings) -> str:
    """The run's recipe: its `fp8_recipe`, or Megatron-LM's default (`DEFAULT_FP8_RECIPE`)."""
    return settings.fp8_recipe or DEFAULT_FP8_RECIPE


def pass_role(name: str) -> str:
    """`forward`, `recompute` or `backward` from a pass name of `paraplan.predict.pass_times`
    (`layer_fwd`, `moe_layer_recompute`, `head_bwd`, ...)."""
    if name.endswith("_bwd"):
        return "backward"
    if name.endswith("_recompute"):
        return "recompute"
    if name.endswith("_fwd"):
        return "forward"
    raise ValueError(f"pass name '{name}' ends in none of _fwd, _recompute, _bwd")


def scaling_bytes(kernels: Kernels, role: str, recipe: str, microbatches: int) -> tuple[float, int]:
    """Bytes and kernel count of the casts that feed the FP8 GEMMs of one pass (module
    doc): a forward casts each GEMM's input (m x k, `batch` times) and 1 / microbatches
    of its weight (k x n); a recomputed forward the inputs only; a backward the output
    gradient of each input-gradient GEMM (m x k); weight-gradient GEMMs reuse those."""
    fp8 = kernels.kind == FP8_GEMM
    if not fp8.any():
        return 0.0, 0
    m, n, k, batch = kernels.m[fp8], kernels.n[fp8], kernels.k[fp8], kernels.batch[fp8]
    weight_grad = kernels.weight_grad[fp8]
    act = quantise_cost(recipe)
    if role == "backward":
        elements = float((m * k * batch)[~weight_grad].sum())
        return elements * act.bytes_per_element, int((~weight_grad).sum()) * act.kernels
    inputs = float((m * k * batch).sum())
    nbytes, count = inputs * act.bytes_per_element, int(fp8.sum()) * act.kernels
    if role == "forward":
        weights = quantise_cost(recipe, weight=True)
        nbytes += float((k * n * batch).sum()) * weights.bytes_per_element / microbatches
    return nbytes, count


def scaling_launches(kernels: Kernels, role: str, recipe: str, microbatches: int) -> float:
    """Device launches of the casts `scaling_bytes` counts (`QuantiseCost.launches`): a
    grouped GEMM's operand is `batch` splits (one per local expert), its weights `batch`
    tensors cast once per iteration (1 / microbatches of them per forward)."""
    fp8 = kernels.kind == FP8_GEMM
    if not fp8.any():
        return 0.0
    batch, weight_grad = kernels.batch[fp8], kernels.weight_grad[fp8]
    act = quantise_cost(recipe)
    if role == "backward":
        return float(act.launches(batch[~weight_grad]).sum())
    launches = float(act.launches(batch).sum())
    if role == "forward":  # each weight its own tensor: never fused across experts
        launches += float((act.launches_per_split * batch).sum()) / microbatches
    return launches


def with_scaling(work: PassWork, role: str, recipe: str, microbatches: int) -> PassWork:
    """`work` with its scaling kernels appended (after its own, so the kernel indices its
    collectives run beside are unchanged); the bytes and the device launches
    (`scaling_launches`, `Kernels.launches`) are spread evenly over as many
    kernels as the casts take."""
    nbytes, count = scaling_bytes(work.kernels, role, recipe, microbatches)
    if count == 0:
        return work
    launches = scaling_launches(work.kernels, role, recipe, microbatches)
    k = work.kernels
    added = {"kind": np.full(count, MEMORY, dtype=np.int8), "flops": np.zeros(count),
             "bytes": np.full(count, nbytes / count), "m": np.zeros(count), "n": np.zeros(count),
             "k": np.zeros(count), "batch": np.ones(count), "weight_grad": np.zeros(count, dtype=bool),
             "launches": np.full(count, launches / count)}
    merged = Kernels(*(np.concatenate([getattr(k, name), column]) for name, column in added.items()))
    return replace(work, kernels=merged)


def scaled_passes(works: Sequence[PassWork], names: Sequence[str], settings: RunSettings) -> list[PassWork]:
    """Every pass of a run with its FP8 scaling kernels (unchanged unless dtype fp8)."""
    if settings.dtype != "fp8":
        return list(works)
    if torchao_fp8.is_torchao(settings):  # torchao's Float8Linear (torchtitan)
        return torchao_fp8.scaled_passes(works, names, settings)
    recipe = fp8_recipe(settings)
    return [with_scaling(w, pass_role(name), recipe, settings.num_microbatches)
            for w, name in zip(works, names, strict=True)]


def fp8_weight_elements(forward: PassWork) -> float:
    """Linear weight elements on one rank that a forward pass multiplies in FP8
    (k x n per GEMM, `batch` experts each)."""
    k = forward.kernels
    fp8 = k.kind == FP8_GEMM
    return float((k.k[fp8] * k.n[fp8] * k.batch[fp8]).sum())


def weight_copy_bytes(forward: PassWork, settings: RunSettings) -> float:
    """Bytes of the FP8 weight copies one forward pass's linear layers keep on a rank
    (0 unless dtype fp8)."""
    if settings.dtype != "fp8":
        return 0.0
    return fp8_weight_elements(forward) * weight_copy_bytes_per_element(fp8_recipe(settings))


def device_speed(device: Device, settings: RunSettings) -> DeviceSpeed:
    """The device numbers a run is priced with: the dtype's datasheet peak, and for
    dtype fp8 the BF16 peak (attention, head, everything outside the FP8 GEMMs) with
    the device's measured FP8 GEMM ceiling (`fp8_gemm_ceiling`)."""
    if settings.dtype != "fp8":
        return DeviceSpeed.of(device, settings.dtype)
    fp8_peak = DeviceSpeed.of(device, "fp8").peak_flops  # refuses a device without FP8 tensor cores
    recipe = fp8_recipe(settings)
    if recipe == "mxfp8" and MXFP8_PEAK_NAME not in dict(device.peak_flops_by_dtype):
        raise StrategyError(f"fp8_recipe mxfp8 needs MXFP8 tensor cores (Blackwell): device {device.name} lists no "
                            f"{MXFP8_PEAK_NAME} peak in its cluster file; use delayed, tensorwise or blockwise")
    ceiling = fp8_gemm_ceiling(device.compute_name)
    return replace(DeviceSpeed.of(device, "bf16"), fp8_gemm=replace(ceiling, peak_flops=fp8_peak))


@lru_cache(maxsize=16)
def fp8_gemm_ceiling(device_name: str) -> Fp8GemmCeiling:
    """The FP8 GEMM ceiling of `config/kernels/<device>.json` (its `fp8` section);
    a clear error when the device has no such measurement."""
    from paraplan.kernels.ceilings import fp8_ceiling

    found = fp8_ceiling(device_name)
    if found is None:
        raise StrategyError(
            f"dtype fp8: no measured FP8 GEMM ceiling for device {device_name} (config/kernels/{device_name}.json has "
            "no fp8 section; fit one from FP8 GEMM micro-benchmarks with `paraplan fit --kind kernels`, docs/fp8.md)")
    return found


def stage_weight_copy_bytes(layer_forward: PassWork, moe_forward: PassWork | None, head_forward: PassWork,
                            dense_layers: np.ndarray, moe_layers: np.ndarray, settings: RunSettings) -> np.ndarray:
    """Per pipeline stage: bytes of the FP8 weight copies on one rank (its dense and MoE
    layers, and on the last stage the head's FP8 layers: the multi-token-prediction
    ones); sharded over the d x c ranks like the weights under ZeRO-3. Zeros unless dtype fp8."""
    stages = dense_layers.shape[0]
    if settings.dtype != "fp8":
        return np.zeros(stages)
    if torchao_fp8.is_torchao(settings):  # no persistent copies: the computing layer's transient ones
        return np.where(dense_layers > 0, torchao_fp8.working_weight_bytes(layer_forward, settings), 0.0)
    out = dense_layers * weight_copy_bytes(layer_forward, settings)
    if moe_forward is not None:
        out = out + moe_layers * weight_copy_bytes(moe_forward, settings)
    out[stages - 1] += weight_copy_bytes(head_forward, settings)
    if settings.zero_stage == 3:
        out = out / settings.data_context_parallel_size
    return out

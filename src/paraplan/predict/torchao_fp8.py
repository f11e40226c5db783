"""torchao's Float8 training as torchtitan runs it (`fp8_recipe torchao_tensorwise`):
torchtitan 9dec370 (`torchtitan/float8.py`) with torchao eab345c (`torchao/float8/`:
`float8_linear.py`, `float8_scaling_utils.py`, `float8_utils.py`, `fsdp_utils.py`,
`config.py`), December 2024. docs/fp8.md says why each rule holds.

- **Which GEMMs.** Every `nn.Linear` of the transformer blocks becomes a `Float8Linear`
  (torchtitan's filter leaves out only `output`, the LM head); the three GEMMs of each
  (output, input gradient, weight gradient) run in FP8 with torchao's default
  `Float8LinearConfig`: e4m3 inputs and weights, e5m2 output gradients, one dynamic
  scale per tensor. The attention core, embedding, head, norms stay bf16. Each is an
  `FP8_GEMM` of `paraplan.predict.ops`, priced at the device's measured FP8 ceiling
  (`fp8_ops.device_speed`); torchao runs the two backward GEMMs without cuBLAS's fast
  accumulation (`gemm_config_grad_input/grad_weight`), which no micro-benchmark in
  `data/` measures apart, so all three share the one ceiling.
- **Casts** (memory-bound kernels appended to each pass, as torch.compile runs them:
  `elementwise_kernels fused`): a dynamic scale reads the bf16 tensor once for
  max(abs(x)) (one reduction kernel, `AMAX_BYTES`), then one kernel reads it again and
  writes FP8 (`CAST_BYTES`). Forward: each GEMM input (m x k) and, unless the weights
  were all-gathered in FP8, each gathered weight (k x n). Backward: each output
  gradient (m x n) with its amax, written in both orientations by one kernel (the input
  gradient takes it row-major, the weight gradient transposed), and a transposed FP8
  copy (`TRANSPOSE_BYTES`) of each input (weight gradient's operand) and weight (input
  gradient's operand: `torch._scaled_mm` needs its second operand column-major).
  Recomputation: full recomputation re-runs the forward's amaxes and casts; torchtitan's
  per-op policy (`selective_ac_option op`) keeps the amaxes (`aten.abs`/`aten.max` are
  in its save list) and recomputes every cast, of all the layer's linears.
- **Float8 all-gather** (`enable_fsdp_float8_all_gather`): FSDP's pre-all-gather hook
  casts each fp32 weight shard (1 / S of the weight) to FP8 in eager PyTorch
  (`SHARD_CAST_BYTES`: multiply, clamp, convert), then FSDP gathers 1 byte per weight
  (the scale travels as metadata). With `precompute_float8_dynamic_scale_for_fsdp` the
  scales come from one `_foreach_norm` over the fp32 shards and one all-reduce of all
  amaxes per iteration; without it each shard's amax (abs, max, `SHARD_AMAX_BYTES`) and
  one all-reduce of one float per weight precede each all-gather.
- **Tensor parallelism** (torchtitan's `apply_tp` with Float8: torchao's
  `Float8ColwiseParallel`, `Float8RowwiseParallel`, `PrepareFloat8ModuleInput`, with
  sequence parallelism): the sequence-parallel inputs are cast on the rank's 1 / t of
  the sequence, then all-gathered in FP8; the row-parallel layers' output gradients
  likewise in the backward, then transposed by a copy; every tensor-parallel
  all-gather of the layer moves 1 byte per element; each cast waits for an all-reduce
  of its amax over the group; the reduce-scatters stay bf16.
- **Memory**: no persistent FP8 copies (the casts are transient); a gathered layer
  holds its weights in FP8 under the float8 all-gather (`fsdp_ops`), and the layer
  being computed holds one transposed FP8 copy of its weights (with the float8
  all-gather) or its FP8 cast and that copy (without).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from paraplan.core.comm import CommModel, Group
from paraplan.core.run_settings import TORCHAO_FP8_RECIPE, RunSettings
from paraplan.core.sharding import gathers_once_per_iteration, reshards_after_forward, sharding_group_size
from paraplan.core.transformer import TransformerModel
from paraplan.predict.ops import FP8_GEMM, MEMORY, Kernels, PassWork
from paraplan.predict.work import NOT_HIDDEN, Collective

BF16_BYTES = 2
FP8_BYTES = 1
FP32_BYTES = 4
AMAX_BYTES = BF16_BYTES  # max(abs(x)) of a bf16 tensor: one read (one reduction kernel under torch.compile)
CAST_BYTES = BF16_BYTES + FP8_BYTES  # x * scale, clamp, to float8: one fused kernel
GRAD_CAST_BYTES = BF16_BYTES + 2 * FP8_BYTES  # an output gradient written row-major and transposed
TRANSPOSE_BYTES = 2 * FP8_BYTES  # a transposed FP8 copy: read 1, write 1
SHARD_CAST_BYTES = 2 * FP32_BYTES + 2 * FP32_BYTES + FP32_BYTES + FP8_BYTES
"""An fp32 weight shard cast in eager PyTorch before FSDP's all-gather: `x * scale`
(read 4, write 4), clamp (read 4, write 4), `.to(float8)` (read 4, write 1) = 21."""
SHARD_CAST_KERNELS = 3
SHARD_AMAX_BYTES = 2 * FP32_BYTES + FP32_BYTES
"""Without precomputed scales: `abs` (read 4, write 4) and `max` (read 4) of the shard."""
SHARD_AMAX_KERNELS = 2 + 4  # abs, max, then amax_to_scale's float64 cast, clamp, divide, float32 cast
AMAX_BYTES_EACH = FP32_BYTES  # one amax (float32) per weight in the scale all-reduces


def is_torchao(settings: RunSettings) -> bool:
    return settings.dtype == "fp8" and settings.fp8_recipe == TORCHAO_FP8_RECIPE


@dataclass(frozen=True)
class LinearElements:
    """Per layer, one rank, summed over the FP8 GEMMs of its forward (paraplan's kernel
    list: QKV, projection, fc1, fc2): inputs (m x k), output gradients (m x n), weights
    (k x n, gathered), how many GEMMs; with sequence parallelism, of those the inputs
    all-gathered along the sequence (QKV's, fc1's: the forward's tensor-parallel
    all-gathers) and the outputs reduce-scattered along it (the projection's, fc2's:
    its reduce-scatters), and the tensor-parallel size t."""

    inputs: float
    outputs: float
    weights: float
    gemms: int
    gathered_inputs: float = 0.0
    scattered_outputs: float = 0.0
    tp: int = 1

    @staticmethod
    def of(forward: PassWork, tp: int = 1) -> LinearElements:
        k = forward.kernels
        fp8 = k.kind == FP8_GEMM
        m, n, kk, batch = k.m[fp8], k.n[fp8], k.k[fp8], k.batch[fp8]

        def sequence(collective: str) -> float:
            return sum(c.nbytes for c in forward.collectives
                       if c.group == "tp" and c.collective == collective) / BF16_BYTES

        return LinearElements(float((m * kk * batch).sum()), float((m * n * batch).sum()),
                              float((kk * n * batch).sum()), int(fp8.sum()), sequence("all_gather"),
                              sequence("reduce_scatter"), tp)

    @property
    def cast_inputs(self) -> float:
        """Input elements a rank casts: a sequence-parallel input on its 1 / t of the
        sequence, before the (FP8) all-gather (torchao's PrepareFloat8ModuleInput)."""
        return self.inputs - self.gathered_inputs + self.gathered_inputs / self.tp


@dataclass(frozen=True)
class CastWork:
    """Memory-bound work appended to one pass: bytes read + written, kernels, and the
    tensor-parallel all-reduces of one amax each (a cast of a tensor split over the
    tensor-parallel ranks takes the group's max)."""

    nbytes: float
    kernels: int
    amax_reduces: int = 0

    def __add__(self, other: CastWork) -> CastWork:
        return CastWork(self.nbytes + other.nbytes, self.kernels + other.kernels,
                        self.amax_reduces + other.amax_reduces)


NONE = CastWork(0.0, 0)


def _tp(lin: LinearElements, casts: int) -> int:
    return casts if lin.tp > 1 else 0


def shard_cast(lin: LinearElements, settings: RunSettings) -> CastWork:
    """One all-gather's pre-gather casts of a layer's fp32 weight shards (1 / S each),
    with each shard's amax unless the scales were precomputed."""
    shard = lin.weights / sharding_group_size(settings)
    work = CastWork(SHARD_CAST_BYTES * shard, SHARD_CAST_KERNELS * lin.gemms)
    if not settings.precompute_float8_dynamic_scale_for_fsdp:
        work += CastWork(SHARD_AMAX_BYTES * shard, SHARD_AMAX_KERNELS * lin.gemms)
    return work


def forward_casts(lin: LinearElements, settings: RunSettings) -> CastWork:
    """A forward: each input's amax and cast; each gathered weight's amax and cast, or
    under the float8 all-gather its shards' pre-gather casts (once per iteration where
    the weights are gathered once) and the precomputed scales' `_foreach_norm` (one
    read of the fp32 shards per iteration, spread over the micro-batches)."""
    work = CastWork((AMAX_BYTES + CAST_BYTES) * lin.cast_inputs, 2 * lin.gemms, _tp(lin, lin.gemms))
    if not settings.enable_fsdp_float8_all_gather:
        return work + CastWork((AMAX_BYTES + CAST_BYTES) * lin.weights, 2 * lin.gemms, _tp(lin, lin.gemms))
    m = settings.num_microbatches
    gather = shard_cast(lin, settings)
    if gathers_once_per_iteration(settings):
        gather = CastWork(gather.nbytes / m, gather.kernels)
    work += gather
    if settings.precompute_float8_dynamic_scale_for_fsdp:
        work += CastWork(FP32_BYTES * lin.weights / sharding_group_size(settings) / m, 1)
    return work


def recompute_casts(lin: LinearElements, settings: RunSettings) -> CastWork:
    """A recomputed forward: full recomputation re-runs the forward's casts (its weights
    were gathered for the backward: their shard casts are the backward's); the per-op
    policy keeps the amaxes and recasts every input (and gathered bf16 weight)."""
    if settings.recompute_granularity == "full":
        work = CastWork((AMAX_BYTES + CAST_BYTES) * lin.cast_inputs, 2 * lin.gemms, _tp(lin, lin.gemms))
        if not settings.enable_fsdp_float8_all_gather:
            work += CastWork((AMAX_BYTES + CAST_BYTES) * lin.weights, 2 * lin.gemms, _tp(lin, lin.gemms))
        return work
    if settings.selective_ac_option == "op":
        work = CastWork(CAST_BYTES * lin.inputs, lin.gemms)
        if not settings.enable_fsdp_float8_all_gather:
            work += CastWork(CAST_BYTES * lin.weights, lin.gemms)
        return work
    return NONE


def backward_casts(lin: LinearElements, settings: RunSettings) -> CastWork:
    """A backward: each output gradient's amax and two-orientation cast, the transposed
    copies of each input and weight, and under the float8 all-gather the shard casts of
    the backward's gather (when the forward resharded). With sequence parallelism a
    reduce-scattered output's gradient is cast on its 1 / t of the sequence before its
    (FP8) all-gather, and the gathered gradient is transposed by a copy."""
    scattered, local = lin.scattered_outputs, lin.outputs - lin.scattered_outputs
    work = CastWork((AMAX_BYTES + GRAD_CAST_BYTES) * local + (AMAX_BYTES + CAST_BYTES) * scattered / lin.tp
                    + TRANSPOSE_BYTES * scattered, 2 * lin.gemms + (2 if scattered else 0), _tp(lin, lin.gemms))
    work += CastWork(TRANSPOSE_BYTES * (lin.inputs + lin.weights), 2 * lin.gemms)
    if settings.enable_fsdp_float8_all_gather and reshards_after_forward(settings) \
            and not gathers_once_per_iteration(settings):
        work += shard_cast(lin, settings)
    return work


def pass_casts(role: str, lin: LinearElements, settings: RunSettings) -> CastWork:
    if role == "forward":
        return forward_casts(lin, settings)
    if role == "recompute":
        return recompute_casts(lin, settings)
    return backward_casts(lin, settings)


def with_casts(work: PassWork, cast: CastWork) -> PassWork:
    """`work` with the casts appended as `cast.kernels` memory-bound kernels sharing its
    bytes evenly (after its own, so its collectives' kernel indices hold), its
    tensor-parallel all-gathers in FP8 (1 byte: torchao's Float8ColwiseParallel and
    PrepareFloat8ModuleInput gather FP8 inputs, Float8RowwiseParallel's backward FP8
    output gradients) and the amax all-reduces, which the casts wait for."""
    if cast.kernels == 0:
        return work
    collectives = tuple(replace(c, nbytes=c.nbytes * FP8_BYTES / BF16_BYTES)
                        if c.group == "tp" and c.collective == "all_gather" else c for c in work.collectives)
    collectives += (Collective("all_reduce", AMAX_BYTES_EACH, NOT_HIDDEN, "tp"),) * cast.amax_reduces
    work = replace(work, collectives=collectives)
    count, k = cast.kernels, work.kernels
    added = {"kind": np.full(count, MEMORY, dtype=np.int8), "flops": np.zeros(count),
             "bytes": np.full(count, cast.nbytes / count), "m": np.zeros(count), "n": np.zeros(count),
             "k": np.zeros(count), "batch": np.ones(count), "weight_grad": np.zeros(count, dtype=bool),
             "launches": np.ones(count)}
    merged = Kernels(*(np.concatenate([getattr(k, name), column]) for name, column in added.items()))
    return replace(work, kernels=merged)


def scaled_passes(works: Sequence[PassWork], names: Sequence[str], settings: RunSettings) -> list[PassWork]:
    """The layer's three passes with torchao's casts (module doc); the embedding's and
    head's passes (no Float8 linears) unchanged."""
    from paraplan.predict.fp8_ops import pass_role

    tp = settings.tensor_model_parallel_size
    forward = {name.removesuffix("_fwd"): LinearElements.of(w, tp) for w, name in zip(works, names, strict=True)
               if name.endswith("_fwd")}
    out = []
    for w, name in zip(works, names, strict=True):
        role = pass_role(name)
        lin = forward[name.rsplit("_", 1)[0]]
        out.append(with_casts(w, pass_casts(role, lin, settings)) if lin.gemms else w)
    return out


def torchtitan_linears(model: TransformerModel) -> int:
    """`nn.Linear` modules of a torchtitan Llama block: wq, wk, wv, wo, w1, w2 (and w3
    with a gated MLP)."""
    return 7 if model.gated_mlp else 6


def gather_weight_bytes(settings: RunSettings) -> float:
    """Bytes per parameter of a layer unit's FSDP all-gather: 1 under the float8
    all-gather (0: the weights' dtype)."""
    return float(FP8_BYTES) if settings.enable_fsdp_float8_all_gather else 0.0


def gather_amax_s(comm: CommModel, shard: Group, settings: RunSettings, linears: int) -> float:
    """Without precomputed scales, before each all-gather of a layer: one all-reduce
    (MAX) of one float per weight (`linears`: torchtitan's nn.Linear count per block)."""
    if not settings.enable_fsdp_float8_all_gather or settings.precompute_float8_dynamic_scale_for_fsdp:
        return 0.0
    return linears * float(comm.time_s("all_reduce", AMAX_BYTES_EACH, shard))


def precompute_s(comm: CommModel, shard: Group, settings: RunSettings, layers: int, linears: int) -> float:
    """With precomputed scales: the iteration's one all-reduce of every weight's amax."""
    if not settings.precompute_float8_dynamic_scale_for_fsdp:
        return 0.0
    return float(comm.time_s("all_reduce", AMAX_BYTES_EACH * layers * linears, shard))


def working_weight_bytes(forward: PassWork, settings: RunSettings) -> float:
    """Transient FP8 weights of the layer being computed on one rank: its transposed copy
    (the backward's), and without the float8 all-gather also its FP8 cast."""
    copies = 1 if settings.enable_fsdp_float8_all_gather else 2
    return copies * FP8_BYTES * LinearElements.of(forward).weights

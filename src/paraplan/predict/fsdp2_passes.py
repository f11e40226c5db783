"""What PyTorch FSDP2 itself does per unit and per step beyond its collectives
(`use_torch_fsdp2`), and torch.optim's foreach AdamW step (`optimizer_impl foreach`), as
torchtitan 9dec370 runs them on the torch nightly 1963fc8 (December 2024).

Read from torch's `torch/distributed/_composable/fsdp/` (`_fsdp_collectives.py`,
`_fsdp_param_group.py`, `_fsdp_state.py`; stored copies of the torch 2.5-2.6 files, the
same code paths as 1963fc8, which itself was not fetched) and torchtitan 9dec370
(`torchtitan/parallelisms/parallelize_llama.py` `apply_fsdp`, `train.py`,
`torchtitan/optimizer.py`, `torchtitan/utils.py` `clip_grad_norm_`). Per FSDP unit (a
transformer block, or the root: embedding, final norm, output layer), on one rank of a
sharding group of N ranks, u the unit's parameters on the rank (after TP / EP), w the
gathered bytes per element (2: bf16 `param_dtype`; 1: torchao's float8 all-gather), o = 4
(torchtitan keeps the sharded weights in fp32), g16 the 16-bit gradient's bytes and r the
reduce dtype's (`reduce_dtype` float32: 4):

- all-gather copy-in, on the all-gather copy-in stream before the collective
  (`foreach_all_gather`; the fp32->bf16 fast path of pytorch/pytorch#133369, Aug 2024, casts
  the shards into a flat bf16 temporary, then `all_gather_copy_in`'s `_foreach_copy_`
  copies it into the all-gather input): (o + w) + 2w bytes per shard element, u / N of
  them. It runs beside compute with the gather, so it lengthens the gather `a`;
- copy-out, on the compute stream (`wait_for_unshard` -> `foreach_all_gather_copy_out`,
  `split_with_sizes_copy` from the all-gather output into the unsharded parameters): 2w
  per element, u of them, after every gather (forward, and backward where resharded);
- reduce-scatter copy-in, on the compute stream (`foreach_reduce` runs
  `foreach_reduce_scatter_copy_in`, `torch._chunk_cat` into an fp32 buffer, before the
  reduce-scatter stream waits on it): g16 + r per element. fp32 and bf16 reduce with
  NCCL's `ReduceOp.AVG` (`_get_gradient_divide_factors` returns no pre/post divide
  factors), and after a `zero_grad` (set_to_none) the reduced shard is assigned, not added:
  no further pass. With gradients accumulated over M micro-batches before one
  reduce-scatter (`set_requires_gradient_sync(False)`, PyTorch's pipeline stages), FSDP2
  upcasts the first micro-batch's gradient to the reduce dtype (`to_accumulated_grad_if_needed`:
  g16 + r), adds each later one into it (`accumulate_unsharded_grad_if_needed`: 2r + g16)
  and copies the fp32 sum in (2r): per iteration g16 + r + (M - 1)(2r + g16) + 2r;
- the root unit: FSDP2's lazy init sets the root's `post_forward_mesh_info = None`, so its
  weights stay gathered from its forward to its backward (no second gather); its
  gradients are reduced in the root's post-backward, which `_root_post_backward_final_callback`
  runs after the whole backward (its forward inputs, token ids, need no gradient), after
  the compute stream waited for the last block's reduce-scatter: its copy-in and its
  reduce-scatter follow the backward, unhidden;
- torchtitan's `apply_fsdp` does not reshard the last transformer block after the forward
  ("FSDP would prefetch it immediately") unless pipelined: without pipelines and with
  `fsdp_reshard_after_forward default` the backward gathers one block fewer, and the
  first backward unit's gather is not exposed.

Per step (`optimizer_impl foreach`; torchtitan's `optimizer.fused = false` makes
`torch.optim.AdamW(foreach=True)`, weight decay 0.1): torchtitan's `clip_grad_norm_` reads
every fp32 gradient once (`_foreach_norm`), all-reduces the norm over the data-parallel
mesh (the DTensor's partial norm) and multiplies every gradient (`clip_grads_with_norm_`:
read and write); AdamW's multi-tensor path then runs eight passes over fp32 tensors
(weight decay mul 8, exp_avg lerp 12, exp_avg_sq mul 8 and addcmul 12, sqrt 8, div 8,
add eps 8, the addcdiv update 16): 80 + 12 = 92 bytes per sharded parameter, half of it
with bf16 shards (torch.optim keeps the moments in the parameters' dtype). `zero_grad`
sets the gradients to None (no kernel); the loss is all-reduced for logging only every
`metrics.log_freq` = 10 steps (two scalar all-reduces), not priced.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from paraplan.core.run_settings import FSDP_PARAM_BYTES, RunSettings
from paraplan.predict.device_model import DeviceEfficiency, DeviceSpeed, memory_time_s

FOREACH_ADAMW_BYTES = 80  # torch.optim's _multi_tensor_adamw, capturable False, on fp32 tensors (module doc)
FOREACH_ADAMW_PASSES = 8
CLIP_GRAD_NORM_BYTES = 12  # _foreach_norm (read 4) + clip_grads_with_norm_'s _foreach_mul_ (read 4, write 4)
CLIP_GRAD_NORM_PASSES = 2
MULTI_TENSOR_APPLY_ELEMENTS = 320 * 65536  # torch's multi_tensor_apply: 320 blocks of 65,536-element chunks a launch


def copy_in_bytes_per_element(gathered_bytes: float, sharded_bytes: int) -> float:
    """Bytes per shard element of a unit's all-gather copy-in: a shard of o bytes per
    element cast into a flat temporary (read o, write w), copied into the all-gather input
    (read w, write w); a shard already in the gathered dtype is copied in directly (2w)."""
    if sharded_bytes == gathered_bytes:
        return 2 * gathered_bytes
    return sharded_bytes + 3 * gathered_bytes


def grad_bytes_per_element(grad16_bytes: int, reduce_bytes: int, microbatches: int, every_microbatch: bool) -> float:
    """Bytes per unsharded gradient element between autograd and the reduce-scatter, per
    micro-batch: each micro-batch's gradient copied (and cast) into the reduce-scatter
    input when every micro-batch reduces (or there is one); else FSDP2's reduce-dtype
    accumulation over the M micro-batches and the final copy-in, spread over them (with a
    16-bit reduce dtype autograd accumulates in place: 3 g16 per later micro-batch)."""
    m = microbatches
    if every_microbatch or m == 1:
        return float(grad16_bytes + reduce_bytes)
    if reduce_bytes == grad16_bytes:
        return float((m - 1) * 3 * grad16_bytes + 2 * reduce_bytes) / m
    first, later, copy_in = grad16_bytes + reduce_bytes, 2 * reduce_bytes + grad16_bytes, 2 * reduce_bytes
    return float(first + (m - 1) * later + copy_in) / m


@dataclass(frozen=True)
class Fsdp2Passes:
    """FSDP2's memory passes on one rank (bytes; module doc), and the communication it
    adds after the backward (seconds). `*_gather_bytes`: a unit's copy-in (copy-in stream,
    before its all-gather) and copy-out (compute stream) per gather; `*_grad_bytes`: a
    unit's gradient passes per micro-batch's backward (compute stream); root arrays per
    virtual stage: the root unit's copy-in and copy-out per gather, its gradient passes
    per iteration (after the backward unless every micro-batch reduces)."""

    layer_copy_in_bytes: float
    layer_copy_out_bytes: float
    layer_grad_bytes: float
    moe_copy_in_bytes: float
    moe_copy_out_bytes: float
    moe_grad_bytes: float
    root_copy_in_bytes: np.ndarray
    root_copy_out_bytes: np.ndarray
    root_grad_bytes: np.ndarray
    after_backward_comm_s: np.ndarray  # per pipeline stage: the root unit's reduce-scatter, the clip all-reduce
    root_after_backward: bool  # the root's gradient passes run after the backward (not every micro-batch)
    last_unit_kept: bool  # torchtitan: the last block is not resharded after the forward (p = 1, `default`)
    last_unit_moe: bool
    gathers_per_layer: bool  # False: gathered once per iteration under pipelines (copies after the step)
    pipeline_stages: int

    def copy_in_s(self, speed: DeviceSpeed, eff: DeviceEfficiency) -> tuple[float, float, np.ndarray]:
        """A dense unit's, a MoE unit's and each root unit's copy-in time (two kernels)."""
        def price(nbytes: float) -> float:
            return memory_time_s(nbytes, speed, eff, 2) if nbytes else 0.0
        return (price(self.layer_copy_in_bytes), price(self.moe_copy_in_bytes),
                np.array([price(float(b)) for b in self.root_copy_in_bytes]))

    def stage_s(self, dense_layers: np.ndarray, moe_layers: np.ndarray, reshard: bool, speed: DeviceSpeed,
                eff: DeviceEfficiency) -> tuple[np.ndarray, np.ndarray]:
        """Per virtual stage and micro-batch, the compute-stream passes of its forward and
        its backward: a copy-out per gather (the root's in the forward; the kept last
        unit's in the forward only) and each layer's gradient passes (the root's too where
        every micro-batch reduces). Under a once-per-iteration gather only the gradient
        passes (the copies are `after_step_s`'s)."""
        def price(nbytes: float) -> float:
            return memory_time_s(nbytes, speed, eff) if nbytes else 0.0
        out_d, out_m = price(self.layer_copy_out_bytes), price(self.moe_copy_out_bytes)
        grad = dense_layers * price(self.layer_grad_bytes) + moe_layers * price(self.moe_grad_bytes)
        if not self.root_after_backward:
            grad = grad + np.array([price(float(b)) for b in self.root_grad_bytes])
        if not self.gathers_per_layer:
            return np.zeros_like(grad), grad
        copies = dense_layers * out_d + moe_layers * out_m
        forward = copies + np.array([price(float(b)) for b in self.root_copy_out_bytes])
        backward = copies if reshard else np.zeros_like(copies)
        if reshard and self.last_unit_kept:  # the last virtual stage's last unit is not gathered again
            backward = backward.copy()
            backward[-1] -= out_m if self.last_unit_moe else out_d
        return forward, backward + grad

    def after_step_s(self, stage_layers: tuple[np.ndarray, np.ndarray], speed: DeviceSpeed,
                     eff: DeviceEfficiency) -> np.ndarray:
        """Per pipeline stage, the memory passes after its last backward: the root units'
        gradient passes (unless every micro-batch reduces them) and, gathered once per
        iteration, the stage's copy-in and copy-out of every unit (`stage_layers`: dense
        and MoE layers per pipeline stage)."""
        p = self.pipeline_stages
        nbytes = np.zeros(p)
        for k, b in enumerate(self.root_grad_bytes):
            nbytes[k % p] += float(b) if self.root_after_backward else 0.0
        if not self.gathers_per_layer:
            dense, moe = stage_layers
            nbytes += (dense * (self.layer_copy_in_bytes + self.layer_copy_out_bytes)
                       + moe * (self.moe_copy_in_bytes + self.moe_copy_out_bytes))
            for k, b in enumerate(self.root_copy_in_bytes + self.root_copy_out_bytes):
                nbytes[k % p] += float(b)
        return np.array([memory_time_s(float(b), speed, eff) if b else 0.0 for b in nbytes])


def optimizer_step_bytes(settings: RunSettings, fused_bytes: int) -> float:
    """Memory traffic of one optimizer step per sharded parameter: `fused_bytes` (the
    fused step, `Precision.optimizer_step_bytes`), or torch's clip_grad_norm_ and foreach
    AdamW on fp32 tensors (module doc); with FSDP2's shards in bf16 (`fsdp_param_dtype`)
    every pass reads and writes 2-byte tensors (the moments follow the parameters): half."""
    nbytes = FOREACH_ADAMW_BYTES + CLIP_GRAD_NORM_BYTES if settings.optimizer_impl == "foreach" else fused_bytes
    if settings.use_torch_fsdp2:
        return nbytes * FSDP_PARAM_BYTES[settings.fsdp_param_dtype] / FSDP_PARAM_BYTES["fp32"]
    return nbytes


def optimizer_kernels(settings: RunSettings, params: float, fused_kernels: int) -> int:
    """Kernel launches of one optimizer step over `params` sharded parameters: the fused
    step's `fused_kernels`, or each foreach pass's multi_tensor_apply launches."""
    if settings.optimizer_impl != "foreach":
        return fused_kernels
    launches = max(1, math.ceil(params / MULTI_TENSOR_APPLY_ELEMENTS))
    return (FOREACH_ADAMW_PASSES + CLIP_GRAD_NORM_PASSES) * launches

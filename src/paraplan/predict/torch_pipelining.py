"""What `torch.distributed.pipelining` holds on each pipeline rank as torchtitan runs it
(`cross_entropy_impl torch` with p > 1: torchtitan's training loop, whose pipelines are
this library's), read in the torch 2.6.0 wheel's source (git 2236df17, cut from main in
December 2024, the month of torch 1963fc8 that torchtitan's benchmark ran) and
torchtitan 9dec370. Per stage object (one per model chunk), with A the bytes of one
micro-batch's activation between stages (e x tokens / (c t) x h with sequence
parallelism: torchtitan's blocks end in a sequence shard) and M micro-batches:

- `_prepare_forward_infra` allocates, on every stage that receives, one input buffer per
  micro-batch (`_make_tensor_from_meta`), once, and keeps them across iterations; the
  stage's first block saves its buffer as its input (`_retrieve_recv_activations`), so
  that input is the buffer's, not an activation of its own. `_prepare_backward_infra`
  allocates, on every stage that sends, one gradient-receive buffer per micro-batch:
  M A each (`buffer_bytes`).
- `forward_one_chunk` appends every micro-batch's output to `output_chunks`, cleared only
  when the next `step()` starts (`clear_runtime_states`): A per forward on a stage that
  sends, kept to the iteration's end (the backward only drops it from `fwd_cache`). On
  the last stage the output is the logits, e bytes per logit (torchtitan's
  `Transformer.forward` returns the output layer's result; under loss parallelism a
  DTensor whose local shard is the rank's V / t columns); the backward detaches it
  (`t.detach_()`: the graph, not the tensor).
- `stage_backward` (`_backward.py`) leaves each micro-batch's input gradient in its
  receive buffer's `.grad`, which `clear_runtime_states` clears at the next `step()`:
  A per backward on a stage that receives, kept to the iteration's end.
- `_maybe_compute_loss` (schedules.py) runs torchtitan's `loss_fn` right after each
  forward of the last stage, on the kept logits: the loss's transient is PyTorch's
  `F.cross_entropy` on `pred.float()` as without pipelines (`paraplan.predict.loss_ops`),
  its backward's 8 fp32 bytes per logit (12 under loss parallelism), which never include
  the logits.
- `step()` ends with `_merge_outputs(output_chunks)` on the last stage: `merge_chunks`
  (microbatch.py) concatenates the M logits tensors (`torch.cat`) into a new one,
  returned to torchtitan's `train.py`, which drops it. For a moment after the last
  backward each rank holds, beside its weight state alone (no activation; FSDP's
  accumulated gradients reduce-scattered and freed by the post-backward that
  `backward_maybe_with_nosync` runs after the last micro-batch), its buffers, kept
  outputs and input gradients, and on the last stage that concatenation
  (`iteration_end_bytes`).

The concatenation's memory pass (2 M logits tensors read and written) is not priced.
"""

from __future__ import annotations

from dataclasses import dataclass

from paraplan.core.run_settings import RunSettings
from paraplan.core.transformer import TransformerModel
from paraplan.predict.layer_shape import _shape


def runs_torch_pipelining(settings: RunSettings) -> bool:
    """torchtitan's pipelines: `cross_entropy_impl torch` with p > 1."""
    return settings.cross_entropy_impl == "torch" and settings.pipeline_model_parallel_size > 1


@dataclass(frozen=True)
class TorchPipeliningMemory:
    """Per virtual stage (model chunk c of rank r is virtual stage c p + r), what
    `torch.distributed.pipelining` holds (module doc)."""

    boundary_bytes: float  # A: one micro-batch's activation between two stages
    logits_bytes: float  # the last stage's output per micro-batch
    microbatches: int
    virtual_stages: int

    def receives(self, vstage: int) -> bool:
        return vstage > 0

    def sends(self, vstage: int) -> bool:
        return vstage < self.virtual_stages - 1

    def kept_output_bytes(self, vstage: int) -> float:
        """Allocated by each forward, held to the iteration's end."""
        return self.boundary_bytes if self.sends(vstage) else self.logits_bytes

    def kept_input_grad_bytes(self, vstage: int) -> float:
        """Allocated by each backward, held to the iteration's end."""
        return self.boundary_bytes if self.receives(vstage) else 0.0

    def buffer_bytes(self, vstage: int) -> float:
        """Receive buffers, allocated once: M inputs and M output gradients."""
        return self.microbatches * self.boundary_bytes * (self.receives(vstage) + self.sends(vstage))

    def received_input_bytes(self, vstage: int) -> float:
        """Per micro-batch: the first block's saved input, which is a receive buffer."""
        return self.boundary_bytes if self.receives(vstage) else 0.0

    def iteration_end_bytes(self, vstage: int) -> float:
        """After the last backward: buffers, M kept outputs and input gradients, and on
        the last stage the M logits tensors' concatenation."""
        kept = self.microbatches * (self.kept_output_bytes(vstage) + self.kept_input_grad_bytes(vstage))
        merged = 0.0 if self.sends(vstage) else self.microbatches * self.logits_bytes
        return self.buffer_bytes(vstage) + kept + merged


def torch_pipelining_memory(model: TransformerModel, settings: RunSettings) -> TorchPipeliningMemory | None:
    """What `torch.distributed.pipelining` holds on one rank of each stage (None unless
    `runs_torch_pipelining`): A = e x tokens / t x h with sequence parallelism (else
    tokens x h), the logits e x tokens x V / t."""
    if not runs_torch_pipelining(settings):
        return None
    x = _shape(model, settings)
    logits = x.e * x.tokens * model.padded_vocab_size(x.t) / x.t
    vstages = settings.pipeline_model_parallel_size * settings.virtual_pipeline_model_parallel_size
    return TorchPipeliningMemory(x.e * x.sp_tokens * x.h, logits, settings.num_microbatches, vstages)

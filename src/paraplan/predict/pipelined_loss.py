"""What torchtitan's loss adds to the last pipeline stage's memory when it runs under
`torch.distributed.pipelining` (`cross_entropy_impl torch` with p > 1), read in the
torch 2.6.0 wheel's source (git 2236df17, cut from main in December 2024, the month of
torch 1963fc8 that torchtitan's benchmark ran) and torchtitan 9dec370:

- `_PipelineStageBase.forward_one_chunk` (stage.py) appends every micro-batch's stage
  output to `output_chunks`; on the last stage that output is the model's output, the
  logits (torchtitan's `Transformer.forward` returns `self.output(h)` in the activation
  dtype, e bytes: the output layer is neither Float8 nor cast; with TP under loss
  parallelism a DTensor whose local shard is the rank's V / t columns). Nothing removes
  an entry until the next `step()` calls `clear_runtime_states`: after its backward a
  micro-batch's logits are detached (`t.detach_()` in `backward_one_chunk`, which drops
  the autograd graph, not the tensor), so each micro-batch's e x tokens x V / t bytes
  stay from its forward to the iteration's end (`kept_output_bytes`).
- `_maybe_compute_loss` (schedules.py) runs torchtitan's `loss_fn` right after that
  forward, on the same tensor, which the stage still references: the loss's transient
  is PyTorch's `F.cross_entropy` on `pred.float()` as without pipelines
  (`paraplan.predict.loss_ops`), its backward's 8 fp32 bytes per logit (12 under loss
  parallelism), which never include the logits; the schedule runs that backward right
  after (1F1B) or later (GPipe, the interleaved schedule's warm-up).
- `PipelineScheduleSingle.step` / `PipelineScheduleMulti.step` end with
  `_merge_outputs(output_chunks)`: `merge_chunks` (microbatch.py) concatenates the M
  outputs along the batch (`torch.cat`) into a new tensor, returned to torchtitan's
  `train.py`, which drops it (`pp_schedule.step(target=labels, losses=losses)`). For a
  moment after the last backward the stage holds 2 M kept outputs beside its weight
  state: no activation is held then, FSDP's accumulated gradients have been
  reduce-scattered and freed by the post-backward that `backward_maybe_with_nosync`
  runs after the last micro-batch (`iteration_end_bytes`).

The concatenation's memory pass (2 M outputs read and written, a few ms) is not priced.
"""

from __future__ import annotations

from dataclasses import dataclass

from paraplan.core.run_settings import RunSettings
from paraplan.core.transformer import TransformerModel
from paraplan.predict.ops import _shape


def runs_pipelined_loss(settings: RunSettings) -> bool:
    """torchtitan's loss under `torch.distributed.pipelining`: `cross_entropy_impl torch`, p > 1."""
    return settings.cross_entropy_impl == "torch" and settings.pipeline_model_parallel_size > 1


@dataclass(frozen=True)
class PipelinedLossMemory:
    """The last pipeline stage's bytes from the pipelined loss (module doc)."""

    kept_output_bytes: float  # per micro-batch, from its forward to the iteration's end
    iteration_end_bytes: float  # after the last backward: the M kept outputs and their concatenation


def pipelined_loss_memory(model: TransformerModel, settings: RunSettings) -> PipelinedLossMemory | None:
    """The pipelined loss's memory on one rank of the last stage (None unless
    `runs_pipelined_loss`): e bytes per logit of the rank's tokens x V / t per
    micro-batch, and 2 M of them at the iteration's end."""
    if not runs_pipelined_loss(settings):
        return None
    x = _shape(model, settings)
    kept = x.e * x.tokens * model.padded_vocab_size(x.t) / x.t
    return PipelinedLossMemory(kept, 2 * settings.num_microbatches * kept)

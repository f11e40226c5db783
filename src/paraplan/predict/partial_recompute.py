"""Full recomputation of some layers, or of groups of layers (Megatron-LM's
`--recompute-method` and `--recompute-num-layers` with `--recompute-granularity full`).

Megatron-Core's `TransformerBlock._checkpointed_forward` runs each model chunk's layers
(a chunk: a pipeline stage's layers, or one virtual stage's under interleaving) in one
of two ways, N = `recompute_num_layers`:

- `block`: the first N layers of the chunk are each checkpointed (they keep only their
  input and recompute their forward in the backward); the chunk's other layers keep all
  their activations and recompute nothing. So a virtual stage of n layers recomputes
  min(N, n) of them (`PartialRecompute.kept`: the n - min(N, n) it does not, and
  `kept_moe`, how many of those are mixture-of-experts layers, from the model's layer
  kinds).
- `uniform`: the chunk's layers in consecutive groups of N, each group checkpointed as
  one: the chunk keeps the input of each group, ceil(n / N) hidden states, and in the
  backward rebuilds a whole group before it runs the group's backward, so N layers'
  activations are alive at once. Every layer is recomputed once, as with N = 1.

An empty `recompute_method` is paraplan's `full`: every layer checkpointed on its own
(uniform with N = 1; Megatron-LM requires the method to be named, and its examples use
uniform 1). Under full recomputation a layer keeps its input, the same hidden state for a
dense and a MoE layer (`ops.layer_activation_bytes`, `moe_ops`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from paraplan.core.run_settings import RunSettings
from paraplan.core.transformer import TransformerModel


@dataclass(frozen=True, eq=False)
class PartialRecompute:
    """How a run's full recomputation is split over its virtual stages (module doc)."""

    method: str  # "block" or "uniform"
    num_layers: int  # N
    kept: np.ndarray  # per virtual stage: layers that recompute nothing (block; zeros for uniform)
    kept_moe: np.ndarray  # of `kept`, the mixture-of-experts layers

    @staticmethod
    def of(model: TransformerModel, settings: RunSettings, counts: np.ndarray) -> PartialRecompute | None:
        """None when every layer is checkpointed on its own (no method, or uniform 1, or
        no full recomputation); `counts`: layers per virtual stage, in virtual stage order
        (consecutive layer ranges; `RunSettings.check` has refused a block of more layers
        than a chunk holds, as Megatron-Core does)."""
        method, n = settings.recompute_method, settings.recompute_num_layers
        if settings.recompute_granularity != "full" or not method or (method == "uniform" and n == 1):
            return None
        counts = np.asarray(counts, dtype=np.int64)
        kept = np.zeros(len(counts), dtype=np.int64)
        kept_moe = np.zeros(len(counts), dtype=np.int64)
        if method == "block":
            flags = np.array(model.moe_layers, dtype=np.int64)
            starts = np.cumsum(counts) - counts
            for j, (start, count) in enumerate(zip(starts, counts, strict=True)):
                kept[j] = max(int(count) - n, 0)
                kept_moe[j] = flags[start + min(n, count):start + count].sum()
        return PartialRecompute(method, n, kept, kept_moe)

    def stored_inputs(self, chunk_layers: np.ndarray) -> np.ndarray:
        """Hidden states a chunk of `chunk_layers` layers keeps for its checkpointed
        layers: one per group under uniform, one per recomputed layer under block (the
        kept layers' activations are counted apart)."""
        layers = np.asarray(chunk_layers, dtype=float)
        if self.method == "uniform":
            return np.ceil(layers / self.num_layers)
        return np.minimum(layers, self.num_layers)

    def rebuilt_layers(self, most_layers: int) -> int:
        """Layers whose activations a backward rebuilds at once: a uniform group, else one."""
        return min(self.num_layers, most_layers) if self.method == "uniform" else 1


def recomputed_layer_share(model: TransformerModel, settings: RunSettings) -> float:
    """Of the model's layers, the share whose forward the backward recomputes in full
    (Megatron's FLOP count with recomputation): 1 under `full` but for a block, whose
    min(N, n) layers of each model chunk of n are recomputed; 0 otherwise."""
    if settings.recompute_granularity != "full":
        return 0.0
    if settings.recompute_method != "block":
        return 1.0
    counts = settings.layers_per_virtual_stage(model.num_layers)
    return sum(min(settings.recompute_num_layers, n) for n in counts) / model.num_layers

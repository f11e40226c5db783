"""Parameters a transformer puts on one rank outside its layers: the input embedding
(and learned positions) on the first pipeline stage, and on the last the final norm,
the output layer and the multi-token-prediction layers' weights.

Megatron-LM pads the vocabulary to a multiple of make_vocab_size_divisible_by x t and
splits its rows over the t tensor-parallel ranks; the output layer is a copy of its own
unless it is tied to the input embedding on a single pipeline stage. The transformer
path applies these to one run (numbers), the planner's estimate to many candidates at
once (numpy arrays of tensor and pipeline sizes)."""

from __future__ import annotations

from typing import overload

import numpy as np

from paraplan.core.transformer import TransformerModel


@overload
def rank_vocab_params(model: TransformerModel, t: int) -> float: ...
@overload
def rank_vocab_params(model: TransformerModel, t: np.ndarray) -> np.ndarray: ...
def rank_vocab_params(model: TransformerModel, t: int | np.ndarray) -> float | np.ndarray:
    """One rank's rows of the padded vocabulary x hidden (input embedding or output layer)."""
    if isinstance(t, np.ndarray):
        return np.array([model.padded_vocab_size(int(x)) for x in t]) * model.hidden_size / t
    return model.padded_vocab_size(t) * model.hidden_size / t


def position_params(model: TransformerModel) -> int:
    """Learned absolute position embeddings (sequence x hidden; not split); 0 for rotary."""
    return model.seq_length * model.hidden_size if model.position_embedding_type == "learned_absolute" else 0


@overload
def rank_head_params(model: TransformerModel, t: int, p: int, vocab: float, mtp_expert_params: int) -> float: ...
@overload
def rank_head_params(model: TransformerModel, t: np.ndarray, p: np.ndarray, vocab: np.ndarray,
                     mtp_expert_params: int) -> np.ndarray: ...
def rank_head_params(model: TransformerModel, t: int | np.ndarray, p: int | np.ndarray, vocab: float | np.ndarray,
                     mtp_expert_params: int) -> float | np.ndarray:
    """The last stage's weights after its layers: the final norm, the output layer
    (`vocab`: one rank's share) unless tied to the embedding on one stage, and the
    multi-token-prediction layers' weights but their routed experts (split over t)."""
    output = np.where(model.untie_embeddings_and_output_weights | (np.asarray(p) > 1), vocab, 0.0)
    head = model.norm_params + output + (model.mtp_parameters - mtp_expert_params) / t
    return head if isinstance(t, np.ndarray) else float(head)

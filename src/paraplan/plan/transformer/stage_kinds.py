"""Dense and mixture-of-experts layers of each pipeline-stage role of the transformer
planner's estimate (`estimate.py`), from the engine's own layer assignment
(`paraplan.predict.build.layers_per_virtual_stage` and `moe_layers_per_virtual_stage`:
Megatron's split with `decoder_first/last_pipeline_num_layers` and
`account_for_embedding/loss_in_pipeline_split`). A model whose first layers are dense
(DeepSeek-V3's first three) holds them on the first stage alone, so a middle stage of
MoE layers only is slower than the model's mean layer says.

The split depends only on (p, v, first, last, acc), which tens of thousands of
candidates share a few dozen of: each distinct split is assigned once and its counts
gathered onto the candidates (no per-candidate loop)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from paraplan.core.run_settings import RunSettings
from paraplan.core.transformer import TransformerModel
from paraplan.plan.transformer.space import Candidates
from paraplan.predict.build import layers_per_virtual_stage, moe_layers_per_virtual_stage


@dataclass(frozen=True, eq=False)
class StageKinds:
    """Per candidate, (dense, MoE) transformer layers (columns 0, 1; shape (n, 2)) of:
    virtual stage 0 (beside the embedding), the last virtual stage (beside the head),
    a mean other chunk of the first and of the last rank (interleaved), the slowest
    middle virtual stage's candidates (`middle`, shape (n, J, 2)) with how many middle
    virtual stages hold each (`middle_count`, (n, J), 0: padding) and the lowest and
    highest pipeline rank among them (`middle_low`, `middle_high`). Where the pipeline
    has no middle stage (p <= 2) `middle` holds virtual stage 0's layers with count 0.
    For the memory estimate: a mean chunk of the second rank, and which rank is the
    first to hold MoE layers alone (`moe_rank`; 1 where none of the middle ranks is)
    with its mean chunk: where the first stages hold the dense layers, it holds the
    most state and the most activations per micro-batch."""

    first: np.ndarray
    last: np.ndarray
    chunk_first: np.ndarray
    chunk_last: np.ndarray
    middle: np.ndarray
    middle_count: np.ndarray
    middle_low: np.ndarray  # (n, J): the lowest pipeline rank that holds each middle entry
    middle_high: np.ndarray  # (n, J): the highest (1F1B's paths turn at a stage: `pipeline_estimate`)
    second: np.ndarray
    moe_rank: np.ndarray
    moe_rank_layers: np.ndarray


def stage_kinds(model: TransformerModel, cand: Candidates, base: RunSettings) -> StageKinds:
    """The engine's split of every distinct (p, v, first, last, acc), gathered onto the candidates."""
    # one int64 per split (each field < 2^12: layers, stages and chunks of a model), as np.unique of
    # rows is several times slower than of a flat array
    packed = np.zeros(len(cand), dtype=np.int64)
    for field in (cand.p, cand.v, cand.first, cand.last, cand.acc):
        packed = (packed << 12) | field.astype(np.int64)
    unique, inverse = np.unique(packed, return_inverse=True)
    keys = [[(int(k) >> (12 * shift)) & 0xFFF for shift in (4, 3, 2, 1, 0)] for k in unique.tolist()]
    splits = [_split(model, base, *key) for key in keys]
    width = max((len(sp.middle) for sp in splits), default=1)

    def column(name: str) -> np.ndarray:
        return np.array([getattr(sp, name) for sp in splits], dtype=float).reshape(-1, 2)

    middle = np.zeros((len(splits), width, 2))
    count = np.zeros((len(splits), width))
    low, high = np.zeros((len(splits), width)), np.zeros((len(splits), width))
    for i, sp in enumerate(splits):
        for j, ((pair, n), (lo, hi)) in enumerate(zip(sp.middle, sp.middle_ranks, strict=True)):
            middle[i, j], count[i, j], low[i, j], high[i, j] = pair, n, lo, hi
    inv = inverse.ravel()
    return StageKinds(column("first")[inv], column("last")[inv], column("chunk_first")[inv],
                      column("chunk_last")[inv], middle[inv], count[inv], low[inv], high[inv], column("second")[inv],
                      np.array([sp.moe_rank for sp in splits], dtype=np.int64)[inv], column("moe_rank_layers")[inv])


Pair = tuple[float, float]  # (dense, MoE) layers


@dataclass(frozen=True)
class _Split:
    """One split's `StageKinds` entries: the middle virtual stages as distinct (dense, MoE)
    pairs with how many hold each."""

    first: Pair
    last: Pair
    chunk_first: Pair
    chunk_last: Pair
    middle: tuple[tuple[Pair, int], ...]
    middle_ranks: tuple[tuple[int, int], ...]  # each middle entry's lowest and highest pipeline rank
    second: Pair
    moe_rank: int
    moe_rank_layers: Pair


def _split(model: TransformerModel, base: RunSettings, p: int, v: int, first: int, last: int, acc: int) -> _Split:
    """The engine's split of `model`'s layers under (p, v, first, last, acc)."""
    settings = replace(base, pipeline_model_parallel_size=p, virtual_pipeline_model_parallel_size=v,
                       decoder_first_pipeline_num_layers=first, decoder_last_pipeline_num_layers=last,
                       account_for_embedding_in_pipeline_split=bool(acc & 1),
                       account_for_loss_in_pipeline_split=bool(acc & 2), pipeline_model_parallel_layout="")
    counts = layers_per_virtual_stage(model.num_layers, settings)
    moe = moe_layers_per_virtual_stage(model, counts)
    pairs = np.stack([counts - moe, moe], axis=1).astype(float)  # vstage c p + r: chunk c of rank r
    by_rank = pairs.reshape(v, p, 2)

    def pair(x: np.ndarray) -> Pair:
        return (float(x[0]), float(x[1]))

    def mean_other(chunks: np.ndarray) -> Pair:
        return pair(chunks.mean(axis=0)) if len(chunks) else (0.0, 0.0)

    middle_pairs = by_rank[:, 1:p - 1].reshape(-1, 2)
    if len(middle_pairs):
        distinct, which, n = np.unique(middle_pairs, axis=0, return_inverse=True, return_counts=True)
        ranks = np.arange(len(middle_pairs)) % (p - 2) + 1  # chunk-major: ranks 1 .. p - 2 per chunk
        which = which.ravel()
        middle = tuple((pair(d), int(k)) for d, k in zip(distinct, n.tolist(), strict=True))
        middle_ranks = tuple((int(ranks[which == j].min()), int(ranks[which == j].max()))
                             for j in range(len(distinct)))
    else:
        middle = ((pair(pairs[0]), 0),)
        middle_ranks = ((0, 0),)
    rank_mean = by_rank.mean(axis=0)  # (p, 2)
    moe_only = [r for r in range(1, p - 1) if by_rank[:, r, 0].sum() == 0 and by_rank[:, r, 1].sum() > 0]
    moe_rank = moe_only[0] if moe_only else min(1, p - 1)
    return _Split(pair(pairs[0]), pair(pairs[-1]), mean_other(by_rank[1:, 0]), mean_other(by_rank[:-1, p - 1]),
                  middle, middle_ranks, pair(rank_mean[min(1, p - 1)]), moe_rank, pair(rank_mean[moe_rank]))

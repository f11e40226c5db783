"""Records the phases of the transformer planner's estimate (`estimate.py`) pass on:
every candidate as float columns, how its layers fall on its stages, and the
parameters its first and last stage hold on one rank. One entry per candidate in
every array."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from paraplan.core.cluster import Cluster
from paraplan.core.layer_split import even_split_sizes
from paraplan.core.run_settings import RunSettings
from paraplan.core.transformer import TransformerModel
from paraplan.plan.transformer.layer_table import table_keys
from paraplan.plan.transformer.space import SCHEDULES, Candidates


@dataclass(frozen=True, eq=False)
class CandidateColumns:
    """The candidates as float columns, and what every phase derives from them."""

    cand: Candidates
    row: np.ndarray  # each candidate's row of the layer table
    t: np.ndarray
    p: np.ndarray
    d: np.ndarray
    b: np.ndarray
    v: np.ndarray
    c: np.ndarray
    m: np.ndarray  # micro-batches per iteration (global batch / (d b))
    dc: np.ndarray  # the ranks that hold the same weights: gradients reduced, state sharded over them
    ep: np.ndarray
    etp: np.ndarray  # ETP, the candidate's TP where Megatron's default (0)
    edp: np.ndarray  # the expert-data-parallel group
    dp_nodes: np.ndarray  # nodes the dp-cp group spans (int)
    edp_nodes: np.ndarray  # nodes the expert-data-parallel group spans (int; stride EP x ETP)
    cross: np.ndarray  # the pipeline's neighbours sit on different nodes
    schedule: np.ndarray  # schedule names
    zero3: np.ndarray
    sharded: np.ndarray  # optimizer state sharded (ZeRO >= 1)
    single: np.ndarray  # one pipeline stage
    num_layers: float

    @classmethod
    def of(cls, model: TransformerModel, cand: Candidates, base: RunSettings, cluster: Cluster,
           index: dict[tuple[int, ...], int]) -> CandidateColumns:
        keys, inverse = table_keys(cand)
        row = np.array([index[k] for k in keys], dtype=np.int64)[inverse]
        t, p, d, b, v = (cand.t.astype(float), cand.p.astype(float), cand.d.astype(float), cand.b.astype(float),
                         cand.v.astype(float))
        c = cand.cp.astype(float)
        dc = d * c
        gpn = cluster.devices_per_node
        ep, etp = cand.ep.astype(float), np.where(cand.etp > 0, cand.etp, cand.t).astype(float)
        # Megatron's rank order tp-cp-dp-pp: the dp-cp group is every t-th rank, so it
        # spans t d c / gpn nodes (each member on its own node once t >= gpn)
        dp_nodes = np.maximum(1, np.ceil(t * dc / np.maximum(gpn, t))).astype(np.int64)
        edp_nodes = np.maximum(1, np.ceil(t * dc / np.maximum(gpn, ep * etp))).astype(np.int64)
        return cls(cand, row, t, p, d, b, v, c, base.global_batch_size / (d * b), dc, ep, etp, t * dc / (ep * etp),
                   dp_nodes, edp_nodes, (t * c * d) >= gpn, np.array(SCHEDULES)[cand.schedule], cand.zero == 3,
                   cand.zero >= 1, p == 1, float(model.num_layers))

    def __len__(self) -> int:
        return len(self.cand)

    @property
    def zero3_once(self) -> np.ndarray:
        """ZeRO-3 under pipelines: each stage's weights gathered once per iteration and
        kept, gradients reduce-scattered after the last micro-batch (`space.ZERO3_PIPELINED`)."""
        return self.zero3 & ~self.single

    @property
    def shards(self) -> np.ndarray:
        """Ranks the optimizer state of a non-expert weight is sharded over."""
        return np.where(self.sharded, self.dc, 1.0)

    @property
    def expert_shards(self) -> np.ndarray:
        """Ranks the optimizer state of an expert weight is sharded over."""
        return np.where(self.sharded, self.edp, 1.0)


@dataclass(frozen=True, eq=False)
class StageLayers:
    """Layers per (virtual) stage. v = 1 splits the layers as evenly as possible (the
    first L mod p stages take one more); interleaving splits each rank's layers evenly
    over its v chunks, the first and last rank holding `first` / `last` layers where
    set (Megatron's uneven split, `interleaved_uneven_split`), the middle ranks sharing
    the rest; with the embedding / loss counted as layers (`space.ACCOUNT_FOR`) every rank
    the same slots, the first and last one layer fewer."""

    n_big: np.ndarray  # ceil(L / p) (a rank's slots where the embedding / loss count as layers)
    n_small: np.ndarray  # floor(L / p)
    count_big: np.ndarray  # stages with n_big layers (v = 1)
    n_chunk: np.ndarray  # the first rank's layers per chunk
    n_mid: np.ndarray  # a middle rank's layers per chunk
    n_last: np.ndarray  # the last rank's layers per chunk

    @classmethod
    def of(cls, cols: CandidateColumns) -> StageLayers:
        L, p, v = cols.num_layers, cols.p, cols.v
        big, small, count_big = even_split_sizes(np.asarray(L), np.asarray(p))  # the one even-split rule
        n_big, n_small = big.astype(float), small.astype(float)
        set_first, set_last = cols.cand.first.astype(float), cols.cand.last.astype(float)
        uneven = (set_first > 0) | (set_last > 0)
        per_middle = np.where(uneven,
                              (L - set_first - set_last) / np.maximum(p - (set_first > 0) - (set_last > 0), 1), L / p)
        n_chunk = np.where(v > 1, np.where(set_first > 0, set_first, per_middle) / v, n_big)
        n_mid = np.where(v > 1, per_middle / v, n_big)
        n_last = np.where(v > 1, np.where(set_last > 0, set_last, per_middle) / v,
                          np.where(count_big == p, n_big, n_small))
        # the embedding / loss counted as a layer (`space.ACCOUNT_FOR`): every rank holds the same
        # slots, the first gives one to the embedding, the last one to the loss (per chunk: the mean)
        acc = cols.cand.acc
        if acc.any():
            counted = acc > 0
            emb, loss = (acc & 1).astype(float), (acc >> 1).astype(float)
            rank = (L + emb + loss) / p
            n_chunk = np.where(counted, (rank - emb) / v, n_chunk)
            n_mid = np.where(counted, rank / v, n_mid)
            n_last = np.where(counted, (rank - loss) / v, n_last)
            n_big = np.where(counted, rank, n_big)
            n_small = np.where(counted, rank, n_small)
            count_big = np.where(counted, cols.cand.p, count_big)
        return cls(n_big, n_small, count_big, n_chunk, n_mid, n_last)

    def first_rank(self, cols: CandidateColumns) -> np.ndarray:
        """Layers on the first stage's rank (all its chunks)."""
        return self.n_chunk * cols.v

    def last_rank(self, cols: CandidateColumns) -> np.ndarray:
        """Layers on the last stage's rank (all its chunks)."""
        return self.n_last * np.where(cols.v > 1, cols.v, 1)


@dataclass(frozen=True, eq=False)
class StageParams:
    """Parameters on one rank of the first and of the last stage: non-expert weights
    and the routed experts' (split over EP x ETP, sharded over the expert-data-parallel
    group)."""

    first: np.ndarray
    last: np.ndarray
    first_experts: np.ndarray
    last_experts: np.ndarray

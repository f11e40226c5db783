"""Uneven all_to_allv exchanges shaped like DLRM's embedding lookup (Lin et al., HiPC 2022).

A sample is (global batch B, tables per rank T_0..T_{n-1}, embedding dim D), float32.
Each rank r owns T_r tables and holds the embeddings of its tables for the whole
batch; the exchange sends every peer j the rows of j's local batch b = B // n:
b x T_r x D elements from r to j, so rank r sends n x b x T_r x D elements in all
and receives b x T_j x D from each j. (B is a power of two >= 256; with a world
size that does not divide it the last B mod n samples are simply not exchanged.)

`size_bytes` of a sample is the largest rank's input buffer,
b x n x max_r(T_r) x D x 4 bytes: the nccl-tests convention "the larger per-rank
buffer" applied to the busiest rank, and the quantity that equals all_to_all's
size when all T_r are equal. The fit stage derives its effective sizes
(sum, max_of_max, max_of_sum) from the recorded B, T_r list and D.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

GLOBAL_BATCHES: tuple[int, ...] = (256, 512, 1024, 2048, 4096)
TABLES_PER_RANK_RANGE: tuple[int, int] = (1, 20)  # inclusive
DIMS: tuple[int, ...] = (32, 64, 128, 256)
A2AV_DTYPE = "float32"
A2AV_ELEMENT_BYTES = 4


@dataclass(frozen=True)
class A2AVSample:
    """One uneven exchange: global batch, tables per rank, embedding dimension."""

    sample: int
    global_batch: int
    tables_per_rank: tuple[int, ...]
    dim: int

    @property
    def world_size(self) -> int:
        return len(self.tables_per_rank)

    @property
    def local_batch(self) -> int:
        return self.global_batch // self.world_size

    def send_elements(self, rank: int) -> int:
        """Elements rank `rank` sends to each peer (and to itself)."""
        return self.local_batch * self.tables_per_rank[rank] * self.dim

    def input_split(self, rank: int) -> list[int]:
        """Elements `rank` sends to rank 0..n-1 (all_to_all_single input_split_sizes)."""
        return [self.send_elements(rank)] * self.world_size

    def output_split(self, rank: int) -> list[int]:
        """Elements `rank` receives from rank 0..n-1 (output_split_sizes)."""
        del rank  # every rank receives the same: peer j's tables for its own batch
        return [self.send_elements(j) for j in range(self.world_size)]

    @property
    def size_bytes(self) -> int:
        """The largest rank's input buffer in bytes (module docstring)."""
        largest = max(self.tables_per_rank)
        return self.local_batch * self.world_size * largest * self.dim * A2AV_ELEMENT_BYTES

    @property
    def tables_label(self) -> str:
        """The T_r list as written in the CSV, e.g. "3-17"."""
        return "-".join(str(t) for t in self.tables_per_rank)


def draw_samples(count: int, world_size: int, seed: int) -> list[A2AVSample]:
    """`count` random exchanges for `world_size` ranks; the same seed gives the same list."""
    rng = np.random.default_rng(seed)
    lo, hi = TABLES_PER_RANK_RANGE
    samples = []
    for index in range(count):
        batch = int(rng.choice(GLOBAL_BATCHES))
        tables = tuple(int(t) for t in rng.integers(lo, hi + 1, size=world_size))
        dim = int(rng.choice(DIMS))
        samples.append(A2AVSample(index, batch, tables, dim))
    return samples

"""Gradient buckets: how a rank's gradients are cut into reductions and when during
its last backward each becomes ready (`GradSync`'s `ready_fraction`).

Two rules, one per kind of input:
- `filled_buckets`: a layer profile's layers, from the last one down, filled into a
  bucket until it holds at least the cap (PyTorch DDP's `bucket_cap_mb`); a bucket is
  ready when its lowest layer's backward ends, measured by the layers' backward times;
- `equal_buckets`: a transformer chunk's parameters in ceil(total / cap) equal buckets
  (Megatron-LM's DDP), ready one after another at equal steps of the backward."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, eq=False)
class FilledBuckets:
    """Buckets of one model chunk in the order they become ready."""

    size_bytes: np.ndarray
    ready_fraction: np.ndarray  # of the chunk's backward op (0: its start, 1: its end)
    lowest_layer: np.ndarray  # the layer whose gradient completes the bucket (index into the layers given)


def filled_buckets(layer_bytes: np.ndarray, layer_bwd_s: np.ndarray, bucket_bytes: float) -> FilledBuckets:
    """Buckets of layers given first to last (`layer_bytes` of gradient, `layer_bwd_s`
    backward time each): filled from the last layer down, each closed once it holds
    `bucket_bytes` or more, the remainder one bucket at the end. Without backward time
    every layer is ready at the end."""
    b_l = np.asarray(layer_bwd_s, dtype=float)[::-1]
    frac = np.cumsum(b_l) / b_l.sum() if b_l.sum() > 0 else np.ones_like(b_l)
    sizes, fractions, lowest = [], [], []
    acc = 0.0
    last = b_l.shape[0] - 1
    for i, (ready, nb) in enumerate(zip(frac, np.asarray(layer_bytes, dtype=float)[::-1], strict=True)):
        acc += nb
        if acc >= bucket_bytes:
            sizes.append(acc)
            fractions.append(float(ready))
            lowest.append(last - i)
            acc = 0.0
    if acc > 0:
        sizes.append(acc)
        fractions.append(float(frac[-1]) if frac.size else 1.0)
        lowest.append(0)
    return FilledBuckets(np.array(sizes, dtype=float), np.array(fractions, dtype=float),
                         np.array(lowest, dtype=np.int64))


@dataclass(frozen=True)
class EqualBuckets:
    """`count` buckets of `each` (in the unit of the total: parameters or bytes)."""

    count: int
    each: float

    @property
    def ready_fractions(self) -> list[float]:
        """Bucket k is ready (k + 1) / count of the way through the backward."""
        return [(k + 1) / self.count for k in range(self.count)]


def equal_buckets(total: float, cap: float, count: int = 0) -> EqualBuckets:
    """ceil(total / cap) equal buckets (at least one) of a chunk's `total` gradients, or
    `count` of them where the caller fixes the number (ZeRO-3: one per FSDP unit)."""
    count = count or max(1, math.ceil(total / cap))
    return EqualBuckets(count, total / count)

"""Layer-wise model profiles and how they scale with batch size."""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np


@dataclass(frozen=True)
class LayerProfile:
    """One layer (the unit a planner may cut at), measured at the profile batch size.

    Time at batch b: fixed + (t - fixed) x b / batch_size; activations scale linearly.
    """

    name: str
    fwd_s: float
    bwd_s: float
    activation_bytes: float  # output activation at the profile batch size
    param_bytes: float
    fwd_fixed_s: float = 0.0
    bwd_fixed_s: float = 0.0
    flops: float | None = None  # forward FLOPs at the profile batch size, when known

    def __post_init__(self) -> None:
        for key in ("fwd_s", "bwd_s", "activation_bytes", "param_bytes", "fwd_fixed_s", "bwd_fixed_s"):
            value = getattr(self, key)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"layer '{self.name}': {key} must be a finite number >= 0, got {value}")
        for total, fixed in (("fwd_s", "fwd_fixed_s"), ("bwd_s", "bwd_fixed_s")):
            if getattr(self, fixed) > getattr(self, total):  # else smaller batches take negative time
                raise ValueError(f"layer '{self.name}': {fixed} {getattr(self, fixed)} exceeds {total} "
                                 f"{getattr(self, total)}; expected fixed <= total")
        if self.flops is not None and not (math.isfinite(self.flops) and self.flops >= 0):
            raise ValueError(f"layer '{self.name}': flops must be a finite number >= 0 (or None), got {self.flops}")


@dataclass(frozen=True)
class ModelProfile:
    """Layers in execution (topological) order, at `batch_size` samples."""

    name: str
    batch_size: int
    layers: tuple[LayerProfile, ...]
    meta: Mapping[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        batch = self.batch_size
        if isinstance(batch, bool) or not isinstance(batch, numbers.Integral) or batch < 1:
            raise ValueError(f"profile '{self.name}': batch_size must be an integer >= 1, got {batch!r}")
        if not self.layers:
            raise ValueError(f"profile '{self.name}' has no layers")

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @cached_property
    def fwd_s(self) -> np.ndarray:
        return np.array([la.fwd_s for la in self.layers], dtype=float)

    @cached_property
    def bwd_s(self) -> np.ndarray:
        return np.array([la.bwd_s for la in self.layers], dtype=float)

    @cached_property
    def fwd_fixed_s(self) -> np.ndarray:
        return np.array([la.fwd_fixed_s for la in self.layers], dtype=float)

    @cached_property
    def bwd_fixed_s(self) -> np.ndarray:
        return np.array([la.bwd_fixed_s for la in self.layers], dtype=float)

    @cached_property
    def activation_bytes(self) -> np.ndarray:
        return np.array([la.activation_bytes for la in self.layers], dtype=float)

    @cached_property
    def param_bytes(self) -> np.ndarray:
        return np.array([la.param_bytes for la in self.layers], dtype=float)

    def fwd_s_at(self, batch: float) -> np.ndarray:
        """Per-layer forward time at `batch` samples."""
        return self.fwd_fixed_s + (self.fwd_s - self.fwd_fixed_s) * (batch / self.batch_size)

    def bwd_s_at(self, batch: float) -> np.ndarray:
        """Per-layer backward time at `batch` samples."""
        return self.bwd_fixed_s + (self.bwd_s - self.bwd_fixed_s) * (batch / self.batch_size)

    def activation_bytes_at(self, batch: float) -> np.ndarray:
        return self.activation_bytes * (batch / self.batch_size)

    @property
    def total_param_bytes(self) -> float:
        return float(self.param_bytes.sum())

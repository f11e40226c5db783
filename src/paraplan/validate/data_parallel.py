"""Data-parallel gradient synchronisation over one contiguous gradient buffer.

Every parameter's gradient is a view into one flat buffer laid out layer by layer
(as DDP's buckets and Megatron's grad buffer do), so backward accumulates straight
into it and no copy is needed before communication:
- after backward (`dp`): one all-reduce of the whole buffer;
- overlapped (`dp_overlap`): one asynchronous all-reduce per layer, started the
  moment backward has produced that layer's last gradient; `wait()` blocks until all
  have finished.
Each rank's loss is divided by the world size beforehand, so summing (the
all-reduce's operation) gives the gradient of the whole batch's mean loss.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import nn


class GradientBuffer:
    """One flat gradient buffer for `layers`' parameters, in layer order."""

    def __init__(self, layers: Sequence[nn.Module], overlap: bool, group=None):
        self.group = group
        self.overlap = overlap
        per_layer = [[p for p in layer.parameters() if p.requires_grad] for layer in layers]
        total = sum(p.numel() for ps in per_layer for p in ps)
        first = next(p for ps in per_layer for p in ps)
        self.flat = torch.zeros(total, dtype=first.dtype, device=first.device)
        self.params: list[nn.Parameter] = []
        self.layer_slices: list[torch.Tensor] = []
        self._remaining: list[int] = []
        self._layer_of: dict[int, int] = {}
        offset = 0
        for index, params in enumerate(per_layer):
            start = offset
            for p in params:
                p.grad = self.flat[offset : offset + p.numel()].view_as(p)
                self.params.append(p)
                self._layer_of[id(p)] = index
                offset += p.numel()
            self.layer_slices.append(self.flat[start:offset])
            self._remaining.append(len(params))
        self._pending = list(self._remaining)
        self._works: list = []
        self._handles = (
            [p.register_post_accumulate_grad_hook(self._ready) for p in self.params] if overlap else []
        )

    def _ready(self, param: nn.Parameter) -> None:
        index = self._layer_of[id(param)]
        self._pending[index] -= 1
        if self._pending[index] == 0 and self.layer_slices[index].numel():
            self._works.append(dist.all_reduce(self.layer_slices[index], group=self.group, async_op=True))

    def synchronise(self) -> None:
        """After backward: wait for the overlapped all-reduces, or run the one all-reduce."""
        if self.overlap:
            for work in self._works:
                work.wait()
            self._works.clear()
        else:
            dist.all_reduce(self.flat, group=self.group)

    def zero(self) -> None:
        """Clear the gradients for the next step (the views stay in place)."""
        self.flat.zero_()
        self._pending = list(self._remaining)

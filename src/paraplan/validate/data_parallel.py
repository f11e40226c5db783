"""Data-parallel gradient synchronisation: after backward, or overlapped with it.

Each rank's loss is divided by the world size beforehand, so summing the gradients
(the all-reduce's own operation) gives the gradient of the whole batch's mean loss
without another pass over the gradients.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist


def allreduce_gradients(params: Iterable[torch.nn.Parameter], group=None) -> None:
    """One all-reduce per gradient after backward has finished (no overlap)."""
    for p in params:
        if p.grad is not None:
            dist.all_reduce(p.grad, group=group)


class OverlappedGradientSync:
    """Starts an asynchronous all-reduce of each gradient the moment backward has
    accumulated it, so communication runs while backward computes the earlier layers;
    `wait()` after backward blocks until every reduction has finished."""

    def __init__(self, params: Iterable[torch.nn.Parameter], group=None):
        self.group = group
        self._works: list = []
        self._handles = [
            p.register_post_accumulate_grad_hook(self._launch) for p in params if p.requires_grad
        ]

    def _launch(self, param: torch.nn.Parameter) -> None:
        self._works.append(dist.all_reduce(param.grad, group=self.group, async_op=True))

    def wait(self) -> None:
        for work in self._works:
            work.wait()
        self._works.clear()

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

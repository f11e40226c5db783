"""Megatron-style tensor parallelism over a process group.

A pair of linear layers A (in -> h) and B (h -> out) with element-wise functions
after each is split so that rank r holds rows r of A (column-parallel: its share of
the h outputs) and the matching columns of B (row-parallel). Forward: every rank
computes its share of h and a partial B output; one all-reduce sums the partials.
Backward: the partial input gradients of A are summed by one all-reduce (skipped by
autograd when the pair's input needs no gradient, e.g. the data itself). Biases of
B and everything outside the pairs are replicated and need no communication,
because every rank sees the full output.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import nn

from paraplan.core import StrategyError

# Functions that act element by element, so they commute with a split of features.
_ELEMENTWISE = (nn.ReLU, nn.GELU, nn.Tanh, nn.Sigmoid, nn.SiLU, nn.Identity, nn.Dropout)


class _CopyToShards(torch.autograd.Function):
    """Forward: identity. Backward: all-reduce (each shard holds a partial gradient)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group) -> torch.Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _ReduceFromShards(torch.autograd.Function):
    """Forward: all-reduce the partial sums. Backward: identity."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group) -> torch.Tensor:
        x = x.contiguous()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, None


def copy_to_shards(x: torch.Tensor, group=None) -> torch.Tensor:
    return _CopyToShards.apply(x, group)


def reduce_from_shards(x: torch.Tensor, group=None) -> torch.Tensor:
    return _ReduceFromShards.apply(x, group)


def split_linear_layer(layer: nn.Module) -> tuple[nn.Linear, list[nn.Module]] | None:
    """A layer that is one `nn.Linear` followed by element-wise functions, as
    (linear, functions); None when the layer has any other shape."""
    if isinstance(layer, nn.Linear):
        return layer, []
    if isinstance(layer, nn.Sequential) and len(layer) >= 1 and isinstance(layer[0], nn.Linear):
        rest = list(layer)[1:]
        if all(isinstance(m, _ELEMENTWISE) for m in rest):
            return layer[0], rest
    return None


def _shard(full: torch.Tensor, dim: int, rank: int, world: int) -> nn.Parameter:
    size = full.shape[dim]
    if size % world:
        raise StrategyError(f"cannot split a dimension of {size} features over {world} ranks evenly")
    return nn.Parameter(full.detach().chunk(world, dim=dim)[rank].clone())


class ParallelLinearPair(nn.Module):
    """Rank `rank`'s shard of the pair (A, fa..., B, fb...)."""

    def __init__(self, first: nn.Module, second: nn.Module, rank: int, world: int, group=None):
        super().__init__()
        a = split_linear_layer(first)
        b = split_linear_layer(second)
        if a is None or b is None:
            raise StrategyError("a tensor-parallel pair needs two layers of the form Linear + element-wise")
        lin_a, self.post_a = a[0], nn.Sequential(*a[1])
        lin_b, self.post_b = b[0], nn.Sequential(*b[1])
        self.group = group
        self.weight_a = _shard(lin_a.weight, 0, rank, world)  # (h / world, in)
        self.bias_a = _shard(lin_a.bias, 0, rank, world) if lin_a.bias is not None else None
        self.weight_b = _shard(lin_b.weight, 1, rank, world)  # (out, h / world)
        self.bias_b = nn.Parameter(lin_b.bias.detach().clone()) if lin_b.bias is not None else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = copy_to_shards(x, self.group)
        h = self.post_a(nn.functional.linear(x, self.weight_a, self.bias_a))
        y = reduce_from_shards(nn.functional.linear(h, self.weight_b), self.group)
        if self.bias_b is not None:
            y = y + self.bias_b
        return self.post_b(y)


def tensor_parallel_layers(
    layers: Sequence[nn.Module], rank: int, world: int, group=None
) -> list[nn.Module]:
    """Rank `rank`'s model: consecutive Linear layers paired and split; a layer that
    cannot be paired (an odd last one, or another kind) stays replicated. Modules
    with their own `tensor_parallel(rank, world, group)` method (e.g. transformer
    blocks) split themselves."""
    out: list[nn.Module] = []
    i = 0
    split_any = False
    while i < len(layers):
        layer = layers[i]
        own = getattr(layer, "tensor_parallel", None)
        if callable(own):
            out.append(own(rank, world, group))
            split_any = True
            i += 1
            continue
        if (
            i + 1 < len(layers)
            and split_linear_layer(layer) is not None
            and split_linear_layer(layers[i + 1]) is not None
        ):
            out.append(ParallelLinearPair(layer, layers[i + 1], rank, world, group))
            split_any = True
            i += 2
            continue
        out.append(layer)
        i += 1
    if not split_any:
        raise StrategyError("tensor parallelism found no layer pair to split in this model")
    return out


def pair_count(layers: Sequence[nn.Module]) -> int:
    """How many Linear pairs `tensor_parallel_layers` splits (for the prediction)."""
    count, i = 0, 0
    while i < len(layers):
        if (
            i + 1 < len(layers)
            and split_linear_layer(layers[i]) is not None
            and split_linear_layer(layers[i + 1]) is not None
        ):
            count += 1
            i += 2
        else:
            i += 1
    return count

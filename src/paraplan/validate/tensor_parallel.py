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

import copy
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import nn

from paraplan.core import StrategyError

if TYPE_CHECKING:
    from paraplan.profile.models import DecoderBlock

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
    from paraplan.profile.models import LinearReLU

    if isinstance(layer, nn.Linear):
        return layer, []
    if isinstance(layer, LinearReLU):
        return layer.linear, [nn.ReLU()]
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


class ParallelDecoderBlock(nn.Module):
    """Rank `rank`'s shard of a pre-norm transformer block (`profile.models.DecoderBlock`):
    attention split by heads (q, k, v column-parallel, output projection
    row-parallel) and the 4x MLP as a linear pair; two all-reduces in forward (after
    the projection and after fc2) and two in backward (into each LayerNorm's output)."""

    def __init__(self, block: DecoderBlock, rank: int, world: int, group=None):
        super().__init__()
        hidden = block.proj.weight.shape[0]
        if block.heads % world:
            raise StrategyError(f"{block.heads} attention heads do not split over {world} ranks")
        self.group = group
        self.heads: int = block.heads // world
        self.ln1: nn.LayerNorm = copy.deepcopy(block.ln1)
        self.ln2: nn.LayerNorm = copy.deepcopy(block.ln2)
        # q, k and v each keep this rank's heads
        qkv_w = block.qkv.weight.detach().split(hidden, dim=0)
        qkv_b = block.qkv.bias.detach().split(hidden, dim=0)
        self.qkv_weight = nn.Parameter(torch.cat([w.chunk(world, 0)[rank] for w in qkv_w]).clone())
        self.qkv_bias = nn.Parameter(torch.cat([b.chunk(world, 0)[rank] for b in qkv_b]).clone())
        self.proj_weight = _shard(block.proj.weight, 1, rank, world)
        self.proj_bias = nn.Parameter(block.proj.bias.detach().clone())
        self.fc1_weight = _shard(block.fc1.weight, 0, rank, world)
        self.fc1_bias = _shard(block.fc1.bias, 0, rank, world)
        self.fc2_weight = _shard(block.fc2.weight, 1, rank, world)
        self.fc2_bias = nn.Parameter(block.fc2.bias.detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        h = copy_to_shards(self.ln1(x), self.group)
        q, k, v = nn.functional.linear(h, self.qkv_weight, self.qkv_bias).chunk(3, dim=-1)
        q, k, v = (t.view(b, s, self.heads, -1).transpose(1, 2) for t in (q, k, v))
        attn = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        attn = attn.transpose(1, 2).reshape(b, s, -1)
        x = x + reduce_from_shards(nn.functional.linear(attn, self.proj_weight), self.group) + self.proj_bias
        h = copy_to_shards(self.ln2(x), self.group)
        h = nn.functional.gelu(nn.functional.linear(h, self.fc1_weight, self.fc1_bias))
        return x + reduce_from_shards(nn.functional.linear(h, self.fc2_weight), self.group) + self.fc2_bias


def tensor_parallel_layers(
    layers: Sequence[nn.Module], rank: int, world: int, group=None
) -> list[nn.Module]:
    """Rank `rank`'s model: consecutive Linear layers paired and split, transformer
    blocks split by heads and MLP features; other layers (an odd last Linear,
    embeddings, heads) stay replicated."""
    from paraplan.profile.models import DecoderBlock

    out: list[nn.Module] = []
    i = 0
    split_any = False
    while i < len(layers):
        layer = layers[i]
        if isinstance(layer, DecoderBlock):
            out.append(ParallelDecoderBlock(layer, rank, world, group))
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


def tp_split_layers(layers: Sequence[nn.Module]) -> list[bool]:
    """Per layer, whether `tensor_parallel_layers` splits it (both layers of a Linear
    pair, every transformer block) or keeps it whole on every rank."""
    from paraplan.profile.models import DecoderBlock

    split = [False] * len(layers)
    i = 0
    while i < len(layers):
        if isinstance(layers[i], DecoderBlock):
            split[i] = True
            i += 1
        elif (
            i + 1 < len(layers)
            and split_linear_layer(layers[i]) is not None
            and split_linear_layer(layers[i + 1]) is not None
        ):
            split[i] = split[i + 1] = True
            i += 2
        else:
            i += 1
    return split


def tp_allreduce_counts(layers: Sequence[nn.Module]) -> list[float]:
    """Per layer, how many activation all-reduces `tensor_parallel_layers` puts in
    forward (and as many in backward) after that layer's output: one on the second
    layer of each Linear pair, two on each transformer block, none elsewhere. The
    simulator's `tp_allreduces` takes this list."""
    from paraplan.profile.models import DecoderBlock

    counts = [0.0] * len(layers)
    i = 0
    while i < len(layers):
        if isinstance(layers[i], DecoderBlock):
            counts[i] = 2.0
            i += 1
        elif (
            i + 1 < len(layers)
            and split_linear_layer(layers[i]) is not None
            and split_linear_layer(layers[i + 1]) is not None
        ):
            counts[i + 1] = 1.0
            i += 2
        else:
            i += 1
    return counts

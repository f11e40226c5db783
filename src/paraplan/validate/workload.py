"""What the ranks train: a model as an ordered list of layers (the units a profile
times and a pipeline cuts at), synthetic inputs, and a loss.

Ranks are separate processes, so a workload travels as a `WorkloadSpec` (the
import path of a builder and its keyword arguments) and every rank builds its own
copy with the same seed: replicas start identical and the tensor-parallel shards
are cut from the same full weights.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from paraplan.core import ConfigError


@dataclass(frozen=True)
class Workload:
    """`layers` run in order; `make_batch(b, generator)` returns (input, target) for b
    samples; `loss(output, target)` is a scalar averaged over the samples."""

    name: str
    layers: Sequence[nn.Module]
    make_batch: Callable[[int, torch.Generator], tuple[torch.Tensor, torch.Tensor]]
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class WorkloadSpec:
    """`builder` is "package.module:function"; the function takes `kwargs` and returns
    a `Workload`. Picklable, so it can be handed to spawned ranks."""

    builder: str
    kwargs: dict = field(default_factory=dict)
    seed: int = 0

    def build(self) -> Workload:
        module_name, _, func_name = self.builder.partition(":")
        try:
            func = getattr(importlib.import_module(module_name), func_name)
        except (ImportError, AttributeError) as exc:
            raise ConfigError("model", f"cannot load workload builder '{self.builder}': {exc}") from None
        torch.manual_seed(self.seed)
        return func(**self.kwargs)


def mlp_workload(
    num_layers: int, input_dim: int, hidden_dim: int, output_dim: int, bias: bool = False
) -> Workload:
    """A plain MLP (Linear + ReLU per layer) for tests that need no profile models."""
    dims = [input_dim] + [hidden_dim] * (num_layers - 1) + [output_dim]
    layers = [nn.Sequential(nn.Linear(dims[i], dims[i + 1], bias=bias), nn.ReLU()) for i in range(num_layers)]

    def make_batch(batch: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randn(batch, input_dim, generator=gen), torch.randn(batch, output_dim, generator=gen)

    return Workload("mlp", layers, make_batch, nn.functional.mse_loss)

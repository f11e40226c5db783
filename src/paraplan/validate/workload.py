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


def profile_model_workload(model: str, settings: dict | None = None, seed: int = 0) -> Workload:
    """The profile stage's model (`paraplan.profile.models`), so the measured model is
    the profiled one, with a loss: mean squared error against random targets (mlp),
    cross-entropy against random tokens (gpt) or classes (resnet)."""
    from paraplan.profile.models import build_model
    from paraplan.profile.specs import GPTSpec, MLPSpec, make_spec

    spec = make_spec(model, settings or {})
    built = build_model(spec, seed=seed)
    cpu = torch.device("cpu")

    if isinstance(spec, MLPSpec):
        def make_batch(batch: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
            x = built.make_input(batch, cpu, torch.float32, gen)
            return x, torch.randn(batch, spec.output_dim, generator=gen)

        return Workload(model, list(built.layers), make_batch, nn.functional.mse_loss)

    if isinstance(spec, GPTSpec):
        def make_batch(batch: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
            tokens = built.make_input(batch, cpu, torch.float32, gen)
            return tokens, torch.randint(0, spec.vocab_size, (batch, spec.seq_length), generator=gen)

        def token_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
            return nn.functional.cross_entropy(logits.flatten(0, 1), target.flatten())

        return Workload(model, list(built.layers), make_batch, token_loss)

    def make_images(batch: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        x = built.make_input(batch, cpu, torch.float32, gen)
        return x, torch.randint(0, spec.num_classes, (batch,), generator=gen)

    return Workload(model, list(built.layers), make_images, nn.functional.cross_entropy)

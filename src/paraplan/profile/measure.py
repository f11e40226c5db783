"""The torch layer profiler: per-layer forward and backward times (median over
repeats), output activation and parameter bytes, and a whole-model step for checking.

Each layer runs on a detached copy of its predecessor's output, so its backward is timed
alone: the backward pass walks the layers in reverse, seeding each with the gradient
the next layer produced. The model's output is seeded with a fixed random gradient (no
loss layer). Layer 0's input needs no gradient (as on a pipeline's first stage).
GPU: CUDA events; CPU: `time.perf_counter` (monotonic). Parameter gradients are reset
to None before every iteration, as `zero_grad(set_to_none=True)` does in training.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from paraplan.profile.models import LayeredModel
from paraplan.profile.scaling import fixed_at_batch


@dataclass(frozen=True)
class LayerTimes:
    """One batch size: medians over `repeats` timed iterations."""

    batch_size: int
    fwd_s: np.ndarray
    bwd_s: np.ndarray
    activation_bytes: np.ndarray
    param_bytes: np.ndarray
    whole_step_s: float  # forward + backward of the whole model, no per-layer breaks

    @property
    def sum_vs_whole_rel_err(self) -> float:
        """(sum of per-layer fwd+bwd) / whole step - 1."""
        return float((self.fwd_s.sum() + self.bwd_s.sum()) / self.whole_step_s - 1.0)


@dataclass(frozen=True)
class ScaledTimes:
    """Several batch sizes, and what the profile CSV keeps (the largest batch + fixed parts)."""

    per_batch: tuple[LayerTimes, ...]
    fwd_fixed_s: np.ndarray
    bwd_fixed_s: np.ndarray

    @property
    def at_max(self) -> LayerTimes:
        return max(self.per_batch, key=lambda t: t.batch_size)


class _Clock:
    """Marks on one stream of work; `elapsed_s(a, b)` after `finish()`."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.marks: list = []

    def mark(self) -> int:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append(event)
        else:
            self.marks.append(time.perf_counter())
        return len(self.marks) - 1

    def finish(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def elapsed_s(self, a: int, b: int) -> float:
        if self.cuda:
            return self.marks[a].elapsed_time(self.marks[b]) / 1e3
        return self.marks[b] - self.marks[a]


def _tensor_bytes(out) -> int:
    if isinstance(out, torch.Tensor):
        return out.numel() * out.element_size()
    return sum(_tensor_bytes(o) for o in out)


def _clear_grads(model: LayeredModel) -> None:
    for p in model.layers.parameters():
        p.grad = None


def _layerwise_iteration(model: LayeredModel, x0: torch.Tensor, seed_grad: torch.Tensor,
                         device: torch.device) -> tuple[list[float], list[float]]:
    clock = _Clock(device)
    n = len(model.layers)
    inputs: list[torch.Tensor] = []
    outputs: list[torch.Tensor] = []
    fwd_marks: list[tuple[int, int]] = []
    x = x0
    for i, layer in enumerate(model.layers):
        if i > 0:
            x = outputs[-1].detach().requires_grad_(True)
        inputs.append(x)
        start = clock.mark()
        y = layer(x)
        fwd_marks.append((start, clock.mark()))
        outputs.append(y)
    bwd_marks: list[tuple[int, int]] = [(0, 0)] * n
    grad = seed_grad
    for i in range(n - 1, -1, -1):
        start = clock.mark()
        outputs[i].backward(grad)
        bwd_marks[i] = (start, clock.mark())
        if i > 0:  # layer 0's input is the data: no gradient
            passed = inputs[i].grad
            assert passed is not None  # inputs after layer 0 require grad
            grad = passed
    clock.finish()
    return [clock.elapsed_s(a, b) for a, b in fwd_marks], [clock.elapsed_s(a, b) for a, b in bwd_marks]


def _whole_iteration(model: LayeredModel, x0: torch.Tensor, seed_grad: torch.Tensor,
                     device: torch.device) -> float:
    clock = _Clock(device)
    start = clock.mark()
    model.forward(x0).backward(seed_grad)
    end = clock.mark()
    clock.finish()
    return clock.elapsed_s(start, end)


def _prepare(model: LayeredModel, batch: int, dev: torch.device, dtype: torch.dtype, seed: int):
    """Layer 0's input and the gradient seeded on the output, plus the bytes per layer."""
    gen = torch.Generator(device=dev).manual_seed(seed + batch)
    x0 = model.make_input(batch, dev, dtype, gen)
    act, params = [], []
    with torch.no_grad():
        x = x0
        for layer in model.layers:
            x = layer(x)
            act.append(_tensor_bytes(x))
            params.append(sum(p.numel() * p.element_size() for p in layer.parameters()))
    seed_grad = torch.randn(x.shape, device=dev, generator=gen).to(x.dtype)
    return x0, seed_grad, np.array(act, dtype=float), np.array(params, dtype=float)


def measure_batches(model: LayeredModel, batches: Sequence[int], repeats: int = 10, warmup: int = 3,
                    device: str = "cpu", dtype: torch.dtype = torch.float32, seed: int = 0) -> tuple[LayerTimes, ...]:
    """Time every layer's forward and backward at each batch size (medians).

    The batch sizes take turns within every repeat (and the per-layer and whole-model
    iterations alternate), so a burst of load from other jobs on a shared machine
    spreads over all of them instead of skewing one."""
    batches = sorted(set(int(b) for b in batches))
    if repeats < 1 or warmup < 0 or not batches or batches[0] < 1:
        raise ValueError("need batch sizes >= 1, repeats >= 1, warmup >= 0")
    dev = torch.device(device)
    model.layers.to(device=dev, dtype=dtype)
    model.layers.train()
    setups = {b: _prepare(model, b, dev, dtype, seed) for b in batches}
    fwd: dict[int, list] = {b: [] for b in batches}
    bwd: dict[int, list] = {b: [] for b in batches}
    whole: dict[int, list] = {b: [] for b in batches}
    for it in range(warmup + repeats):
        for b in batches:
            x0, seed_grad, _, _ = setups[b]
            _clear_grads(model)
            f, g = _layerwise_iteration(model, x0, seed_grad, dev)
            _clear_grads(model)
            w = _whole_iteration(model, x0, seed_grad, dev)
            if it >= warmup:
                fwd[b].append(f)
                bwd[b].append(g)
                whole[b].append(w)
    _clear_grads(model)
    return tuple(
        LayerTimes(
            batch_size=b,
            fwd_s=np.median(np.array(fwd[b]), axis=0),
            bwd_s=np.median(np.array(bwd[b]), axis=0),
            activation_bytes=setups[b][2],
            param_bytes=setups[b][3],
            whole_step_s=float(np.median(whole[b])),
        )
        for b in batches
    )


def measure_layers(model: LayeredModel, batch: int, repeats: int = 10, warmup: int = 3,
                   device: str = "cpu", dtype: torch.dtype = torch.float32, seed: int = 0) -> LayerTimes:
    """Time every layer's forward and backward at `batch` samples (medians)."""
    return measure_batches(model, [batch], repeats, warmup, device, dtype, seed)[0]


def measure_scaling(model: LayeredModel, batches: Sequence[int], repeats: int = 10, warmup: int = 3,
                    device: str = "cpu", dtype: torch.dtype = torch.float32) -> ScaledTimes:
    """`measure_batches`, plus the per-layer fixed parts of time(b) = fixed + per_sample x b
    (zero with a single batch size)."""
    per_batch = measure_batches(model, batches, repeats, warmup, device, dtype)
    sizes = [t.batch_size for t in per_batch]
    at_max = per_batch[-1]
    if len(per_batch) > 1:
        fwd_fixed = fixed_at_batch(sizes, np.array([t.fwd_s for t in per_batch]), at_max.fwd_s)
        bwd_fixed = fixed_at_batch(sizes, np.array([t.bwd_s for t in per_batch]), at_max.bwd_s)
    else:
        fwd_fixed = np.zeros_like(at_max.fwd_s)
        bwd_fixed = np.zeros_like(at_max.bwd_s)
    return ScaledTimes(per_batch=per_batch, fwd_fixed_s=fwd_fixed, bwd_fixed_s=bwd_fixed)

"""Layers whose attention differs from layer 0's: sliding-window layers beside full
ones (Gemma 3: five windowed layers, then a full one; GPT-OSS: alternating).

The step builder prices one transformer layer (layer 0) and multiplies it by the layers
of each virtual stage; this module adds, per virtual stage, what its layers' attention
cores cost beyond layer 0's: for each layer, its core's device time minus layer 0's
(negative where the stage holds fewer windowed layers than layer 0 is), forward,
backward and, when the core is recomputed (selective or full recomputation), the
recomputed forward. Only the fused kernel skips the keys outside the window (priced at
its ceilings' efficiency for rows of w keys, `layer_shape.kernel_seq_length`); the unfused path
masks the full score matrix, so its layers all cost the same. A window
changes neither activations (flash keeps per-row statistics; the unfused path keeps
the full scores) nor collectives.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from paraplan.core.run_settings import DTYPE_BYTES, RunSettings
from paraplan.core.transformer import TransformerModel
from paraplan.predict.device_model import DeviceEfficiency, DeviceSpeed, kernel_times_s
from paraplan.predict.layer_shape import _shape
from paraplan.predict.ops import Kernels, _attention_core_backward, _attention_core_forward, _Builder
from paraplan.predict.partial_recompute import PartialRecompute


def attention_core_kernels(model: TransformerModel, settings: RunSettings, layer: int) -> tuple[Kernels, Kernels]:
    """The forward and backward kernels of layer `layer`'s attention core alone (what
    a sliding window changes)."""
    x = _shape(model, settings, layer)
    gemm_bytes = DTYPE_BYTES[settings.dtype]
    forward, backward = _Builder(gemm_bytes), _Builder(gemm_bytes)
    _attention_core_forward(forward, model, x, settings.use_flash_attn)
    _attention_core_backward(backward, model, x, settings.use_flash_attn)
    return forward.build().kernels, backward.build().kernels


@dataclass(frozen=True, eq=False)
class AttentionMix:
    """Attention cores unlike layer 0's, and how many of each every virtual stage holds."""

    reference: tuple[Kernels, Kernels]  # layer 0's core: forward, backward
    variants: tuple[tuple[Kernels, Kernels], ...]
    counts: np.ndarray  # [variant, virtual stage]
    recomputed: bool  # the backward recomputes the core's forward
    kept: np.ndarray | None = None  # [variant, virtual stage]: of `counts`, layers recomputing nothing (block)

    def added_s(self, speed: DeviceSpeed, eff: DeviceEfficiency) -> tuple[np.ndarray, np.ndarray]:
        """Per virtual stage: the device time its layers' cores add to (or take from)
        layers priced as layer 0, in the forward and in the backward (with the
        recomputed forward)."""
        ref_f, ref_b = (float(kernel_times_s(k, speed, eff).sum()) for k in self.reference)
        fwd = np.zeros(self.counts.shape[1])
        bwd = np.zeros(self.counts.shape[1])
        kept = self.kept if self.kept is not None else np.zeros_like(self.counts)
        for (kf, kb), counts, whole in zip(self.variants, self.counts, kept, strict=True):
            df = float(kernel_times_s(kf, speed, eff).sum()) - ref_f
            db = float(kernel_times_s(kb, speed, eff).sum()) - ref_b
            fwd += counts * df
            bwd += counts * db + ((counts - whole) * df if self.recomputed else 0.0)
        return fwd, bwd


def attention_mix(model: TransformerModel, settings: RunSettings, layers_per_vstage: np.ndarray,
                  recompute: PartialRecompute | None = None) -> AttentionMix | None:
    """The attention cores that differ from layer 0's (None when every layer's is
    alike: no window, or the unfused attention path); `layers_per_vstage` in virtual
    stage order (consecutive layer ranges); `recompute`: the layers that recompute
    nothing under `recompute_method block` (the last ones of each virtual stage)."""
    windowed = model.windowed_layers
    if not settings.use_flash_attn or len(set(windowed)) < 2 or model.window_size >= model.seq_length:
        return None
    other = next(i for i, w in enumerate(windowed) if w != windowed[0])
    stage_of_layer = np.repeat(np.arange(len(layers_per_vstage)), layers_per_vstage)
    unlike = np.array([w != windowed[0] for w in windowed])
    counts = np.bincount(stage_of_layer[unlike], minlength=len(layers_per_vstage)).astype(float)[None, :]
    kept = None
    if recompute is not None and recompute.kept.any():  # a layer past the first N of its virtual stage
        position = np.arange(len(windowed)) - np.repeat(np.cumsum(layers_per_vstage) - layers_per_vstage,
                                                       layers_per_vstage)
        whole = unlike & (position >= recompute.num_layers)
        kept = np.bincount(stage_of_layer[whole], minlength=len(layers_per_vstage)).astype(float)[None, :]
    return AttentionMix(
        reference=attention_core_kernels(model, settings, 0),
        variants=(attention_core_kernels(model, settings, other),),
        counts=counts,
        recomputed=settings.recompute_granularity != "none",
        kept=kept,
    )

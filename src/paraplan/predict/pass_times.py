"""The passes of a run's structure and their times: which pass is which (`Pass`, the
order of `RunStructure.passes`: a transformer layer's forward, recomputation and
backward, the embedding's and the last stage's forward and backward, then a
mixture-of-experts layer's three), and each pass's device and host time once its kernels
are priced (`pass_times`, with the weight-gradient kernels that ZB-H1 and DualPipe run
apart and a measured layer shape's time factor). `paraplan.predict.build` turns these
into each virtual stage's op times.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import TYPE_CHECKING

import numpy as np

from paraplan.predict.device_model import DeviceEfficiency

if TYPE_CHECKING:
    from paraplan.predict.build import RunStructure
    from paraplan.predict.kernel_batch import PassSums


class Pass(IntEnum):
    """A pass of a run's structure: its index in `RunStructure.passes` and `PassTimes`."""

    LAYER_FWD = 0
    LAYER_RECOMPUTE = 1
    LAYER_BWD = 2
    EMBEDDING_FWD = 3
    EMBEDDING_BWD = 4
    HEAD_FWD = 5
    HEAD_BWD = 6
    MOE_LAYER_FWD = 7
    """The mixture-of-experts layer's passes: a MoE model's structure only."""
    MOE_LAYER_RECOMPUTE = 8
    MOE_LAYER_BWD = 9


PASSES: tuple[str, ...] = tuple(p.name.lower() for p in Pass if p < Pass.MOE_LAYER_FWD)
MOE_PASSES: tuple[str, ...] = tuple(p.name.lower() for p in Pass if p >= Pass.MOE_LAYER_FWD)
"""A mixture-of-experts model's structure has these three after `PASSES`."""

LAYER_PASSES = (Pass.LAYER_FWD, Pass.LAYER_RECOMPUTE, Pass.LAYER_BWD)  # the transformer layer's passes
MOE_LAYER_PASSES = (Pass.MOE_LAYER_FWD, Pass.MOE_LAYER_RECOMPUTE, Pass.MOE_LAYER_BWD)  # a MoE model's structure


@dataclass(frozen=True)
class PassTimes:
    """Each pass's device time (kernels and collectives) and host issue time, and the
    weight-gradient kernels of the layer and head backward (ZB-H1 splits them off)."""

    device_s: list[float]  # in PASSES (then MOE_PASSES) order
    host_s: list[float]
    layer_weight_grad_s: float
    head_weight_grad_s: float
    moe_layer_weight_grad_s: float = 0.0


def pass_times(structure: RunStructure, kernel_s: list[np.ndarray], eff: DeviceEfficiency,
               sums: PassSums | None = None) -> PassTimes:
    """The passes' times given their kernels' times (and, when already summed, their
    sums: `KernelBatch.priced`); a layer shape with a measured
    factor (`DeviceEfficiency.layer_time_factors`) has its layer passes (device and
    host time alike, so the whole op) scaled by it."""
    moe = len(structure.passes) > len(PASSES)
    if sums is None:
        dev = [c.device_s(k, eff) for c, k in zip(structure.passes, kernel_s, strict=True)]
        layer_wgt = structure.passes[Pass.LAYER_BWD].weight_grad_s(kernel_s[Pass.LAYER_BWD])
        moe_wgt = structure.passes[Pass.MOE_LAYER_BWD].weight_grad_s(kernel_s[Pass.MOE_LAYER_BWD]) if moe else 0.0
        head_wgt = structure.passes[Pass.HEAD_BWD].weight_grad_s(kernel_s[Pass.HEAD_BWD])
    else:
        dev = [c.device_s(k, eff, total) for c, k, total in zip(structure.passes, kernel_s, sums.kernel_s,
                                                                 strict=True)]
        layer_wgt = sums.weight_grad_s[Pass.LAYER_BWD]
        moe_wgt = sums.weight_grad_s[Pass.MOE_LAYER_BWD] if moe else 0.0
        head_wgt = sums.weight_grad_s[Pass.HEAD_BWD]
    host = [c.host_s(eff) for c in structure.passes]
    factor = eff.layer_time_factors.factor(structure.layer_key)
    if factor != 1.0:
        for j in LAYER_PASSES + (MOE_LAYER_PASSES if moe else ()):
            dev[j] *= factor
            host[j] *= factor
        layer_wgt *= factor
        moe_wgt *= factor
    return PassTimes(dev, host, layer_wgt, head_wgt, moe_wgt)

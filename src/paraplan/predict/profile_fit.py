"""Calibrate the device model from a layer profile of the profile stage (a GPT model
timed layer by layer, on a GPU with CUDA events or on this machine's CPU), instead of
whole measured iterations.

The profiled model (`paraplan.profile.models`, model `gpt`) is a pre-norm decoder
block: LayerNorm, fused QKV, causal scaled-dot-product attention (a fused kernel),
output projection, residual, LayerNorm, 4h GeLU MLP, residual; no dropout. Each of
its transformer blocks was timed alone, forward and backward, at every batch size
of the profile's `batches`; the profile stores each layer's time at its batch
size and the batch-independent part (time(b) = fixed + (t - fixed) b / batch).
Every (block, batch, pass) is one measurement; the device model predicts it as one
op: the block's kernels on the device against the host's time to issue them (the
smooth maximum of `paraplan.predict.device_model`). The embedding and the head are
left out: the profile's head has no loss, the predictor's does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np

from paraplan.core.cluster import Cluster
from paraplan.core.comm import CommModel
from paraplan.core.errors import InputFileError
from paraplan.core.profile import ModelProfile
from paraplan.core.run_settings import RunSettings
from paraplan.core.transformer import TransformerModel
from paraplan.predict.build import PassCost, kernel_times_by_pass, run_structure
from paraplan.predict.device_model import DeviceEfficiency, host_bound_s

PROFILE_DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
GPT_SETTINGS = ("num_layers", "hidden_size", "num_attention_heads", "seq_length", "vocab_size")
"""What `paraplan profile --model gpt` writes into meta model_settings (Megatron-LM's names)."""
LEGACY_SETTINGS = {"layers": "num_layers", "hidden": "hidden_size", "heads": "num_attention_heads",
                   "seq_len": "seq_length", "vocab": "vocab_size"}
"""The names profiles written before the profile stage took Megatron-LM's names used."""


def profiled_model(profile: ModelProfile, source: str) -> tuple[TransformerModel, str]:
    """The transformer a `gpt` profile measured, and its dtype in run-table terms."""
    meta = dict(profile.meta)
    settings = meta.get("model_settings")
    if meta.get("model") != "gpt" or not isinstance(settings, dict):
        raise InputFileError(source, "a calibration profile must be a `paraplan profile --model gpt` profile "
                             f"(its meta names model '{meta.get('model')}')")
    dtype = PROFILE_DTYPES.get(str(meta.get("dtype")))
    if dtype is None:
        raise InputFileError(source, f"meta dtype '{meta.get('dtype')}': expected one of {', '.join(PROFILE_DTYPES)}")
    settings = {LEGACY_SETTINGS.get(k, k): v for k, v in settings.items()}
    try:
        model = TransformerModel(
            name=profile.name, num_layers=int(settings["num_layers"]), hidden_size=int(settings["hidden_size"]),
            num_attention_heads=int(settings["num_attention_heads"]), seq_length=int(settings["seq_length"]),
            vocab_size=int(settings["vocab_size"]), untie_embeddings_and_output_weights=True, hidden_dropout=0.0,
            attention_dropout=0.0, make_vocab_size_divisible_by=1)
    except KeyError as exc:
        raise InputFileError(source, f"meta model_settings: missing {exc}; expected the gpt profile's settings "
                             f"({', '.join(GPT_SETTINGS)})") from None
    except (TypeError, ValueError) as exc:
        raise InputFileError(source, f"meta model_settings: {exc}") from None
    return model, dtype


@dataclass(frozen=True, eq=False)
class LayerTimes:
    """Measured block times of one profile, with the passes that predict them."""

    passes: tuple[PassCost, ...]  # per measurement
    structures: tuple  # the structures whose kernels the passes are
    pass_index: np.ndarray  # which pass of its structure (0: forward, 2: backward)
    structure_index: np.ndarray
    measured_s: np.ndarray
    labels: tuple[str, ...]  # "b<batch>" per measurement (cross-validation groups)

    def __len__(self) -> int:
        return int(self.measured_s.shape[0])

    def predict(self, eff: DeviceEfficiency, idx: np.ndarray) -> np.ndarray:
        kernel_s = kernel_times_by_pass(list(self.structures), eff)
        out = np.empty(len(idx))
        for k, i in enumerate(idx):
            s, j = int(self.structure_index[i]), int(self.pass_index[i])
            cost = self.structures[s].passes[j]
            out[k] = float(host_bound_s(cost.device_s(kernel_s[s][j], eff), cost.host_s(eff), eff))
        return out


def layer_times(profile: ModelProfile, cluster: Cluster, comm: CommModel, source: str) -> LayerTimes:
    """The block measurements of `profile` (see the module doc)."""
    model, dtype = profiled_model(profile, source)
    batches = [int(b) for b in cast(Sequence[int], profile.meta.get("batches", [profile.batch_size]))]
    blocks = [i for i, layer in enumerate(profile.layers) if layer.name.startswith("block")]
    if not blocks:
        raise InputFileError(source, "no transformer block layers (named block<i>) to calibrate on")
    structures, passes, pass_index, structure_index, measured, labels = [], [], [], [], [], []
    for b in batches:
        settings = RunSettings(micro_batch_size=b, global_batch_size=b, dtype=dtype,  # type: ignore[arg-type]
                               use_flash_attn=True)
        structures.append(run_structure(model, settings, cluster, comm))
        fwd = profile.fwd_s_at(b)
        bwd = profile.bwd_s_at(b)
        for layer in blocks:
            for j, seconds in ((0, fwd[layer]), (2, bwd[layer])):
                if seconds <= 0:
                    raise InputFileError(source, f"layer {layer}: a time of {seconds} s at batch {b}", line=layer + 2)
                passes.append(structures[-1].passes[j])
                pass_index.append(j)
                structure_index.append(len(structures) - 1)
                measured.append(float(seconds))
                labels.append(f"b{b}")
    return LayerTimes(tuple(passes), tuple(structures), np.array(pass_index), np.array(structure_index),
                      np.array(measured), tuple(labels))

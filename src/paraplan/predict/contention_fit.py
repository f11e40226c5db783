"""The contention share of an overlapped tensor-parallel collective
(`DeviceEfficiency.comm_overlap_contention`), fitted on published per-layer times.

Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer
Models", arXiv 2205.05198), Table 4, times the forward and the backward pass of one
transformer layer of their 22B model (Table 3: h = 6144, 64 heads, s = 2048,
micro-batch 4, TP 8 on one DGX A100 node, Megatron-LM with the asynchronous backward
all-reduce, no flash attention) in five variants (sequence parallelism, full and
selective recomputation). `data/published/korthikanti2022_table4.csv`
holds the table.

In the model a layer's backward B(share) = B0 + share x O, where B0 is its time with
free overlap and O the sum over its overlapped collectives of min(collective, kernel
beside it) (`PassCost.comm_s`). Dividing by the layer's forward F (no overlapped
collective, so independent of the share) removes the device's absolute speed, which
this table cannot separate from the GEMM efficiency: the share is the least-squares
solution of B_i / F_i = (B0_i + share x O_i) / F_i over the rows, in closed form,
clipped to [0, 1].
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from paraplan.core.cluster import Cluster
from paraplan.core.comm import CommModel
from paraplan.core.run_settings import RunSettings
from paraplan.core.transformer import TransformerModel
from paraplan.predict.build import kernel_times_by_pass, run_structure
from paraplan.predict.device_model import DeviceEfficiency
from paraplan.predict.pass_times import LAYER_PASSES

TABLE4 = Path(__file__).resolve().parents[3] / "data/published/korthikanti2022_table4.csv"
MODEL_22B = TransformerModel("korthikanti-22b", num_layers=48, hidden_size=6144, num_attention_heads=64,
                             seq_length=2048, vocab_size=51200)
SETTINGS_22B = RunSettings(tensor_model_parallel_size=8, micro_batch_size=4, global_batch_size=4,
                           dtype="bf16", use_flash_attn=False)


@dataclass(frozen=True)
class LayerTimes:
    """Per row: the published forward and backward, and the model's F, B0 and O (seconds)."""

    experiment: tuple[str, ...]
    measured_forward_s: np.ndarray
    measured_backward_s: np.ndarray
    forward_s: np.ndarray
    backward_free_s: np.ndarray  # B0: overlapped collectives free
    overlapped_s: np.ndarray  # O: sum of min(collective, kernel beside it)

    def backward_s(self, share: float) -> np.ndarray:
        return self.backward_free_s + share * self.overlapped_s


def read_table4(path: Path = TABLE4) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def layer_times(cluster: Cluster, comm: CommModel, eff: DeviceEfficiency,
                rows: list[dict[str, str]] | None = None) -> LayerTimes:
    """The model's per-layer times of the 22B layer in each row's variant."""
    rows = read_table4() if rows is None else rows
    settings = [replace(SETTINGS_22B, sequence_parallel=r["sequence_parallel"] == "true",
                        recompute_granularity=r["recompute_granularity"]) for r in rows]  # type: ignore[arg-type]
    structures = [run_structure(MODEL_22B, s, cluster, comm) for s in settings]
    free = replace(eff, comm_overlap_contention=0.0)
    full = replace(eff, comm_overlap_contention=1.0)
    kernel_s = kernel_times_by_pass(structures, eff)
    fwd, b0, over = [], [], []
    fwd_pass, recompute_pass, bwd_pass = LAYER_PASSES
    for st, ks in zip(structures, kernel_s, strict=True):
        fwd.append(st.passes[fwd_pass].device_s(ks[fwd_pass], free))
        back = (recompute_pass, bwd_pass)
        b_free = sum(st.passes[j].device_s(ks[j], free) for j in back)
        b_full = sum(st.passes[j].device_s(ks[j], full) for j in back)
        b0.append(b_free)
        over.append(b_full - b_free)
    return LayerTimes(tuple(r["experiment"] for r in rows),
                      np.array([float(r["forward_ms"]) for r in rows]) / 1e3,
                      np.array([float(r["backward_ms"]) for r in rows]) / 1e3,
                      np.array(fwd), np.array(b0), np.array(over))


def fit_contention(times: LayerTimes) -> float:
    """Least-squares share on backward / forward (module doc), clipped to [0, 1]."""
    target = times.measured_backward_s / times.measured_forward_s - times.backward_free_s / times.forward_s
    x = times.overlapped_s / times.forward_s
    if not np.any(x > 0):
        return 0.0
    return float(np.clip(np.dot(x, target) / np.dot(x, x), 0.0, 1.0))

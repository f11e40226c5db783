"""The transformer planner's post-pass: settings that leave the model's mathematics as it
is but that the closed-form estimate does not price, tried on the best candidates of the
search and re-timed with the exact engine (`search.py`, `retime.py`).

- `tp_comm_overlap` (Transformer Engine's userbuffers: the tensor-parallel all-gathers
  and reduce-scatters beside the GEMMs around them) where Megatron-LM and Transformer
  Engine run it: TP > 1 with sequence parallelism (Megatron-LM's `arguments.py` asserts
  it), the TP group inside one NVLink node (Transformer Engine's requirement), on a
  device of compute capability 9.0 or newer (`userbuffers_multicast`);
- `overlap_moe_expert_parallel_comm` (Megatron-Core's combined 1F1B: one micro-batch's
  dispatch and combine beside another's compute) where Megatron-Core's
  `TransformerConfig` allows it: EP > 1, no full recomputation, no `moe` recompute
  module, no `moe_shared_expert_overlap`, a 16-bit model, at most one
  multi-token-prediction layer, and with pipelines the interleaved schedule (v > 1);
- `moe_shared_expert_overlap` (the shared experts beside the all-to-alls) for a model
  with shared experts and EP > 1, exclusive with the above (Megatron-Core);
- schedule `dualpipe` (DeepSeek-V3's DualPipe, deepseek-ai/DualPipe) on the fastest 1F1B
  candidates that DualPipe can run (`dualpipe_runs`: p even, M even, M >= 2p, the rules
  of `run_settings_checks.check_dualpipe_settings`) and whose memory with two stages per
  rank fits by estimate (`estimate.Estimates.dualpipe_peak_memory_bytes`).

- `recompute_method block` (Megatron-LM's: the first N layers of each model chunk fully
  recomputed, the others keeping their activations) on the best plans with full
  recomputation, for a few N below the chunk's layer count (`block_recompute_variants`):
  recomputing fewer layers is faster and holds more memory, so the exact engine keeps the
  fastest that fits.

Each is a flag a plan row carries (`output.py`), so `paraplan predict` on the row prices
what the planner priced.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np

from paraplan.core.cluster import Cluster, nvlink_multicast
from paraplan.core.errors import StrategyError
from paraplan.core.run_settings import RunSettings
from paraplan.core.transformer import TransformerModel
from paraplan.plan.transformer.space import SCHEDULES, Candidates, SearchSpace

DUALPIPE_CANDIDATES = 4
"""1F1B candidates of least estimated DualPipe time (`dualpipe_estimate_s`) re-timed as DualPipe."""
VARIANT_PLANS = 5
"""Best re-timed plans whose flag variants are re-timed (at least the plans answered)."""


def userbuffers_multicast(device_name: str) -> bool:
    """Transformer Engine's userbuffers use CUDA multicast on Hopper and Blackwell GPUs
    (`paraplan.core.cluster.MULTICAST_DEVICES`); older devices need `UB_SKIPMC=1` for a
    CUDA IPC fallback that Transformer Engine calls less performant, and paraplan has no
    measurement of it, so the planner does not offer `tp_comm_overlap` on them (`paraplan
    predict` still prices a row that sets it, as on Hopper)."""
    return nvlink_multicast(device_name)


def tp_comm_overlap_runs(s: RunSettings, cluster: Cluster) -> bool:
    """`tp_comm_overlap` can run with `s` on `cluster` (module doc)."""
    t = s.tensor_model_parallel_size
    return (t > 1 and s.sequence_parallel and t <= cluster.devices_per_node and cluster.devices_per_node % t == 0
            and userbuffers_multicast(cluster.device.name))


def _moe_overlap_base(s: RunSettings, model: TransformerModel) -> bool:
    """What both MoE overlaps need: MoE layers, EP > 1, the all-to-all or flex dispatcher,
    not DualPipe (which pairs its own passes)."""
    return (model.num_moe_layers > 0 and s.expert_model_parallel_size > 1
            and s.moe_token_dispatcher_type in ("alltoall", "flex") and s.pipeline_schedule != "dualpipe")


def a2a_overlap_runs(s: RunSettings, model: TransformerModel) -> bool:
    """`overlap_moe_expert_parallel_comm` can run with `s` (Megatron-Core's rules, module doc)."""
    return (_moe_overlap_base(s, model) and s.recompute_granularity != "full"
            and not (s.recompute_granularity == "selective" and "moe" in s.recompute_modules)
            and not s.moe_shared_expert_overlap and s.dtype != "fp32" and model.mtp_num_layers <= 1
            and (s.pipeline_model_parallel_size == 1 or s.virtual_pipeline_model_parallel_size > 1))


def shared_overlap_runs(s: RunSettings, model: TransformerModel) -> bool:
    """`moe_shared_expert_overlap` can run with `s` (shared experts, EP > 1, not with the
    all-to-all overlap, not with `shared_experts` recomputed)."""
    return (_moe_overlap_base(s, model) and model.moe_shared_expert_intermediate_size > 0
            and not s.overlap_moe_expert_parallel_comm
            and not (s.recompute_granularity == "selective" and "shared_experts" in s.recompute_modules))


def flag_variants(s: RunSettings, model: TransformerModel, cluster: Cluster, space: SearchSpace) -> list[RunSettings]:
    """`s` with every valid combination of the overlap flags the space allows, `s` itself
    left out: `tp_comm_overlap` on or off, and at most one of the two MoE overlaps."""
    tp = [x for x in space.tp_comm_overlap if not x or tp_comm_overlap_runs(s, cluster)]
    plain = replace(s, overlap_moe_expert_parallel_comm=False, moe_shared_expert_overlap=False)
    moe = [(False, False)]  # (overlap_moe_expert_parallel_comm, moe_shared_expert_overlap)
    if True in space.overlap_moe_expert_parallel_comm and a2a_overlap_runs(plain, model):
        moe.append((True, False))
    if True in space.moe_shared_expert_overlap and shared_overlap_runs(plain, model):
        moe.append((False, True))
    out = []
    for on, (a2a, shared) in itertools.product(tp, moe):
        variant = replace(plain, tp_comm_overlap=on, overlap_moe_expert_parallel_comm=a2a,
                          moe_shared_expert_overlap=shared)
        if variant != s and _runs(variant, model):
            out.append(variant)
    return out


BLOCK_SHARES: tuple[float, ...] = (0.25, 0.5, 0.75)
"""Shares of a chunk's layers a block recomputation variant recomputes (with one fewer
than all): few enough that the exact re-timing stays cheap."""


def block_recompute_variants(s: RunSettings, model: TransformerModel, space: SearchSpace) -> list[RunSettings]:
    """`s` (full recomputation of every layer) with only the first N layers of each model
    chunk recomputed, N a few shares of its largest chunk and one fewer than it."""
    if True not in space.recompute_block or s.recompute_granularity != "full" or s.recompute_method:
        return []
    most = max(s.layers_per_virtual_stage(model.num_layers))
    counts = sorted({max(1, round(most * share)) for share in BLOCK_SHARES} | {most - 1})
    out = []
    for n in counts:
        variant = replace(s, recompute_method="block", recompute_num_layers=n)
        if 1 <= n < most and _runs(variant, model):
            out.append(variant)
    return out


def dualpipe_runs(s: RunSettings) -> bool:
    """Schedule DualPipe can run `s` as paraplan prices it (`check_dualpipe_settings`;
    ZeRO-2's per-micro-batch gradient shards are not modelled with it either)."""
    p, m = s.pipeline_model_parallel_size, s.num_microbatches
    return (p >= 2 and p % 2 == 0 and m % 2 == 0 and m >= 2 * p and s.virtual_pipeline_model_parallel_size == 1
            and s.zero_stage < 2 and s.context_parallel_size == 1 and s.recompute_granularity != "full"
            and not s.moe_shared_expert_overlap and not s.overlap_moe_expert_parallel_comm)


def dualpipe_estimate_s(cand: Candidates, iteration_s: np.ndarray, bubble_fraction: np.ndarray) -> np.ndarray:
    """A candidate's estimated iteration as DualPipe, to order them: its 1F1B estimate less
    the part of its bubble DualPipe removes, (p/2 - 1) / (p - 1) of 1F1B's (p - 1)(F + B)
    left (DeepSeek-V3's Table 2, the pairs' and W's terms left out)."""
    p = cand.p.astype(float)
    kept = np.where(p > 1, (p / 2 - 1) / np.maximum(p - 1, 1), 1.0)
    return iteration_s * (1.0 - np.nan_to_num(bubble_fraction) * (1.0 - kept))


def dualpipe_settings(cand: Candidates, base: RunSettings, model: TransformerModel, fits: np.ndarray,
                      estimate_s: np.ndarray) -> list[tuple[int, RunSettings]]:
    """The `DUALPIPE_CANDIDATES` 1F1B candidates of least `estimate_s` (`dualpipe_estimate_s`)
    among those that fit by estimate (`fits`: as DualPipe, `estimate.Estimates`) and that
    DualPipe can run: (candidate index, its settings as DualPipe runs)."""
    one_f_one_b = SCHEDULES.index("1f1b")
    eligible = np.flatnonzero((cand.schedule == one_f_one_b) & (cand.p >= 2) & (cand.p % 2 == 0) & (cand.cp == 1)
                              & (cand.zero < 2) & fits & np.isfinite(estimate_s))
    out: list[tuple[int, RunSettings]] = []
    for i in eligible[np.argsort(estimate_s[eligible], kind="stable")].tolist():
        s = replace(cand.settings(int(i), base), schedule="dualpipe")
        if dualpipe_runs(s) and _runs(s, model):
            out.append((int(i), s))
            if len(out) == DUALPIPE_CANDIDATES:
                break
    return out


def _runs(s: RunSettings, model: TransformerModel) -> bool:
    try:
        s.check(model)
    except StrategyError:
        return False
    return True

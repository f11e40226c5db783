"""The layer table of the transformer planner's estimate (`estimate.py`): what a
layer costs depends only on (t, b, sequence parallelism, recomputation, c, EP, ETP),
so those few combinations are priced once with the exact device model
(`paraplan.predict.build`) on probe runs of one stage; a mixture-of-experts model's
layer is its mean layer (the share of MoE layers times the MoE layer, the rest dense)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from paraplan.core.cluster import Cluster
from paraplan.core.comm import CommModel
from paraplan.core.run_settings import RunSettings
from paraplan.core.transformer import TransformerModel
from paraplan.plan.transformer.experts import probe_data_parallel, probe_structures
from paraplan.plan.transformer.space import RECOMPUTE, Candidates
from paraplan.predict.build import kernel_times_by_pass, pass_times
from paraplan.predict.device_model import DeviceEfficiency
from paraplan.predict.moe_ops import moe_activation_bytes
from paraplan.predict.mtp_ops import last_stage_work
from paraplan.predict.ops import embedding_work, layer_activation_bytes


@dataclass(frozen=True, eq=False)
class LayerTable:
    """Per (t, b, sp, recompute, cp, EP, ETP): device and host time of a layer's forward and
    backward (with recomputation), of the embedding and head passes, the weight-grad
    part, and activation bytes; a mixture-of-experts model's layer is its mean layer
    (module doc)."""

    index: dict[tuple[int, ...], int]  # (t, b, sp, recompute, cp, EP, ETP)
    fwd_dev: np.ndarray
    fwd_host: np.ndarray
    bwd_dev: np.ndarray
    bwd_host: np.ndarray
    wgt_dev: np.ndarray
    emb_fwd: np.ndarray  # (dev, host) pairs
    emb_bwd: np.ndarray
    head_fwd: np.ndarray
    head_bwd: np.ndarray
    act_layer: np.ndarray
    act_full_layer: np.ndarray  # a layer's activations without recomputation (full recompute's working set)
    act_emb: np.ndarray
    act_head: np.ndarray


def layer_table(model: TransformerModel, cand: Candidates, base: RunSettings, cluster: Cluster, comm: CommModel,
                eff: DeviceEfficiency) -> LayerTable:
    keys = sorted(set(table_keys(cand)))
    # the probe's data-parallel size only has to let EP x ETP divide t x c x d
    probes = [replace(base, tensor_model_parallel_size=t, pipeline_model_parallel_size=1,
                      data_parallel_size=probe_data_parallel(t * c, ep * etp), micro_batch_size=b,
                      global_batch_size=b * probe_data_parallel(t * c, ep * etp),
                      virtual_pipeline_model_parallel_size=1,
                      schedule="", sequence_parallel=bool(sp), recompute_granularity=RECOMPUTE[rc], zero_stage=0,
                      use_distributed_optimizer=False, overlap_grad_reduce=False, overlap_param_gather=False,
                      context_parallel_size=c, cp_comm_type="p2p", expert_model_parallel_size=ep,
                      expert_tensor_parallel_size=etp)
              for t, b, sp, rc, c, ep, etp in keys]
    moe_share = model.num_moe_layers / model.num_layers
    structures = probe_structures(model, probes, cluster, comm)
    kernel_s = kernel_times_by_pass(structures, eff)
    n = len(keys)
    out = {k: np.zeros(n) for k in ("fd", "fh", "bd", "bh", "w", "al", "af", "ae", "ah")}
    pairs = {k: np.zeros((n, 2)) for k in ("ef", "eb", "hf", "hb")}
    # a dense layer's and the embedding's activations, once per (t, b, sp, recompute, c):
    # `layer_activation_bytes` and `embedding_work` read no expert setting
    dense: dict[tuple[int, ...], tuple[float, float, float]] = {}
    for i, (st, ks, s) in enumerate(zip(structures, kernel_s, probes, strict=True)):
        times = pass_times(st, ks, eff)
        dev, host = times.device_s, times.host_s
        out["fd"][i], out["fh"][i] = dev[0], host[0]
        out["bd"][i], out["bh"][i] = dev[1] + dev[2], host[1] + host[2]
        out["w"][i] = times.layer_weight_grad_s
        if moe_share:
            def mean(dense: float, moe: float) -> float:
                return (1.0 - moe_share) * dense + moe_share * moe
            out["fd"][i], out["fh"][i] = mean(dev[0], dev[7]), mean(host[0], host[7])
            out["bd"][i], out["bh"][i] = mean(dev[1] + dev[2], dev[8] + dev[9]), mean(host[1] + host[2],
                                                                                       host[8] + host[9])
            out["w"][i] = mean(times.layer_weight_grad_s, times.moe_layer_weight_grad_s)
        if st.attention_mix is not None:  # sliding windows: the mean layer's attention core, not layer 0's
            factor = eff.layer_time_factors.factor(st.layer_key)
            added_fwd, added_bwd = st.attention_mix.added_s(st.speed, eff)
            out["fd"][i] += factor * float(added_fwd.sum()) / model.num_layers
            out["bd"][i] += factor * float(added_bwd.sum()) / model.num_layers
        pairs["ef"][i] = dev[3], host[3]
        pairs["eb"][i] = dev[4], host[4]
        pairs["hf"][i] = dev[5], host[5]
        pairs["hb"][i] = dev[6], host[6]
        group = keys[i][:5]  # (t, b, sp, recompute, c): all the dense layer and embedding depend on
        if group not in dense:
            dense[group] = (layer_activation_bytes(model, s),
                            layer_activation_bytes(model, replace(s, recompute_granularity="none")),
                            embedding_work(model, s).activation_bytes)
        out["al"][i], out["af"][i], out["ae"][i] = dense[group]
        if moe_share:
            out["al"][i] = (1.0 - moe_share) * out["al"][i] + moe_share * moe_activation_bytes(model, s)
            out["af"][i] = max(out["af"][i], moe_activation_bytes(model, replace(s, recompute_granularity="none")))
        out["ah"][i] = last_stage_work(model, s).activation_bytes
    return LayerTable({k: i for i, k in enumerate(keys)}, out["fd"], out["fh"], out["bd"], out["bh"], out["w"],
                      pairs["ef"], pairs["eb"], pairs["hf"], pairs["hb"], out["al"], out["af"], out["ae"], out["ah"])


def table_keys(cand: Candidates) -> list[tuple[int, ...]]:
    return [(int(t), int(b), int(sp), int(rc), int(c), int(ep), int(etp)) for t, b, sp, rc, c, ep, etp in
            zip(cand.t, cand.b, cand.sp, cand.recompute, cand.cp, cand.ep, cand.etp, strict=True)]

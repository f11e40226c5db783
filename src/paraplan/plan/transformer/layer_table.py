"""The layer table of the transformer planner's estimate (`estimate.py`): what a
layer costs depends only on (t, b, sequence parallelism, recomputation, c, EP, ETP),
so those few combinations are priced once with the exact device model
(`paraplan.predict.build`) on probe runs of one stage. A mixture-of-experts model's
dense and MoE layers are priced apart (the `kind_*` columns: a stage's time reads its
own count of each, `stage_kinds`); its mean layer (the share of MoE layers times the
MoE layer, the rest dense) serves what reads a stage-independent layer (gradient
buckets, ZeRO-3 gathers)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from paraplan.core.cluster import Cluster
from paraplan.core.comm import CommModel
from paraplan.core.run_settings import RunSettings
from paraplan.core.transformer import TransformerModel
from paraplan.plan.transformer.experts import probe_data_parallel, probe_structures
from paraplan.plan.transformer.space import RECOMPUTE, Candidates
from paraplan.plan.transformer.unique_rows import unique_rows
from paraplan.predict.build import (
    RunStructure,
    kernel_times_by_pass,
)
from paraplan.predict.cp_memory import layer_cp_transient
from paraplan.predict.device_model import DeviceEfficiency
from paraplan.predict.edge_ops import embedding_work, head_work
from paraplan.predict.loss_ops import loss_transient_bytes
from paraplan.predict.moe_ops import moe_activation_bytes
from paraplan.predict.mtp_ops import last_stage_activation_bytes
from paraplan.predict.ops import layer_activation_bytes
from paraplan.predict.pass_times import LAYER_PASSES, MOE_LAYER_PASSES, Pass, PassTimes, pass_times
from paraplan.predict.variability import straggled

KIND_COLUMNS = ("kind_fwd_dev", "kind_fwd_host", "kind_bwd_dev", "kind_bwd_host", "kind_wgt_dev")


@dataclass(frozen=True, eq=False)
class LayerTable:
    """Per (t, b, sp, recompute, cp, EP, ETP): device and host time of a layer's forward and
    backward (with recomputation), of the embedding and head passes, a dense and a MoE
    layer's apart with their weight-grad part (`KIND_COLUMNS`), and activation bytes; the
    un-suffixed layer columns are a mixture-of-experts model's mean layer
    (module doc). The times are NaN on rows not priced (`activation_table`)."""

    index: dict[tuple[int, ...], int]  # (t, b, sp, recompute, cp, EP, ETP)
    fwd_dev: np.ndarray
    fwd_host: np.ndarray
    bwd_dev: np.ndarray
    bwd_host: np.ndarray
    emb_fwd: np.ndarray  # (dev, host) pairs
    emb_bwd: np.ndarray
    head_fwd: np.ndarray
    head_bwd: np.ndarray
    act_layer: np.ndarray
    act_full_layer: np.ndarray  # a layer's activations without recomputation (full recompute's working set)
    act_emb: np.ndarray
    act_head: np.ndarray
    loss_transient: np.ndarray  # the loss's bytes for a moment on the last stage (`loss_ops.loss_transient_bytes`)
    cp_forward: np.ndarray  # a layer's context-parallel attention buffers in a forward (`cp_memory.CpTransientBytes`)
    cp_backward: np.ndarray  # ... and in a backward (`backward_moment_bytes`: the recomputed forward's where larger)
    # (rows, 2): a dense layer's (column 0) and a MoE layer's (column 1; a dense model's: its dense layer)
    kind_fwd_dev: np.ndarray
    kind_fwd_host: np.ndarray
    kind_bwd_dev: np.ndarray
    kind_bwd_host: np.ndarray
    kind_wgt_dev: np.ndarray
    act_kind: np.ndarray  # (rows, 2): a dense and a MoE layer's activations (`act_layer`: their mean)
    probes: tuple[RunSettings, ...] = ()  # the one-stage run each row is priced on


def layer_table(model: TransformerModel, cand: Candidates, base: RunSettings, cluster: Cluster, comm: CommModel,
                eff: DeviceEfficiency) -> LayerTable:
    """Every row of the table, priced."""
    table = activation_table(model, cand, base)
    return priced(table, model, np.arange(len(table.probes)), cluster, comm, eff)


def activation_table(model: TransformerModel, cand: Candidates, base: RunSettings) -> LayerTable:
    """The rows the candidates need, with their activations (all a memory estimate
    reads) and no times yet (`priced`)."""
    keys, _ = table_keys(cand)
    # the probe's data-parallel size only has to let EP x ETP divide t x c x d
    probes = tuple(replace(base, tensor_model_parallel_size=t, pipeline_model_parallel_size=1,
                           data_parallel_size=probe_data_parallel(t * c, ep * etp), micro_batch_size=b,
                           global_batch_size=b * probe_data_parallel(t * c, ep * etp),
                           virtual_pipeline_model_parallel_size=1,
                           schedule="", sequence_parallel=bool(sp), recompute_granularity=RECOMPUTE[rc], zero_stage=0,
                           use_distributed_optimizer=False, overlap_grad_reduce=False, overlap_param_gather=False,
                           context_parallel_size=c, cp_comm_type="p2p", expert_model_parallel_size=ep,
                           expert_tensor_parallel_size=etp)
                   for t, b, sp, rc, c, ep, etp in keys)
    moe_share = model.num_moe_layers / model.num_layers
    n = len(keys)
    act = {k: np.zeros(n) for k in ("al", "af", "ae", "ah", "loss", "cpf", "cpb", "ad", "am")}
    # a dense layer's and the embedding's activations, once per (t, b, sp, recompute, c):
    # `layer_activation_bytes` and `embedding_work` read no expert setting
    # (and the LM head's); a MoE layer's once per settings (those that differ only in recomputation
    # share the one without it)
    dense: dict[tuple[int, ...], tuple[float, float, float, float]] = {}
    moe: dict[RunSettings, float] = {}

    def moe_bytes(s: RunSettings) -> float:
        if s not in moe:
            moe[s] = moe_activation_bytes(model, s)
        return moe[s]

    for i, s in enumerate(probes):
        group = keys[i][:5]
        if group not in dense:
            dense[group] = (layer_activation_bytes(model, s),
                            layer_activation_bytes(model, replace(s, recompute_granularity="none")),
                            embedding_work(model, s).activation_bytes, head_work(model, s).activation_bytes)
        act["al"][i], act["af"][i], act["ae"][i], head = dense[group]
        act["ad"][i] = act["am"][i] = act["al"][i]
        moe_layer = None
        if moe_share:
            moe_layer = act["am"][i] = moe_bytes(s)
            act["al"][i] = (1.0 - moe_share) * act["al"][i] + moe_share * moe_layer
            act["af"][i] = max(act["af"][i], moe_bytes(replace(s, recompute_granularity="none")))
        act["ah"][i] = last_stage_activation_bytes(model, s, head, moe_layer)
        act["loss"][i] = loss_transient_bytes(model, s)
        cp = layer_cp_transient(model, s)  # the probes' cp_comm_type is the candidates' (`space`)
        act["cpf"][i], act["cpb"][i] = cp.forward_bytes, cp.backward_moment_bytes
    nan, nan2 = np.full(n, np.nan), np.full((n, 2), np.nan)
    return LayerTable({k: i for i, k in enumerate(keys)}, nan, nan, nan, nan, nan2, nan2, nan2, nan2,
                      act["al"], act["af"], act["ae"], act["ah"], act["loss"], act["cpf"], act["cpb"],
                      nan2, nan2, nan2, nan2, nan2, np.stack([act["ad"], act["am"]], axis=1), probes)


def priced(table: LayerTable, model: TransformerModel, rows: np.ndarray, cluster: Cluster, comm: CommModel,
           eff: DeviceEfficiency, num_gpus: int | None = None) -> LayerTable:
    """`table` with the times of `rows` priced on their probes (the other rows as they were).
    `num_gpus`: the candidates' GPU count, whose slowest GPU sets the compute-bound time
    (`paraplan.predict.variability`; the probes themselves run a few GPUs); None: the probes'."""
    rows_list = [int(r) for r in rows]
    probes = [table.probes[r] for r in rows_list]
    structures = probe_structures(model, probes, cluster, comm)
    if num_gpus is not None:  # y3: the job's straggler factor, as the engine prices the candidate
        structures = [replace(st, speed=straggled(st.speed, cluster.device, num_gpus)) for st in structures]
    kernel_s = kernel_times_by_pass(structures, eff)
    out = {k: getattr(table, k).copy() for k in ("fwd_dev", "fwd_host", "bwd_dev", "bwd_host", "emb_fwd", "emb_bwd",
                                                  "head_fwd", "head_bwd", *KIND_COLUMNS)}
    for i, st, ks in zip(rows_list, structures, kernel_s, strict=True):
        _price_row(out, i, model, pass_times(st, ks, eff), st, eff)
    return replace(table, **out)


def _price_row(out: dict[str, np.ndarray], i: int, model: TransformerModel, times: PassTimes, st: RunStructure,
               eff: DeviceEfficiency) -> None:
    """Row i of the time columns from its probe's pass times."""
    moe_share = model.num_moe_layers / model.num_layers
    dev, host = times.device_s, times.host_s
    fwd, rec, bwd = LAYER_PASSES
    out["fwd_dev"][i], out["fwd_host"][i] = dev[fwd], host[fwd]
    out["bwd_dev"][i], out["bwd_host"][i] = dev[rec] + dev[bwd], host[rec] + host[bwd]
    kinds = {"kind_fwd_dev": (dev[fwd], dev[fwd]), "kind_fwd_host": (host[fwd], host[fwd]),
             "kind_bwd_dev": (dev[rec] + dev[bwd],) * 2, "kind_bwd_host": (host[rec] + host[bwd],) * 2,
             "kind_wgt_dev": (times.layer_weight_grad_s,) * 2}
    if moe_share:
        def mean(dense: float, moe: float) -> float:
            return (1.0 - moe_share) * dense + moe_share * moe
        mf, mr, mb = MOE_LAYER_PASSES
        kinds = {"kind_fwd_dev": (dev[fwd], dev[mf]), "kind_fwd_host": (host[fwd], host[mf]),
                 "kind_bwd_dev": (dev[rec] + dev[bwd], dev[mr] + dev[mb]),
                 "kind_bwd_host": (host[rec] + host[bwd], host[mr] + host[mb]),
                 "kind_wgt_dev": (times.layer_weight_grad_s, times.moe_layer_weight_grad_s)}
        out["fwd_dev"][i], out["fwd_host"][i] = mean(*kinds["kind_fwd_dev"]), mean(*kinds["kind_fwd_host"])
        out["bwd_dev"][i], out["bwd_host"][i] = mean(*kinds["kind_bwd_dev"]), mean(*kinds["kind_bwd_host"])
    for k, pair in kinds.items():
        out[k][i] = pair
    if st.attention_mix is not None:  # sliding windows: the mean layer's attention core, not layer 0's
        factor = eff.layer_time_factors.factor(st.layer_key)
        added_fwd, added_bwd = st.attention_mix.added_s(st.speed, eff)
        out["fwd_dev"][i] += factor * float(added_fwd.sum()) / model.num_layers
        out["bwd_dev"][i] += factor * float(added_bwd.sum()) / model.num_layers
        out["kind_fwd_dev"][i] += factor * float(added_fwd.sum()) / model.num_layers
        out["kind_bwd_dev"][i] += factor * float(added_bwd.sum()) / model.num_layers
    out["emb_fwd"][i] = dev[Pass.EMBEDDING_FWD], host[Pass.EMBEDDING_FWD]
    out["emb_bwd"][i] = dev[Pass.EMBEDDING_BWD], host[Pass.EMBEDDING_BWD]
    out["head_fwd"][i] = dev[Pass.HEAD_FWD], host[Pass.HEAD_FWD]
    out["head_bwd"][i] = dev[Pass.HEAD_BWD], host[Pass.HEAD_BWD]


def table_keys(cand: Candidates) -> tuple[list[tuple[int, ...]], np.ndarray]:
    """The distinct (t, b, sp, recompute, c, EP, ETP) of the candidates, sorted, and each
    candidate's index among them (vectorised: the planner has tens of thousands)."""
    cols = np.stack([cand.t, cand.b, cand.sp, cand.recompute, cand.cp, cand.ep, cand.etp], axis=1)
    unique, inverse = unique_rows(cols)
    return [tuple(int(x) for x in row) for row in unique.tolist()], inverse

"""Context-parallel attention's transient buffers (`paraplan.predict.cp_memory`) against
the closed forms read from PyTorch's `_templated_ring_attention` (late 2024) and
Transformer Engine's `AttnFuncWithCPAnd*` (d0067d0), and their place in a stage's
working set (`rank_state._Moments`)."""

from dataclasses import replace

import numpy as np
import pytest

from paraplan.core.run_settings import RunSettings
from paraplan.predict.cp_memory import CpTransientBytes, attention_recomputed, cp_transient, layer_cp_transient
from paraplan.predict.cp_ops import AttentionShape
from paraplan.predict.models import PRESETS
from paraplan.predict.rank_state import ActivationBytes, _Moments

# Llama 3.1 8B at torchtitan's CP 8 row: 262,144 tokens, 32 heads of 128, 8 key/value groups
B, S, HEADS, GROUPS, D, E = 1, 262144.0, 32.0, 8.0, 128.0, 2
N = B * S / 8 * HEADS * D  # the rank's query elements: 32,768 tokens x 32 heads x 128 = 134M


def shape(cp: int, compiled: bool = True, groups: float = GROUPS) -> AttentionShape:
    return AttentionShape(B, S, HEADS, groups, D, E, cp, compiled)


def test_torch_allgather_holds_every_ranks_keys_and_values_with_every_query_head():
    # repeat_kv: keys and values carry 32 heads, so m = n; gathered over 8 ranks: 2 x 2 x 134M x 8 = 4.3 GB
    got = cp_transient(shape(8), "torch_allgather")
    gathered = 2 * E * N * 8
    assert gathered == pytest.approx(4.295e9, rel=1e-3)
    assert got.forward_bytes == gathered + (E + 2 * 4) * N  # the fused merge: old and new fp32 result, the output
    # fp32 dQ, the fp32 dK/dV block received and the flat copy sent on, one call's dQ, dK, dV
    assert got.backward_bytes == gathered + 4 * N + 2 * 2 * 4 * N + E * 3 * N


def test_torch_eager_merges_and_alltoall_rotation():
    eager = cp_transient(shape(8, compiled=False), "torch_allgather")
    assert eager.forward_bytes == 2 * E * N * 8 + (E + 4 * 4) * N  # two fp32 temporaries beside the merge
    assert eager.backward_bytes == 2 * E * N * 8 + 4 * N + 3 * 2 * 4 * N + E * 3 * N  # _partial_update's block
    ring = cp_transient(shape(8), "torch_alltoall")
    assert ring.forward_bytes == 3 * 2 * E * N + (E + 2 * 4) * N  # the block in use, sent, received


def test_transformer_engine_p2p_keeps_every_step():
    # 8 query heads and 1 key/value group per tensor rank (Llama 3 70B at TP 8), CP 4 of 131,072 tokens
    x = AttentionShape(1, 131072.0, 8.0, 1.0, 128.0, 2, 4)
    n, m, rows = 32768 * 8 * 128, 32768 * 1 * 128, 32768 * 8
    got = cp_transient(x, "p2p")
    assert got.forward_bytes == 4 * (2 * 2 * m + 2 * n + 4 * rows)  # p2p_comm_buffers, out_per_step, lse per step
    assert got.backward_bytes == 3 * 2 * 2 * m + 2 * (n + 2 * m)  # two [2, kv] double buffers less dK/dV, one step


def test_transformer_engine_all_gather_and_a2a():
    x = AttentionShape(1, 131072.0, 8.0, 1.0, 128.0, 2, 4)
    n, m = 32768 * 8 * 128, 32768 * 1 * 128
    gathered = 2 * 2 * m * 4
    got = cp_transient(x, "all_gather")
    assert got.forward_bytes == gathered + max(2 * m * 4, 2 * 2 * n)
    assert got.backward_bytes == pytest.approx(2 * gathered + 9 / 8 * gathered + 2 * n)
    assert cp_transient(x, "a2a") == CpTransientBytes(2 * 2 * (n + 2 * m), 2 * 2 * n + 2 * (n + 2 * m))


def test_no_context_parallelism_no_transient():
    assert cp_transient(shape(1), "torch_allgather") == CpTransientBytes(0.0, 0.0)
    assert layer_cp_transient(PRESETS["llama3-8b"], RunSettings()) == CpTransientBytes(0.0, 0.0)


def test_layer_transient_takes_the_runs_shape():
    model = PRESETS["llama3-8b"]
    settings = RunSettings(context_parallel_size=8, cp_comm_type="torch_allgather", micro_batch_size=1,
                           global_batch_size=1, elementwise_kernels="fused")
    got = layer_cp_transient(replace(model, seq_length=262144), settings)
    assert got == cp_transient(shape(8), "torch_allgather")
    full = layer_cp_transient(replace(model, seq_length=262144), replace(settings, recompute_granularity="full"))
    assert full.recomputed and full.backward_moment_bytes == max(got.forward_bytes, got.backward_bytes)


def test_working_set_per_moment():
    acts = ActivationBytes(layer=1.0, moe_layer=None, embedding=0.0, head=0.0, recomputed_layer=5.0,
                           loss_transient=30.0, cp=CpTransientBytes(7.0, 11.0, recomputed=True))
    moments = _Moments(gathered=2.0, backward=3.0)
    has_layers = np.array([True, False, True])
    # forward: gathered + the attention's; the last chunk of the last stage: the larger of it and the loss
    # backward: its own + the recomputed layer's attention, the larger of its forward and backward
    got = moments.per_op(has_layers, acts, last_stage=True)
    assert got.tolist() == [[2 + 7, 2, 2 + 30], [3 + 11, 3, 3 + 11]]
    assert moments.per_op(has_layers, acts, last_stage=False)[0].tolist() == [9, 2, 9]
    unrecomputed = ActivationBytes(1.0, None, 0.0, 0.0, 0.0, 0.0, cp=CpTransientBytes(13.0, 11.0))
    assert moments.per_op(has_layers, unrecomputed, last_stage=False)[1].tolist() == [14, 3, 14]
    recomputed = ActivationBytes(1.0, None, 0.0, 0.0, 0.0, 0.0, cp=CpTransientBytes(13.0, 11.0, recomputed=True))
    assert moments.per_op(has_layers, recomputed, last_stage=False)[1].tolist() == [16, 3, 16]


@pytest.mark.parametrize(("settings", "recomputed"), [
    (RunSettings(recompute_granularity="full"), True),
    (RunSettings(recompute_granularity="selective"), True),  # Megatron's default modules: core_attn
    (RunSettings(recompute_granularity="selective", recompute_modules=("mlp",)), False),
    (RunSettings(recompute_granularity="selective", selective_ac_option="op"), False),  # flash outputs saved
    (RunSettings(), False),
])
def test_attention_forward_rerun_in_the_backward(settings, recomputed):
    assert attention_recomputed(settings) is recomputed

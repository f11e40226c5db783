"""The MoE router kernel by kernel (`paraplan.predict.moe_router`), counted from
Megatron-Core core_r0.15.0 (`router.py`, `moe_utils.py`) and Transformer Engine v2.9's
fused router; the refusals of `check_router`; the router columns of a run table."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from paraplan.core.errors import InputFileError, StrategyError
from paraplan.core.moe_router_settings import check_router
from paraplan.core.run_settings import RunSettings
from paraplan.predict.models import PRESETS
from paraplan.predict.moe_ops import moe_layer_work
from paraplan.predict.moe_router import (
    RouterShape,
    expert_bias_all_reduce_bytes,
    router_passes,
)
from paraplan.predict.runtable import read_run_table

T, E, K, H = 4096, 128, 8, 2048
QWEN = RouterShape(T, E, K, H, tp_cp=2, tp_dp_cp=16)
S = 8  # an index or a count (int64)


def router(**kw: object) -> RunSettings:
    return RunSettings(**kw)  # type: ignore[arg-type]


def test_qwen3_recipe_router_fused_forced_aux_loss():
    """Megatron-Bridge's Qwen3 MoE recipe (fusion, forced balancing, aux_loss 1e-3, bf16
    logits): forward = clone and normal_ of the logits, TE's fused top-k (reads the
    logits, writes probabilities, map and saved scores: T E (3b + 1)), the fused scores for
    the loss, the counts' sum, the fused loss, two tracker kernels; the counts all-reduced
    over TP x CP. Backward: the auto-scaler's two, the loss's, the scores', their sum into
    the logits' gradient, the top-k's."""
    s = router(moe_router_fusion=True, moe_router_force_load_balancing=True, moe_aux_loss_coeff=1e-3)
    fwd, bwd = router_passes(s, QWEN)
    b = 2
    assert fwd.kernel_bytes == (2 * T * E * b, T * E * b, T * E * (3 * b + 1), T * E * (3 * b + 1), T * E + E * S,
                                T * E * b + E * S, 8, 8)
    assert fwd.all_reduces == (("tp_cp", E * S),)
    assert bwd.kernel_bytes == (8, 8, T * E * b + E * S, 3 * T * E * b, 3 * T * E * b, T * E * (3 * b + 1))
    assert bwd.all_reduces == ()
    # TP x CP = 1: Megatron's reduce_from_tensor_model_parallel_region returns the counts as they are
    alone, _ = router_passes(s, RouterShape(T, E, K, H, tp_cp=1, tp_dp_cp=8))
    assert alone.all_reduces == () and alone.kernel_bytes == fwd.kernel_bytes


def test_megatron_default_router_is_pytorch_ops_without_a_loss():
    """Megatron's defaults (no fusion, softmax after top-k, aux_loss with coefficient 0:
    no loss): top-k, fp32 softmax of the k chosen and its cast back, then the dense
    probabilities (zeros, copy, scatter_) and routing map (zeros, int, copy, scatter_,
    bool): 11 kernels. Backward: the probabilities' gather, the cast, softmax's, top-k's
    zeros, copy and scatter_: 6."""
    fwd, bwd = router_passes(router(), QWEN)
    assert len(fwd.kernel_bytes) == 11 and fwd.all_reduces == ()
    assert fwd.kernel_bytes[:3] == (T * E * 2 + T * K * (2 + S), T * K * (2 + 4), T * K * (4 + 2))
    assert sum(fwd.kernel_bytes[3:]) == (T * E * 2 + 2 * T * E * 2 + T * K * (S + 4)  # probabilities
                                         + T * E * 2 + T * E * 6 + 8 * T * E + T * K * (S + 4) + 5 * T * E)  # map
    assert len(bwd.kernel_bytes) == 6


def test_fp32_routing_widens_logits_and_casts_the_gating_backward():
    """`moe_router_dtype fp32`: 4-byte logits (the softmax's output needs no cast back) and
    four casts around the gating GEMMs' backward (weight and input to fp32, both gradients
    back to 16 bits)."""
    fwd, bwd = router_passes(router(moe_router_dtype="fp32", moe_router_fusion=True), QWEN)
    assert fwd.kernel_bytes == (T * E * 13,)
    assert bwd.kernel_bytes == (T * E * 13, E * H * 6, T * H * 6, T * H * 6, E * H * 6)
    unfused, _ = router_passes(router(moe_router_dtype="fp32"), QWEN)
    assert len(unfused.kernel_bytes) == 10  # no cast back after the fp32 softmax


def test_deepseek_v3_recipe_router_expert_bias_groups_fused():
    """DeepSeek-V3 (sigmoid, expert bias, 8 groups of which 4, fp32, fusion, forced, no
    aux loss as its coefficient is 0): clone, normal_, one fused kernel reading the bias
    too, and the bias's count (sum) and its add into the layer's buffer."""
    s = router(moe_router_fusion=True, moe_router_force_load_balancing=True, moe_router_score_function="sigmoid",
               moe_router_enable_expert_bias=True, moe_router_dtype="fp32", moe_router_pre_softmax=True,
               moe_router_topk_scaling_factor=2.5, moe_router_load_balancing_type="seq_aux_loss")
    x = RouterShape(T, 256, 8, 7168, groups=(8, 4), tp_cp=2, tp_dp_cp=128)
    fwd, bwd = router_passes(s, x)
    assert fwd.kernel_bytes == (2 * T * 256 * 4, T * 256 * 4, T * 256 * 13 + 256 * 4, T * 256 + 256 * S,
                                256 * (4 + S + 4))
    assert fwd.all_reduces == ()
    assert len(bwd.kernel_bytes) == 5  # the fused top-k's backward and the four fp32 casts
    # once per iteration: 58 MoE layers over 8 stages -> a rank's layers' counts in fp32
    assert expert_bias_all_reduce_bytes(s, 8, 256) == 8 * 256 * 4
    assert expert_bias_all_reduce_bytes(router(), 8, 256) == 0.0


def test_group_limited_topk_unfused_is_ten_kernels():
    """`group_limited_topk`: top k/g per group, their sum, top g groups, zeros, scatter_,
    the mask's copy, bool, not, masked_fill, top-k: 10 kernels where plain top-k is one."""
    plain, _ = router_passes(router(), RouterShape(T, 256, 8, 7168))
    limited, limited_bwd = router_passes(router(), RouterShape(T, 256, 8, 7168, groups=(8, 4)))
    assert len(limited.kernel_bytes) - len(plain.kernel_bytes) == 9
    assert len(limited_bwd.kernel_bytes) == 7  # and masked_fill's backward


def test_seq_and_global_aux_loss():
    """seq_aux_loss: the loss divided by the batch (one kernel each way); global_aux_loss:
    counts all-reduced over TP x DP x CP, a running sum, a step count and an average."""
    base = dict(moe_router_fusion=True, moe_aux_loss_coeff=1e-3)
    aux, aux_b = router_passes(router(**base), QWEN)
    seq, seq_b = router_passes(router(moe_router_load_balancing_type="seq_aux_loss", **base), QWEN)
    glob, _ = router_passes(router(moe_router_load_balancing_type="global_aux_loss", **base), QWEN)
    assert (len(seq.kernel_bytes) - len(aux.kernel_bytes), len(seq_b.kernel_bytes) - len(aux_b.kernel_bytes)) == (1, 1)
    assert len(glob.kernel_bytes) - len(aux.kernel_bytes) == 3
    assert (seq.all_reduces, glob.all_reduces) == ((("tp_cp", E * S),), (("tp_dp_cp", E * S),))
    none, _ = router_passes(router(moe_router_load_balancing_type="none", moe_aux_loss_coeff=1e-3,
                                   moe_router_fusion=True), QWEN)
    assert none.kernel_bytes == (T * E * 7,)  # `none` computes no loss whatever the coefficient


def test_unfused_aux_loss_kernels():
    """Unfused softmax scores for the loss (fp32 softmax, top-k, its own routing map: 7),
    the counts' sum, the loss in four (sum over tokens, x counts, sum, x constant), two
    tracker kernels; backward: the scaler's two, x constant, x counts, the expanded copy,
    softmax's backward, the sum into the logits' gradient."""
    plain_f, plain_b = router_passes(router(), QWEN)
    fwd, bwd = router_passes(router(moe_aux_loss_coeff=1e-2), QWEN)
    assert len(fwd.kernel_bytes) - len(plain_f.kernel_bytes) == 7 + 1 + 4 + 2
    assert len(bwd.kernel_bytes) - len(plain_b.kernel_bytes) == 7


def test_z_loss_is_logsumexp_and_its_backward():
    """z-loss: ATen's logsumexp (amax, abs, eq, masked_fill_, sub, exp_, sum, log_, add_),
    square, mean, x coefficient and two tracker kernels forward; 9 backward."""
    plain_f, plain_b = router_passes(router(moe_router_fusion=True), QWEN)
    fwd, bwd = router_passes(router(moe_router_fusion=True, moe_z_loss_coeff=1e-3), QWEN)
    assert (len(fwd.kernel_bytes) - len(plain_f.kernel_bytes), len(bwd.kernel_bytes) - len(plain_b.kernel_bytes)) \
        == (14, 9)
    assert sum(fwd.kernel_bytes) - sum(plain_f.kernel_bytes) == pytest.approx(
        (1 + 2 + 2 + 1) * T * E * 2  # amax, sub, exp_, sum over the T x E logits
        + (1 + 2 + 1 + 2 + 1 + 1 + 2 + 3 + 2 + 1) * T * 2 + T + T  # the per-token ones (eq, masked_fill_: bools)
        + 2 + 2 * 2 + 2 * 2 + 3 * 2)  # mean's scalar, x coefficient, the tracker's two


def test_token_dropping_kernels():
    """`apply_router_token_dropping`: capacity = ceil(T k / E x factor) per expert;
    7 kernels (6 when padding: the mask is the map), one backward."""
    drop = RouterShape(T, E, K, H, capacity_factor=1.25)
    plain, _ = router_passes(router(moe_router_fusion=True), QWEN)
    fwd, bwd = router_passes(router(moe_router_fusion=True), drop)
    padded, _ = router_passes(router(moe_router_fusion=True), RouterShape(T, E, K, H, capacity_factor=1.25,
                                                                          pad_to_capacity=True))
    assert (len(fwd.kernel_bytes), len(padded.kernel_bytes), len(bwd.kernel_bytes)) == (8, 7, 2)
    capacity = math.ceil(T * K / E * 1.25)
    assert fwd.kernel_bytes[1] == T * E * 2 + capacity * E * (2 + S) and len(plain.kernel_bytes) == 1


@pytest.mark.parametrize(("kw", "message"), [
    ({"moe_router_load_balancing_type": "sinkhorn"}, "moe_router_load_balancing_type sinkhorn is not modelled"),
    ({"moe_router_dtype": "fp64"}, "moe_router_dtype fp64 is not modelled"),
    ({"moe_router_enable_expert_bias": True}, "moe_router_enable_expert_bias needs moe_router_score_function "
     "sigmoid (Megatron-Core: expert bias for aux-loss-free routing only supports sigmoid)"),
])
def test_refusals(kw, message):
    with pytest.raises(StrategyError, match=message.replace("(", r"\(").replace(")", r"\)")):
        router(**kw).check(PRESETS["qwen3-30b-a3b"])


def test_top1_softmax_needs_pre_softmax():
    top1 = PRESETS["llama4-scout"] if PRESETS["llama4-scout"].moe_router_topk == 1 else None
    assert top1 is not None
    with pytest.raises(StrategyError, match="moe_router_topk 1 with the softmax score function needs "
                                            "moe_router_pre_softmax"):
        check_router(router(), top1)
    check_router(router(moe_router_score_function="sigmoid"), top1)  # Llama 4's own router
    check_router(router(moe_router_pre_softmax=True), top1)


def test_layer_work_carries_the_aux_loss_all_reduce():
    """In the layer: with TP 2 and SP the aux loss's counts (E int64) all-reduced over TP x CP."""
    s = RunSettings(tensor_model_parallel_size=2, sequence_parallel=True, expert_model_parallel_size=8,
                    expert_tensor_parallel_size=1, global_batch_size=8, moe_aux_loss_coeff=1e-3,
                    moe_router_fusion=True)
    work = moe_layer_work(PRESETS["qwen3-30b-a3b"], s)
    reduces = [(c.collective, c.nbytes) for c in work.forward.collectives if c.group == "tp_cp"]
    assert reduces == [("all_reduce", 128 * 8)]


def test_run_table_router_columns(tmp_path: Path):
    table = tmp_path / "runs.csv"
    table.write_text("model,seq_length,tensor_model_parallel_size,pipeline_model_parallel_size,data_parallel_size,"
                     "global_batch_size,expert_model_parallel_size,moe_router_fusion,moe_router_load_balancing_type,"
                     "moe_aux_loss_coeff,moe_router_force_load_balancing\n"
                     "qwen3-30b-a3b,4096,1,1,8,64,8,true,aux_loss,0.001,true\n")
    _, rows = read_run_table(table)
    s = rows[0].settings
    assert (s.moe_router_fusion, s.moe_router_load_balancing_type, s.moe_aux_loss_coeff,
            s.moe_router_force_load_balancing) == (True, "aux_loss", 0.001, True)
    table.write_text(table.read_text().replace("aux_loss,0.001", "switch,0.001"))
    with pytest.raises(InputFileError, match="moe_router_load_balancing_type"):
        read_run_table(table)


def test_automodel_fake_balanced_gate_has_no_gemm_and_no_backward():
    """NeMo AutoModel's FakeBalancedGate: ones / k, arange % E + 0, the cast: six kernels of
    T k elements; the MoE layer then has no router GEMM forward or backward."""
    from paraplan.predict.moe_router import fake_balanced_gate

    gate = fake_balanced_gate(QWEN)
    assert gate.kernel_bytes == (T * K * 4, 2 * T * K * 4, T * K * 8, 2 * T * K * 8, 2 * T * K * 8, T * K * 6)
    base = dict(expert_model_parallel_size=8, expert_tensor_parallel_size=1, global_batch_size=8)
    qwen = PRESETS["qwen3-30b-a3b"]
    megatron, fake = moe_layer_work(qwen, RunSettings(**base)), moe_layer_work(
        qwen, RunSettings(fake_balanced_gate=True, **base))
    router_gemms = [(4096, 2048, 128), (4096, 128, 2048), (2048, 4096, 128)]  # logits; input and weight gradients
    for work, present in ((megatron, True), (fake, False)):
        shapes = {(k.m[i], k.k[i], k.n[i]) for k in (work.forward.kernels, work.backward.kernels)
                  for i in range(len(k))}
        assert all((g in shapes) == present for g in router_gemms)
    with pytest.raises(StrategyError, match="fake_balanced_gate \\(NeMo AutoModel's\\) replaces Megatron-Core's "
                                            "router: moe_router_fusion must be left at its default"):
        check_router(router(fake_balanced_gate=True, moe_router_fusion=True), qwen)

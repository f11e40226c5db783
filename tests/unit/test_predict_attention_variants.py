"""Multi-latent attention, sliding windows and multi-token prediction in the
execution model (`paraplan.predict.ops`, `paraplan.predict.mla_ops`)."""

from dataclasses import replace

import pytest

from paraplan.clusters import load_cluster
from paraplan.core import ConstantBandwidthModel
from paraplan.core.run_settings import RunSettings
from paraplan.core.transformer import TransformerModel
from paraplan.predict.attention_mix import attention_core_kernels
from paraplan.predict.build import build_execution, run_structure
from paraplan.predict.device_model import DeviceEfficiency, DeviceSpeed, kernel_times_s
from paraplan.predict.edge_ops import head_work
from paraplan.predict.layer_shape import causal_scores, kernel_seq_length
from paraplan.predict.mtp_ops import last_stage_activation_bytes, last_stage_work
from paraplan.predict.ops import (
    ATTENTION,
    layer_activation_bytes,
    layer_work,
)

H, A, S = 1024, 16, 512
MLA = TransformerModel("mla", num_layers=4, hidden_size=H, num_attention_heads=A, seq_length=S, vocab_size=32000,
                       swiglu=True, ffn_hidden_size=2816, add_bias_linear=False, normalization="RMSNorm",
                       position_embedding_type="rope", multi_latent_attention=True, q_lora_rank=384,
                       kv_lora_rank=256, qk_head_dim=64, qk_pos_emb_head_dim=32, v_head_dim=64)


def settings(t: int, **kw) -> RunSettings:
    return RunSettings(tensor_model_parallel_size=t, micro_batch_size=2, global_batch_size=2, **kw)


@pytest.mark.parametrize("t", [1, 2, 4])
def test_mla_kernels_sum_to_the_closed_form_plus_the_replicated_down_projections(t):
    work = layer_work(MLA, settings(t, use_flash_attn=False))
    tokens = 2 * S
    down = 2 * tokens * H * (384 + 256 + 32)  # q down and kv down (with the rotary key part) on every rank
    assert work.forward.kernels.total_flops * t == pytest.approx(MLA.layer_forward_flops(2) + (t - 1) * down,
                                                                 rel=1e-12)
    assert work.backward.kernels.total_flops == pytest.approx(2 * work.forward.kernels.total_flops, rel=1e-12)


def test_mla_sequence_parallel_runs_the_down_projections_on_a_tth_of_the_tokens():
    plain, sp = layer_work(MLA, settings(4, use_flash_attn=False)), layer_work(
        MLA, settings(4, use_flash_attn=False, sequence_parallel=True))
    tokens = 2 * S
    down = 2 * tokens * H * (384 + 256 + 32)
    assert plain.forward.kernels.total_flops - sp.forward.kernels.total_flops == pytest.approx(down * 3 / 4)
    # the q latent, the rotary key part and the kv latent are gathered before the up projections
    gathered = sorted(c.nbytes for c in sp.forward.collectives if c.collective == "all_gather")
    assert gathered == sorted([2 * tokens * w for w in (384, 32, 256, H)])


def test_mla_flash_core_scores_with_qk_plus_rope_and_values_with_v_head_dim():
    work = layer_work(MLA, settings(2))
    core = work.forward.kernels.flops[work.forward.kernels.kind == ATTENTION].sum()
    assert core == pytest.approx(2 * 2 * (A / 2) * S * S / 2 * ((64 + 32) + 64))


def test_mla_keeps_latents_and_its_q_k_v():
    s = settings(1)
    x_tokens, e = 2 * S, 2
    gqa_like = replace(MLA, multi_latent_attention=False, q_lora_rank=0, kv_lora_rank=0, qk_head_dim=0,
                       qk_pos_emb_head_dim=0, v_head_dim=0, kv_channels=64)
    latents = 2 * e * x_tokens * (384 + 256) + e * x_tokens * 32
    qkv_mla = e * x_tokens * A * (2 * 96 + 64)
    qkv_mha = e * x_tokens * 3 * A * 64
    assert layer_activation_bytes(MLA, s) - layer_activation_bytes(gqa_like, s) == pytest.approx(
        latents + qkv_mla - qkv_mha)


def test_causal_window_counts_keys_per_query():
    assert causal_scores(4096) == 4096**2 / 2
    assert causal_scores(4096, 1024) == 4096 * 1024 - 1024**2 / 2
    assert causal_scores(512, 1024) == 512**2 / 2  # a window longer than the sequence changes nothing


def test_a_windowed_kernel_is_priced_at_the_causal_efficiency_of_twice_its_window():
    # a causal row of length s sees s / 2 keys on average; a window-128 row sees 128, as at s = 256
    assert kernel_seq_length(4096, 128) == 256
    assert kernel_seq_length(4096) == 4096
    assert kernel_seq_length(4096, 4096) == 4096  # a window as long as the sequence: the full kernel's


# ---- sliding windows and multi-token prediction in the step ----------------------

CLUSTER = load_cluster("dgx-h100")
COMM = ConstantBandwidthModel(100e9, 100e9, 5e-6, 5e-6)
EFF = DeviceEfficiency(kernel_latency_s=0.0)
LLAMA = TransformerModel("small", num_layers=4, hidden_size=2048, num_attention_heads=16, seq_length=8192,
                         vocab_size=32000, swiglu=True, add_bias_linear=False, normalization="RMSNorm",
                         position_embedding_type="rope", hidden_dropout=0.0, attention_dropout=0.0,
                         untie_embeddings_and_output_weights=True)


def test_windowed_layers_cost_their_own_attention_on_each_stage():
    # window 1024 in layers 1-3, layer 4 full; two stages: [W, W] and [W, F]
    windowed = replace(LLAMA, window_size=1024, window_attn_skip_freq=4)
    s = RunSettings(pipeline_model_parallel_size=2, micro_batch_size=1, global_batch_size=8)
    speed = DeviceSpeed.of(CLUSTER.device, "bf16")
    full_core = float(kernel_times_s(attention_core_kernels(LLAMA, s, 0)[0], speed, EFF).sum())
    fwd = [float(kernel_times_s(attention_core_kernels(windowed, s, i)[0], speed, EFF).sum()) for i in (0, 3)]
    bwd = [float(kernel_times_s(attention_core_kernels(windowed, s, i)[1], speed, EFF).sum()) for i in (0, 3)]
    assert fwd[1] == pytest.approx(full_core) and fwd[0] < fwd[1] / 3  # 8192 x 1024 - 1024^2/2 of 8192^2/2 pairs
    base = build_execution(LLAMA, s, CLUSTER, COMM, EFF).costs
    win = build_execution(windowed, s, CLUSTER, COMM, EFF).costs
    assert base.fwd_s - win.fwd_s == pytest.approx([2 * (fwd[1] - fwd[0]), fwd[1] - fwd[0]], rel=1e-9)
    assert base.bwd_s - win.bwd_s == pytest.approx([2 * (bwd[1] - bwd[0]), bwd[1] - bwd[0]], rel=1e-9)


def test_mtp_layer_runs_a_layer_a_projection_and_the_head_again_on_the_last_stage():
    mtp = replace(LLAMA, mtp_num_layers=1)
    for t in (1, 2):
        s = RunSettings(tensor_model_parallel_size=t, micro_batch_size=1, global_batch_size=1, use_flash_attn=False)
        head, last, layer = head_work(mtp, s), last_stage_work(mtp, s), layer_work(mtp, s, 3)
        tokens, h = 8192, 2048
        assert last.forward.kernels.total_flops == pytest.approx(
            2 * head.forward.kernels.total_flops + layer.forward.kernels.total_flops + 2 * tokens * 2 * h * h / t)
        assert last.backward.kernels.total_flops == pytest.approx(2 * last.forward.kernels.total_flops)
        assert last.activation_bytes > 2 * head.activation_bytes + layer.activation_bytes
    s = RunSettings(pipeline_model_parallel_size=2, micro_batch_size=1, global_batch_size=8)
    plain, with_mtp = run_structure(LLAMA, s, CLUSTER, COMM), run_structure(mtp, s, CLUSTER, COMM)
    assert with_mtp.rank_params[1] - plain.rank_params[1] == mtp.mtp_parameters == (
        LLAMA.dense_layer_params + 2 * h * h + 3 * h)
    assert with_mtp.rank_params[0] == plain.rank_params[0]


def test_explain_puts_the_windowed_cores_under_attention():
    from paraplan.predict.explain import explain_run

    windowed = replace(LLAMA, window_size=1024, window_attn_skip_freq=4)
    s = RunSettings(micro_batch_size=1, global_batch_size=4)
    full, win = explain_run(LLAMA, s, CLUSTER, COMM, EFF), explain_run(windowed, s, CLUSTER, COMM, EFF)
    speed = DeviceSpeed.of(CLUSTER.device, "bf16")
    saved = sum(float(kernel_times_s(attention_core_kernels(LLAMA, s, 0)[j], speed, EFF).sum())
                - float(kernel_times_s(attention_core_kernels(windowed, s, 0)[j], speed, EFF).sum()) for j in (0, 1))
    assert full.seconds["attention"] - win.seconds["attention"] == pytest.approx(4 * 3 * saved, rel=1e-9)
    assert win.seconds["host"] == pytest.approx(full.seconds["host"], rel=1e-9, abs=1e-12)
    assert sum(win.seconds.values()) == pytest.approx(win.iteration_s, rel=1e-9)


# ---- Megatron-Core's recompute_modules ---------------------------------------------

def _selective(*modules: str, t: int = 2) -> RunSettings:
    return settings(t, use_flash_attn=False, recompute_granularity="selective", recompute_modules=modules)


def test_mla_up_proj_recomputes_the_up_projections_and_drops_q_k_v():
    t, tokens, e = 2, 2 * S, 2
    base, up = layer_work(MLA, _selective("core_attn", t=t)), layer_work(MLA, _selective("core_attn", "mla_up_proj",
                                                                                         t=t))
    heads = A / t
    up_flops = 2 * tokens * (384 * heads * 96 + 256 * heads * (64 + 64))
    assert up.recompute.kernels.total_flops - base.recompute.kernels.total_flops == pytest.approx(up_flops)
    assert base.activation_bytes - up.activation_bytes == pytest.approx(e * tokens * heads * (2 * 96 + 64))


def test_layernorm_and_mlp_recomputation_drop_what_they_recompute():
    from paraplan.predict.ops import MEMORY

    t, tokens, e, f = 2, 2 * S, 2, 2816
    base = layer_work(MLA, _selective("core_attn", t=t))
    norms = layer_work(MLA, _selective("core_attn", "layernorm", t=t))
    mlp = layer_work(MLA, _selective("core_attn", "mlp", t=t))
    assert base.activation_bytes - norms.activation_bytes == pytest.approx(2 * e * tokens * H)
    with_norms, without = norms.recompute.kernels, base.recompute.kernels
    assert (with_norms.bytes[with_norms.kind == MEMORY].sum() - without.bytes[without.kind == MEMORY].sum()
            == pytest.approx(2 * 2 * e * tokens * H))  # two norms, each reading and writing b s h
    # SwiGLU: the gated first projection's output (2f), the activation's output (f)
    assert base.activation_bytes - mlp.activation_bytes == pytest.approx(3 * e * tokens * f / t)
    assert mlp.recompute.kernels.total_flops - base.recompute.kernels.total_flops == pytest.approx(
        2 * tokens * 3 * H * f / t)
    assert [c.collective for c in mlp.recompute.collectives] == ["all_reduce"]  # the row-parallel output's sum


def test_recompute_modules_are_checked():
    from paraplan.core import StrategyError

    with pytest.raises(StrategyError, match="recompute_modules mla_up_proj needs multi-latent attention; 'small'"):
        _selective("mla_up_proj").check(LLAMA)
    with pytest.raises(StrategyError, match="recompute_modules core_attn mlp needs recompute_granularity selective, "
                       "got none"):
        replace(_selective("core_attn", "mlp"), recompute_granularity="none").check(LLAMA)
    with pytest.raises(StrategyError, match="recompute_modules: 'mhc' is not one of core_attn, mla_up_proj, "
                       "layernorm, mlp, moe_act, moe, shared_experts"):
        _selective("mhc").check(LLAMA)
    with pytest.raises(StrategyError, match="recompute_modules moe_act needs a mixture-of-experts model; 'small' has "
                       "no experts"):
        _selective("moe_act").check(LLAMA)


def test_context_parallelism_with_mla_or_windows_is_refused_by_name():
    from paraplan.core import StrategyError

    cp = RunSettings(context_parallel_size=2, micro_batch_size=1, global_batch_size=1)
    with pytest.raises(StrategyError, match="context_parallel_size 2 with multi-latent attention is not modelled"):
        cp.check(MLA)
    with pytest.raises(StrategyError, match="context_parallel_size 2 with sliding-window attention is not modelled"):
        cp.check(replace(LLAMA, window_size=1024, window_attn_skip_freq=4))


@pytest.mark.parametrize("preset", ["deepseek-v3", "llama3-8b", "qwen3-30b-a3b"])
@pytest.mark.parametrize("change", [{}, {"recompute_granularity": "full"}, {"tensor_model_parallel_size": 2,
                                                                         "sequence_parallel": True}])
def test_last_stage_activation_bytes_equal_the_built_work(preset, change):
    """The planner's kernel-free count (MTP layers included) is the built work's."""
    from paraplan.predict.models import PRESETS

    model = replace(PRESETS[preset], seq_length=4096)
    s = replace(RunSettings(micro_batch_size=1, global_batch_size=1), **change)
    assert last_stage_activation_bytes(model, s) == pytest.approx(last_stage_work(model, s).activation_bytes,
                                                                  rel=1e-12)

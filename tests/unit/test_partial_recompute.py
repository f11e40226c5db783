"""Full recomputation of some layers or of groups of layers (Megatron-LM's
`recompute_method` block / uniform with `recompute_num_layers`): which layers each
virtual stage keeps, the backward they skip, the activations they keep, and the errors."""

from dataclasses import replace

import numpy as np
import pytest

from paraplan.clusters import load_cluster
from paraplan.core import ConstantBandwidthModel, StrategyError
from paraplan.core.run_settings import RunSettings
from paraplan.core.transformer import TransformerModel
from paraplan.predict.build import build_execution
from paraplan.predict.device_model import DeviceEfficiency
from paraplan.predict.explain import explain_run
from paraplan.predict.models import PRESETS
from paraplan.predict.partial_recompute import PartialRecompute
from paraplan.predict.predictor import predict_rows
from paraplan.predict.runtable import RunRow

CLUSTER = load_cluster("dgx-h100")
COMM = ConstantBandwidthModel(100e9, 100e9, 5e-6, 5e-6)
EFF = DeviceEfficiency(kernel_latency_s=0.0)  # no host time: stage times add up exactly
L, H, S = 8, 2048, 4096
GPT = TransformerModel("gpt", num_layers=L, hidden_size=H, num_attention_heads=16, seq_length=S, vocab_size=32000,
                       swiglu=True, add_bias_linear=False, normalization="RMSNorm", position_embedding_type="rope",
                       hidden_dropout=0.0, attention_dropout=0.0, untie_embeddings_and_output_weights=True)


def run(granularity: str = "none", method: str = "", n: int = 0, **kw) -> RunSettings:
    base = dict(micro_batch_size=1, global_batch_size=4, use_flash_attn=True, recompute_granularity=granularity,
                recompute_method=method, recompute_num_layers=n)
    return RunSettings(**{**base, **kw})


def test_block_keeps_the_layers_past_the_first_n_of_each_virtual_stage_by_kind():
    dsv3 = PRESETS["deepseek-v3"]  # layers 0-2 dense, the rest MoE
    counts = np.array([4, 4, dsv3.num_layers - 8])
    part = PartialRecompute.of(dsv3, run("full", "block", 2), counts)
    assert part is not None
    assert part.kept.tolist() == [2, 2, dsv3.num_layers - 10]
    assert part.kept_moe.tolist() == [1, 2, dsv3.num_layers - 10]  # stage 0 keeps layers 2 (dense) and 3 (MoE)
    assert part.stored_inputs(np.array([4, 1])).tolist() == [2, 1] and part.rebuilt_layers(4) == 1
    uniform = PartialRecompute.of(dsv3, run("full", "uniform", 3), counts)
    assert uniform is not None and not uniform.kept.any()
    assert uniform.stored_inputs(np.array([4, 53])).tolist() == [2, 18] and uniform.rebuilt_layers(53) == 3
    # every layer on its own: nothing to model apart
    assert PartialRecompute.of(dsv3, run("full"), counts) is None
    assert PartialRecompute.of(dsv3, run("full", "uniform", 1), counts) is None


@pytest.mark.parametrize("v", [1, 2])
def test_block_recomputes_min_n_layers_of_each_stage_in_the_backward(v):
    pp = dict(pipeline_model_parallel_size=2, virtual_pipeline_model_parallel_size=v, global_batch_size=8)
    none = build_execution(GPT, run(**pp), CLUSTER, COMM, EFF).costs
    full = build_execution(GPT, run("full", **pp), CLUSTER, COMM, EFF).costs
    n_stage = L // (2 * v)
    for n in (1, n_stage - 1, n_stage):
        block = build_execution(GPT, run("full", "block", n, **pp), CLUSTER, COMM, EFF).costs
        assert block.fwd_s == pytest.approx(full.fwd_s, rel=1e-12)
        assert block.bwd_s == pytest.approx(none.bwd_s + n / n_stage * (full.bwd_s - none.bwd_s), rel=1e-12)


def test_uniform_groups_recompute_every_layer_once():
    full = build_execution(GPT, run("full"), CLUSTER, COMM, EFF).costs
    grouped = build_execution(GPT, run("full", "uniform", 4), CLUSTER, COMM, EFF).costs
    assert grouped.bwd_s == pytest.approx(full.bwd_s, rel=1e-12)


def _activations(settings: RunSettings) -> float:
    row = RunRow(line=2, name="r", model=GPT, settings=settings, search_micro_batch_size=False,
                 search_virtual_stages=False, measured_iteration_s=None, cells={})
    return predict_rows([row], CLUSTER, COMM, EFF)[0].peak_memory.activation_bytes


def test_block_keeps_whole_activations_of_its_kept_layers_and_uniform_one_input_per_group():
    none, full = _activations(run()), _activations(run("full"))
    for n in (2, 5):  # L - n layers keep everything, n only their input
        assert _activations(run("full", "block", n)) - full == pytest.approx((L - n) / L * (none - full), rel=1e-12)
    layer_input = 2 * S * H  # bf16 hidden state of one micro-batch
    assert full - _activations(run("full", "uniform", 4)) == pytest.approx((L - 2) * layer_input, rel=1e-12)


def test_explain_still_adds_up_with_kept_layers():
    s = run("full", "block", 3, pipeline_model_parallel_size=2, global_batch_size=8)
    parts = explain_run(GPT, s, CLUSTER, COMM, EFF)
    assert sum(parts.seconds.values()) == pytest.approx(parts.iteration_s, rel=1e-9)
    whole = explain_run(GPT, replace(s, recompute_method="", recompute_num_layers=0), CLUSTER, COMM, EFF)
    assert parts.iteration_s < whole.iteration_s


@pytest.mark.parametrize(("settings", "message"), [
    (run("selective", "block", 2), "recompute_method block needs recompute_granularity full, got selective"),
    (run("full", recompute_num_layers=2), "recompute_num_layers 2 needs a recompute_method (uniform or block)"),
    (run("full", "block", 0), "recompute_method block needs recompute_num_layers >= 1 (Megatron-LM's "
                              "--recompute-num-layers)"),
    (run("full", "every", 1), "recompute_method 'every' is not one of uniform, block"),
])
def test_recompute_method_settings_are_checked(settings, message):
    with pytest.raises(StrategyError) as err:
        settings.check(GPT)
    assert str(err.value) == message


def test_a_block_larger_than_a_chunk_is_an_error():
    s = run("full", "block", 5, pipeline_model_parallel_size=2, global_batch_size=8)
    with pytest.raises(StrategyError) as err:
        build_execution(GPT, s, CLUSTER, COMM, EFF)
    assert str(err.value) == ("recompute_method block with recompute_num_layers 5: a model chunk holds at most 4 "
                              "layers (Megatron-Core: recompute_num_layers must not exceed the layers of a chunk)")


def test_block_recomputes_the_attention_core_of_the_layers_it_recomputes():
    """Layers 0-2 windowed, layer 3 full (a window every 4th layer skipped): block 4
    recomputes the full layer beside block 3's three windowed ones."""
    from paraplan.predict.attention_mix import attention_core_kernels
    from paraplan.predict.device_model import DeviceSpeed, kernel_times_s

    windowed = replace(GPT, num_layers=4, window_size=1024, window_attn_skip_freq=4)
    bwd = [build_execution(windowed, run("full", "block", n), CLUSTER, COMM, EFF).costs.bwd_s[0] for n in (2, 3, 4)]
    speed = DeviceSpeed.of(CLUSTER.device, "bf16")
    core = [float(kernel_times_s(attention_core_kernels(windowed, run(), i)[0], speed, EFF).sum()) for i in (0, 3)]
    assert core[1] > 2 * core[0]
    assert (bwd[2] - bwd[1]) - (bwd[1] - bwd[0]) == pytest.approx(core[1] - core[0], rel=1e-9)


def test_the_flop_count_recomputes_only_the_blocks():
    from paraplan.predict.partial_recompute import recomputed_layer_share

    pp2 = dict(pipeline_model_parallel_size=2, global_batch_size=8)
    assert recomputed_layer_share(GPT, run("full", "block", 3, **pp2)) == 6 / 8
    assert recomputed_layer_share(GPT, run("full", "uniform", 4, **pp2)) == 1.0
    assert recomputed_layer_share(GPT, run("full", **pp2)) == 1.0 and recomputed_layer_share(GPT, run(**pp2)) == 0.0
    flops = GPT.model_flops_per_iteration(8, 0.75)
    assert flops == pytest.approx(GPT.model_flops_per_iteration(8, 0.0) + 0.75 * GPT.layers_forward_flops(8), rel=1e-12)

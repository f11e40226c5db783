"""Each mixture-of-experts model carries its own router (`paraplan.core.moe_router_model`):
read from its Hugging Face file (`paraplan.predict.hf_router`), set in its preset, used by
the planner and by run-table rows that leave the router columns empty; a stated cell
wins. DeepSeek-V3 was priced with Megatron-Core's default softmax router without a word
(issue 24: every architecture key used, warned about or refused)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from paraplan.core.errors import InputFileError
from paraplan.core.moe_router_model import model_router_defaults
from paraplan.core.transformer import TransformerModel
from paraplan.predict.hf_config import HARMLESS, read_hf_config
from paraplan.predict.models import PRESETS
from paraplan.predict.runtable import read_run_table

HF = Path(__file__).resolve().parents[1] / "data" / "hf"
SIGMOID_BIAS_25 = ("sigmoid", True, 2.5, False)
SOFTMAX_OVER_K = ("softmax", False, 0.0, False)


def _router(model: TransformerModel) -> tuple[str, bool, float, bool]:
    return (model.moe_router_score_function, model.moe_router_enable_expert_bias,
            model.moe_router_topk_scaling_factor, model.moe_router_pre_softmax)


def _config(name: str) -> dict:
    return json.loads((HF / f"{name}.json").read_text())


def _read(config: dict, name: str = "m"):
    return read_hf_config(config, name, f"{name}.json")


@pytest.mark.parametrize(("name", "expected"), [
    ("deepseek-v3", SIGMOID_BIAS_25),  # scoring_func sigmoid, topk_method noaux_tc, routed_scaling_factor 2.5
    ("qwen3-30b-a3b", SOFTMAX_OVER_K),  # norm_topk_prob true: the softmax over the 8 chosen
    ("qwen3-235b-a22b", SOFTMAX_OVER_K),
    ("mixtral-8x7b", SOFTMAX_OVER_K),  # transformers renormalises its top-2 softmax weights
    ("gpt-oss-20b", SOFTMAX_OVER_K),  # top-4 of the logits, then a softmax over the 4
    ("gpt-oss-120b", SOFTMAX_OVER_K),
])
def test_each_shipped_config_reads_its_router_and_its_preset_carries_it(name, expected):
    read = _read(_config(name), name)
    assert _router(read.model) == expected == _router(PRESETS[name])
    assert read.ignored == () and read.notes == ()
    assert not {"scoring_func", "topk_method", "routed_scaling_factor", "norm_topk_prob"} & HARMLESS


def test_deepseek_v3_keeps_its_group_limit_beside_its_router():
    m = _read(_config("deepseek-v3")).model
    assert (m.moe_router_num_groups, m.moe_router_group_topk) == (8, 4)


def test_a_kimi_k2_style_file_reads_as_deepseek_v3s_router_with_its_own_scaling():
    """Kimi K2 (moonshotai/Kimi-K2-Instruct config.json): DeepSeek-V3's architecture under
    model_type kimi_k2, 384 experts in one group, routed_scaling_factor 2.827."""
    config = {**_config("deepseek-v3"), "model_type": "kimi_k2", "n_routed_experts": 384, "n_group": 1,
              "topk_group": 1, "routed_scaling_factor": 2.827}
    m = _read(config).model
    assert _router(m) == ("sigmoid", True, 2.827, False) and m.router_groups == (1, 1)


def test_a_deepseek_v2_style_file_reads_its_unnormalised_softmax_router():
    """DeepSeek-V2-Lite's keys: scoring_func softmax, topk_method greedy, routed_scaling_factor
    1.0, norm_topk_prob false: Megatron-Core's pre-softmax, weights scaled by 1."""
    config = {**_config("deepseek-v3"), "model_type": "deepseek_v2", "n_routed_experts": 64, "n_group": 1,
              "topk_group": 1, "num_experts_per_tok": 6, "scoring_func": "softmax", "topk_method": "greedy",
              "routed_scaling_factor": 1.0, "norm_topk_prob": False}
    assert _router(_read(config).model) == ("softmax", False, 1.0, True)


def test_a_llama4_file_reads_its_sigmoid_top1_router():
    scout = {  # Llama-4-Scout-17B-16E's text_config, 4 of its 48 layers, the keys the reader needs
        "model_type": "llama4_text", "hidden_size": 5120, "num_hidden_layers": 4, "num_attention_heads": 40,
        "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 8192, "intermediate_size_mlp": 16384,
        "num_local_experts": 16, "num_experts_per_tok": 1, "moe_layers": [0, 1, 2, 3], "vocab_size": 202048,
        "no_rope_layers": [1, 1, 1, 0], "attention_chunk_size": 8192, "max_position_embeddings": 10485760,
        "hidden_act": "silu", "rms_norm_eps": 1e-05}
    m = _read(scout).model
    assert _router(m) == ("sigmoid", False, 0.0, False) == _router(PRESETS["llama4-scout"])


def test_qwen_without_normalised_top_k_is_megatrons_pre_softmax():
    """Qwen2/3-MoE's norm_topk_prob false (also transformers' default, named in a note):
    the top-k of a softmax over all experts, unnormalised."""
    config = _config("qwen3-30b-a3b")
    assert _router(_read({**config, "norm_topk_prob": False}).model) == ("softmax", False, 0.0, True)
    del config["norm_topk_prob"]
    read = _read(config)
    assert _router(read.model) == ("softmax", False, 0.0, True)
    assert read.notes == ("m.json: norm_topk_prob not stated: the qwen3_moe family's router used (softmax, "
                          "scaling 0, norm_topk_prob false, as transformers builds it)",)


def test_a_deepseek_v3_file_without_router_keys_gets_its_family_router_said_in_a_note():
    config = {k: v for k, v in _config("deepseek-v3").items()
              if k not in ("scoring_func", "topk_method", "routed_scaling_factor", "norm_topk_prob")}
    read = _read(config)
    assert _router(read.model) == SIGMOID_BIAS_25
    assert read.notes == ("m.json: scoring_func, topk_method, routed_scaling_factor, norm_topk_prob not stated: "
                          "the deepseek_v3 family's router used (sigmoid, expert bias, scaling 2.5, "
                          "norm_topk_prob true, as transformers builds it)",)


def test_router_keys_megatron_core_cannot_run_are_refused_or_said():
    ds = _config("deepseek-v3")
    with pytest.raises(InputFileError) as err:
        _read({**ds, "scoring_func": "tanh"})
    assert str(err.value) == "m.json: key 'scoring_func': expected one of softmax, sigmoid, got 'tanh'"
    with pytest.raises(InputFileError) as err:
        _read({**ds, "scoring_func": "softmax"})
    assert str(err.value) == ("m.json: key 'topk_method': noaux_tc (an expert bias on the scores) with scoring_func "
                              "softmax: Megatron-Core's expert bias is for the sigmoid router only")
    with pytest.raises(InputFileError) as err:
        _read({**ds, "routed_scaling_factor": -1})
    assert str(err.value) == "m.json: key 'routed_scaling_factor': expected a number in (0, 1e6], got -1"
    read = _read({**ds, "norm_topk_prob": False})
    assert read.notes == ("m.json: norm_topk_prob false: Megatron-Core's sigmoid router normalises the 8 chosen "
                          "weights whatever it is told; priced with that division",)
    greedy = _read({**ds, "topk_method": "greedy"}).model  # DeepSeek-V2's method: no bias, no group limit
    assert _router(greedy) == ("sigmoid", False, 2.5, False) and greedy.router_groups == (1, 1)


def test_router_keys_a_family_does_not_read_are_named_as_ignored():
    """Mixtral's transformers class routes without these keys: stated, they are named."""
    read = _read({**_config("mixtral-8x7b"), "scoring_func": "sigmoid"})
    assert read.ignored == ("scoring_func",) and _router(read.model) == SOFTMAX_OVER_K


def test_a_model_router_megatron_core_cannot_run_is_an_error():
    with pytest.raises(ValueError) as err:
        replace(PRESETS["llama3-8b"], moe_router_score_function="sigmoid")
    assert str(err.value) == "model 'llama3-8b': moe_router_score_function sigmoid needs experts (num_experts > 0)"
    with pytest.raises(ValueError) as err:
        replace(PRESETS["mixtral-8x7b"], moe_router_enable_expert_bias=True)
    assert str(err.value) == ("model 'mixtral-8x7b': moe_router_enable_expert_bias needs moe_router_score_function "
                              "sigmoid (Megatron-Core's expert bias is for the sigmoid router only)")


def test_a_run_takes_the_unstated_router_settings_from_its_model():
    ds = PRESETS["deepseek-v3"]
    assert model_router_defaults(ds, {}) == {
        "moe_router_score_function": "sigmoid", "moe_router_enable_expert_bias": True,
        "moe_router_topk_scaling_factor": 2.5, "moe_router_pre_softmax": False}
    # a stated softmax drops the model's sigmoid-only expert bias, keeps its scaling
    assert model_router_defaults(ds, {"moe_router_score_function": "softmax"}) == {
        "moe_router_topk_scaling_factor": 2.5, "moe_router_pre_softmax": False}
    assert model_router_defaults(ds, {"fake_balanced_gate": True}) == {}  # AutoModel's gate replaces the router
    assert model_router_defaults(PRESETS["llama3-8b"], {}) == {}


RUNS = ("model,tensor_model_parallel_size,pipeline_model_parallel_size,data_parallel_size,"
        "expert_model_parallel_size,expert_tensor_parallel_size,global_batch_size,micro_batch_size,"
        "moe_router_score_function,moe_router_topk_scaling_factor\n"
        "deepseek-v3,1,16,64,64,1,1024,1,,\n"
        "deepseek-v3,1,16,64,64,1,1024,1,softmax,\n"
        "deepseek-v3,1,16,64,64,1,1024,1,,1\n")


def test_a_stated_run_table_cell_overrides_the_models_router(tmp_path):
    runs = tmp_path / "runs.csv"
    runs.write_text(RUNS)
    _, rows = read_run_table(runs)
    got = [(r.settings.moe_router_score_function, r.settings.moe_router_enable_expert_bias,
            r.settings.moe_router_topk_scaling_factor) for r in rows]
    assert got == [("sigmoid", True, 2.5), ("softmax", False, 2.5), ("sigmoid", True, 1.0)]


def test_predict_writes_the_router_it_priced_into_the_cells_a_row_left_empty(tmp_path):
    """`paraplan predict` states what was priced: the empty router cells of each
    DeepSeek-V3 row get the values used (the model's own router, Megatron-Core's default
    expert bias where a stated softmax drops the model's); stated cells are kept as written;
    the output, predicted again, prices the same."""
    import csv

    from paraplan.cli.main import main

    runs = tmp_path / "runs.csv"
    runs.write_text(RUNS)
    out, again = tmp_path / "out.csv", tmp_path / "again.csv"
    assert main(["predict", str(runs), "--cluster", "dgx-h100", "-o", str(out), "--no-track"]) == 0
    rows = list(csv.DictReader(out.open()))
    router = ("moe_router_score_function", "moe_router_enable_expert_bias", "moe_router_topk_scaling_factor",
              "moe_router_pre_softmax")
    assert [tuple(r[k] for k in router) for r in rows] == [
        ("sigmoid", "true", "2.5", "false"), ("softmax", "false", "2.5", "false"), ("sigmoid", "true", "1", "false")]
    assert main(["predict", str(out), "--cluster", "dgx-h100", "-o", str(again), "--no-track"]) == 0
    assert [r["predicted_iteration_s"] for r in csv.DictReader(again.open())] == \
        [r["predicted_iteration_s"] for r in rows]


def test_a_dense_row_gets_no_router_columns(tmp_path):
    from paraplan.cli.main import main

    runs = tmp_path / "runs.csv"
    runs.write_text("model,tensor_model_parallel_size,pipeline_model_parallel_size,data_parallel_size,"
                    "global_batch_size,micro_batch_size\nllama3-8b,1,1,8,64,1\n")
    out = tmp_path / "out.csv"
    assert main(["predict", str(runs), "--cluster", "dgx-h100", "-o", str(out), "--no-track"]) == 0
    assert "moe_router" not in out.read_text().splitlines()[0]

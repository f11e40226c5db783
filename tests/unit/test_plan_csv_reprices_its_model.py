"""`paraplan predict` on a plan CSV prices the plan's own model and recipe: a model file's
row names the file (relative to the CSV's folder), not the model's name, which predict
read as a preset of that name (a Mixtral config.json of 8 layers re-priced as the
32-layer preset, 4x slower) or as no model at all; an FP8 plan names its recipe, which
predict otherwise replaced by Megatron-LM's default."""

import csv
import json

from paraplan.cli.main import main

MIXTRAL_8_LAYERS = {  # mistralai/Mixtral-8x7B-v0.1's config.json, 8 of its 32 layers
    "architectures": ["MixtralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2,
    "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
    "max_position_embeddings": 32768, "model_type": "mixtral", "num_attention_heads": 32,
    "num_experts_per_tok": 2, "num_hidden_layers": 8, "num_key_value_heads": 8, "num_local_experts": 8,
    "output_router_logits": False, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.02,
    "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True,
    "vocab_size": 32000,
}


def _plan_then_predict(tmp_path, plans, args):
    again = tmp_path / "again.csv"
    assert main(["plan", *args, "--cluster", "dgx-h100", "--gpus", "8", "--global-batch-size", "64", "--top-k", "2",
                 "-o", str(plans), "--no-track"]) == 0
    assert main(["predict", str(plans), "--cluster", "dgx-h100", "-o", str(again), "--no-track"]) == 0
    with plans.open() as a, again.open() as b:
        return list(csv.DictReader(a)), list(csv.DictReader(b))


def test_a_model_file_named_like_a_preset_is_repriced_from_the_file(tmp_path):
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "mixtral-8x7b.json").write_text(json.dumps(MIXTRAL_8_LAYERS))
    planned, again = _plan_then_predict(tmp_path, tmp_path / "out" / "plans.csv",
                                        ["--model", str(tmp_path / "hf" / "mixtral-8x7b.json"), "--seq-length", "4096"])
    assert {r["model"] for r in planned} == {"../hf/mixtral-8x7b.json"}
    # 8 layers of 46.7B's 32, with the embedding and head: 11.87B parameters, not the preset's 46.70B
    assert {r["num_parameters"] for r in again} == {"11872309248"}
    for row, pred in zip(planned, again, strict=True):
        assert pred["predicted_iteration_s"] == row["predicted_iteration_s"]


def test_a_preset_row_names_the_preset(tmp_path):
    planned, again = _plan_then_predict(tmp_path, tmp_path / "plans.csv", ["--model", "llama3-8b"])
    assert {r["model"] for r in planned} == {"llama3-8b"}
    assert [r["predicted_iteration_s"] for r in again] == [r["predicted_iteration_s"] for r in planned]


def test_an_fp8_plan_names_its_recipe(tmp_path, capsys):
    planned, again = _plan_then_predict(tmp_path, tmp_path / "plans.csv",
                                        ["--model", "llama3-8b", "--dtype", "fp8", "--fp8-recipe", "blockwise"])
    assert {r["fp8_recipe"] for r in planned} == {"blockwise"}
    assert [r["predicted_iteration_s"] for r in again] == [r["predicted_iteration_s"] for r in planned]
    assert "empty fp8_recipe" not in capsys.readouterr().err


def test_a_model_folder_named_like_a_preset_stays_a_path(tmp_path, monkeypatch):
    from paraplan.cli.plan import model_reference

    (tmp_path / "deepseek-v3").mkdir()
    monkeypatch.chdir(tmp_path)
    assert model_reference("./deepseek-v3", tmp_path / "plans.csv") == "./deepseek-v3"
    assert model_reference("deepseek-v3", tmp_path / "plans.csv") == "deepseek-v3"  # the preset, as planned
    assert model_reference("./deepseek-v3", tmp_path / "out" / "plans.csv") == "../deepseek-v3"

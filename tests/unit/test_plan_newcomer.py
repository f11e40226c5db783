"""What a new user meets planning mixture-of-experts and long-context models (issues 24
and 25, tried from a clean folder): Llama 4 is planned at all (its top-1 router was
refused) and its plan CSV prices again to the digit; an answer of no says what would
change it (the global batch a layout can divide, the largest part of the smallest
plan's memory, the multi-token-prediction share of the parameter count); a long
sequence planned without context parallelism says why."""

from __future__ import annotations

import csv
import json
from dataclasses import replace

import pytest

from paraplan.cli.main import main
from paraplan.cli.plan import context_parallel_note
from paraplan.clusters import load_cluster
from paraplan.core.errors import StrategyError
from paraplan.plan.transformer.memory_text import fits_nowhere_advice
from paraplan.plan.transformer.request import TransformerPlanRequest
from paraplan.plan.transformer.search import search
from paraplan.plan.transformer.space import SearchSpace, enumerate_candidates
from paraplan.predict.calibration import load_calibration
from paraplan.predict.models import PRESETS
from paraplan.predict.peak_memory import PeakMemory

CAL = load_calibration()

SCOUT_4_LAYERS = {  # meta-llama/Llama-4-Scout-17B-16E's text_config, 4 of its 48 layers
    "attention_bias": False, "attention_chunk_size": 8192, "attention_dropout": 0.0, "attn_scale": 0.1,
    "attn_temperature_tuning": True, "bos_token_id": 200000, "eos_token_id": [200001, 200007, 200008],
    "floor_scale": 8192, "for_llm_compressor": False, "head_dim": 128, "hidden_act": "silu", "hidden_size": 5120,
    "initializer_range": 0.02, "interleave_moe_layer_step": 1, "intermediate_size": 8192,
    "intermediate_size_mlp": 16384, "max_position_embeddings": 10485760, "model_type": "llama4_text",
    "moe_layers": [0, 1, 2, 3], "no_rope_layers": [1, 1, 1, 0], "num_attention_heads": 40, "num_experts_per_tok": 1,
    "num_hidden_layers": 4, "num_key_value_heads": 8, "num_local_experts": 16, "output_router_logits": False,
    "pad_token_id": 200018, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 16.0, "high_freq_factor": 1.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "router_aux_loss_coef": 0.001, "router_jitter_noise": 0.0, "torch_dtype": "bfloat16",
    "use_cache": True, "use_qk_norm": True, "vocab_size": 202048,
}


def test_top1_models_are_planned_with_llama4s_sigmoid_router():
    """Megatron-Core refuses top-1 routing with a softmax over the one chosen expert;
    the planner gave every MoE model Megatron's default softmax, so both Llama 4 presets
    stopped on that error before any search. Each model now plans with its own router."""
    assert PRESETS["llama4-scout"].moe_router_score_function == "sigmoid"
    assert PRESETS["llama4-maverick"].moe_router_score_function == "sigmoid"
    assert PRESETS["qwen3-30b-a3b"].moe_router_score_function == "softmax"
    request = TransformerPlanRequest(PRESETS["llama4-scout"], load_cluster("dgx-h100"), 64, 256)
    assert request.base_settings().moe_router_score_function == "sigmoid"
    dense = TransformerPlanRequest(PRESETS["llama3-8b"], load_cluster("dgx-h100"), 8, 64).base_settings()
    assert (dense.moe_router_score_function, dense.moe_router_topk_scaling_factor) == ("softmax", 0.0)


def test_a_llama4_plan_names_its_router_and_prices_again_to_the_digit(tmp_path):
    (tmp_path / "scout").mkdir()
    (tmp_path / "scout" / "config.json").write_text(json.dumps(SCOUT_4_LAYERS))
    plans, again = tmp_path / "plans.csv", tmp_path / "again.csv"
    assert main(["plan", "--model", str(tmp_path / "scout"), "--seq-length", "8192", "--cluster", "dgx-h100",
                 "--gpus", "8", "--global-batch-size", "16", "--top-k", "2", "-o", str(plans), "--no-track"]) == 0
    assert main(["predict", str(plans), "--cluster", "dgx-h100", "-o", str(again), "--no-track"]) == 0
    with plans.open() as a, again.open() as b:
        planned, priced = list(csv.DictReader(a)), list(csv.DictReader(b))
    assert [r["moe_router_score_function"] for r in planned] == ["sigmoid", "sigmoid"]
    assert [r["predicted_iteration_s"] for r in priced] == [r["predicted_iteration_s"] for r in planned]
    assert [r["predicted_peak_memory_bytes"] for r in priced] == [r["predicted_peak_memory_bytes"] for r in planned]


def test_a_dense_plan_leaves_the_router_column_empty(tmp_path):
    plans = tmp_path / "plans.csv"
    assert main(["plan", "--model", "gpt3-350m", "--cluster", "dgx-h100", "--gpus", "8", "--global-batch-size",
                 "64", "--top-k", "1", "-o", str(plans), "--no-track"]) == 0
    with plans.open() as handle:
        assert [r["moe_router_score_function"] for r in csv.DictReader(handle)] == [""]


def test_a_global_batch_no_layout_divides_names_one_that_would_do():
    """1,024 GPUs of 8 per node: TP <= 8 and PP <= 80 layers leave DP >= 2 for Llama 3 70B."""
    with pytest.raises(StrategyError) as err:
        enumerate_candidates(PRESETS["llama3-70b"], 1024, 1, 8, SearchSpace())
    assert str(err.value) == (
        "no parallel layout of llama3-70b fits the divisibility rules on 1024 GPUs at global batch 1 (TP must "
        "divide the heads, groups and MLP width; DP the global batch); the fewest data-parallel replicas of a "
        "layout that runs are 2 (TP 8, PP 64): a global batch divisible by 2 would do")
    assert len(enumerate_candidates(PRESETS["llama3-70b"], 1024, 2, 8, SearchSpace())) > 0


def _peak(state_gb: float, working_gb: float, activations_gb: float) -> PeakMemory:
    return PeakMemory(0, (state_gb + working_gb + activations_gb) * 1e9, state_gb * 1e9, working_gb * 1e9, 0.0,
                      activations_gb * 1e9)


def test_fits_nowhere_says_what_to_change_from_the_largest_part():
    scout = replace(PRESETS["llama4-scout"], seq_length=10485760)
    assert fits_nowhere_advice(_peak(32.1, 531.5, 1183.8), scout, 1) == (
        "its activations are the largest part (1183.8 GB): a shorter sequence than its 10,485,760 tokens "
        "(--seq-length), more GPUs or a device with more memory would do; context parallelism, which splits a "
        "sequence's activations, is not priced for chunked attention")
    llama = replace(PRESETS["llama3-70b"], seq_length=131072)
    assert fits_nowhere_advice(_peak(10.0, 2.0, 40.0), llama, 1) == (
        "its activations are the largest part (40.0 GB): a shorter sequence than its 131,072 tokens "
        "(--seq-length), context parallelism (--context-parallel-sizes, e.g. 1,2,4,8), more GPUs or a device with "
        "more memory would do")
    assert fits_nowhere_advice(_peak(10.0, 2.0, 40.0), llama, 8) == (
        "its activations are the largest part (40.0 GB): a shorter sequence than its 131,072 tokens "
        "(--seq-length), more GPUs or a device with more memory would do")
    assert fits_nowhere_advice(_peak(40.0, 2.0, 10.0), llama, 8) == (
        "more GPUs, a smaller model or a device with more memory would do")


def test_the_model_state_count_says_its_multi_token_prediction_share():
    """The plan CSV's num_parameters leaves DeepSeek-V3's MTP layer out; the memory
    message counts it, and now says so (671.0B there, 682.6B here, was unexplained).
    4 of its 61 layers: 3 MoE layers of 11.5B, a dense one of 0.6B, embedding and head
    1.85B, the MTP layer 11.6B."""
    model = replace(PRESETS["deepseek-v3"], num_layers=4, moe_layer_freq=(0, 1, 1, 1))
    cluster = load_cluster("dgx-h100")
    with pytest.raises(StrategyError, match=r"its weights, gradients and optimizer state alone are 874.2 GB \(48.6B "
                                            r"parameters, 11.6B of them multi-token prediction, x 18 bytes, bf16\)"):
        search(TransformerPlanRequest(model, cluster, 8, 8), CAL.comm_model(cluster), CAL.efficiency)


def test_a_long_sequence_planned_without_context_parallelism_says_why():
    long_ds = replace(PRESETS["deepseek-v3"], seq_length=32768)
    assert context_parallel_note(long_ds, ()) == (
        "context parallelism is not searched: it is not priced for deepseek-v3's multi-latent attention "
        "(docs/stages/plan.md), so its 32,768-token sequences are planned without it")
    assert context_parallel_note(long_ds, (1,)) == ""  # the user chose
    assert context_parallel_note(PRESETS["deepseek-v3"], ()) == ""  # 4,096 tokens: CP is not searched anyway
    assert context_parallel_note(replace(PRESETS["llama3-70b"], seq_length=131072), ()) == ""  # searched


def test_predict_on_a_device_without_calibration_says_so_once(tmp_path, capsys):
    """The warning of `calibration_for` and predict's own note said the same thing twice;
    the note stays for a calibration named with --calibration."""
    runs = tmp_path / "runs.csv"
    runs.write_text("model,tensor_model_parallel_size,pipeline_model_parallel_size,data_parallel_size,"
                    "global_batch_size,micro_batch_size\nllama3-8b,1,1,8,64,1\n")
    assert main(["predict", str(runs), "--cluster", "gh200-alps", "-o", str(tmp_path / "a.csv"), "--no-track"]) == 0
    err = capsys.readouterr().err
    assert err.count("A100-SXM4-80GB") == 1 and "note: calibration" not in err
    assert main(["predict", str(runs), "--cluster", "dgx-h100", "--calibration", "a100-vtrain", "-o",
                 str(tmp_path / "b.csv"), "--no-track"]) == 0
    assert ("paraplan predict: note: calibration 'a100-vtrain' was fitted on A100-SXM4-80GB; H100-SXM5-80GB gets "
            "its efficiencies as fractions of its own datasheet peaks") in capsys.readouterr().err


def test_a_llama4_run_row_takes_its_models_router_and_a_stated_softmax_says_why_not(tmp_path, capsys):
    """A row that leaves the router columns empty runs Llama 4's own sigmoid router; one
    that states Megatron-Core's softmax for top-1 routing is refused, naming the fix."""
    runs = tmp_path / "runs.csv"
    runs.write_text("model,tensor_model_parallel_size,pipeline_model_parallel_size,data_parallel_size,"
                    "expert_model_parallel_size,sequence_parallel,global_batch_size,micro_batch_size\n"
                    "llama4-scout,4,1,16,16,true,256,1\n")
    assert main(["predict", str(runs), "--cluster", "dgx-h100", "-o", str(tmp_path / "a.csv"), "--no-track"]) == 0
    runs.write_text(runs.read_text().replace("micro_batch_size\n", "micro_batch_size,moe_router_score_function\n")
                    .replace(",1\n", ",1,softmax\n"))
    assert main(["predict", str(runs), "--cluster", "dgx-h100", "-o", str(tmp_path / "a.csv"), "--no-track"]) == 2
    assert capsys.readouterr().err.endswith(
        "runs.csv:2: impossible run: moe_router_topk 1 with the softmax score function needs moe_router_pre_softmax "
        "(Megatron-Core: a softmax over one expert has a zero gradient), or moe_router_score_function sigmoid "
        "(Llama 4's router)\n")


def test_an_expert_row_that_leaves_etp_empty_is_told_it_is_tp(tmp_path, capsys):
    """Megatron-Core's ETP defaults to TP; the plan writes ETP 1, a hand-written row with
    EP alone did not know why 8 x 2 came up."""
    runs = tmp_path / "runs.csv"
    runs.write_text("model,tensor_model_parallel_size,pipeline_model_parallel_size,data_parallel_size,"
                    "expert_model_parallel_size,sequence_parallel,global_batch_size,micro_batch_size\n"
                    "mixtral-8x22b,2,8,4,8,true,256,1\n")
    assert main(["predict", str(runs), "--cluster", "dgx-h100", "-o", str(tmp_path / "a.csv"), "--no-track"]) == 2
    assert capsys.readouterr().err.endswith(
        "runs.csv:2: impossible run: expert_model_parallel_size x expert_tensor_parallel_size = 8 x 2 does not "
        "divide the tensor x data-parallel ranks of a pipeline stage, 2 x 4 (Megatron-Core: EP x ETP x PP must "
        "divide the world size); expert_tensor_parallel_size left empty is the tensor-parallel size, 2 "
        "(Megatron-Core's default): set it, e.g. 1\n")


def test_a_csv_named_as_the_model_says_what_a_model_file_is(tmp_path, capsys):
    plan = tmp_path / "plans.csv"
    plan.write_text("rank,model\n1,llama3-8b\n")
    assert main(["plan", "--model", str(plan), "--cluster", "dgx-h100", "--gpus", "8", "--global-batch-size", "8",
                 "-o", str(tmp_path / "x.csv"), "--no-track"]) == 2
    assert capsys.readouterr().err.endswith(
        "plans.csv: expected a model description (a Hugging Face config.json or TransformerModel fields) (a YAML "
        "mapping), got a YAML str\n")


def test_a_mistyped_calibration_name_lists_the_known_ones(tmp_path, capsys):
    assert main(["plan", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8", "--global-batch-size", "8",
                 "--calibration", "h100", "-o", str(tmp_path / "x.csv"), "--no-track"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("paraplan plan: error: option --calibration: no calibration named 'h100' (")
    assert err.endswith("h100.json not found); known calibrations: a100-vtrain, h100-transfer, mi300x-transfer; "
                        "or a path to a `paraplan calibrate` JSON\n")


KIMI_K2 = {  # the architecture keys of moonshotai/Kimi-K2-Instruct's config.json
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "kimi_k2", "first_k_dense_replace": 1,
    "hidden_act": "silu", "hidden_size": 7168, "intermediate_size": 18432, "kv_lora_rank": 512,
    "max_position_embeddings": 131072, "moe_intermediate_size": 2048, "moe_layer_freq": 1, "n_group": 1,
    "n_routed_experts": 384, "n_shared_experts": 1, "norm_topk_prob": True, "num_attention_heads": 64,
    "num_experts_per_tok": 8, "num_hidden_layers": 61, "num_key_value_heads": 64, "num_nextn_predict_layers": 0,
    "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "routed_scaling_factor": 2.827,
    "scoring_func": "sigmoid", "tie_word_embeddings": False, "topk_group": 1, "topk_method": "noaux_tc",
    "v_head_dim": 128, "vocab_size": 163840, "attention_bias": False, "rms_norm_eps": 1e-06,
}


def test_kimi_k2_is_read_as_deepseek_v3s_architecture():
    """Its model_type was unknown: read from its keys alone, the shared expert was
    ignored with a warning (1,023.8B, 30.2B active). Moonshot's card: 1T total, 32B
    activated; 60 MoE layers of 384 experts of 3 x 7,168 x 2,048 are 1,014.7B of it."""
    from paraplan.predict.hf_config import read_hf_config

    read = read_hf_config(KIMI_K2, "kimi-k2", "config.json")
    assert (read.notes, read.ignored) == ((), ())
    m = read.model
    assert (m.num_parameters, m.active_parameters) == (1_026_408_209_408, 32_861_477_888)
    assert m.multi_latent_attention and m.moe_shared_expert_intermediate_size == 2048 and m.num_moe_layers == 60
    # a file of a known RMSNorm family that states neither rms_norm_eps nor attention_bias
    # is read as its transformers class builds it (was LayerNorm with biases: +261.6M)
    trimmed = {k: v for k, v in KIMI_K2.items() if k not in ("rms_norm_eps", "attention_bias")}
    assert read_hf_config(trimmed, "kimi-k2", "config.json").model == m


def test_the_kimi_k2_preset_is_its_file_at_its_pre_training_length():
    """The preset is the file read at 4,096 tokens (the report's first pre-training phase),
    with the grouped-query default (as many groups as heads: 0) spelled as presets do."""
    from paraplan.predict.hf_config import read_hf_config

    read = read_hf_config(KIMI_K2, "kimi-k2", "config.json").model
    assert PRESETS["kimi-k2"] == replace(read, seq_length=4096, num_query_groups=0)
    assert (PRESETS["kimi-k2"].num_parameters, PRESETS["kimi-k2"].active_parameters) == (1_026_408_209_408,
                                                                                        32_861_477_888)


def test_a_device_of_the_same_compute_takes_its_calibration_without_a_warning(tmp_path, capsys):
    """dgx-h200's device computes as the H100 SXM5 (`same_compute_as`): predict takes the
    H100's shipped calibration and says nothing; naming it is no note either."""
    runs = tmp_path / "runs.csv"
    runs.write_text("model,tensor_model_parallel_size,pipeline_model_parallel_size,data_parallel_size,"
                    "global_batch_size,micro_batch_size\nllama3-8b,1,1,8,64,1\n")
    for extra in ([], ["--calibration", "h100-transfer"]):
        assert main(["predict", str(runs), "--cluster", "dgx-h200", "-o", str(tmp_path / "a.csv"), "--no-track",
                     *extra]) == 0
        err = capsys.readouterr().err
        assert "with h100-transfer@" in err and "warning" not in err and "note: calibration" not in err
        with (tmp_path / "a.csv").open(newline="") as handle:
            assert next(csv.DictReader(handle))["calibration"].startswith("h100-transfer@")


def test_the_baselines_say_what_they_run(tmp_path, capsys):
    """On one GPU the best plan and the baselines share TP 1, PP 1, DP 1; the speedup
    over them is the micro-batch and recomputation, which the line above them says."""
    assert main(["plan", "--model", "gpt3-350m", "--cluster", "dgx-h100", "--gpus", "1", "--global-batch-size", "8",
                 "--top-k", "1", "-o", str(tmp_path / "x.csv"), "--no-track"]) == 0
    err = capsys.readouterr().err
    assert ("paraplan plan: data-parallel baselines (DP 1, micro-batch 1, full recomputation, each with its own "
            "overlap or ZeRO stage):\nparaplan plan: baseline dp_no_overlap: ") in err
    assert "best: TP 1, PP 1, DP 1, micro-batch 8, no recomputation" in err

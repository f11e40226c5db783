"""Run tables that name their model (`model` column: a preset or a model file) or give
the architecture columns beyond GPT/Llama; `num_parameters` / `active_parameters` in
the outputs."""

import csv
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from paraplan.cli.main import main
from paraplan.core import InputFileError
from paraplan.predict.models import PRESETS
from paraplan.predict.runtable import read_run_table

HF = Path(__file__).resolve().parents[1] / "data" / "hf"
SETTINGS = "tensor_model_parallel_size,pipeline_model_parallel_size,data_parallel_size,global_batch_size"


def table(path: Path, header: str, *rows: str) -> Path:
    path.write_text("\n".join([header, *rows]) + "\n")
    return path


def test_a_preset_row_takes_its_architecture_and_may_set_the_sequence_length(tmp_path):
    path = table(tmp_path / "runs.csv", f"model,seq_length,{SETTINGS},micro_batch_size",
                 "llama3-8b,,8,1,1,8,1", "llama3-8b,4096,8,1,1,8,1")
    _, (a, b) = read_run_table(path)
    assert a.model == PRESETS["llama3-8b"] and a.name == "llama3-8b"
    assert b.model == replace(PRESETS["llama3-8b"], seq_length=4096)


def test_a_config_file_is_found_beside_the_table(tmp_path, capsys):
    (tmp_path / "configs").mkdir()
    shutil.copy(HF / "qwen3-32b.json", tmp_path / "configs" / "qwen3-32b.json")
    path = table(tmp_path / "runs.csv", f"model,seq_length,{SETTINGS},micro_batch_size",
                 "configs/qwen3-32b.json,4096,8,2,1,16,1", "configs/qwen3-32b.json,4096,8,4,1,16,1")
    _, rows = read_run_table(path)
    assert rows[0].model.kv_channels == 128 and rows[0].model.qk_layernorm and rows[0].model.seq_length == 4096
    assert rows[0].model is rows[1].model  # read once per table
    with pytest.raises(InputFileError, match=r"runs.csv:2: column 'model': 'configs/none.json' is neither a preset"):
        read_run_table(table(tmp_path / "runs.csv", f"model,{SETTINGS}", "configs/none.json,8,1,1,8"))


def test_a_preset_row_may_say_how_many_mtp_layers_the_run_trains(tmp_path):
    """`mtp_num_layers` is Megatron's training argument: beside a model it replaces the
    model's count (NeMo AutoModel's DeepSeek-V3 trains none: 671.0B parameters, the card's
    671B; with its MTP layer 682.6B)."""
    path = table(tmp_path / "runs.csv", f"model,mtp_num_layers,{SETTINGS},micro_batch_size",
                 "deepseek-v3,0,8,8,16,1024,1", "deepseek-v3,,8,8,16,1024,1")
    _, (none, own) = read_run_table(path)
    assert none.model == replace(PRESETS["deepseek-v3"], mtp_num_layers=0) and own.model == PRESETS["deepseek-v3"]
    assert round(none.model.num_parameters / 1e9, 1) == 671.0 and none.model.mtp_parameters == 0
    assert round((own.model.num_parameters + own.model.mtp_parameters) / 1e9, 1) == 682.6


def test_a_model_and_its_dimensions_in_one_row_is_a_conflict(tmp_path):
    path = table(tmp_path / "runs.csv", f"model,hidden_size,{SETTINGS}", "llama3-8b,4096,8,1,1,8")
    with pytest.raises(InputFileError) as err:
        read_run_table(path)
    assert str(err.value) == (f"{path}:2: a row with a model ('llama3-8b') takes its architecture from it; "
                              "column 'hidden_size' must be empty (or give the dimensions without a model)")
    # a row without a model needs its dimensions, and says it could name a model instead
    path = table(tmp_path / "runs.csv", f"model,num_layers,hidden_size,num_attention_heads,seq_length,vocab_size,"
                 f"{SETTINGS}", ",2,256,4,,1000,1,1,1,8")
    with pytest.raises(InputFileError, match=r"runs.csv:2: column 'seq_length': expected a whole number .*, got an "
                       r"empty cell \(or a model column"):
        read_run_table(path)


def test_columns_beyond_gpt_reach_the_model(tmp_path):
    header = ("num_layers,hidden_size,num_attention_heads,seq_length,vocab_size,kv_channels,qk_layernorm,"
              f"gated_linear_unit,window_size,window_attn_skip_freq,add_qkv_bias,{SETTINGS}")
    _, (row,) = read_run_table(table(tmp_path / "runs.csv", header, "6,1024,8,4096,32000,256,true,true,1024,6,"
                                     "true,1,1,1,8"))
    m = row.model
    assert (m.kv_channels, m.qk_layernorm, m.gated_linear_unit, m.window_size, m.window_attn_skip_freq,
            m.add_qkv_bias) == (256, True, True, 1024, 6, True)
    assert m.windowed_layers == (True,) * 5 + (False,)
    header = ("num_layers,hidden_size,num_attention_heads,seq_length,vocab_size,multi_latent_attention,"
              f"kv_lora_rank,qk_head_dim,qk_pos_emb_head_dim,v_head_dim,num_experts,{SETTINGS}")
    _, (row,) = read_run_table(table(tmp_path / "runs.csv", header, "2,1024,8,1024,32000,true,256,64,32,64,,1,1,1,8"))
    assert row.model.multi_latent_attention and row.model.kv_lora_rank == 256
    with pytest.raises(InputFileError, match=r"runs.csv:2: column 'window_size': expected a whole number \(0: none\)"):
        read_run_table(table(tmp_path / "runs.csv", f"num_layers,hidden_size,num_attention_heads,seq_length,"
                             f"vocab_size,window_size,{SETTINGS}", "2,1024,8,1024,32000,-5,1,1,1,8"))


def test_predict_writes_the_parameter_counts(tmp_path):
    runs = table(tmp_path / "runs.csv", f"model,seq_length,{SETTINGS},micro_batch_size,dtype",
                 "llama3-8b,2048,8,1,1,8,1,bf16")
    out = tmp_path / "out.csv"
    assert main(["predict", str(runs), "--cluster", "dgx-h100", "-o", str(out), "--no-track"]) == 0
    with out.open() as handle:
        (row,) = list(csv.DictReader(handle))
    assert row["model"] == "llama3-8b"
    assert int(row["num_parameters"]) == int(row["active_parameters"]) == PRESETS["llama3-8b"].num_parameters
    assert float(row["predicted_iteration_s"]) > 0


def test_recompute_modules_column(tmp_path):
    header = f"model,seq_length,{SETTINGS},recompute_granularity,recompute_modules"
    _, (row,) = read_run_table(table(tmp_path / "runs.csv", header, "llama3-8b,4096,1,1,8,8,selective,core_attn mlp"))
    assert row.settings.recompute_modules == ("core_attn", "mlp")
    with pytest.raises(InputFileError, match=r"runs.csv:2: column 'recompute_modules': expected module names among "
                       r"core_attn, mla_up_proj, layernorm, mlp, moe_act, moe, shared_experts separated by spaces, "
                       r"got 'mhc'"):
        read_run_table(table(tmp_path / "runs.csv", header, "llama3-8b,4096,1,1,8,8,selective,core_attn mhc"))

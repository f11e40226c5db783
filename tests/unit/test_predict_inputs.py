"""Run tables, model files and calibration files: what is accepted and the errors."""

import json

import pytest

from paraplan.core import InputFileError
from paraplan.predict.calibration import Calibration, load_calibration
from paraplan.predict.device_model import DeviceEfficiency
from paraplan.predict.models import PRESETS, from_hf_config, load_model
from paraplan.predict.runtable import read_run_table

HEADER = ("name,num_layers,hidden_size,num_attention_heads,seq_length,vocab_size,tensor_model_parallel_size,"
          "pipeline_model_parallel_size,data_parallel_size,global_batch_size")


def table(tmp_path, text):
    path = tmp_path / "runs.csv"
    path.write_text(text)
    return path


def test_a_row_with_defaults(tmp_path):
    path = table(tmp_path, HEADER + ",micro_batch_size\nx,24,2048,16,2048,50257,2,2,2,64,2\n")
    header, rows = read_run_table(path)
    (row,) = rows
    assert header[0] == "name" and row.line == 2 and row.name == "x"
    s = row.settings
    assert (s.tensor_model_parallel_size, s.pipeline_model_parallel_size, s.data_parallel_size) == (2, 2, 2)
    assert (s.micro_batch_size, s.num_microbatches, s.dtype, s.recompute_granularity) == (2, 16, "bf16", "none")
    assert s.use_flash_attn  # bf16: flash attention unless told otherwise
    assert not row.search_micro_batch_size and not row.search_virtual_stages


def test_empty_micro_batch_and_virtual_size_are_searched(tmp_path):
    path = table(tmp_path, HEADER + ",micro_batch_size,virtual_pipeline_model_parallel_size,dtype\n"
                 "x,24,2048,16,2048,50257,1,4,1,64,,,fp16\n")
    (row,) = read_run_table(path)[1]
    assert row.search_micro_batch_size and row.search_virtual_stages
    assert not row.settings.use_flash_attn  # fp16: the unfused path by default


@pytest.mark.parametrize(("extra_header", "cells", "message"), [
    (",flavour", "x,24,2048,16,2048,50257,1,1,1,8,vanilla", "runs.csv:1: unknown column 'flavour'"),
    ("", "x,24,2048,16,2048,50257,1,1,3,8",
     "runs.csv:2: impossible run: global_batch_size 8 is not divisible by data_parallel_size x micro_batch_size"),
    ("", "x,24,2048,16,2048,50257,3,1,1,8",
     "runs.csv:2: impossible run: num_attention_heads 16 is not divisible by tensor_model_parallel_size 3"),
    (",num_gpus", "x,24,2048,16,2048,50257,2,2,2,8,16",
     "runs.csv:2: column 'num_gpus': 16 is not tensor x pipeline x data parallel size = 2 x 2 x 2 = 8"),
    ("", "x,24,2048.5,16,2048,50257,1,1,1,8",
     "runs.csv:2: column 'hidden_size': expected a whole number (an integer >= 1 and <= 2^40), got '2048.5': "
     "not an integer"),
    ("", "x,,2048,16,2048,50257,1,1,1,8",
     "runs.csv:2: column 'num_layers': expected a whole number (an integer >= 1 and <= 2^40), got an empty cell"),
    (",sequence_parallel", "x,24,2048,16,2048,50257,2,1,1,8,maybe",
     "runs.csv:2: column 'sequence_parallel': expected true or false, got 'maybe'"),
    (",dtype", "x,24,2048,16,2048,50257,1,1,1,8,int4",
     "runs.csv:2: column 'dtype': expected one of bf16, fp16, fp8, fp32"),
    (",measured_iteration_s", "x,24,2048,16,2048,50257,1,1,1,8,nan",
     "runs.csv:2: column 'measured_iteration_s': expected a time in seconds (a number > 0 and <= 1e7), got 'nan': "
     "not a finite number"),
    ("", "x,24,2048,16,2048,50257,1,1,1", "runs.csv:2: expected 10 fields (as in the header), got 9"),
    ("", "x,24,2048,16,2048,50257,1,1,1,1_000", "runs.csv:2: column 'global_batch_size': expected a whole number"),
    ("", "x,24,2048,16,2048,50257,1,4,1,1000000000",
     "runs.csv:2: 1,000,000,000 micro-batches per iteration (global_batch_size / data_parallel_size with "
     "micro_batch_size searched from 1); expected at most 16,384"),
    (",micro_batch_size,virtual_pipeline_model_parallel_size", "x,320,2048,16,2048,50257,1,32,1,16384,1,10",
     "runs.csv:2: 15,728,640 pipeline operations (3 x stages x micro-batches x model chunks); expected at most "
     "8,388,608"),
    (",hidden_dropout", "x,24,2048,16,2048,50257,1,1,1,8,1.0",
     "runs.csv:2: column 'hidden_dropout': expected a probability in [0, 1), got '1.0'"),
])
def test_bad_rows_name_line_column_and_expectation(tmp_path, extra_header, cells, message):
    path = table(tmp_path, HEADER + extra_header + "\n" + cells + "\n")
    with pytest.raises(InputFileError) as err:
        read_run_table(path)
    assert message in str(err.value)


def test_missing_required_column_and_non_utf8(tmp_path):
    path = table(tmp_path, "num_layers,hidden_size\n1,2\n")
    with pytest.raises(InputFileError, match=r"runs.csv:1: missing column\(s\) num_attention_heads, seq_length"):
        read_run_table(path)
    bad = tmp_path / "bad.csv"
    bad.write_bytes(HEADER.encode() + b"\n\xff\xfe\n")
    with pytest.raises(InputFileError, match="not UTF-8"):
        read_run_table(bad)


LLAMA3_8B_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
    "intermediate_size": 14336, "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "vocab_size": 128256, "max_position_embeddings": 8192, "hidden_act": "silu", "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0, "tie_word_embeddings": False, "attention_bias": False,
}


def test_hugging_face_llama_config_equals_the_preset():
    model = from_hf_config(LLAMA3_8B_CONFIG, "llama3-8b")
    assert model == PRESETS["llama3-8b"]


def test_model_files_by_path(tmp_path):
    hf = tmp_path / "llama" / "config.json"
    hf.parent.mkdir()
    hf.write_text(json.dumps(LLAMA3_8B_CONFIG))
    assert load_model(str(hf)).num_parameters == PRESETS["llama3-8b"].num_parameters
    own = tmp_path / "tiny.yaml"
    own.write_text("num_layers: 2\nhidden_size: 64\nnum_attention_heads: 4\nseq_length: 128\nvocab_size: 1000\n")
    assert load_model(str(own)).name == "tiny"
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps({**LLAMA3_8B_CONFIG, "num_attention_heads": 0}))
    with pytest.raises(InputFileError, match="key 'num_attention_heads': expected an integer >= 1, got 0"):
        load_model(str(broken))


def test_calibration_round_trip_and_label(tmp_path):
    cal = Calibration("test", "A100-SXM4-80GB", DeviceEfficiency(gemm_efficiency=0.7), fitted=("gemm_efficiency",))
    path = tmp_path / "test.json"
    path.write_text(json.dumps(cal.to_dict()))
    back = load_calibration(str(path))
    assert back.efficiency == cal.efficiency and back.label == cal.label
    assert back.label.startswith("test@") and len(back.label) == len("test@") + 8
    path.write_text(json.dumps({**cal.to_dict(), "efficiency": {"gemm_efficiency": 2.0}}))
    with pytest.raises(InputFileError, match=r"test.json: efficiency.gemm_efficiency: expected a fraction of the peak "
                       r"\(a number > 0 and <= 1\), got 2.0: out of range"):
        load_calibration(str(path))


def test_shipped_calibration_is_for_the_dgx_a100_device():
    cal = load_calibration()
    assert cal.device == "A100-SXM4-80GB"
    assert cal.errors["cross_validated"]["mape"] < 0.08


@pytest.mark.parametrize(("efficiency", "message"), [
    ({"host_kernel_s": 5.0}, r"efficiency.host_kernel_s: expected seconds \(a number >= 0 and <= 1\), got 5.0: "
                             r"more than a second to run or issue one kernel or collective; wrong unit\? \(seconds\)"),
    ({"gemm_k_half": "600"}, r"efficiency.gemm_k_half: expected a GEMM depth in elements .*, got '600'"),
    ({"host_overlap_exponent": 0.5}, r"efficiency.host_overlap_exponent: expected an exponent \(a number >= 1 "
                                     r"and <= 1000\), got 0.5: out of range"),
])
def test_calibration_values_out_of_range_name_the_key(tmp_path, efficiency, message):
    path = tmp_path / "cal.json"
    path.write_text(json.dumps({**Calibration("c", "A100-SXM4-80GB", DeviceEfficiency()).to_dict(),
                                "efficiency": efficiency}))
    with pytest.raises(InputFileError, match=r"cal.json: " + message):
        load_calibration(str(path))
    path.write_text('{"schema_version": 1, "name": "c", "device": "d", "efficiency": {"gemm_efficiency": NaN}}')
    with pytest.raises(InputFileError, match=r"cal\.json: not valid JSON: NaN is not a JSON value"):
        load_calibration(str(path))


def test_calibration_with_a_broken_comm_fit_is_refused_when_read(tmp_path):
    document = Calibration("c", "A100-SXM4-80GB", DeviceEfficiency()).to_dict()
    fit = {"collective": "all_reduce", "world_size": 8, "nodes": 1, "tier": "intra", "model": "alpha_beta",
           "chosen": True, "params": {"alpha_s": 1e-5, "beta_Bps": -1e9, "busbw_factor": 1.75},
           "size_range_bytes": [1024, 2**30]}
    document["intra_node_comm"] = {"schema_version": 1, "fits": [fit]}
    path = tmp_path / "cal.json"
    path.write_text(json.dumps(document))
    with pytest.raises(InputFileError, match=r"cal.json: intra_node_comm: fits\[0\].params: predict -0.00"):
        load_calibration(str(path))
    fit["params"]["beta_Bps"] = 1e9
    fit["size_range_bytes"] = [2**30, 1024]
    path.write_text(json.dumps(document))
    with pytest.raises(InputFileError, match=r"fits\[0\].size_range_bytes: expected \[smallest, largest\] sizes"):
        load_calibration(str(path))


@pytest.mark.parametrize(("config", "message"), [
    ({"num_hidden_layers": 100_000, "hidden_size": 64, "num_attention_heads": 1, "vocab_size": 8,
      "max_position_embeddings": 8}, "num_layers 100,000 is above 65,536: more layers than any trained model has"),
    ({"num_hidden_layers": 2, "hidden_size": 2**25, "num_attention_heads": 1, "vocab_size": 8,
      "max_position_embeddings": 8}, "hidden_size 33,554,432 is above 16,777,216: wider than any trained model"),
    ({"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 1, "vocab_size": 8,
      "max_position_embeddings": 8, "hidden_dropout": "0.1"}, r"key 'hidden_dropout': expected a probability in "
                                                              r"\[0, 1\), got '0.1'"),
    ({"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 1, "vocab_size": 8,
      "max_position_embeddings": 8, "tie_word_embeddings": "false"}, "key 'tie_word_embeddings': expected true "
                                                                     "or false, got 'false'"),
])
def test_absurd_or_mistyped_model_files_name_the_file(tmp_path, config, message):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    with pytest.raises(InputFileError, match=r"config.json: .*" + message):
        load_model(str(path))

"""Round 4's inputs audited as a careless user would feed them (issues 21 and 24):
result files given to `paraplan report` (kernel fits, calibrations, comm_model.json),
the `chunked_attention` run-table column, `selective_ac_option` against its recompute
settings, and Hugging Face files whose architectures paraplan does not model, each
through the CLI: one error line naming the file, line, column or key and what was
expected, no traceback, no output written. "was:" says what happened before."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from paraplan.cli.main import main

REPO = Path(__file__).resolve().parents[2]
KERNELS = json.loads((REPO / "config/kernels/H100-SXM5-80GB.json").read_text())
CALIBRATION = json.loads((REPO / "config/calibrations/h100-transfer.json").read_text())


def _error(capsys, argv: list[str]) -> str:
    """The one line a failing command prints (no traceback: main returns 2)."""
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"paraplan {argv[0]}: error: "), err
    return err[0].removeprefix(f"paraplan {argv[0]}: error: ")


def _report(tmp_path, capsys, where: str, document: object) -> str:
    path = tmp_path / where
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document))
    out = tmp_path / "summary.md"
    message = _error(capsys, ["report", str(path), "-o", str(out), "--no-track"])
    assert not out.exists()
    return message.replace(f"{tmp_path}/", "")


# ---- paraplan report: kernel fits through the loader -------------------------------------

K = "results/kernels/h100/fit.json"


@pytest.mark.parametrize(("document", "message"), [
    # was: AttributeError: 'list' object has no attribute 'get' (a traceback)
    ([1, 2], f"{K}: expected a kernel fit (make one with `paraplan fit --kind kernels`) (a JSON object), got a JSON "
             "list"),
    ({**KERNELS, "gemm": [1]}, f"{K}: gemm: expected a JSON object, got [1]"),
    # was: AttributeError: 'str' object has no attribute 'get'
    ({**KERNELS, "gemm": {**KERNELS["gemm"], "params": "x"}}, f"{K}: gemm.params: expected a JSON object, got 'x'"),
    # was: ValueError: Unknown format code 'f' for object of type 'str'
    ({**KERNELS, "gemm": {**KERNELS["gemm"], "mape": "bad"}}, f"{K}: gemm.mape: expected a number, got 'bad'"),
    # was: TypeError: unsupported format string passed to list.__format__
    ({**KERNELS, "attention": {**KERNELS["attention"], "heldout_mape": [1]}},
     f"{K}: attention.heldout_mape: expected a number, got [1]"),
    # was: summarised as if valid (the loader refuses it everywhere else)
    ({**KERNELS, "efficiency": {**KERNELS["efficiency"], "gemm_efficiency": "x"}},
     f"{K}: efficiency.gemm_efficiency: expected a fraction of the peak (a number > 0 and <= 1), got 'x'"),
    ({k: v for k, v in KERNELS.items() if k != "schema_version"}, f"{K}: schema_version None; expected 1"),
])
def test_report_reads_kernel_fits_through_the_loader(tmp_path, capsys, document, message):
    assert _report(tmp_path, capsys, K, document) == message


def test_report_still_summarises_the_shipped_kernel_fit(tmp_path):
    path = tmp_path / K
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(KERNELS))
    out = tmp_path / "summary.md"
    assert main(["report", str(path), "-o", str(out), "--no-track"]) == 0
    row = next(line for line in out.read_text().splitlines() if line.startswith("| h100/fit |"))
    assert "| H100-SXM5-80GB |" in row


C = "results/calibrations/cal.json"
F = "results/fits/c/comm_model.json"


@pytest.mark.parametrize(("where", "document", "message"), [
    # was: summarised (a calibration every other command refuses)
    (C, {"efficiency": 3}, f"{C}: schema_version None; expected 1"),
    # was: AttributeError: 'list' object has no attribute 'get'
    (C, {**CALIBRATION, "errors": [1]}, f"{C}: errors: expected a JSON object, got [1]"),
    (C, {**CALIBRATION, "errors": {"cross_validated": {"mape": "x"}}},
     f"{C}: errors.cross_validated.mape: expected a number, got 'x'"),
    # was: AttributeError: 'list' object has no attribute 'get'
    (F, [1], f"{F}: expected a comm model (paraplan fit's comm_model.json) (a JSON object), got a JSON list"),
    (F, {"fits": [3]}, f"{F}: fits[0]: expected a JSON object, got 3"),
    (F, {"fits": [{"collective": "all_reduce", "model": "table", "world_size": "8"}]},
     f"{F}: fits[0].world_size: expected an integer, got '8'"),
    (F, {"fits": [{"collective": "all_reduce", "model": "table", "world_size": 8, "heldout_gmae": "low"}]},
     f"{F}: fits[0].heldout_gmae: expected a number, got 'low'"),
])
def test_report_checks_calibrations_and_comm_models(tmp_path, capsys, where, document, message):
    assert _report(tmp_path, capsys, where, document) == message


# ---- run tables ------------------------------------------------------------------------

HEADER = ("name,num_layers,hidden_size,num_attention_heads,seq_length,vocab_size,tensor_model_parallel_size,"
          "pipeline_model_parallel_size,data_parallel_size,global_batch_size,micro_batch_size")
CELLS = "x,4,1024,16,8192,32000,2,2,2,64,1"


def _predict(tmp_path, capsys, header: str, row: str) -> str:
    table = tmp_path / "runs.csv"
    table.write_text(f"{header}\n{row}\n")
    out = tmp_path / "out.csv"
    message = _error(capsys, ["predict", str(table), "--cluster", "dgx-h100", "-o", str(out), "--no-track"])
    assert not out.exists()
    return message.replace(f"{tmp_path}/", "")


@pytest.mark.parametrize(("columns", "cells", "message"), [
    (",chunked_attention", ",true", "runs.csv:2: chunked_attention needs a window_size (the chunk's length in tokens)"),
    (",chunked_attention,window_size", ",maybe,512",
     "runs.csv:2: column 'chunked_attention': expected true or false, got 'maybe'"),
])
def test_chunked_attention_column(tmp_path, capsys, columns, cells, message):
    assert _predict(tmp_path, capsys, HEADER + columns, CELLS + cells) == message


def test_chunked_attention_column_prices_a_row(tmp_path):
    table = tmp_path / "runs.csv"
    table.write_text(f"{HEADER},window_size,window_attn_skip_freq,chunked_attention\n{CELLS},2048,4,true\n"
                     f"{CELLS.replace('x,', 'y,', 1)},2048,4,false\n{CELLS.replace('x,', 'z,', 1)},,,\n")
    out = tmp_path / "out.csv"
    assert main(["predict", str(table), "--cluster", "dgx-h100", "-o", str(out), "--no-track"]) == 0
    import pandas as pd

    rows = pd.read_csv(out).set_index("name")
    time = rows["predicted_iteration_s"]
    assert time["x"] < time["y"] < time["z"]  # chunks: fewer pairs than a sliding window, which has fewer than full


def test_a_chunked_layer_has_its_own_calibration_key():
    """A layer-time factor measured on sliding-window layers never scales chunked ones."""
    from dataclasses import replace

    from paraplan.core.run_settings import RunSettings
    from paraplan.predict.layer_factors import layer_shape_key
    from paraplan.predict.models import PRESETS

    scout, run = PRESETS["llama4-scout"], RunSettings()
    assert "window=8192/4chunked" in layer_shape_key(scout, run, "H100-SXM5-80GB")
    assert "window=8192/4," in layer_shape_key(replace(scout, chunked_attention=False), run, "H100-SXM5-80GB")


def test_context_parallelism_with_chunked_attention_says_chunked(tmp_path, capsys):
    """was: "... with sliding-window attention is not modelled" for a chunked model."""
    columns = ",window_size,window_attn_skip_freq,chunked_attention,context_parallel_size,use_flash_attn"
    assert _predict(tmp_path, capsys, HEADER + columns, CELLS + ",2048,4,true,2,true") == (
        "runs.csv:2: impossible run: context_parallel_size 2 with chunked attention is not modelled (the "
        "context-parallel attention core prices full causal attention with one head width)")


@pytest.mark.parametrize(("cells", "message"), [
    # was: "... got none core_attn"
    (",op,,", "recompute_granularity none, recompute_modules core_attn"),
    (",op,full,", "recompute_granularity full, recompute_modules core_attn"),
    (",op,selective,mlp", "recompute_granularity selective, recompute_modules mlp"),
])
def test_selective_ac_option_names_what_it_got(tmp_path, capsys, cells, message):
    header = ("name,model,seq_length,tensor_model_parallel_size,pipeline_model_parallel_size,data_parallel_size,"
              "global_batch_size,micro_batch_size,selective_ac_option,recompute_granularity,recompute_modules")
    got = _predict(tmp_path, capsys, header, "x,llama3-8b,2048,1,2,4,64,1" + cells)
    assert got == ("runs.csv:2: impossible run: selective_ac_option op needs recompute_granularity selective and the "
                   f"default recompute_modules (core_attn), got {message}")


# ---- Hugging Face files through the CLI --------------------------------------------------

LLAMA = json.loads((REPO / "tests/data/hf/llama-3.1-8b.json").read_text())


@pytest.mark.parametrize(("changes", "message"), [
    # was: planned as Llama 3.1 8B with a warning "ignored (not modelled): index_topk"
    ({"index_topk": 2048}, "key 'index_topk': DeepSeek sparse attention (an indexer choosing index_topk keys per "
                           "query), which paraplan does not model"),
    # was: a warning "ignored (not modelled): layer_types" and every layer full attention
    ({"layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"] * 8},
     "key 'layer_types': 'linear_attention' layers are linear-attention layers, which paraplan does not model"),
    # was: a warning "ignored (not modelled): mamba_d_conv"
    ({"mamba_d_conv": 4}, "key 'mamba_d_conv': state-space (Mamba) layers, which paraplan does not model"),
    # was: read as a sliding window of 8,192 (twice the attention pairs at 32k tokens)
    ({"attention_chunk_size": 8192, "no_rope_layers": [1, 0, 0, 1] * 8},
     "key 'no_rope_layers': only a regular pattern of chunked and full attention layers is modelled (every k-th "
     "layer full); got full attention on layers [1, 2, 5, 6, 9, 10, 13, 14, 17, 18, 21, 22, 25, 26, 29, 30] of 32"),
])
def test_plan_refuses_hf_architectures_it_does_not_model(tmp_path, capsys, changes, message):
    path = tmp_path / "m" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps({**LLAMA, **changes}))
    out = tmp_path / "plan.csv"
    got = _error(capsys, ["plan", "--model", str(path), "--cluster", "dgx-h100", "--gpus", "8",
                          "--global-batch-size", "8", "--seq-length", "4096", "-o", str(out), "--no-track"])
    assert not out.exists()
    assert got.replace(f"{tmp_path}/", "") == f"m/config.json: {message}"

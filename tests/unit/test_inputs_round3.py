"""This round's inputs audited as a careless user would feed them (issue 21): run-table
columns of the attention backend, sharded gradient reduction, pipeline p2p and
group-limited routing; a Hugging Face config's `n_group` / `topk_group` / `topk_method`;
a cluster file's device memory and `reserved`; `paraplan fit --kind kernels` options and
sustained-GEMM rows; a kernel file's `attention_kernels` / `sustained` sections. Each is
one error line naming the file, line, column or key and what was expected. "was:" says
what happened before this round's fixes; cases without it were already right and are
kept from regressing."""

from __future__ import annotations

import csv
import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from paraplan.cli.main import main
from paraplan.core import InputFileError
from paraplan.kernels.ceilings import KernelCeilings

REPO = Path(__file__).resolve().parents[2]
HEADER = ("name,num_layers,hidden_size,num_attention_heads,seq_length,vocab_size,tensor_model_parallel_size,"
          "pipeline_model_parallel_size,data_parallel_size,global_batch_size,micro_batch_size")
CELLS = "x,4,1024,16,2048,32000,2,2,2,64,1"
MOE = ",num_experts,moe_router_topk,moe_router_num_groups,moe_router_group_topk"


def _error(capsys, argv: list[str]) -> str:
    """The one line a failing command prints (no traceback: main returns 2)."""
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err and err[-1].startswith(f"paraplan {argv[0]}: error: ")
    return err[-1].removeprefix(f"paraplan {argv[0]}: error: ")


def _predict(tmp_path, capsys, columns: str, cells: str, cluster: str = "dgx-h100") -> str:
    table = tmp_path / "runs.csv"
    table.write_text(f"{HEADER}{columns}\n{CELLS}{cells}\n")
    out = tmp_path / "out.csv"
    message = _error(capsys, ["predict", str(table), "--cluster", cluster, "-o", str(out), "--no-track"])
    assert not out.exists()
    return message.replace(f"{tmp_path}/", "")


# ---- run-table columns -------------------------------------------------------------


@pytest.mark.parametrize(("columns", "cells", "message"), [
    (",attention_backend", ",FLASH",
     "runs.csv:2: column 'attention_backend': expected one of flash, fused, unfused, local, auto, got 'FLASH'"),
    (",attention_backend", ",true",
     "runs.csv:2: column 'attention_backend': expected one of flash, fused, unfused, local, auto, got 'true'"),
    (",flash_attention_version", ",2.0", "runs.csv:2: column 'flash_attention_version': expected one of 2, 3, 4, "
                                         "got '2.0'"),
    (",flash_attention_version", ",-1", "runs.csv:2: column 'flash_attention_version': expected one of 2, 3, 4, "
                                        "got '-1'"),
    (",sharded_grad_reduce", ",true", "runs.csv:2: column 'sharded_grad_reduce': expected one of default, "
                                      "every_microbatch, last_microbatch, got 'true'"),
    (",sharded_grad_reduce", ",last_microbatch", "runs.csv:2: impossible run: sharded_grad_reduce last_microbatch "
                                                 "needs sharded gradients (zero_stage 2 or 3), got zero_stage 0"),
    (",overlap_p2p_comm", ",2", "runs.csv:2: column 'overlap_p2p_comm': expected true or false, got '2'"),
    (",scatter_gather_tensors_in_pipeline", ",maybe",
     "runs.csv:2: column 'scatter_gather_tensors_in_pipeline': expected true or false, got 'maybe'"),
    (",batch_p2p_sync", ",-1", "runs.csv:2: column 'batch_p2p_sync': expected true or false, got '-1'"),
    (MOE, ",8,2,-1,1", "runs.csv:2: column 'moe_router_num_groups': expected a whole number (0: none) "
                       "(an integer >= 0 and <= 2^40), got '-1': negative"),
    (MOE, ",8,2,true,1", "runs.csv:2: column 'moe_router_num_groups': expected a whole number (0: none) "
                         "(an integer >= 0 and <= 2^40), got 'true'"),
    (MOE, ",8,2,99999999999999,1", "runs.csv:2: column 'moe_router_num_groups': expected a whole number (0: none) "
                                   "(an integer >= 0 and <= 2^40), got '99999999999999': out of range"),
])
def test_run_table_cells_already_named(tmp_path, capsys, columns, cells, message):
    assert _predict(tmp_path, capsys, columns, cells) == message


def test_flash_attention_version_on_the_unfused_default_names_use_flash_attn(tmp_path, capsys):
    """was: '... but attention_backend auto runs the unfused path; expected attention_backend
    flash or auto' for an fp16 row, whose backend already was auto."""
    assert _predict(tmp_path, capsys, ",flash_attention_version,dtype", ",3,fp16") == (
        "runs.csv:2: impossible run: flash_attention_version 3 pins FlashAttention's generation, but use_flash_attn "
        "is false (the unfused path; an empty use_flash_attn is false for fp16 and fp32); expected use_flash_attn "
        "true")


@pytest.mark.parametrize(("columns", "cells", "problem"), [
    # was: "... needs moe_router_num_groups dividing num_experts 8 and ... got 2 and 0"
    (MOE, ",8,2,2,", "group-limited routing: moe_router_group_topk (how many of the moe_router_num_groups 2 groups "
                     "each token's experts come from) must be in [1, 2], got none"),
    (MOE, ",8,2,4,5", "group-limited routing: moe_router_group_topk (how many of the moe_router_num_groups 4 "
                      "groups each token's experts come from) must be in [1, 4], got 5"),
    (MOE, ",8,2,3,1", "group-limited routing: moe_router_num_groups 3 does not divide num_experts 8"),
    (MOE, ",8,4,4,1", "group-limited routing: each of the moe_router_group_topk 1 chosen groups holds 2 experts "
                      "(num_experts 8 / moe_router_num_groups 4), fewer than moe_router_topk 4 / 1 = 4"),
    (MOE, ",8,2,,2", "moe_router_group_topk 2 needs moe_router_num_groups (group-limited routing), got none"),
    # was: accepted silently on a dense model (the column was dropped)
    (",moe_router_group_topk", ",2", "moe_router_group_topk 2 needs num_experts > 0, got 0"),
    # was: "moe_ffn_hidden_size / moe_shared_expert_intermediate_size / moe_router_num_groups need ..."
    (",moe_router_num_groups,moe_router_group_topk", ",4,2",
     "moe_router_num_groups 4, moe_router_group_topk 2 need num_experts > 0, got 0"),
])
def test_group_limited_routing_names_the_broken_condition(tmp_path, capsys, columns, cells, problem):
    assert _predict(tmp_path, capsys, columns, cells) == f"runs.csv:2: {problem}"


def test_group_limited_routing_that_fits_is_accepted(tmp_path):
    """The row is priced as the same model and settings built directly: its router columns
    are written back as given and its time, parameters and memory are `predict_settings`'s."""
    from paraplan.clusters import load_cluster
    from paraplan.core.run_settings import RunSettings
    from paraplan.core.transformer import TransformerModel
    from paraplan.predict.calibration import calibration_for
    from paraplan.predict.predictor import predict_settings, summarize

    table = tmp_path / "runs.csv"
    table.write_text(f"{HEADER}{MOE}\n{CELLS},8,4,2,2\n")
    assert main(["predict", str(table), "--cluster", "dgx-h100", "-o", str(tmp_path / "o.csv"), "--no-track"]) == 0
    with (tmp_path / "o.csv").open() as handle:
        [row] = list(csv.DictReader(handle))
    assert {k: row[k] for k in ("num_experts", "moe_router_topk", "moe_router_num_groups",
                                "moe_router_group_topk")} == {"num_experts": "8", "moe_router_topk": "4",
                                                              "moe_router_num_groups": "2",
                                                              "moe_router_group_topk": "2"}
    model = TransformerModel("x", num_layers=4, hidden_size=1024, num_attention_heads=16, seq_length=2048,
                             vocab_size=32000, num_experts=8, moe_router_topk=4, moe_router_num_groups=2,
                             moe_router_group_topk=2)
    settings = RunSettings(tensor_model_parallel_size=2, pipeline_model_parallel_size=2, data_parallel_size=2,
                           global_batch_size=64, micro_batch_size=1)
    cluster = load_cluster("dgx-h100")
    calibration = calibration_for(cluster)
    assert row["calibration"].split("@")[0] == calibration.name
    [(result, priced)] = predict_settings(model, [settings], cluster, calibration.comm_model(cluster),
                                          calibration.efficiency)
    direct = summarize(model, priced, result, cluster)
    assert math.isfinite(direct.iteration_s) and direct.iteration_s > 0
    # the file holds 6 significant digits
    assert float(row["predicted_iteration_s"]) == pytest.approx(direct.iteration_s, rel=1e-6)
    assert float(row["predicted_peak_memory_bytes"]) == pytest.approx(direct.peak_memory_bytes, rel=1e-6)
    assert (int(row["num_parameters"]), int(row["active_parameters"])) == (model.num_parameters,
                                                                          model.active_parameters)
    # the group limit is priced: the same row without it is 6% faster (the comparison tells them apart)
    [(ungrouped, _)] = predict_settings(replace(model, moe_router_num_groups=0, moe_router_group_topk=0), [settings],
                                        cluster, calibration.comm_model(cluster), calibration.efficiency)
    assert ungrouped.iteration_s < direct.iteration_s * (1 - 1e-3)


# ---- Hugging Face config.json: n_group, topk_group, topk_method ----------------------


def _hf(tmp_path, capsys, **changes) -> str:
    config = json.loads((REPO / "tests/data/hf/deepseek-v3.json").read_text())
    config.update({"num_hidden_layers": 4, **changes})
    config = {k: v for k, v in config.items() if v is not ...}
    (tmp_path / "config.json").write_text(json.dumps(config))
    table = tmp_path / "runs.csv"
    table.write_text("name,model,seq_length,tensor_model_parallel_size,pipeline_model_parallel_size,"
                     "data_parallel_size,global_batch_size,micro_batch_size\nx,config.json,2048,1,1,8,64,1\n")
    return _error(capsys, ["predict", str(table), "--cluster", "dgx-h100", "-o", str(tmp_path / "o.csv"),
                           "--no-track"]).replace(f"{tmp_path}/", "")


@pytest.mark.parametrize(("changes", "message"), [
    # was: any topk_method but 'greedy' (a typo, a number) read as group-limited routing
    ({"topk_method": "grredy"}, "key 'topk_method': expected one of greedy, group_limited_greedy, noaux_tc, "
                                "got 'grredy'"),
    ({"topk_method": 3}, "key 'topk_method': expected one of greedy, group_limited_greedy, noaux_tc, got 3"),
    # was: a missing or 0 topk_group taken as n_group (no group limit), then a routing
    # error in Megatron's names ("... got 8 and 8")
    ({"topk_group": ...}, "key 'topk_group': expected an integer in [1, n_group 8] (the groups each token's "
                          "experts come from), got None"),
    ({"topk_group": 0}, "key 'topk_group': expected an integer in [1, n_group 8] (the groups each token's "
                        "experts come from), got 0"),
    ({"topk_group": 9}, "key 'topk_group': expected an integer in [1, n_group 8] (the groups each token's "
                        "experts come from), got 9"),
    ({"n_group": 8.0}, "key 'n_group': expected an integer >= 0, got 8.0"),
    ({"n_group": 7}, "model 'w': group-limited routing: moe_router_num_groups 7 does not divide num_experts 256"),
])
def test_hf_group_routing_keys(tmp_path, capsys, changes, message):
    assert _hf(tmp_path, capsys, **changes) == f"runs.csv:2: column 'model': config.json: {message}".replace(
        "model 'w'", f"model '{tmp_path.name}'")


def test_hf_greedy_router_ignores_the_groups(tmp_path):
    config = json.loads((REPO / "tests/data/hf/deepseek-v3.json").read_text())
    from paraplan.predict.hf_config import read_hf_config
    assert read_hf_config({**config, "topk_method": "greedy", "topk_group": 0}, "v2").model.router_groups == (1, 1)


# ---- cluster files: device memory and reserved -----------------------------------------

DEVICE_MEMORY = "  memory_MiB: 81105.6875"
CONTEXT = "    cuda_context_MiB: 400"


@pytest.mark.parametrize(("old", "new", "message"), [
    (CONTEXT, "    cuda_context_MiB: -1", "key 'device.reserved.cuda_context_MiB': expected a number >= 0 and <= 1e9, "
                                          "got -1: negative"),
    (CONTEXT, "    cuda_context_MiB: abc", "key 'device.reserved.cuda_context_MiB': expected a number >= 0 and "
                                           "<= 1e9, got 'abc'"),
    (CONTEXT, "    cuda_context_MiB: 81105.6875", "key 'device': reserved (81169.7 MiB) leaves nothing of the "
                                                  "device's 81105.7 MiB"),
    (CONTEXT, "    cuda_context: 400", "key 'device.reserved.cuda_context': unknown key; expected one of "
                                       "cuda_context_MiB, blas_workspace_MiB"),
    (DEVICE_MEMORY, DEVICE_MEMORY + "\n  memory_GB: 85", "key 'device': give exactly one of memory_MiB (the "
     "runtime's total, 2**20 bytes each) and memory_GB (1e9 bytes each), got both"),
    (DEVICE_MEMORY, "", "key 'device': give exactly one of memory_MiB (the runtime's total, 2**20 bytes each) and "
                        "memory_GB (1e9 bytes each), got neither"),
    (DEVICE_MEMORY, "  memory_MiB: true", "key 'device.memory_MiB': expected a number >= 1e-6 and <= 1e9, got True"),
])
def test_cluster_memory_keys(tmp_path, capsys, old, new, message):
    text = (REPO / "config/clusters/dgx-h100.yaml").read_text()
    assert old in text
    cluster = tmp_path / "c.yaml"
    cluster.write_text(text.replace(old, new, 1))
    assert _predict(tmp_path, capsys, "", "", cluster=str(cluster)) == f"c.yaml: {message}"


# ---- paraplan fit --kind kernels --------------------------------------------------------

PUBLISHED = REPO / "data/published"
KERNEL_INPUTS = [PUBLISHED / "gemm/xla_h100_sm90_bf16.csv", PUBLISHED / "attention/flash3_paper_h100_fwd.csv",
                 PUBLISHED / "attention/fa3_paper_h100_bwd_and_cudnn_fwd.csv"]


def _fit(tmp_path, capsys, *options: str, inputs=KERNEL_INPUTS) -> str:
    out = tmp_path / "k.json"
    message = _error(capsys, ["fit", "--kind", "kernels", "--no-track", *map(str, inputs), "--cluster", "dgx-h100",
                              "-o", str(out), *options])
    assert not out.exists()
    return message


@pytest.mark.parametrize(("options", "message"), [
    (("--attention-head-dim", "128,abc"), "option --attention-head-dim: expected distinct positive integers, "
                                          "comma-separated; got '128,abc'"),
    (("--attention-head-dim", "0"), "option --attention-head-dim: expected distinct positive integers, "
                                    "comma-separated; got '0'"),
    (("--attention-head-dim", "128,128"), "option --attention-head-dim: expected distinct positive integers, "
                                          "comma-separated; got '128,128'"),
    # was: the trailing empty name dropped silently
    (("--attention-kernel", "flash-attention-2,"), "option --attention-kernel: expected distinct kernel "
                                                   "names, comma-separated; got 'flash-attention-2,'"),
])
def test_kernel_fit_options_are_checked_before_the_inputs_are_read(tmp_path, capsys, options, message):
    """was: checked after the GEMM fit had run and printed its figures."""
    assert _fit(tmp_path, capsys, *options, inputs=[tmp_path / "absent.csv"]) == message


def test_kernel_fit_of_a_kernel_absent_from_the_inputs(tmp_path, capsys):
    """was: a kernel file written without attention ceilings ('attention not fitted' on stderr)."""
    assert _fit(tmp_path, capsys, "--attention-kernel", "flash-atention-2") == (
        "option --attention-kernel: no attention rows of 'H100-SXM5-80GB' (flash-atention-2) in the inputs to "
        "fit; expected one of the kernels there: cudnn, flash-attention-2, flash-attention-3")


def test_kernel_fit_of_a_head_dim_absent_from_the_inputs(tmp_path, capsys):
    """was: the error named the first input, a GEMM file, and not the head dims there."""
    assert _fit(tmp_path, capsys, "--attention-head-dim", "100") == (
        "option --attention-head-dim: no causal attention rows of 'H100-SXM5-80GB' (flash-attention-2) with "
        "head_dim 100 in the inputs (head_dim there: 64, 128, 256)")


SUSTAINED = (PUBLISHED / "gemm/mamf_msmf_sustained.csv").read_text().splitlines()


@pytest.mark.parametrize(("column", "value", "message"), [
    ("sustained_tflops", "900", "column 'sustained_tflops': sustained_tflops 900 above burst_tflops 841.9; expected "
                                "a sustained rate no higher than the burst of the same run"),
    ("sustained_tflops", "708.5e12", "column 'sustained_tflops': sustained_tflops 7.085e+14 above burst_tflops "
                                     "841.9; expected a sustained rate no higher than the burst of the same run"),
    ("sustained_tflops", "", "column 'sustained_tflops': expected a number, got ''"),
    ("burst_tflops", "-1", "column 'burst_tflops': expected a positive number, got '-1'"),
    ("device", "", "column 'device': expected a value, got an empty cell"),
])
def test_sustained_gemm_rows(tmp_path, capsys, column, value, message):
    header = SUSTAINED[0].split(",")
    cells = SUSTAINED[1].split(",")
    cells[header.index(column)] = value
    path = tmp_path / "sustained.csv"
    path.write_text(f"{SUSTAINED[0]}\n{','.join(cells)}\n")
    assert _fit(tmp_path, capsys, "--sustained-from", "H200-SXM-141GB",
                inputs=[*KERNEL_INPUTS, path]) == f"{path}:2: {message}"


def test_sustained_from_an_unknown_device(tmp_path, capsys):
    inputs = [*KERNEL_INPUTS, PUBLISHED / "gemm/mamf_msmf_sustained.csv"]
    assert _fit(tmp_path, capsys, "--sustained-from", "H300", inputs=inputs) == (
        "option --sustained-from: no sustained-GEMM rows of 'H300' in the inputs (devices: B200-SXM, "
        "H200-SXM-141GB)")


# ---- kernel files as predict loads them ------------------------------------------------

SHIPPED = json.loads((REPO / "config/kernels/H100-SXM5-80GB.json").read_text())


def _kernel_file_error(change) -> str:
    data = json.loads(json.dumps(SHIPPED))
    change(data)
    with pytest.raises(InputFileError) as err:
        KernelCeilings.from_dict(data, "k.json")
    return str(err.value)


@pytest.mark.parametrize(("change", "message"), [
    # was: accepted; `paraplan report`'s kernels table then failed on 'str'.get
    (lambda d: d["gemm"].__setitem__("sustained", "x"), "k.json: gemm.sustained: expected a JSON object whose factor "
                                                        "(sustained / burst throughput) is a number > 0 and <= 1, got "
                                                        "'x'"),
    (lambda d: d["attention"].__setitem__("sustained", {"factor": 1.2}),
     "k.json: attention.sustained: expected a JSON object whose factor (sustained / burst throughput) is a number "
     "> 0 and <= 1, got factor 1.2"),
    (lambda d: d["attention_kernels"]["flash-attention-2"].__setitem__("sustained", {}),
     "k.json: attention_kernels.flash-attention-2.sustained: expected a JSON object whose factor (sustained / burst "
     "throughput) is a number > 0 and <= 1, got factor None"),
    # was: accepted, a kernel no backend can name
    (lambda d: d["attention_kernels"].__setitem__(" ", d["attention_kernels"]["flash-attention-2"]),
     "k.json: attention_kernels: expected a kernel name, got ' '"),
    (lambda d: d.__setitem__("attention_kernels", []),
     "k.json: attention_kernels: expected a JSON object of fits by kernel name, got []"),
    (lambda d: d["attention_kernels"].__setitem__("cudnn", 3),
     "k.json: attention_kernels.cudnn: expected a fit report with params"),
    (lambda d: d["attention_kernels"]["flash-attention-2"]["params"].__setitem__("attention_fwd_efficiency", 5),
     "k.json: attention_kernels.flash-attention-2.params.attention_fwd_efficiency: expected a fraction of the peak "
     "(a number > 0 and <= 1), got 5: out of range"),
])
def test_kernel_file_sections(change, message):
    assert _kernel_file_error(change) == message


def test_shipped_kernel_files_still_load():
    """Each loads and is for the device it is named after (`shipped_kernel_ceilings` refuses
    a file whose device is another)."""
    paths = sorted((REPO / "config/kernels").glob("*.json"))
    assert {"A100-SXM4-80GB", "H100-SXM5-80GB"} <= {p.stem for p in paths}
    devices = [KernelCeilings.from_dict(json.loads(p.read_text()), str(p)).device for p in paths]
    assert devices == [p.stem for p in paths]

"""Round 5's run-table columns fed as a careless or hostile user would (issue 21): the
router, precision-aware optimizer, torchao Float8, PyTorch CP, FSDP2, cross-entropy,
DualPipe, fake_balanced_gate and chunked_attention columns, mutated one or two at a time
on rows copied from benchmarks/data (`tests/fuzz_harness.py`'s `run_table_mutations`).
Each input gives either a prediction with finite, positive figures or one error line
naming the file and line (and the column or setting), no traceback, no output written.
"was:" says what happened before."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from fuzz_harness import RUN_TABLE_BASES, classify_run_row, run_table_mutations
from paraplan.cli.main import main


def _predict_error(tmp_path: Path, capsys, cells: dict[str, str]) -> str:
    runs, out = tmp_path / "runs.csv", tmp_path / "out.csv"
    with runs.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(cells))
        writer.writeheader()
        writer.writerow(cells)
    assert main(["predict", str(runs), "--cluster", "dgx-h100", "-o", str(out), "--no-track"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("paraplan predict: error: "), err
    assert not out.exists()
    return err[0].removeprefix("paraplan predict: error: ").replace(f"{tmp_path}/", "")


TITAN = RUN_TABLE_BASES["titan"]  # torchtitan Llama 3.1 8B, FSDP2 on 8 GPUs (a dense model)
MOE = RUN_TABLE_BASES["moe"]  # Megatron-Bridge Qwen3-30B-A3B


@pytest.mark.parametrize(("column", "value", "shown"), [
    # was: a prediction identical to the row without the column (the router settings of a
    # dense model were dropped without a word)
    ("moe_aux_loss_coeff", "0.5", "0.5"),
    ("moe_router_enable_expert_bias", "true", "true"),
    ("fake_balanced_gate", "true", "true"),
    ("moe_router_score_function", "sigmoid", "sigmoid"),
    ("moe_router_dtype", "fp32", "fp32"),
    ("moe_router_load_balancing_type", "seq_aux_loss", "seq_aux_loss"),
    ("moe_router_topk_scaling_factor", "2.5", "2.5"),
])
def test_router_columns_on_a_dense_model_are_refused(tmp_path, capsys, column, value, shown) -> None:
    assert _predict_error(tmp_path, capsys, {**TITAN, column: value}) == (
        f"runs.csv:2: impossible run: {column} {shown} needs a mixture-of-experts model; 'llama3-8b' has no "
        "experts (num_experts 0): expected it empty")


def test_router_columns_at_their_defaults_on_a_dense_model_still_predict(tmp_path) -> None:
    cells = {**TITAN, "moe_aux_loss_coeff": "0", "moe_router_fusion": "false", "moe_router_load_balancing_type":
             "aux_loss", "fake_balanced_gate": "false"}
    assert classify_run_row(cells, tmp_path).kind == "ok"


def test_torchtitan_only_options_on_an_moe_model_say_what_differs(tmp_path, capsys) -> None:
    # was: "'qwen3-30b-a3b' lacks no qk_layernorm, no experts" (a double negative)
    cells = {**MOE, "selective_ac_option": "op", "recompute_granularity": "selective", "recompute_modules": ""}
    assert _predict_error(tmp_path, capsys, cells) == (
        "runs.csv:2: impossible run: selective_ac_option op prices torchtitan's Llama layer; 'qwen3-30b-a3b' "
        "differs from it: expected no qk_layernorm, no experts")


def test_mutated_new_columns_predict_or_fail_with_one_line(tmp_path) -> None:
    """The fuzz driver's fixed-seed subset: every mutation is "ok" (finite, positive
    figures) or "error" (one line naming the file and line 2)."""
    outcomes: dict[str, int] = {}
    for cells in run_table_mutations(seed=5, count=150):
        outcome = classify_run_row(cells, tmp_path)
        assert outcome.kind in ("ok", "error"), (cells, outcome.detail)
        outcomes[outcome.kind] = outcomes.get(outcome.kind, 0) + 1
    assert outcomes.get("ok", 0) >= 10 and outcomes.get("error", 0) >= 10, outcomes


AUTOMODEL = RUN_TABLE_BASES["auto"]  # NeMo AutoModel Qwen3 MoE 30B with fake_balanced_gate true


@pytest.mark.parametrize(("column", "value"), [
    # was: predicted as if the column were empty (the fake gate checked five router columns)
    ("moe_router_load_balancing_type", "sinkhorn"),
    ("moe_router_dtype", "fp64"),
    ("moe_router_pre_softmax", "true"),
    ("moe_router_score_function", "sigmoid"),
    ("moe_router_topk_scaling_factor", "2.5"),
])
def test_fake_balanced_gate_refuses_every_megatron_router_column(tmp_path, capsys, column, value) -> None:
    assert AUTOMODEL["fake_balanced_gate"] == "true"
    assert _predict_error(tmp_path, capsys, {**AUTOMODEL, column: value}) == (
        f"runs.csv:2: impossible run: fake_balanced_gate (NeMo AutoModel's) replaces Megatron-Core's router: "
        f"{column} must be left at its default")


@pytest.mark.parametrize(("column", "value", "shown"), [
    # was: "expert_model_parallel_size / expert_tensor_parallel_size / moe_shared_expert_overlap /
    # moe_expert_capacity_factor need a mixture-of-experts model" whichever was set
    ("expert_model_parallel_size", "8", "expert_model_parallel_size 8"),
    ("moe_expert_capacity_factor", "1.5", "moe_expert_capacity_factor 1.5"),
    ("moe_shared_expert_overlap", "true", "moe_shared_expert_overlap true"),
])
def test_expert_settings_on_a_dense_model_name_the_setting(tmp_path, capsys, column, value, shown) -> None:
    assert _predict_error(tmp_path, capsys, {**TITAN, column: value}) == (
        f"runs.csv:2: impossible run: {shown} needs a mixture-of-experts model; 'llama3-8b' has no experts "
        "(num_experts 0)")


# ---- paraplan plan: options of the other planner ----------------------------------------

_LLM = ["plan", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8", "--global-batch-size", "8"]
_PROFILE = ["plan", "--profile", "data/pipedream-profiles/vgg-19-pbs-32.txt", "--cluster", "dgx1-v100", "--shapes",
            "2x8", "--global-batch-sizes", "32"]
_FOR_PROFILE = ("is for a layer profile (--profile or --study), not --model (a transformer's memory comes from the "
                "cluster file, its communication from the calibration)")


@pytest.mark.parametrize(("argv", "message"), [
    # was: five plans written, --memory-gb nan / -1 ignored without a word
    ([*_LLM, "--memory-gb", "nan"], f"option --memory-gb: {_FOR_PROFILE}"),
    ([*_LLM, "--memory-gb", "-1"], f"option --memory-gb: {_FOR_PROFILE}"),
    ([*_LLM, "--model-state-factor", "4"], f"option --model-state-factor: {_FOR_PROFILE}"),
    ([*_LLM, "--shapes", "1x8"], f"option --shapes: {_FOR_PROFILE}"),
    ([*_LLM, "--comm-model", "x.json"], f"option --comm-model: {_FOR_PROFILE}"),
    ([*_LLM, "--plots", "figures"], f"option --plots: {_FOR_PROFILE}"),
    # was: the profile planned, --gpus / --seq-length / --fp8-recipe ignored
    ([*_PROFILE, "--gpus", "8"], "option --gpus: is for a transformer (--model), not a layer profile"),
    ([*_PROFILE, "--seq-length", "8"], "option --seq-length: is for a transformer (--model), not a layer "
                                       "profile"),
    ([*_PROFILE, "--fp8-recipe", "tensorwise"], "option --fp8-recipe: is for a transformer (--model), not a "
                                                "layer profile"),
])
def test_plan_refuses_the_other_planners_options(tmp_path, capsys, monkeypatch, argv, message) -> None:
    monkeypatch.chdir(Path(__file__).resolve().parents[2])
    out = tmp_path / "plans.csv"
    assert main([*argv, "-o", str(out), "--no-track"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"paraplan plan: error: {message}"]
    assert not out.exists()


def test_a_sequence_longer_than_any_model_on_a_preset_row_names_the_column(tmp_path, capsys) -> None:
    # was: ValueError: model 'qwen3-30b-a3b': seq_length 1,099,511,627,776 is above 16,777,216 (a traceback)
    assert _predict_error(tmp_path, capsys, {**MOE, "seq_length": "1099511627776"}) == (
        "runs.csv:2: column 'seq_length': 1,099,511,627,776 is above 16,777,216: wider than any trained model (the "
        "widest dimensions hold a few hundred thousand)")


def test_plan_seq_length_longer_than_any_model_is_one_line(tmp_path, capsys) -> None:
    # was: the same ValueError traceback from `paraplan plan --model llama3-8b --seq-length 20000000`
    out = tmp_path / "plans.csv"
    assert main([*_LLM, "--seq-length", "20000000", "-o", str(out), "--no-track"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "paraplan plan: error: option --seq-length: 20,000,000 is above 16,777,216: wider than any trained "
        "model (the widest dimensions hold a few hundred thousand)"]
    assert not out.exists()


def test_calibrate_refuses_a_measured_time_shorter_than_a_kernel_launch(tmp_path, capsys) -> None:
    # was: calibrated, "max 194054530025828739573607645052928.00%" cross-validated error
    runs, out = tmp_path / "runs.csv", tmp_path / "c.json"
    rows = [{**TITAN, "measured_iteration_s": "1e-30"}, {**MOE, "measured_iteration_s": "9"}]
    columns = list(dict.fromkeys(k for row in rows for k in row))
    with runs.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    assert main(["calibrate", str(runs), "--cluster", "dgx-h100", "-o", str(out), "--no-track", "--jobs", "1"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1:] == [
        f"paraplan calibrate: error: {runs}:2: column 'measured_iteration_s': expected a time in seconds of at least "
        "1e-06 (one kernel launch takes a few microseconds), got '1e-30'"]
    assert not out.exists()


def test_fp8_input_store_with_torchtitans_per_op_recomputation_is_refused(tmp_path, capsys) -> None:
    # was: predicted 2.04 s against 1.99 s with the same peak memory (the cast priced, its saving not)
    cells = {**TITAN, "elementwise_kernels": "fused", "activation_func_fp8_input_store": "true"}
    assert _predict_error(tmp_path, capsys, cells) == (
        "runs.csv:2: impossible run: activation_func_fp8_input_store is Megatron-LM's fused bias-SwiGLU; "
        "selective_ac_option op (torchtitan's per-op recomputation) recomputes SwiGLU from its bf16 input: expected "
        "one of them")

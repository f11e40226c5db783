"""`paraplan plan --model`'s memory columns: every plan answered was re-timed by the
exact engine, so its rows carry `paraplan predict`'s memory columns with their
meaning (`paraplan.predict.peak_memory`): the pipeline rank whose peak is the largest
and its model state, working set, gradient accumulators and activations at that
moment, adding up to `predicted_peak_memory_bytes` to the byte.

The closed-form case: a 4-layer GPT (h = s = 1,024, a = 16, V = 32,000, tied
embeddings, no dropout, flash attention) on 2 GPUs at global batch 1 with TP 1 (so PP
2, one micro-batch), no recomputation, no ZeRO. The last rank peaks: its 2 layers, the
tied head's copy of the embedding and the final norm at 2 + 4 + 12 bytes per
parameter; the loss's bf16 logits for a moment (Megatron's cross-entropy: 2 s V); the
layers' activations (Korthikanti et al. 2022 without dropout masks and with flash
attention: 32 sh + 4 s a each) and the head's (the final norm's input and output and
the head's input, 3 x 2 sh, and one fp32 value per logit, 4 s V)."""

import csv
from dataclasses import replace

import pytest

from paraplan.cli.main import main
from paraplan.clusters import load_cluster
from paraplan.core.transformer import TransformerModel
from paraplan.plan.transformer.output import PLAN_COLUMNS, plan_rows
from paraplan.plan.transformer.request import TransformerPlanRequest
from paraplan.plan.transformer.search import search
from paraplan.plan.transformer.space import SearchSpace
from paraplan.predict.calibration import calibration_for
from paraplan.predict.models import PRESETS, load_model
from paraplan.predict.peak_memory import PEAK_MEMORY_COLUMNS

PARTS = PEAK_MEMORY_COLUMNS[1:]
L, H, S, HEADS, VOCAB = 4, 1024, 1024, 16, 32000
TINY = TransformerModel("tiny", num_layers=L, hidden_size=H, num_attention_heads=HEADS, seq_length=S,
                        vocab_size=VOCAB, hidden_dropout=0.0, attention_dropout=0.0)


def planned(model: TransformerModel, cluster_name: str, gpus: int, batch: int, space: SearchSpace | None = None):
    cluster = load_cluster(cluster_name)
    calibration = calibration_for(cluster)
    request = TransformerPlanRequest(model, cluster, gpus, batch, space=space or SearchSpace())
    result = search(request, calibration.comm_model(cluster), calibration.efficiency)
    return result, plan_rows(model, result, calibration.label, calibration.efficiency)


def assert_parts_add_up(result, rows) -> None:
    """Each row's parts add up to its peak to the byte, each within a byte of the
    engine's part it is named after, on a pipeline rank the plan has."""
    assert len(rows) == len(result.plans) >= 1
    for row, plan in zip(rows, result.plans, strict=True):
        parts = [int(row[c]) for c in PARTS]
        assert sum(parts) == int(row["predicted_peak_memory_bytes"])
        assert min(parts) >= 0 and parts[0] > 0 and parts[3] > 0
        at = plan.peak_memory
        engine = (at.model_state_bytes, at.working_bytes, at.gradient_accumulator_bytes, at.activation_bytes)
        assert parts == pytest.approx(engine, abs=1.0)
        assert int(row["peak_memory_rank"]) == at.rank < int(row["pipeline_model_parallel_size"])


def test_closed_form_breakdown_of_a_two_stage_plan():
    _, rows = planned(TINY, "dgx-a100", 2, 1, SearchSpace(
        tensor_sizes=(1,), schedules=("1f1b",), recompute=("none",), zero_stages=(0,), sequence_parallel=(False,),
        context_parallel_sizes=(1,)))
    row = rows[0]
    assert [row[k] for k in ("tensor_model_parallel_size", "pipeline_model_parallel_size", "data_parallel_size",
                             "micro_batch_size", "use_flash_attn")] == ["1", "2", "1", "1", "true"]
    layer_params = 12 * H * H + 13 * H
    state = 18 * (2 * layer_params + VOCAB * H + 2 * H)  # 1,043,324,928
    loss = 2 * S * VOCAB  # 65,536,000
    acts = 2 * (32 * S * H + 4 * S * HEADS) + 6 * S * H + 4 * S * VOCAB  # 204,603,392
    assert (row["peak_memory_rank"], *(int(row[c]) for c in PARTS)) == ("1", state, loss, 0, acts)
    assert int(row["predicted_peak_memory_bytes"]) == state + loss + acts == 1_313_464_320


def test_gpt3_175b_on_1024_a100_as_written_and_tracked(tmp_path, monkeypatch, capsys):
    """The README's plan through the command: the columns follow the peak as in
    predict's table, add up, are logged as metrics beside it and printed in GB."""
    import paraplan.cli.common

    logged = []
    monkeypatch.setattr(paraplan.cli.common, "track", lambda args, run: logged.append(run))
    out = tmp_path / "gpt3.csv"
    assert main(["plan", "--model", "gpt3-175b", "--cluster", "dgx-a100", "--gpus", "1024", "--global-batch-size",
                 "1536", "-o", str(out), "--no-track"]) == 0
    with out.open(newline="") as handle:
        reader = csv.DictReader(handle)
        rows = list(reader)
    header = list(reader.fieldnames or ())
    assert header == list(PLAN_COLUMNS)
    after = header.index("predicted_peak_memory_bytes") + 1
    assert header[after:after + len(PEAK_MEMORY_COLUMNS)] == list(PEAK_MEMORY_COLUMNS)
    for row in rows:
        assert sum(int(row[c]) for c in PARTS) == int(row["predicted_peak_memory_bytes"])
        assert 0 <= int(row["peak_memory_rank"]) < int(row["pipeline_model_parallel_size"])
    gb = {c: f"{int(rows[0][c]) / 1e9:.1f} GB" for c in PARTS}
    # gradient accumulators only with ZeRO-2/3 reduced after the last micro-batch (the best plan may be
    # either: with ZeRO-3 under pipelines the same layout is within 0.1% of the distributed optimizer)
    sharded_grads = int(rows[0]["zero_stage"]) >= 2
    accumulators = f"{gb['predicted_peak_gradient_accumulator_bytes']} of gradient accumulators, "
    assert (f"best plan's peak memory: pipeline rank {rows[0]['peak_memory_rank']}: "
            f"{gb['predicted_peak_model_state_bytes']} of weights, gradients and optimizer state, "
            f"{gb['predicted_peak_working_bytes']} of working buffers, {accumulators if sharded_grads else ''}"
            f"{gb['predicted_peak_activation_bytes']} of activations\n") in capsys.readouterr().err
    assert (rows[0]["predicted_peak_gradient_accumulator_bytes"] != "0") == sharded_grads
    (run,) = logged
    assert {f"best_{c}": float(rows[0][c]) for c in PEAK_MEMORY_COLUMNS}.items() <= run.metrics.items()
    assert set(PEAK_MEMORY_COLUMNS) <= set(run.table.metrics)


def test_llama3_70b_at_128k_context_parallel_plans():
    result, rows = planned(load_model("llama3-70b", seq_length=131072), "dgx-a100-40gb", 64, 32)
    assert result.plans[0].settings.context_parallel_size > 1
    assert_parts_add_up(result, rows)


def test_deepseek_v3_on_1024_h100_expert_parallel_plans():
    result, rows = planned(replace(PRESETS["deepseek-v3"], seq_length=4096), "dgx-h100", 1024, 1024)
    assert result.plans[0].settings.expert_model_parallel_size > 1
    assert_parts_add_up(result, rows)

"""`paraplan predict`'s memory columns: the pipeline rank with the largest peak and what
it holds at that moment (model state, working set, gradient accumulators, activations),
adding up to `predicted_peak_memory_bytes` (`paraplan.predict.peak_memory`).

The Llama 3 405B rows take their parts from the closed forms of test_l3_memory.py: on
rank 1 (8 layers, P parameters after TP), sharded state 18 P / d, gathered bf16 weights
2 P, fp32 accumulators 4 P per chunk that ran a backward, activations in flight x a."""

import csv
from pathlib import Path

import numpy as np
import pytest
from test_l3_memory import GLOBAL_BATCH, SHARDED_BYTES_PER_PARAM, V, inflight, layer_act_bytes, layer_params, predicted

from paraplan.cli.main import main
from paraplan.clusters import load_cluster
from paraplan.predict.calibration import calibration_for
from paraplan.predict.peak_memory import PEAK_MEMORY_COLUMNS, RETIRED_COLUMNS, PeakMemory
from paraplan.predict.predictor import predict_rows, predict_settings
from paraplan.predict.runtable import KNOWN, read_run_table

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks" / "data"
PARTS = PEAK_MEMORY_COLUMNS[1:]
RUNS = [  # (table, row, cluster): the cluster bench_published.py predicts the table on
    ("megatron_sc21_table1", "sc21 145B", "dgx-a100"),  # dense: TP 8, PP 8, DP 6
    ("llama3_405b_table4", "llama3-405b 8192 GPUs seq 8192", "dgx-h100"),  # PP 16 x V 8 with ZeRO-3
    ("megatron_bridge_h100_moe", "qwen3-30b-a3b 25.11", "dgx-h100"),  # MoE: PP 2 x V 12, EP 8
    ("torchtitan_llama31_h100", "8B 8 GPUs FSDP", "grand-teton-h100-500w"),  # FSDP2 (ZeRO-3), one micro-batch
]


def run_table(tmp_path: Path, table: str, name: str, extra: dict[str, str] | None = None) -> Path:
    """One published row as a run table (its run-table columns only)."""
    with (BENCHMARKS / f"{table}.csv").open(newline="") as handle:
        row = next(r for r in csv.DictReader(handle) if r["name"] == name)
    cells = {k: v for k, v in row.items() if k in KNOWN} | (extra or {})
    path = tmp_path / "runs.csv"
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(cells))
        writer.writeheader()
        writer.writerow(cells)
    return path


def predict_cli(tmp_path: Path, runs: Path, cluster: str) -> tuple[list[str], dict[str, str]]:
    out = tmp_path / "out.csv"
    assert main(["predict", str(runs), "--cluster", cluster, "-o", str(out), "--no-track"]) == 0
    with out.open(newline="") as handle:
        reader = csv.DictReader(handle)
        rows = list(reader)
        return list(reader.fieldnames or ()), rows[0]


@pytest.mark.parametrize(("table", "name", "cluster"), RUNS)
def test_written_parts_add_up_to_the_peak_to_the_byte(tmp_path, table, name, cluster):
    header, row = predict_cli(tmp_path, run_table(tmp_path, table, name), cluster)
    assert header[header.index("predicted_peak_memory_bytes") + 1:][:len(PEAK_MEMORY_COLUMNS)] == list(
        PEAK_MEMORY_COLUMNS)
    parts = [int(row[c]) for c in PARTS]
    assert sum(parts) == int(row["predicted_peak_memory_bytes"])
    assert min(parts) >= 0 and parts[0] > 0 and parts[3] > 0
    assert 0 <= int(row["peak_memory_rank"]) < int(row["pipeline_model_parallel_size"])


@pytest.mark.parametrize(("table", "name", "cluster"), RUNS)
def test_every_ranks_parts_add_up_to_its_peak(tmp_path, table, name, cluster):
    """Per pipeline rank (the engine's `MemoryAtPeak`), for the settings the row chose;
    without gradient accumulators the activations are the rank's activation peak."""
    cluster_ = load_cluster(cluster)
    calibration = calibration_for(cluster_)
    comm = calibration.comm_model(cluster_)
    _, rows = read_run_table(run_table(tmp_path, table, name))
    pred = predict_rows(rows, cluster_, comm, calibration.efficiency)[0]
    ((result, _),) = predict_settings(rows[0].model, [pred.settings], cluster_, comm, calibration.efficiency)
    at = result.memory_at_peak
    total = at.state_bytes + at.working_bytes + at.gradient_accumulator_bytes + at.activation_bytes
    np.testing.assert_allclose(total, result.peak_memory_bytes, rtol=1e-12)
    no_accumulators = at.gradient_accumulator_bytes == 0
    np.testing.assert_array_equal(at.activation_bytes[no_accumulators],
                                  result.activation_peak_bytes[no_accumulators])
    assert np.all(at.activation_bytes <= result.activation_peak_bytes)
    peak = PeakMemory.of(result)
    assert peak.rank == int(np.argmax(result.peak_memory_bytes))
    assert peak == pred.peak_memory and peak.total_bytes == pred.peak_memory_bytes


@pytest.mark.parametrize(("dp", "chunks_live", "in_flight"), [(64, V, 141), (128, 1, 127)])
def test_llama_405b_rows_peak_on_rank_1_with_the_closed_form_parts(dp, chunks_live, in_flight):
    """DP 64 (8,192 GPUs): 0.90 + 6.38 + 12.75 + 75.18 = 95.20 GB; DP 128 (16,384 GPUs):
    0.45 + 6.38 + 1.59 (one chunk's accumulators) + 67.72 (127 a) = 76.13 GB."""
    stage = 8 * layer_params()
    m = GLOBAL_BATCH // dp
    assert in_flight == (inflight(1, m) if chunks_live == V else inflight(1, m) - 1)
    _, result = predicted(dp)
    peak = PeakMemory.of(result)
    assert peak.rank == 1
    assert peak.model_state_bytes == pytest.approx(SHARDED_BYTES_PER_PARAM * stage / dp, rel=1e-9)
    assert peak.working_bytes == pytest.approx(2 * stage, rel=1e-9)
    assert peak.gradient_accumulator_bytes == pytest.approx(4 * stage * chunks_live / V, rel=1e-9)
    assert peak.activation_bytes == pytest.approx(in_flight * layer_act_bytes(), rel=1e-9)
    assert peak.total_bytes == pytest.approx(
        SHARDED_BYTES_PER_PARAM * stage / dp + 2 * stage + 4 * stage * chunks_live / V
        + in_flight * layer_act_bytes(), rel=1e-9)
    # rank 0 (7 layers and the embedding) peaks lower: the old first-rank columns were not the peak's
    assert result.peak_memory_bytes[0] < peak.total_bytes


def test_the_8k_row_as_written(tmp_path):
    """The run-table cells of the 8,192-GPU row: rank 1, and its parts in GB."""
    _, row = predict_cli(tmp_path, run_table(tmp_path, *RUNS[1][:2]), RUNS[1][2])
    assert row["peak_memory_rank"] == "1"
    got = [int(row[c]) / 1e9 for c in ("predicted_peak_memory_bytes", *PARTS)]
    assert got == pytest.approx([95.204, 0.8965, 6.3754, 12.7508, 75.1813], abs=1e-3)


def test_whole_bytes_round_each_partial_sum():
    """Parts are differences of rounded partial sums: within a byte of their values,
    never negative, adding up to the rounded total."""
    peak = PeakMemory(0, 10.0, 2.5, 3.5, 0.0, 4.0)  # partial sums 2.5 -> 2, 6.0, 6.0; total 10
    assert peak.whole_bytes() == (10, 2, 4, 0, 4)
    tight = PeakMemory(0, 6.4, 3.4, 3.4, 0.0, 0.0)  # partial sums above the total: clamped to it
    assert tight.whole_bytes() == (6, 3, 3, 0, 0)
    assert tight.cells() == {"peak_memory_rank": "0", "predicted_peak_model_state_bytes": "3",
                             "predicted_peak_working_bytes": "3", "predicted_peak_gradient_accumulator_bytes": "0",
                             "predicted_peak_activation_bytes": "0"}


def test_retired_columns_are_read_and_not_written_back(tmp_path):
    """A table written by an earlier version (with the first rank's weight state and
    activation peak) predicts again, without those columns."""
    extra = dict.fromkeys(RETIRED_COLUMNS, "1")
    header, row = predict_cli(tmp_path, run_table(tmp_path, *RUNS[0][:2], extra=extra), RUNS[0][2])
    assert not set(RETIRED_COLUMNS) & set(header)
    assert sum(int(row[c]) for c in PARTS) == int(row["predicted_peak_memory_bytes"])

"""The published test sets under benchmarks/data/ (read by benchmarks/bench_published.py):
every table reads through the run-table reader, and every measured_iteration_s is the
published number converted with the FLOP count its authors used, which reproduces the
utilisation the papers print beside it."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import pytest

from paraplan.predict.vtrain import read_vtrain
from script_module import load_script

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
published = load_script(BENCHMARKS / "published.py", register=True)

ROWS = {"megatron_sc21_table1": 10, "korthikanti2022_table5": 9, "megatron_core_h100_weak_scaling": 9,
        "megatron_deepspeed_vtrain_multinode": 109, "llama3_405b_table4": 3, "megatron_bridge_h100_moe": 8,
        "automodel_h100_moe": 6, "deepseek_v3_report": 1, "megatron_bridge_h100_llama3_fp8": 5,
        "torchtitan_llama31_h100": 18}
A100_PEAK_FLOPS = 312e12
H100_PEAK_FLOPS = 989.4e12


@pytest.fixture(scope="module")
def tables():
    return {stem: published.load_table(path) for stem, path in published.table_paths().items()}


def test_every_table_reads_through_the_run_table_reader(tables):
    assert {stem: len(rows) for stem, rows in tables.items()} == ROWS
    for stem, rows in tables.items():
        for row in rows:
            assert (row.run is None) == bool(row.not_expressible), (stem, row.name)
            if row.run is not None:
                assert row.run.measured_iteration_s is not None and row.run.measured_iteration_s > 0


def _flops(row) -> float:
    m, s = row.run.model, row.run.settings
    convention = row.annotations["flops_convention"]
    if convention == "sc21_with_recompute":
        return published.sc21_flops(s.global_batch_size, m.seq_length, m.num_layers, m.hidden_size, m.vocab_size)
    if convention == "megatron_model":
        return published.megatron_model_flops(s.global_batch_size, m.seq_length, m.num_layers, m.hidden_size,
                                              m.vocab_size, m.ffn_size, m.num_attention_heads, m.query_groups,
                                              m.swiglu)
    assert convention == "palm"
    return published.palm_flops(s.global_batch_size * m.seq_length, m.num_parameters, m.num_layers, m.hidden_size,
                                m.seq_length)


def test_measured_times_are_the_published_numbers_converted(tables):
    for stem, rows in tables.items():
        for row in rows:
            if row.run is None:
                continue
            value, unit = float(row.annotations["published_value"]), row.annotations["published_unit"]
            measured = row.run.measured_iteration_s
            if published.published_seconds(row.cells) is not None:
                expected = published.published_seconds(row.cells)
            elif unit == "s":
                expected = value
            elif unit == "ms":
                expected = value / 1e3
            else:
                assert unit == "TFLOP/s/GPU", (stem, row.name)
                expected = _flops(row) / (value * 1e12 * row.run.settings.num_gpus)
            assert measured == pytest.approx(expected, rel=1e-5), (stem, row.name)


def test_sc21_times_reproduce_the_published_aggregate_throughput(tables):
    """Table 1's last column, aggregate PFLOP/s = TFLOP/s per GPU x GPUs (to its rounding)."""
    aggregate = [4.4, 8.8, 18.2, 34.6, 70.8, 143.8, 227.1, 297.4, 410.2, 502.0]
    for row, pflops in zip(tables["megatron_sc21_table1"], aggregate, strict=True):
        assert row.run is not None
        flops = published.sc21_flops(row.run.settings.global_batch_size, 2048, row.run.model.num_layers,
                                     row.run.model.hidden_size, 51200)
        assert flops / row.run.measured_iteration_s / 1e15 == pytest.approx(pflops, rel=0.006)


def test_korthikanti_times_reproduce_the_published_mfu(tables):
    """Table 5's MFU (and Sec. 6.3's 54.2% at 2,240 GPUs) from the iteration times, with
    the paper's model FLOPs 72 B s l h^2 (1 + s/6h + V/12lh) and 312 TFLOP/s per A100."""
    mfu = {"korthikanti 22B selective + SP": 0.415, "korthikanti 175B selective + SP": 0.514,
           "korthikanti 530B selective + SP": 0.560, "korthikanti 1T selective + SP": 0.563,
           "korthikanti 530B selective + SP, DP8": 0.542}
    rows = {r.name: r for r in tables["korthikanti2022_table5"]}
    for name, expected in mfu.items():
        run = rows[name].run
        assert run is not None
        flops = published.megatron_model_flops(run.settings.global_batch_size, 2048, run.model.num_layers,
                                               run.model.hidden_size, 51200)
        assert flops / run.measured_iteration_s / run.settings.num_gpus / A100_PEAK_FLOPS == pytest.approx(
            expected, abs=0.002)


def test_megatron_core_throughput_is_the_published_mfu_of_h100_bf16(tables):
    """TFLOP/s per GPU / 989.4 is the printed MFU to its rounding (the 462B row prints 47%
    for 459.9 / 989.4 = 46.5%)."""
    mfu = [0.41, 0.47, 0.49, 0.46, 0.42, 0.43, 0.44, 0.48, 0.47]
    for row, expected in zip(tables["megatron_core_h100_weak_scaling"], mfu, strict=True):
        assert float(row.annotations["published_value"]) * 1e12 / H100_PEAK_FLOPS == pytest.approx(expected, abs=0.006)


def test_multinode_table_is_vtrain_ground_truth_row_by_row(tables):
    raw = read_vtrain(published.DATA / "vtrain_ground_truth_multi.csv")
    rows = tables["megatron_deepspeed_vtrain_multinode"]
    assert len(raw) == len(rows) == 109
    for source, row in zip(raw, rows, strict=True):
        assert row.run is not None
        s, m = row.run.settings, row.run.model
        assert (s.tensor_model_parallel_size, s.pipeline_model_parallel_size, s.data_parallel_size,
                s.global_batch_size, s.micro_batch_size, m.num_layers, m.hidden_size, m.num_attention_heads,
                m.seq_length) == tuple(int(source[k]) for k in (
                    "tensor_model_parallel_size", "pipeline_model_parallel_size", "data_parallel_size",
                    "global_batch_size", "micro_batch_size", "num_layers", "hidden_size", "num_attention_heads",
                    "seq_length"))
        assert row.run.measured_iteration_s == pytest.approx(float(source["measured_iteration_s"]), rel=1e-5)
        assert (s.recompute_granularity, s.dtype, s.use_flash_attn, s.overlap_grad_reduce) == ("full", "fp16", False,
                                                                                              False)
    assert sum(r.run is not None and r.run.settings.tensor_model_parallel_size == 16 for r in rows) == 6


def test_llama_context_parallel_row_runs_cp16_on_16384_gpus(tables):
    rows = tables["llama3_405b_table4"]
    assert [r.run is not None for r in rows] == [True, True, True]
    long = rows[2].run
    assert long is not None and not rows[2].not_expressible
    s = long.settings
    assert (s.tensor_model_parallel_size, s.context_parallel_size, s.pipeline_model_parallel_size,
            s.data_parallel_size, s.cp_comm_type, long.model.seq_length) == (8, 16, 16, 8, "all_gather", 131072)
    assert s.num_gpus == 16384
    assert [float(r.annotations["published_value"]) for r in rows] == [430, 400, 380]
    assert rows[1].run is not None and rows[1].run.settings.num_gpus == 16384


def test_an_unknown_column_is_refused(tmp_path):
    path = tmp_path / "t.csv"
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["num_layers", "hidden_size", "num_attention_heads", "seq_length", "vocab_size",
                         "tensor_model_parallel_size", "pipeline_model_parallel_size", "data_parallel_size",
                         "global_batch_size", "tflops"])
        writer.writerow([2, 64, 2, 16, 100, 1, 1, 1, 1, 3])
    with pytest.raises(ValueError, match="column 'tflops' is neither a run-table column nor an annotation"):
        published.load_table(path)


def test_moe_throughputs_convert_to_the_published_tokens_per_gpu(tables):
    """Every MoE row, expressible or not: its time gives back the printed tokens/s/GPU
    (AutoModel prints both: 512 x 4096 tokens / 8.18 s / 256 GPUs = 1,002), and
    DeepSeek-V3's 180K H800 GPU-hours per trillion tokens is 1,543 tokens/s/GPU."""
    for stem in published.MOE_TABLES:
        for row in tables[stem]:
            c = row.cells
            tokens_per_gpu_s = int(c["global_batch_size"]) * int(c["seq_length"]) / (
                float(c["measured_iteration_s"]) * int(c["num_gpus"]))
            if c["published_unit"] == "tokens/s/GPU":
                assert tokens_per_gpu_s == pytest.approx(float(c["published_value"]), rel=1e-5), row.name
            assert "not modelled yet" not in row.not_expressible, row.name  # MoE layers and EP are priced
    automodel = {r.name: r.cells for r in tables["automodel_h100_moe"]}
    c = automodel["DeepSeek V3 671B 256 GPUs"]
    assert 512 * 4096 / float(c["measured_iteration_s"]) / 256 == pytest.approx(1002, abs=1)
    c = automodel["Kimi K2 256 GPUs"]  # the table's 924 tokens/s/GPU and its FSDP 32 x PP 8 x 1
    assert 512 * 4096 / float(c["measured_iteration_s"]) / 256 == pytest.approx(924, abs=1)
    assert int(c["data_parallel_size"]) * int(c["pipeline_model_parallel_size"]) == int(c["num_gpus"])
    assert {r["fsdp_param_dtype"] for r in automodel.values()} == {"bf16"}  # the model built in bf16
    (report,) = tables["deepseek_v3_report"]
    assert 15360 * 4096 / float(report.cells["measured_iteration_s"]) / 2048 == pytest.approx(1543.2, abs=0.1)


def test_the_docs_summary_is_what_the_benchmark_writes(tmp_path):
    """docs/published-benchmarks.md shows benchmarks/results/published-summary.md: it must be
    the benchmark's own output for the code as it is, never a hand-edited copy."""
    import subprocess

    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "summary.md"
    subprocess.run([sys.executable, str(root / "benchmarks" / "bench_published.py"), "--no-plan", "--no-layers",
                    "--markdown", str(out)], check=True, capture_output=True, cwd=root)
    committed = (root / "benchmarks" / "results" / "published-summary.md").read_text()
    assert out.read_text() == committed, ("benchmarks/results/published-summary.md is stale: rerun "
                                          "python benchmarks/bench_published.py --markdown "
                                          "benchmarks/results/published-summary.md")
    assert "<!-- include: benchmarks/results/published-summary.md -->" in (
        root / "docs" / "published-benchmarks.md").read_text()

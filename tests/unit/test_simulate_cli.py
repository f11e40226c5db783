"""`paraplan simulate`: files written, published comparison, errors, tracking."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import yaml

from paraplan.cli.main import main

DESIGN_COLUMNS = [
    "experiment", "mode", "series", "D", "T", "P", "microbatches", "schedule", "batch_size",
    "devices", "step_time_s", "throughput", "speedup", "bubble_fraction", "peak_mem_bytes",
]


def test_fig3_compatible_mode_writes_results_timing_figures(repo_root, data_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(repo_root)  # the published file is named relative to the repository root
    out = tmp_path / "fig3"
    code = main(["simulate", "--experiment", "config/experiments/distir_fig3.yaml", "-o", str(out),
                 "--modes", "distir-v0.1", "--repeats", "2", "--no-track"])
    assert code == 0
    rows = pd.read_csv(out / "results.csv")
    assert list(rows.columns) == DESIGN_COLUMNS
    assert len(rows) == 40 and set(rows["series"]) == {"DP", "PP"}
    assert rows["peak_mem_bytes"].isna().all()
    timing = json.loads((out / "timing.json").read_text())
    assert 0 < timing["simulate_s"] < 5 and timing["repeats"] == 2
    comparison = pd.read_csv(out / "published_comparison.csv")
    assert len(comparison) == 40
    assert comparison["rel_diff"].abs().max() < 0.03
    for suffix in (".png", ".pdf"):
        assert (out / "figures" / f"distir_fig3_distir_v0_1{suffix}").stat().st_size > 0


def test_fig4_compatible_mode_matches_every_published_row(repo_root, data_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(repo_root)
    out = tmp_path / "fig4"
    figures = tmp_path / "figs"
    assert main(["simulate", "--experiment", "config/experiments/distir_fig4.yaml", "-o", str(out),
                 "--figures", str(figures), "--modes", "distir-v0.1", "--repeats", "1", "--no-track"]) == 0
    comparison = pd.read_csv(out / "published_comparison.csv")
    assert len(comparison) == 111
    assert comparison["rel_diff"].abs().max() < 1e-9
    rows = pd.read_csv(out / "results.csv")
    base = rows[(rows["devices"] == 1)]["throughput"].iloc[0]
    assert rows["speedup"].to_numpy() == pytest.approx(rows["throughput"].to_numpy() / base)
    assert (figures / "distir_fig4_distir_v0_1.png").is_file()


def test_bad_experiment_key_is_a_clean_error_and_writes_nothing(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({
        "name": "bad", "model": {"kind": "mlp", "layers": 4, "dim": 64},
        "modes": {"distir-v0.1": {"bandwidth_gbps": 200}},
        "series": [{"name": "DP", "parallelism": "data", "batch_sizes": [8], "devices": [2], "devcies": [4]}],
    }))
    out = tmp_path / "out"
    assert main(["simulate", "--experiment", str(bad), "-o", str(out), "--no-track"]) == 2
    err = capsys.readouterr().err
    assert "series[0].devcies" in err and str(bad) in err and "Traceback" not in err
    assert not out.exists()


def test_unknown_mode_option_is_a_clean_error(repo_root, tmp_path, capsys):
    exp = repo_root / "config/experiments/distir_fig3.yaml"
    assert main(["simulate", "--experiment", str(exp), "-o", str(tmp_path), "--modes", "exact",
                 "--no-track"]) == 2
    assert "--modes" in capsys.readouterr().err


def test_gantt_experiment_writes_charts_and_chrome_traces(tmp_path):
    exp = tmp_path / "sched.yaml"
    exp.write_text(yaml.safe_dump({
        "name": "sched", "model": {"kind": "unit", "layers": 4, "fwd_s": 1, "bwd_s": 2, "microbatch_size": 8},
        "modes": {"corrected": {}},
        "series": [{"name": "gpipe", "parallelism": "pipeline", "schedule": "gpipe", "devices": [4],
                    "batch_sizes": [32], "microbatch_size": 8}],
        "figure": "gantt",
    }))
    out = tmp_path / "out"
    assert main(["simulate", "--experiment", str(exp), "-o", str(out), "--no-track"]) == 0
    row = pd.read_csv(out / "results.csv").iloc[0]
    # GPipe: (M + p - 1)(t_f + t_b) with M = 4, p = 4
    assert row["step_time_s"] == pytest.approx((4 + 4 - 1) * 3)
    assert row["bubble_fraction"] == pytest.approx(3 / 7)
    assert (out / "figures" / "gpipe_b32_m4_it1.png").is_file()
    trace = json.loads((out / "traces" / "gpipe_b32_m4_it1.json").read_text())
    assert len(trace["traceEvents"]) >= 2 * 4 * 4




RUN_HEADER = ["name", "num_layers", "hidden_size", "num_attention_heads", "seq_length", "vocab_size",
              "tensor_model_parallel_size", "pipeline_model_parallel_size", "data_parallel_size",
              "global_batch_size", "micro_batch_size", "recompute_granularity", "dtype"]


def test_runs_timelines_match_predict_and_write_traces_and_gantt(tmp_path):
    runs = tmp_path / "runs.csv"
    runs.write_text(",".join(RUN_HEADER) + "\n" + "gpt 1.3B/x,24,2048,16,2048,50257,2,4,2,64,2,full,bf16\n")
    predicted = tmp_path / "pred.csv"
    assert main(["predict", str(runs), "--cluster", "dgx-a100", "-o", str(predicted), "--no-track"]) == 0
    out = tmp_path / "timelines"
    assert main(["simulate", "--runs", str(runs), "--cluster", "dgx-a100", "-o", str(out), "--no-track"]) == 0
    summary = json.loads((out / "timelines.json").read_text())
    assert summary["cluster"] == "dgx-a100" and summary["calibration"].startswith("a100-vtrain@")
    (run,) = summary["runs"]
    assert run["name"] == "gpt 1.3B/x"
    assert run["iteration_s"] == pytest.approx(float(pd.read_csv(predicted)["predicted_iteration_s"][0]), rel=1e-5)
    assert 0 < run["bubble_fraction"] < 1
    trace = json.loads((out / "traces" / "gpt_1_3B_x.json").read_text())
    assert trace["otherData"]["step_time_s"] == pytest.approx(run["iteration_s"])
    assert "speedup" not in trace["otherData"]  # no one-device baseline for a transformer run
    assert len([e for e in trace["traceEvents"] if e.get("ph") == "X"]) == run["events"]
    assert (out / "figures" / "gpt_1_3B_x.png").stat().st_size > 0


def test_runs_needs_a_cluster_and_excludes_a_study(tmp_path, capsys):
    runs = tmp_path / "runs.csv"
    runs.write_text(",".join(RUN_HEADER) + "\n")
    assert main(["simulate", "--runs", str(runs), "-o", str(tmp_path / "o"), "--no-track"]) == 2
    assert "--cluster" in capsys.readouterr().err
    assert main(["simulate", "--runs", str(runs), "--study", "schedules", "--cluster", "dgx-a100",
                 "-o", str(tmp_path / "o"), "--no-track"]) == 2
    assert "give a study (--study NAME) or a run table (--runs FILE)" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()

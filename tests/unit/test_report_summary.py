"""summary.md: each stage's headline numbers come out of its files."""

from __future__ import annotations

import json

import pandas as pd

from paraplan.cli.main import main
from paraplan.report.summary import StageFiles, fit_section, render, validate_section


def _fit_doc():
    def entry(model, heldout, chosen):
        return {"collective": "all_reduce", "world_size": 2, "nodes": 1, "tier": "intra", "model": model,
                "chosen": chosen, "params": {}, "size_range_bytes": [8, 1024], "gmae": heldout / 2,
                "heldout_gmae": heldout, "mean_abs_rel_err": 0.0, "std_abs_rel_err": 0.0, "n_points": 8}
    return {"schema_version": 1, "fits": [entry("alpha_beta", 0.12, False), entry("sigmoid_bw", 0.08, False),
                                           entry("table", 0.031, True)]}


def test_fit_section_names_the_chosen_model_and_all_errors():
    lines = fit_section({"local-cpu": _fit_doc()})
    row = next(line for line in lines if line.startswith("| local-cpu"))
    assert row == "| local-cpu | all_reduce n2 | table | 3.1% | 12.0% | 8.0% | 3.1% |"
    assert any("snakemake -R fit --until fit" in line for line in lines)


def test_validate_section_reports_signed_errors_and_median():
    frame = pd.DataFrame({"strategy": ["dp", "tp2"], "measured_s": [0.010, 0.020],
                          "measured_p10_s": [0.009, 0.018], "measured_p90_s": [0.011, 0.022],
                          "predicted_s": [0.011, 0.017], "rel_err": [0.1, -0.15]})
    text = "\n".join(validate_section({"mlp": frame}))
    assert "| mlp | tp2 | 20 | 18 .. 22 | 17 | -15.0% |" in text
    assert "median 12.5%, max 15.0%" in text


def test_empty_stages_are_left_out():
    text = render(StageFiles({}, {}, {}, {}, {}, {}))
    assert "## " not in text


def test_cli_writes_summary_from_result_files(tmp_path):
    fits = tmp_path / "results/fits/local-cpu"
    fits.mkdir(parents=True)
    (fits / "comm_model.json").write_text(json.dumps(_fit_doc()))
    ignored = tmp_path / "results/figures/x.png"
    ignored.parent.mkdir(parents=True)
    ignored.write_bytes(b"")
    out = tmp_path / "results/summary.md"
    assert main(["report", str(fits / "comm_model.json"), str(ignored), "-o", str(out), "--no-track"]) == 0
    assert "| local-cpu | all_reduce n2 | table | 3.1%" in out.read_text()


def test_cli_missing_input_is_an_error(tmp_path, capsys):
    assert main(["report", str(tmp_path / "nope.csv"), "-o", str(tmp_path / "s.md"), "--no-track"]) == 2
    assert "nope.csv: no such file" in capsys.readouterr().err


def test_plan_section_lists_every_batch_size_of_a_short_sweep():
    from paraplan.report.summary import plan_section

    frame = pd.DataFrame({"gbs": [32, 64, 128], "dp_no_overlap": [1.5, 2.0, 3.0], "dp_overlap": [1.6, 2.1, 3.2],
                          "dp_p3": [1.7, 2.2, 3.3], "best_hybrid": [1.9, 2.5, 3.4],
                          "stages": ["[0-3]x2", "[0-1]x1 | [2-3]x1", "[0-3]x2"]})
    text = "\n".join(plan_section({"mlp__local-cpu": frame}))
    assert "### mlp__local-cpu" in text
    assert "| 64 | 2 | 2.1 | 2.2 | 2.5 | [0-1]x1 \\| [2-3]x1 |" in text  # the cell's pipe is escaped
    assert "| 128 | 3 | 3.2 | 3.3 | 3.4 | [0-3]x2 |" in text


def test_distir_figures_are_compared_from_any_working_directory(repo_root, data_dir, tmp_path, monkeypatch):
    """The published numbers are found beside the checkout as well as beside the working
    directory, so the summary's "difference to published" column is filled."""
    monkeypatch.chdir(tmp_path)  # no data/ beside this folder
    out = tmp_path / "results/simulations"
    for name in ("distir_fig3", "distir_fig4"):
        assert main(["simulate", "--study", str(repo_root / f"config/studies/simulate/{name}.yaml"),
                     "-o", str(out / name), "--repeats", "1", "--no-plots", "--no-track"]) == 0
    assert main(["report", str(out / "distir_fig3/results.csv"), str(out / "distir_fig4/results.csv"),
                 "-o", str(tmp_path / "summary.md"), "--no-track"]) == 0
    rows = {line.split("|")[1].strip(): line.split("|")[6].strip()
            for line in (tmp_path / "summary.md").read_text().splitlines() if line.startswith("| distir_fig")}
    assert "distir-v0.1 vs DistIR v0.1: max 0.4%" in rows["distir_fig3"]
    assert "distir-v0.1 vs DistIR v0.1 (published CSV): max 0.0%" in rows["distir_fig4"]


def test_missing_published_numbers_are_said_not_left_blank():
    from paraplan.report.summary import simulate_section

    frame = pd.DataFrame({"mode": ["corrected"], "speedup": [2.0], "D": [2], "T": [1], "P": [1]})
    lines = simulate_section({"distir_fig3": (frame, {"simulate_s": 0.01, "published":
                                                      "not compared: data/x.csv not found"}, None)})
    row = next(line for line in lines if line.startswith("| distir_fig3"))
    assert row.rstrip(" |").endswith("not compared: data/x.csv not found")


def test_calibrate_section_reports_runs_ranking_and_layer_factors():
    from paraplan.report.summary import calibrate_section

    cal = {"device": "A100-SXM4-80GB", "data": {"measurements": 1440},
           "layer_time_factors": [{"shape": "device=x,mbs=1", "factor": 1.1, "runs": 4}] * 3,
           "errors": {"in_sample": {"mape": 0.0412}, "cross_validated": {"mape": 0.0448, "median_ape": 0.0296,
                                                                          "max_ape": 0.218, "spearman": 0.995},
                      "ranking": {"measured_fastest_in_top_k": 1.0, "predicted_fastest_within_5pct": 0.944}}}
    text = "\n".join(calibrate_section({"a100": cal}))
    assert "| a100 | A100-SXM4-80GB | 1440 | 4.1% | 4.5% | 3.0% | 21.8% | 0.995 | 100.0% | 94.4% | 3 |" in text


def test_kernels_section_reads_the_shipped_kernel_fit(repo_root, tmp_path):
    """The H100 file: 169 GEMMs timed held at the 700 W limit on an H100, gemm_efficiency 0.712
    (no factor: 'held'), held-out 3.1%; cuDNN attention measured the same way, 0.635 / 0.506."""
    out = tmp_path / "summary.md"
    assert main(["report", str(repo_root / "config/kernels/H100-SXM5-80GB.json"), "-o", str(out), "--no-track"]) == 0
    row = next(line for line in out.read_text().splitlines() if line.startswith("| H100-SXM5-80GB"))
    assert row == "| H100-SXM5-80GB | H100-SXM5-80GB | 169 | 0.712 | held | 221 | 3.0% | 3.1% | 0.635 | 0.506 | 8.7% |"

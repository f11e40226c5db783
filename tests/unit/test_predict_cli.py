"""`paraplan predict` and `paraplan calibrate` as a user runs them."""

import csv
import json

import pytest

from paraplan.cli.main import main
from paraplan.predict.calibrate import FIT_BOUNDS

HEADER = ["name", "num_layers", "hidden_size", "num_attention_heads", "seq_length", "vocab_size",
          "tensor_model_parallel_size", "pipeline_model_parallel_size", "data_parallel_size", "global_batch_size",
          "micro_batch_size", "recompute_granularity", "dtype"]


def write_table(path, rows, header=HEADER):
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def read(path):
    with path.open() as handle:
        return list(csv.DictReader(handle))


def test_predict_writes_the_table_back_with_predictions(tmp_path):
    runs = write_table(tmp_path / "runs.csv", [
        ["a", 24, 2048, 16, 2048, 50257, 2, 2, 2, 64, 2, "full", "bf16"],
        ["b", 24, 2048, 16, 2048, 50257, 2, 2, 2, 64, "", "selective", "bf16"],
    ])
    out = tmp_path / "out.csv"
    assert main(["predict", str(runs), "--cluster", "dgx-a100", "-o", str(out), "--no-track"]) == 0
    a, b = read(out)
    assert a["name"] == "a" and a["micro_batch_size"] == "2" and a["chosen"] == ""
    assert b["chosen"].startswith("micro_batch_size=") and b["micro_batch_size"] == b["chosen"].split("=")[1]
    for row in (a, b):
        assert float(row["predicted_iteration_s"]) > 0 and row["fits_memory"] == "true"
        assert 0 < float(row["predicted_mfu"]) < 1 and row["calibration"].startswith("a100-vtrain@")
        parts = ("predicted_peak_model_state_bytes", "predicted_peak_working_bytes",
                 "predicted_peak_gradient_accumulator_bytes", "predicted_peak_activation_bytes")
        assert sum(int(row[c]) for c in parts) == int(row["predicted_peak_memory_bytes"])
        assert row["peak_memory_rank"] in ("0", "1")
    # full recomputation counts the recomputed forward: more model FLOPs per second than MFU says
    assert float(a["predicted_tflops_per_gpu"]) * 1e12 / 312e12 > float(a["predicted_mfu"])


def test_predict_bad_row_is_one_line_error(tmp_path, capsys):
    runs = write_table(tmp_path / "runs.csv", [["a", 24, 2048, 16, 2048, 50257, 3, 1, 1, 64, 1, "none", "bf16"]])
    out = tmp_path / "out.csv"
    assert main(["predict", str(runs), "--cluster", "dgx-a100", "-o", str(out), "--no-track"]) == 2
    err = capsys.readouterr().err
    assert "runs.csv:2: impossible run: num_attention_heads 16 is not divisible by tensor_model_parallel_size 3" in err
    assert "Traceback" not in err and not out.exists()


def test_predict_reports_runs_that_do_not_fit(tmp_path, capsys):
    runs = write_table(tmp_path / "runs.csv", [["big", 96, 12288, 96, 2048, 50257, 1, 1, 8, 64, 8, "none", "bf16"]])
    out = tmp_path / "out.csv"
    assert main(["predict", str(runs), "--cluster", "dgx-a100", "-o", str(out), "--no-track"]) == 0
    (row,) = read(out)
    assert row["fits_memory"] == "false" and float(row["predicted_peak_memory_bytes"]) > 80e9
    peak_gb = float(row["predicted_peak_memory_bytes"]) / 1e9
    # 175B parameters over 8 pipeline stages, no recomputation: the model state is the largest part
    state_gb = int(row["predicted_peak_model_state_bytes"]) / 1e9
    assert state_gb > max(int(row[c]) for c in ("predicted_peak_working_bytes", "predicted_peak_activation_bytes",
                                                 "predicted_peak_gradient_accumulator_bytes")) / 1e9
    assert ("1 run(s) in" in (err := capsys.readouterr().err)
            and f"; 1 does not fit in 84.7 GB usable of 85.1 GB (line 2 'big' {peak_gb:.1f} GB, largest part "
                f"model state {state_gb:.1f} GB)\n" in err)


def test_the_largest_memory_part_is_named_with_its_size():
    from paraplan.cli.predict import largest_memory_part
    from paraplan.predict.peak_memory import PeakMemory

    assert largest_memory_part(PeakMemory(0, 95.2e9, 12e9, 3e9, 5e9, 75.2e9)) == "activations 75.2 GB"
    assert largest_memory_part(PeakMemory(3, 90e9, 10e9, 60.04e9, 20e9, 0.0)) == "working buffers 60.0 GB"
    assert largest_memory_part(PeakMemory(1, 90e9, 30e9, 0.0, 30e9, 30e9)) == "model state 30.0 GB"


def test_calibrate_writes_a_cross_validated_calibration(tmp_path):
    rows = []
    for h, layers in ((1024, 4), (1024, 8), (2048, 4)):
        for t, p, b, seconds in ((1, 1, 2, 0.1), (2, 1, 2, 0.08), (1, 2, 4, 0.09), (2, 2, 4, 0.07)):
            scale = layers / 4 * (h / 1024) ** 1.5
            rows.append([f"h{h}", layers, h, 16, 1024, 50257, t, p, 1, 8, b, "full", "fp16", seconds * scale])
    runs = write_table(tmp_path / "runs.csv", rows, [*HEADER, "measured_iteration_s"])
    out = tmp_path / "cal.json"
    code = main(["calibrate", str(runs), "--cluster", "dgx-a100", "--fit", "gemm_efficiency,memory_efficiency",
                 "-o", str(out), "--predictions", str(tmp_path / "cv.csv"), "--no-track"])
    assert code == 0
    cal = json.loads(out.read_text())
    assert cal["name"] == "cal" and cal["device"] == "A100-SXM4-80GB" and cal["fitted"] == [
        "gemm_efficiency", "memory_efficiency"]
    cv = cal["errors"]["cross_validated"]
    assert cv["groups"] == 3 and cv["n"] == 12 and cv["mape"] >= cal["errors"]["in_sample"]["mape"] - 1e-9
    assert cal["data"]["measurements"] == 12 and len(cal["data"]["sha256"]) == 64
    assert len(read(tmp_path / "cv.csv")) == 12
    # the file is what predict uses
    predicted = tmp_path / "p.csv"
    assert main(["predict", str(runs), "--cluster", "dgx-a100", "--calibration", str(out), "-o", str(predicted),
                 "--no-track"]) == 0
    assert read(predicted)[0]["calibration"].startswith("cal@")


def test_calibrate_without_ranking_questions_writes_the_calibration_and_says_why(tmp_path, capsys):
    """Issue 21: every row a different model (no question asked of two runs) crashed after
    the whole fit, NaN ranking metrics reaching the JSON writer."""
    rows = [[f"h{h}", layers, h, 16, 1024, 50257, 1, 1, 1, 8, 2, "full", "fp16", 0.1 * layers / 4 * (h / 1024) ** 1.5]
            for h, layers in ((1024, 4), (1024, 8), (2048, 4))]
    runs = write_table(tmp_path / "runs.csv", rows, [*HEADER, "measured_iteration_s"])
    out = tmp_path / "cal.json"
    code = main(["calibrate", str(runs), "--cluster", "dgx-a100", "--fit", "gemm_efficiency", "--group-by",
                 "num_layers", "-o", str(out), "--no-track"])
    assert code == 0
    ranking = json.loads(out.read_text())["errors"]["ranking"]
    assert ranking["questions"] == 0 and ranking["measured_fastest_in_top_k"] is None
    assert ranking["predicted_fastest_within_5pct"] is None
    assert ("paraplan calibrate: warning: no ranking metrics: no question has >= 2 runs"
            in capsys.readouterr().err)
    # one run: no Spearman correlation either, written as null
    one = write_table(tmp_path / "one.csv", rows[:1], [*HEADER, "measured_iteration_s"])
    assert main(["calibrate", str(one), "--cluster", "dgx-a100", "--fit", "gemm_efficiency", "-o", str(out),
                 "--no-track"]) == 0
    assert json.loads(out.read_text())["errors"]["in_sample"]["spearman"] is None


@pytest.mark.parametrize(("args", "message"), [
    ([], "option --profile: give a run table or --profile (one of them)"),
    (["--fit", "speed"], f"option --fit: unknown parameter 'speed'; expected some of {', '.join(FIT_BOUNDS)}"),
])
def test_calibrate_usage_errors(tmp_path, capsys, args, message):
    runs = write_table(tmp_path / "runs.csv", [["a", 4, 1024, 16, 1024, 50257, 1, 1, 1, 8, 2, "full", "fp16"]],
                       HEADER)
    base = [] if not args else [str(runs)]
    code = main(["calibrate", *base, *args, "--cluster", "dgx-a100", "-o", str(tmp_path / "c.json"), "--no-track"])
    assert code == 2
    assert capsys.readouterr().err == f"paraplan calibrate: error: {message}\n"


def test_calibrate_holds_the_kernel_ceilings_of_the_device(tmp_path):
    """--kernel-ceilings device: the GEMM and attention parameters stay at
    config/kernels/A100-SXM4-80GB.json; only the rest is fitted."""
    from paraplan.kernels.ceilings import held_parameters

    rows = [[f"h{h}", 4, h, 16, 1024, 50257, t, p, 1, 8, b, "full", "fp16", seconds * h / 1024]
            for h in (1024, 2048) for t, p, b, seconds in ((1, 1, 2, 0.1), (2, 1, 2, 0.08), (1, 2, 4, 0.09))]
    runs = write_table(tmp_path / "runs.csv", rows, [*HEADER, "measured_iteration_s"])
    out = tmp_path / "cal.json"
    assert main(["calibrate", str(runs), "--cluster", "dgx-a100", "--kernel-ceilings", "device",
                 "--fit", "memory_efficiency", "--no-cross-validation", "-o", str(out), "--no-track"]) == 0
    cal = json.loads(out.read_text())
    held = held_parameters("A100-SXM4-80GB")
    assert cal["fitted"] == ["memory_efficiency"]
    assert cal["efficiency"]["gemm_efficiency"] == held["gemm_efficiency"]
    assert cal["efficiency"]["attention_seq_half"] == held["attention_seq_half"]
    assert cal["efficiency"]["gemm_k_half"] == 64.0  # not determined by one published shape: not held, not fitted
    assert cal["assumptions"]["held_at_kernel_fit"] == held
    assert main(["calibrate", str(runs), "--cluster", "dgx-a100", "--kernel-ceilings", "device",
                 "--fit", "gemm_efficiency", "-o", str(tmp_path / "x.json"), "--no-track"]) == 2


def test_predict_help_names_every_run_table_column_and_schedule():
    """`paraplan predict --help` (and the generated command-line page) lists each column
    the run-table reader accepts and each pipeline schedule, so that a new column cannot
    be added without telling users."""
    import re

    import paraplan.cli.predict as cli
    from paraplan.core.run_settings import PIPELINE_SCHEDULES
    from paraplan.predict.runtable import MODEL_COLUMNS, REQUIRED, SETTINGS_COLUMNS

    words = set(re.findall(r"[A-Za-z0-9_]+", cli.__doc__ or ""))
    missing = [c for c in (*REQUIRED, *MODEL_COLUMNS, *SETTINGS_COLUMNS, *PIPELINE_SCHEDULES) if c not in words]
    assert missing == []


def test_a_row_that_parses_but_cannot_be_priced_names_file_line_and_run(tmp_path, capsys):
    """An error raised while pricing (here MXFP8 on a Hopper device) reads as a parse
    error does, `FILE:LINE: ...`, with the run's name; nothing is written."""
    runs = tmp_path / "runs.csv"
    runs.write_text("name,model,tensor_model_parallel_size,pipeline_model_parallel_size,data_parallel_size,"
                    "global_batch_size,micro_batch_size,dtype,fp8_recipe\n"
                    "fp8 row,llama3-8b,1,1,8,8,1,fp8,mxfp8\n")
    out = tmp_path / "out.csv"
    assert main(["predict", str(runs), "--cluster", "dgx-h100", "-o", str(out), "--no-track"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"paraplan predict: error: {runs}:2: impossible run (fp8 row): fp8_recipe mxfp8 needs MXFP8 "
                   "tensor cores (Blackwell): device H100-SXM5-80GB lists no mxfp8 peak in its cluster file; use "
                   "delayed, tensorwise or blockwise"]
    assert not out.exists()

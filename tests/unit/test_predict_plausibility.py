"""The plausibility guard: an MFU above the device's GEMM ceiling or above 65% for a
full training step is flagged in the output and named in a warning."""

import csv
import json
from pathlib import Path

import pytest

from paraplan.cli.main import main
from paraplan.predict.device_model import DeviceEfficiency
from paraplan.predict.predictor import MAX_PUBLISHED_MFU, plausibility


@pytest.mark.parametrize(("mfu", "gemm", "expected"), [
    (0.50, 0.80, ""),
    (0.65, 0.80, ""),  # at the line: still plausible
    (0.70, 0.80, "MFU 70.0% is above 65%, more than any published full training step"),
    (0.60, 0.55, "MFU 60.0% is above the device's GEMM ceiling (55.0% of peak)"),
    (0.90, 0.85, "MFU 90.0% is above the device's GEMM ceiling (85.0% of peak) and above 65%, more than any "
                 "published full training step"),
])
def test_plausibility_messages(mfu, gemm, expected):
    assert MAX_PUBLISHED_MFU == 0.65
    assert plausibility(mfu, DeviceEfficiency(gemm_efficiency=gemm)) == expected


def test_cli_flags_an_implausible_run_in_the_column_and_the_log(tmp_path, capsys):
    """A calibration with ideal GEMMs and free overlap makes GPT-3 175B run above 65%."""
    data = json.loads((Path(__file__).resolve().parents[2] / "config/calibrations/a100-vtrain.json").read_text())
    data["efficiency"].update(gemm_efficiency=1.0, gemm_k_half=0.0, comm_overlap_contention=0.0)
    calibration = tmp_path / "ideal.json"
    calibration.write_text(json.dumps(data))
    runs = tmp_path / "runs.csv"
    runs.write_text(
        "name,num_layers,hidden_size,num_attention_heads,seq_length,vocab_size,tensor_model_parallel_size,"
        "pipeline_model_parallel_size,data_parallel_size,global_batch_size,micro_batch_size,"
        "virtual_pipeline_model_parallel_size,sequence_parallel,use_distributed_optimizer,overlap_grad_reduce\n"
        "small,24,2048,16,2048,50257,1,1,8,64,1,1,false,false,true\n"
        "gpt3,96,12288,96,2048,51200,4,8,32,1536,1,12,true,true,true\n")
    out = tmp_path / "out.csv"
    assert main(["predict", str(runs), "--cluster", "dgx-a100", "-o", str(out), "--no-track", "--calibration",
                 str(calibration)]) == 0
    with out.open() as handle:
        small, gpt3 = list(csv.DictReader(handle))
    assert small["plausibility"] == "" and float(small["predicted_mfu"]) < 0.65
    mfu = float(gpt3["predicted_mfu"])
    assert mfu > 0.65 and gpt3["plausibility"] == (f"MFU {mfu:.1%} is above 65%, more than any published full "
                                                    "training step")
    err = capsys.readouterr().err
    assert f"warning: {runs}:3 (gpt3): MFU {mfu:.1%} is above 65%" in err and "(small)" not in err

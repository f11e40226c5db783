"""Power limits (docs/kernels.md#power-limits): a cluster file states the limit its devices
run at, a kernel fit records the fitting cluster's, and a device priced by ceilings measured
at another limit is told so by predict and plan."""

import json
from pathlib import Path

import pytest
import yaml

from paraplan.cli.main import main
from paraplan.clusters import cluster_from_dict, load_cluster
from paraplan.core.errors import InputFileError
from paraplan.kernels.ceilings import KernelCeilings, load_kernel_ceilings, power_limit_note

REPO = Path(__file__).resolve().parents[2]
H100_FILE = REPO / "config/kernels/H100-SXM5-80GB.json"


def test_the_shipped_kernel_files_record_the_limit_they_were_measured_at():
    # the H100 kernels were timed on an H100 SXM5 at its 700 W limit (data/measured/h100-sxm5/README.md),
    # the A100's held at 400 W by Perlmutter's sustained GEMMs; the MAMF table names no MI300X limit
    assert load_kernel_ceilings("H100-SXM5-80GB").power_limit_w == 700.0
    assert load_kernel_ceilings("A100-SXM4-80GB").power_limit_w == 400.0
    assert load_kernel_ceilings("MI300X-192GB").power_limit_w is None
    assert load_cluster("dgx-h100").device.power_limit_w == 700.0
    assert load_cluster("grand-teton-h100-500w").device.power_limit_w == 500.0
    assert load_cluster("mi300x").device.power_limit_w is None


@pytest.mark.parametrize(("value", "message"), [
    ("700", "expected the measured device's power limit in W (a number > 0 and <= 10000), got '700'"),
    (True, "expected the measured device's power limit in W (a number > 0 and <= 10000), got True"),
    (0, "got 0: a device's power limit is above 0 and at most 10 kW; wrong unit? (power_limit_w is in watts)"),
    (7e5, "got 700000.0: a device's power limit is above 0 and at most 10 kW"),
])
def test_a_kernel_file_with_a_bad_power_limit_is_refused_with_the_key(value, message):
    data = json.loads(H100_FILE.read_text())
    assert KernelCeilings.from_dict(data, "k.json").to_dict() == data  # round trip, power_limit_w included
    data["power_limit_w"] = value
    with pytest.raises(InputFileError) as err:
        KernelCeilings.from_dict(data, "k.json")
    assert str(err.value).startswith("k.json: power_limit_w: ") and message in str(err.value)


def test_a_cluster_file_with_a_power_limit_in_kilowatts_is_refused_with_the_key():
    data = yaml.safe_load((REPO / "config/clusters/dgx-h100.yaml").read_text())
    data["device"]["power_limit_w"] = 70000
    with pytest.raises(InputFileError) as err:
        cluster_from_dict(data, "x.yaml")
    assert str(err.value).startswith("x.yaml: key 'device.power_limit_w': expected a number")
    assert "above 10 kW for one device; wrong unit? (power_limit_w is in watts)" in str(err.value)


def test_a_device_at_another_limit_than_its_ceilings_gets_a_note_naming_both():
    assert power_limit_note("H100-SXM-96GB-HBM2e", "H100-SXM5-80GB", 500.0) == (
        "H100-SXM-96GB-HBM2e runs at a 500 W power limit, but its GEMM and attention ceilings "
        "(config/kernels/H100-SXM5-80GB.json) were measured at 700 W; a power limit sets the clock compute-bound "
        "kernels hold, which paraplan does not model, so their time here is a lower bound "
        "(docs/kernels.md#power-limits)")
    assert power_limit_note("H100-SXM5-80GB", "H100-SXM5-80GB", 800.0).endswith(
        "so their time here is an upper bound (docs/kernels.md#power-limits)")
    # the same limit, a limit not stated on either side, or no kernel file: nothing to compare
    assert power_limit_note("H100-SXM5-80GB", "H100-SXM5-80GB", 700.0) == ""
    assert power_limit_note("H100-SXM5-80GB", "H100-SXM5-80GB", None) == ""
    assert power_limit_note("MI300X-192GB", "MI300X-192GB", 750.0) == ""
    assert power_limit_note("V100-SXM2-16GB", "V100-SXM2-16GB", 300.0) == ""


def test_predict_on_the_500_w_hosts_says_their_compute_is_priced_at_700_w(tmp_path, capsys):
    table = tmp_path / "runs.csv"
    table.write_text("name,model,seq_length,tensor_model_parallel_size,pipeline_model_parallel_size,"
                     "data_parallel_size,global_batch_size\nr,llama3-8b,2048,1,1,8,8\n")
    assert main(["predict", str(table), "--cluster", "grand-teton-h100-500w", "-o", str(tmp_path / "o.csv"),
                 "--no-track"]) == 0
    assert ("paraplan predict: note: H100-SXM-96GB-HBM2e runs at a 500 W power limit, but its GEMM and attention "
            "ceilings (config/kernels/H100-SXM5-80GB.json) were measured at 700 W") in capsys.readouterr().err
    assert main(["predict", str(table), "--cluster", "dgx-h100", "-o", str(tmp_path / "p.csv"), "--no-track"]) == 0
    assert "power limit" not in capsys.readouterr().err


def test_the_notes_become_the_tracked_runs_description(tmp_path, monkeypatch, capsys):
    """What predict and plan say about a device they cannot price fully is also the MLflow
    run's description (`mlflow.note.content`), where `mlflow ui` shows it."""
    import paraplan.cli.common
    import paraplan.cli.predict

    logged = []
    monkeypatch.setattr(paraplan.cli.predict, "track", lambda args, run: logged.append(run))
    monkeypatch.setattr(paraplan.cli.common, "track", lambda args, run: logged.append(run))
    table = tmp_path / "runs.csv"
    table.write_text("name,model,seq_length,tensor_model_parallel_size,pipeline_model_parallel_size,"
                     "data_parallel_size,global_batch_size\nr,llama3-8b,2048,1,1,16,16\n")
    assert main(["predict", str(table), "--cluster", "grand-teton-h100-500w", "-o", str(tmp_path / "o.csv"),
                 "--no-track"]) == 0
    assert main(["plan", "--model", "llama3-8b", "--cluster", "grand-teton-h100-500w", "--gpus", "16",
                 "--global-batch-size", "16", "--seq-length", "2048", "--top-k", "1", "-o", str(tmp_path / "p.csv"),
                 "--no-track"]) == 0
    for run in logged:
        description = run.tags["mlflow.note.content"]
        assert description.startswith("paraplan's notes and warnings:\n\n- note: ")
        assert "runs at a 500 W power limit" in description  # the power-limit note
        assert "slowest of 16 GPUs is not priced" in description  # the spread note (two nodes of 8)
    assert [run.stage for run in logged] == ["predict", "plan"]
    assert main(["predict", str(table), "--cluster", "dgx-a100", "-o", str(tmp_path / "a.csv"), "--no-track"]) == 0
    assert logged[-1].tags == {}  # nothing to say: no description
    capsys.readouterr()

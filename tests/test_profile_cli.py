"""`paraplan profile`, `paraplan ingest --format pipedream` and `paraplan export
--format pipedream` end to end (in-process, no tracking)."""

from __future__ import annotations

import json

import pytest

from paraplan.cli.main import main
from paraplan.profile.io import read_profile
from paraplan.profile.specs import profile_cli_args


@pytest.fixture
def keep_threads():
    import torch

    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_profile_tiny_mlp_with_batch_scaling_and_chart(tmp_path, capsys, keep_threads):
    out = tmp_path / "mlp.csv"
    code = main(["profile", "--model", "mlp", "--layers", "2", "--input-dim", "16", "--hidden-dim", "32",
                 "--output-dim", "8", "--batches", "2,4", "--repeats", "2", "--warmup", "1", "--threads", "1",
                 "-o", str(out), "--plots", str(tmp_path / "fig"), "--no-track"])
    assert code == 0
    profile = read_profile(out)
    assert profile.batch_size == 4 and profile.num_layers == 2
    assert list(profile.param_bytes) == [4 * (16 * 32 + 32), 4 * (32 * 8 + 8)]
    assert [la.flops for la in profile.layers] == [2 * 4 * 16 * 32 + 2 * 4 * 32, 2 * 4 * 32 * 8 + 2 * 4 * 8]
    meta = json.loads((tmp_path / "mlp.meta.json").read_text())
    assert meta["threads"] == 1 and meta["method"] == "torch" and meta["batches"] == [2, 4]
    assert meta["model_settings"]["hidden_dim"] == 32 and set(meta["per_batch"]) == {"2", "4"}
    assert (tmp_path / "fig" / "mlp.png").is_file() and (tmp_path / "fig" / "mlp.pdf").is_file()
    assert "sum of layers vs whole step" in capsys.readouterr().out


def test_unknown_model_exits_2_listing_known_models(tmp_path, capsys):
    assert main(["profile", "--model", "alexnet", "-o", str(tmp_path / "x.csv"), "--no-track"]) == 2
    assert "known models: gpt, mlp, resnet" in capsys.readouterr().err
    assert not (tmp_path / "x.csv").exists()


def test_analytic_profile_on_a_cluster_device(tmp_path, repo_root):
    out = tmp_path / "resnet.csv"
    cluster = repo_root / "config" / "clusters" / "dgx1-v100.yaml"
    assert main(["profile", "--model", "resnet", "--batch", "32", "--analytic", "--cluster", str(cluster),
                 "-o", str(out), "--no-track"]) == 0
    profile = read_profile(out)
    assert profile.num_layers == 18
    assert profile.total_param_bytes / 1e6 == pytest.approx(102.2, abs=0.05)  # as PipeDream's ResNet-50
    assert profile.meta["method"] == "analytic-roofline" and profile.meta["device"] == "V100-SXM2-16GB"


def test_ingest_then_export_pipedream(shared_dir, tmp_path):
    source = shared_dir / "data" / "pipedream-profiles" / "bert-24-pbs-6.txt"
    csv_path = tmp_path / "bert.csv"
    assert main(["ingest", "--format", "pipedream", str(source), "-o", str(csv_path), "--no-track"]) == 0
    text_path = tmp_path / "bert-pbs-6.txt"
    assert main(["export", "--format", "pipedream", str(csv_path), "-o", str(text_path), "--no-track"]) == 0
    again = tmp_path / "again.csv"
    assert main(["ingest", "--format", "pipedream", str(text_path), "-o", str(again), "--no-track"]) == 0
    assert again.read_text() == csv_path.read_text()
    assert read_profile(again).num_layers == 29


def test_export_refuses_a_name_with_another_batch_size(tmp_path, capsys):
    csv_path = tmp_path / "p.csv"
    csv_path.write_text("layer,name,fwd_s,bwd_s,activation_bytes,param_bytes\n0,a,1,2,3,4\n")
    (tmp_path / "p.meta.json").write_text('{"batch_size": 8}')
    assert main(["export", "--format", "pipedream", str(csv_path), "-o", str(tmp_path / "p-pbs-4.txt"),
                 "--no-track"]) == 2
    assert "-pbs-4" in capsys.readouterr().err


def test_workflow_entry_becomes_cli_options():
    entry = {"model": "resnet", "batches": [16, 32], "settings": {"blocks": [1, 2], "width": 8},
             "analytic": {"cluster": "dgx-a100"}}
    assert profile_cli_args(entry) == ["--model", "resnet", "--blocks", "1,2", "--width", "8", "--analytic",
                                       "--cluster", "dgx-a100", "--combine", "roofline", "--batch", "32"]
    assert profile_cli_args({"model": "mlp", "batches": [8], "settings": {"bias": False}}) == [
        "--model", "mlp", "--no-bias", "--batches", "8"]

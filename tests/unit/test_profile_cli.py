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
    torch = pytest.importorskip("torch")  # measuring a profile is the measure extra's

    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_profile_tiny_mlp_with_batch_scaling_and_chart(tmp_path, capsys, keep_threads):
    out = tmp_path / "mlp.csv"
    code = main(["profile", "--model", "mlp", "--num-layers", "2", "--input-dim", "16", "--hidden-dim", "32",
                 "--output-dim", "8", "--profile-batch-sizes", "2,4", "--repeats", "2", "--warmup", "1",
                 "--threads", "1",
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
    assert "paraplan profile: sum of layers vs whole step" in capsys.readouterr().err


def test_unknown_model_exits_2_listing_known_models(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        main(["profile", "--model", "alexnet", "-o", str(tmp_path / "x.csv"), "--no-track"])
    assert stop.value.code == 2
    assert "invalid choice: 'alexnet' (choose from 'mlp', 'gpt', 'resnet')" in capsys.readouterr().err
    assert not (tmp_path / "x.csv").exists()


def test_a_setting_of_another_model_names_the_option_and_the_ones_it_takes(tmp_path, capsys):
    assert main(["profile", "--model", "gpt", "--in-channels", "1", "--analytic", "--cluster", "dgx-a100",
                 "-o", str(tmp_path / "x.csv"), "--no-track"]) == 2
    assert capsys.readouterr().err == (
        "paraplan profile: error: option --in-channels: does not apply here; expected one of --num-layers, "
        "--hidden-size, --num-attention-heads, --seq-length, --vocab-size\n")


def test_every_setting_of_a_model_is_an_option(tmp_path):
    """The workflow's ResNet `in_channels` reaches `paraplan profile` as --in-channels."""
    out = tmp_path / "r.csv"
    assert main(["profile", "--model", "resnet", "--in-channels", "1", "--blocks", "1,1", "--width", "8",
                 "--image-size", "32", "--num-classes", "10", "--profile-batch-size", "2", "--analytic",
                 "--cluster", "dgx-a100", "-o", str(out), "--no-track"]) == 0
    settings = read_profile(out).meta["model_settings"]
    assert (settings["in_channels"], settings["blocks"], settings["image_size"]) == (1, [1, 1], 32)


def test_analytic_profile_on_a_cluster_device(tmp_path, repo_root):
    out = tmp_path / "resnet.csv"
    cluster = repo_root / "config" / "clusters" / "dgx1-v100.yaml"
    assert main(["profile", "--model", "resnet", "--profile-batch-size", "32", "--analytic", "--cluster", str(cluster),
                 "-o", str(out), "--no-track"]) == 0
    profile = read_profile(out)
    assert profile.num_layers == 18
    assert profile.total_param_bytes / 1e6 == pytest.approx(102.2, abs=0.05)  # as PipeDream's ResNet-50
    assert profile.meta["method"] == "analytic-roofline" and profile.meta["device"] == "V100-SXM2-16GB"


def test_ingest_then_export_pipedream(data_dir, tmp_path):
    source = data_dir / "pipedream-profiles" / "bert-24-pbs-6.txt"
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
    entry = {"model": "resnet", "profile_batch_sizes": [16, 32], "settings": {"blocks": [1, 2], "width": 8,
                                                                             "in_channels": 1},
             "analytic": {"cluster": "dgx-a100"}}
    assert profile_cli_args(entry) == ["--model", "resnet", "--blocks", "1,2", "--width", "8", "--in-channels", "1",
                                       "--analytic", "--cluster", "dgx-a100", "--combine", "roofline",
                                       "--profile-batch-size", "32"]
    assert profile_cli_args({"model": "mlp", "profile_batch_sizes": [8], "settings": {"bias": False}}) == [
        "--model", "mlp", "--no-bias", "--profile-batch-sizes", "8"]


def test_every_workflow_option_is_one_the_command_takes():
    """What the workflow passes, the command parses (the spec fields are the options)."""
    from paraplan.cli.main import build_parser
    from paraplan.profile.specs import MODEL_SPECS, spec_settings

    for model, cls in MODEL_SPECS.items():
        settings = spec_settings(cls())
        args = profile_cli_args({"model": model, "profile_batch_sizes": [2], "settings": settings})
        parsed = build_parser().parse_args(["profile", *args, "-o", "x.csv"])
        assert {k[len("spec_"):] for k in vars(parsed) if k.startswith("spec_")} == set(settings)


def test_a_0_1_workflow_entry_gives_the_same_options(capsys):
    old = {"model": "gpt", "batches": [2, 4], "settings": {"layers": 2, "hidden": 64, "heads": 2}}
    new = {"model": "gpt", "profile_batch_sizes": [2, 4],
           "settings": {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 2}}
    assert profile_cli_args(old) == profile_cli_args(new)
    assert "'hidden' is deprecated, use 'hidden_size'" in capsys.readouterr().err


def test_a_bad_workflow_entry_names_the_config_key():
    from paraplan.core import ConfigError

    with pytest.raises(ConfigError,
                       match=r"'profile.models.m.settings.width': expected an integer >= 1 and <= 2\^24, got 0"):
        profile_cli_args({"model": "resnet", "profile_batch_sizes": [2], "settings": {"width": 0}},
                         "profile.models.m")


def test_an_analytic_profile_says_no_thread_count(tmp_path, capsys):
    """An analytic profile measured nothing: its line has no 'threads None'."""
    out = tmp_path / "resnet_v100.csv"
    assert main(["profile", "--model", "resnet", "--profile-batch-size", "32", "--analytic", "--cluster", "dgx1-v100",
                 "-o", str(out), "--no-track"]) == 0
    err = capsys.readouterr().err
    assert err.startswith("paraplan profile: resnet_v100: 18 layers at batch 32 (analytic-roofline, V100-SXM2-16GB): ")
    assert err.endswith(f"paraplan profile: wrote {out} and {tmp_path / 'resnet_v100.meta.json'}\n")

"""The files a study names are read from the root the study came from, not the working
directory (`paraplan.studies.paths`; a walkthrough's `cd /tmp && paraplan plan --study
dapple_resnet50` failed on the study's data/pipedream-profiles/resnet50-pbs-32.txt)."""

from __future__ import annotations

import shutil

import pandas as pd
import pytest
import yaml

from paraplan.cli.main import main
from paraplan.config_files import find_study
from paraplan.core.errors import InputFileError
from paraplan.studies.paths import study_root
from paraplan.studies.plan import load_plan_study

PROFILE = "data/pipedream-profiles/resnet50-pbs-32.txt"


def test_study_root_is_above_config_or_beside_the_file(tmp_path):
    assert study_root(tmp_path / "config/studies/plan/x.yaml") == tmp_path
    assert study_root(tmp_path / "config/studies/simulate/x.yaml") == tmp_path
    assert study_root(tmp_path / "config/experiments/x.yaml") == tmp_path  # paraplan 0.1's folder
    assert study_root(tmp_path / "site-packages/paraplan/_config/studies/plan/x.yaml") == \
        tmp_path / "site-packages/paraplan"  # the wheel's copy
    assert study_root(tmp_path / "mine/x.yaml") == tmp_path / "mine"
    assert study_root(tmp_path / "notconfig/studies/plan/x.yaml") == tmp_path / "notconfig/studies/plan"


def test_a_named_study_reads_its_profile_from_the_checkout_in_any_directory(repo_root, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    study = load_plan_study(find_study("plan", "dapple_resnet50"))
    assert study.profile == repo_root / PROFILE and study.profile.is_file()
    out = tmp_path / "out"
    assert main(["plan", "--study", "dapple_resnet50", "--global-batch-sizes", "32,64", "-o", str(out),
                 "--no-track"]) == 0
    plans = pd.read_csv(out / "dapple_resnet50__2x8.csv")
    assert plans["gbs"].tolist() == [32, 64] and (plans["best_hybrid"] > 0).all()


def test_a_profile_given_on_the_command_line_stays_relative_to_the_working_directory(repo_root, tmp_path,
                                                                                      monkeypatch):
    shutil.copyfile(repo_root / PROFILE, tmp_path / "mine-pbs-32.txt")
    monkeypatch.chdir(tmp_path)
    assert main(["plan", "--study", "dapple_resnet50", "--profile", "mine-pbs-32.txt", "--global-batch-sizes", "32",
                 "-o", "out", "--no-track"]) == 0
    assert pd.read_csv(tmp_path / "out/dapple_resnet50__16x1.csv")["gbs"].tolist() == [32]


def test_a_study_file_kept_elsewhere_reads_beside_itself(repo_root, tmp_path, monkeypatch):
    study = yaml.safe_load((repo_root / "config/studies/plan/dapple_resnet50.yaml").read_text())
    (tmp_path / "mine").mkdir()
    shutil.copyfile(repo_root / PROFILE, tmp_path / "mine" / "resnet50-pbs-32.txt")
    path = tmp_path / "mine" / "study.yaml"
    path.write_text(yaml.safe_dump({**study, "profile": "resnet50-pbs-32.txt"}))
    monkeypatch.chdir(repo_root)
    assert load_plan_study(path).profile == tmp_path / "mine" / "resnet50-pbs-32.txt"


def test_a_missing_file_in_a_study_is_one_line_naming_the_study_and_the_path_tried(repo_root, tmp_path, capsys):
    study = yaml.safe_load((repo_root / "config/studies/plan/dapple_resnet50.yaml").read_text())
    folder = tmp_path / "config/studies/plan"
    folder.mkdir(parents=True)
    path = folder / "mine.yaml"
    path.write_text(yaml.safe_dump({**study, "name": "mine", "profile": "data/nope.txt"}))
    assert main(["plan", "--study", str(path), "-o", str(tmp_path / "out"), "--no-track"]) == 2
    assert capsys.readouterr().err == (
        f"paraplan plan: error: {path}: key 'profile': no file {tmp_path}/data/nope.txt "
        f"('data/nope.txt' is read relative to {tmp_path}, where the study comes from)\n")
    assert not (tmp_path / "out").exists()
    # a cluster given as a YAML path is read the same way
    path.write_text(yaml.safe_dump({**study, "name": "mine", "profile": str(repo_root / PROFILE),
                                    "cluster": "clusters/v100.yaml"}))
    with pytest.raises(InputFileError, match=rf"mine.yaml: key 'cluster': no file {tmp_path}/clusters/v100.yaml "):
        load_plan_study(path)


def test_simulate_reads_a_studys_published_numbers_from_the_checkout(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["simulate", "--study", "distir_fig3", "--modes", "distir-v0.1", "--repeats", "1", "--no-plots",
                 "-o", "out", "--no-track"]) == 0
    compared = pd.read_csv(tmp_path / "out/published_comparison.csv")
    assert len(compared) == 40  # DistIR's Figure 3: 40 published points
    assert "not found" not in capsys.readouterr().err


def test_simulate_warns_once_naming_the_study_and_the_published_file_tried(repo_root, tmp_path, capsys):
    study = yaml.safe_load((repo_root / "config/studies/simulate/distir_fig3.yaml").read_text())
    path = tmp_path / "fig3.yaml"
    path.write_text(yaml.safe_dump({**study, "published": {**study["published"], "file": "nope.csv"}}))
    assert main(["simulate", "--study", str(path), "--modes", "distir-v0.1", "--repeats", "1", "--no-plots",
                 "-o", str(tmp_path / "out"), "--no-track"]) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert warnings == [f"paraplan simulate: warning: {path}: key 'published.file': no file {tmp_path}/nope.csv "
                        f"('nope.csv' is read relative to {tmp_path}, where the study comes from); no comparison"]

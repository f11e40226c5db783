"""A Hugging Face model folder (what `huggingface-cli download` leaves: config.json beside
the weights) names a model as its config.json does, in `--model` and in a run table's
`model` column; the model takes the folder's name."""

import shutil

import pytest

from paraplan.core import ConfigError
from paraplan.predict.models import PRESETS, load_model
from paraplan.predict.runtable import read_run_table


def _folder(tmp_path, repo_root):
    folder = tmp_path / "Qwen3-32B"
    folder.mkdir()
    shutil.copy(repo_root / "tests/data/hf/qwen3-32b.json", folder / "config.json")
    return folder


def test_a_folder_is_read_as_its_config_json(tmp_path, repo_root, capsys):
    folder = _folder(tmp_path, repo_root)
    model = load_model(str(folder), seq_length=4096)
    assert model == load_model(str(folder / "config.json"), seq_length=4096)
    assert model.name == "Qwen3-32B" and model.num_layers == 64 and model.kv_channels == 128


def test_a_run_table_names_the_folder(tmp_path, repo_root):
    _folder(tmp_path, repo_root)
    path = tmp_path / "runs.csv"
    path.write_text("model,seq_length,tensor_model_parallel_size,pipeline_model_parallel_size,data_parallel_size,"
                    "global_batch_size\nQwen3-32B,4096,8,2,1,16\n")
    (row,) = read_run_table(path)[1]
    assert row.model.name == "Qwen3-32B" and row.model.hidden_size == 5120


def test_a_folder_without_config_json_is_the_same_error(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError) as err:
        load_model(str(tmp_path / "empty"))
    assert str(err.value) == (f"config key 'model': '{tmp_path / 'empty'}' is neither a preset ({', '.join(PRESETS)}) "
                              "nor a file (or a folder holding a config.json)")


def test_a_folder_named_like_a_preset_is_named_in_a_warning(tmp_path, monkeypatch, capsys):
    (tmp_path / "deepseek-v3").mkdir()
    monkeypatch.chdir(tmp_path)
    assert load_model("deepseek-v3", prog="paraplan plan") == PRESETS["deepseek-v3"]
    assert capsys.readouterr().err == ("paraplan plan: warning: 'deepseek-v3' is a preset, which is used; the file or "
                                       "folder of that name is not read (name it ./deepseek-v3 to read it)\n")
    assert load_model("llama3-8b") == PRESETS["llama3-8b"] and capsys.readouterr().err == ""


def test_a_run_table_reads_a_folder_named_like_a_preset_by_its_path(tmp_path, repo_root, monkeypatch):
    """`./deepseek-v3` beside the table is the folder (a Qwen3-32B here), not the preset,
    also when the table's folder is the working directory (the path then normalises to
    the preset's bare name)."""
    folder = tmp_path / "deepseek-v3"
    folder.mkdir()
    shutil.copy(repo_root / "tests/data/hf/qwen3-32b.json", folder / "config.json")
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "runs.csv"
    path.write_text("model,seq_length,tensor_model_parallel_size,pipeline_model_parallel_size,data_parallel_size,"
                    "global_batch_size\n./deepseek-v3,4096,8,2,1,16\ndeepseek-v3,4096,8,2,1,16\n")
    rows = read_run_table("runs.csv")[1]
    assert [r.model.num_layers for r in rows] == [64, 61]  # the folder's Qwen3-32B, then the preset

"""The typed-input machinery: one dataclass gives the loader, its errors, the JSON
schema and the command-line options; 0.1 names still load (files, options, the
workflow config and config/experiments/) with a deprecation line."""

from __future__ import annotations

import argparse
import copy
from dataclasses import dataclass
from typing import Literal

import pytest
import yaml

from paraplan.core import ConfigError, InputFileError
from paraplan.typed import Count, PositiveFloat, Source, add_options, given, json_schema, load


@dataclass(frozen=True, kw_only=True)
class Inner:
    """A nested record."""

    global_batch_sizes: tuple[Count, ...]
    """Samples per iteration."""


@dataclass(frozen=True, kw_only=True)
class Outer:
    """A made-up input file."""

    name: str
    """Its name."""
    micro_batch_size: Count = 1
    """Samples per micro-batch."""
    memory_GB: PositiveFloat | None = None
    """Device memory."""
    schedule: Literal["gpipe", "1f1b"] = "1f1b"
    """The schedule."""
    overlap: bool = False
    """Overlap or not."""
    inner: Inner | None = None
    """Something nested."""


def test_a_mapping_loads_and_each_error_names_the_key_the_value_and_what_was_expected():
    ok = load(Outer, {"name": "x", "micro_batch_size": 4, "inner": {"global_batch_sizes": [8, 16]}},
              Source.file("f.yaml"))
    assert ok == Outer(name="x", micro_batch_size=4, inner=Inner(global_batch_sizes=(8, 16)))
    bad = [
        ({"name": "x", "inner": {"global_batch_sizes": [8, 0]}},
         "f.yaml: key 'inner.global_batch_sizes[1]': expected an integer >= 1, got 0"),
        ({"name": "x", "memory_GB": -1.0}, "f.yaml: key 'memory_GB': expected a number > 0, got -1.0: negative"),
        ({"name": "x", "schedule": "zigzag"}, "f.yaml: key 'schedule': expected one of gpipe, 1f1b, got 'zigzag'"),
        ({"name": "x", "overlap": "yes"}, "f.yaml: key 'overlap': expected true or false, got 'yes'"),
        ({"name": 3}, "f.yaml: key 'name': expected text, got 3"),
        ({"micro_batch_size": 2}, "f.yaml: key 'name': missing; expected text"),
        ([], "f.yaml: expected a mapping, got []"),
    ]
    for data, message in bad:
        with pytest.raises(InputFileError) as err:
            load(Outer, data, Source.file("f.yaml"))
        assert str(err.value) == message


def test_a_0_1_key_loads_with_a_line_and_both_names_are_an_error(capsys):
    assert load(Outer, {"name": "x", "microbatch_size": 2}, Source.file("f.yaml")).micro_batch_size == 2
    assert capsys.readouterr().err.strip() == (
        "paraplan: warning: f.yaml: 'microbatch_size' is deprecated, use 'micro_batch_size' "
        "(the old name goes away after paraplan 0.2)")
    with pytest.raises(InputFileError, match="'microbatch_size' is the old name of 'micro_batch_size'; give only"):
        load(Outer, {"name": "x", "microbatch_size": 2, "micro_batch_size": 2}, Source.file("f.yaml"))


def test_the_schema_comes_from_the_fields_and_their_docstrings():
    schema = json_schema(Outer)
    assert schema["description"] == "A made-up input file."
    assert schema["required"] == ["name"]
    props = schema["properties"]
    assert props["micro_batch_size"] == {"type": "integer", "minimum": 1, "description": "Samples per micro-batch.",
                                         "default": 1}
    assert props["schedule"]["enum"] == ["gpipe", "1f1b"]
    assert props["memory_GB"]["anyOf"] == [{"type": "number", "exclusiveMinimum": 0}, {"type": "null"}]
    assert props["microbatch_size"] == {"deprecated": True,
                                        "description": "The paraplan 0.1 name of 'micro_batch_size'."}


def test_the_options_come_from_the_fields(capsys):
    parser = argparse.ArgumentParser(prog="x")
    add_options(parser, Outer, "o_", only=["name", "micro_batch_size", "schedule", "overlap", "memory_GB"])
    text = parser.format_help()
    assert "--micro-batch-size N" in text and "Samples per micro-batch. (default: 1)" in text
    assert "--memory-gb X" in text and "{gpipe,1f1b}" in text and "--overlap, --no-overlap" in text
    assert "--microbatch-size" not in text  # the 0.1 spelling works, unlisted
    args = parser.parse_args(["--name", "n", "--microbatch-size", "3", "--no-overlap"])
    assert "x: warning: --microbatch-size is deprecated, use --micro-batch-size" in capsys.readouterr().err
    values = given(Outer, args, "o_")
    assert values == {"name": "n", "micro_batch_size": "3", "overlap": False}
    assert load(Outer, values, Source.command_line()).micro_batch_size == 3
    with pytest.raises(ConfigError, match=r"^option --micro-batch-size: expected an integer >= 1, got 'none'$"):
        load(Outer, {"name": "n", "micro_batch_size": "none"}, Source.command_line())


OLD_CONFIG = """
plan: {mbs: 0, gbs: [32, 64], optimizer_factor: 4}
simulate: {experiments: [schedules]}
validate: {models: {mlp: {batch: 32, microbatches: 4}}}
profile:
  models:
    mlp: {model: mlp, batches: [8, 16], settings: {layers: 4}}
"""


def test_a_0_1_workflow_config_is_renamed_before_validation(repo_root, capsys, monkeypatch):
    from snakemake.utils import validate

    from paraplan.workflow_env import upgrade_config

    monkeypatch.chdir(repo_root)
    config = yaml.safe_load(OLD_CONFIG)
    upgrade_config(config)
    assert config["plan"] == {"min_micro_batch_size": 0, "global_batch_sizes": [32, 64], "model_state_factor": 4}
    assert config["simulate"] == {"studies": ["schedules"]}
    assert config["validate"]["models"]["mlp"] == {"global_batch_size": 32, "num_microbatches": 4}
    assert config["profile"]["models"]["mlp"] == {"model": "mlp", "profile_batch_sizes": [8, 16],
                                                  "settings": {"num_layers": 4}}
    err = capsys.readouterr().err
    assert "config plan: 'mbs' is deprecated, use 'min_micro_batch_size'" in err
    assert "config profile.models.mlp.settings: 'layers' is deprecated, use 'num_layers'" in err
    validate(copy.deepcopy(config), "workflow/schemas/config.schema.yaml")


def test_studies_are_found_by_name_and_in_the_0_1_folder(repo_root, tmp_path, monkeypatch, capsys):
    from paraplan.config_files import find_study

    assert find_study("simulate", "schedules").parts[-3:] == ("studies", "simulate", "schedules.yaml")
    assert find_study("plan", "dapple_resnet50").name == "dapple_resnet50.yaml"
    monkeypatch.chdir(repo_root)
    moved = find_study("simulate", "config/experiments/distir_fig3.yaml")
    assert moved == repo_root / "config/studies/simulate/distir_fig3.yaml" or moved.name == "distir_fig3.yaml"
    assert "config/experiments/distir_fig3.yaml' is deprecated" in capsys.readouterr().err
    monkeypatch.chdir(tmp_path)  # a user's own 0.1 study folder
    (tmp_path / "config/experiments").mkdir(parents=True)
    (tmp_path / "config/experiments/mine.yaml").write_text("name: mine\n")
    assert find_study("simulate", "mine") == tmp_path.joinpath("config/experiments/mine.yaml").relative_to(tmp_path)
    assert "is deprecated, use 'config/studies/simulate/'" in capsys.readouterr().err


def test_a_plan_study_given_to_simulate_says_which_stage_it_is_for(repo_root):
    from paraplan.studies.simulate import load_study

    with pytest.raises(InputFileError, match="key 'stage': expected one of simulate, got 'plan'"):
        load_study(repo_root / "config/studies/plan/dapple_resnet50.yaml")

"""The workflow config schema: the default validates; bad keys fail with their path."""

from __future__ import annotations

import copy

import pytest
import yaml
from snakemake.exceptions import WorkflowError
from snakemake.utils import validate


@pytest.fixture()
def schema(repo_root):
    return str(repo_root / "workflow/schemas/config.schema.yaml")


@pytest.fixture()
def default_config(repo_root):
    return yaml.safe_load((repo_root / "config/config.yaml").read_text())


def test_default_config_validates(schema, default_config):
    validate(copy.deepcopy(default_config), schema)


def test_defaults_fill_missing_keys(schema):
    config = {"bench": {}}
    validate(config, schema)
    assert config["bench"]["iters"] == 20
    assert config["bench"]["collectives"][0] == "all_reduce"
    assert config["mlflow"]["tracking_uri"] == ""


def test_unknown_key_fails_with_its_path(schema, default_config):
    config = copy.deepcopy(default_config)
    config["bench"]["iterations"] = 5
    with pytest.raises(WorkflowError) as err:
        validate(config, schema)
    text = str(err.value)
    assert "'iterations' was unexpected" in text and "['bench']" in text


def test_bad_value_fails_with_its_path(schema, default_config):
    config = copy.deepcopy(default_config)
    config["bench"]["world_sizes"] = [1]
    with pytest.raises(WorkflowError) as err:
        validate(config, schema)
    assert "['bench']['world_sizes'][0]" in str(err.value)


def test_every_key_has_a_description(repo_root):
    schema = yaml.safe_load((repo_root / "workflow/schemas/config.schema.yaml").read_text())

    def walk(node, path):
        for key, sub in node.get("properties", {}).items():
            assert "description" in sub, f"{path}.{key} has no description"
            assert "default" in sub or sub.get("type") == "object", f"{path}.{key} has no default"
            if sub.get("type") == "object":
                walk(sub, f"{path}.{key}")

    walk(schema, "config")

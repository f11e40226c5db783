"""The environment the Snakefile hands to every job."""

from __future__ import annotations

import os

import pytest

from paraplan import workflow_env
from paraplan.track import ENV_CONFIG_DIGEST, ENV_INVOCATION, config_digest


@pytest.fixture(autouse=True)
def _restore_environment(monkeypatch):
    """prepare_environment writes os.environ; monkeypatch restores these keys after each test."""
    for key in (ENV_INVOCATION, ENV_CONFIG_DIGEST, "MLFLOW_TRACKING_URI"):
        monkeypatch.setenv(key, "placeholder")
        monkeypatch.delenv(key)


def test_invocation_id_is_kept_when_inherited(monkeypatch):
    monkeypatch.setenv(ENV_INVOCATION, "from-parent")
    workflow_env.prepare_environment({"mlflow": {"tracking_uri": ""}})
    assert os.environ[ENV_INVOCATION] == "from-parent"


def test_fresh_invocation_id_and_digest(monkeypatch):
    monkeypatch.delenv(ENV_INVOCATION, raising=False)
    config = {"bench": {"iters": 3}, "mlflow": {"tracking_uri": ""}}
    workflow_env.prepare_environment(config)
    assert len(os.environ[ENV_INVOCATION]) == 32
    assert os.environ[ENV_CONFIG_DIGEST] == config_digest(config)
    assert config_digest(config) != config_digest({"bench": {"iters": 4}, "mlflow": {"tracking_uri": ""}})


def test_config_uri_used_only_without_environment(monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    workflow_env.prepare_environment({"mlflow": {"tracking_uri": "http://server:5000"}})
    assert os.environ["MLFLOW_TRACKING_URI"] == "http://server:5000"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///elsewhere.db")
    workflow_env.prepare_environment({"mlflow": {"tracking_uri": "http://server:5000"}})
    assert os.environ["MLFLOW_TRACKING_URI"] == "sqlite:///elsewhere.db"

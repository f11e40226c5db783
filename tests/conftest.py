"""Shared fixtures: the repository root, its data/ folder (published logs, profiles and
reference numbers) and a fresh MLflow store."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
DATA_DIR = REPO_ROOT / "data"


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The repository's data/ folder (data/README.md says where each file comes from)."""
    return DATA_DIR


@pytest.fixture()
def store(tmp_path, monkeypatch) -> str:
    """A SQLite MLflow store in a fresh working directory, with the job tags a
    Snakemake invocation would set."""
    from paraplan import track

    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv(track.ENV_INVOCATION, "inv-123")
    monkeypatch.setenv(track.ENV_CONFIG_DIGEST, "abcd")
    return uri

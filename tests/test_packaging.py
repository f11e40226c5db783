"""pyproject.toml and environment.yml declare the same dependencies."""

from __future__ import annotations

import tomllib

import yaml
from packaging.requirements import Requirement

CONDA_TO_PYPI = {"pytorch": "torch"}


def _pyproject_requirements(repo_root) -> dict[str, str]:
    data = tomllib.loads((repo_root / "pyproject.toml").read_text())
    reqs = [Requirement(r) for r in data["project"]["dependencies"]]
    return {r.name.lower(): str(r.specifier) for r in reqs}


def _conda_requirements(repo_root) -> dict[str, str]:
    env = yaml.safe_load((repo_root / "environment.yml").read_text())
    out = {}
    for dep in env["dependencies"]:
        if not isinstance(dep, str):  # the nested `pip:` list installs paraplan itself
            continue
        req = Requirement(dep.replace(" ", ""))
        name = CONDA_TO_PYPI.get(req.name.lower(), req.name.lower())
        if name in ("python", "pip"):
            continue
        out[name] = str(req.specifier)
    return out


def test_environment_yml_matches_pyproject(repo_root):
    assert _conda_requirements(repo_root) == _pyproject_requirements(repo_root)


def test_torch_range_admits_the_local_cpu_build(repo_root):
    from packaging.version import Version

    spec = Requirement(f"torch{_pyproject_requirements(repo_root)['torch']}").specifier
    assert Version("2.13.0") in spec


def test_mlflow_range_resolves_below_3_18(repo_root):
    from packaging.version import Version

    spec = Requirement(f"mlflow{_pyproject_requirements(repo_root)['mlflow']}").specifier
    assert Version("3.17.2") in spec and Version("3.18.0") not in spec

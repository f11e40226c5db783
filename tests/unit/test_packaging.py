"""pyproject.toml and environment.yml declare the same dependencies; the wheel carries
the default clusters and experiments and runs from outside the checkout."""

from __future__ import annotations

import importlib.metadata
import tomllib

import yaml
from packaging.requirements import Requirement

CONDA_TO_PYPI = {"pytorch": "torch"}


def _pyproject(repo_root) -> dict:
    return tomllib.loads((repo_root / "pyproject.toml").read_text())


def _extra_packages(package: str, extra: str) -> set[str]:
    """The packages a requirement's extra adds (conda has no extras, so environment.yml
    lists them by name), read from the installed distribution's metadata."""
    added = set()
    for text in importlib.metadata.requires(package) or []:
        req = Requirement(text)
        if req.marker is not None and req.marker.evaluate({"extra": extra}) and not req.marker.evaluate({"extra": ""}):
            added.add(req.name.lower())
    return added


def _pyproject_requirements(repo_root) -> dict[str, str]:
    """Dependencies plus the `measure` extra (the conda environment runs the whole
    workflow); an extra's packages enter with no version bound."""
    data = _pyproject(repo_root)
    reqs = [Requirement(r) for r in [*data["project"]["dependencies"],
                                     *data["project"]["optional-dependencies"]["measure"]]]
    out = {r.name.lower(): str(r.specifier) for r in reqs}
    for req in reqs:
        for extra in req.extras:
            out.update({name: "" for name in _extra_packages(req.name, extra)})
    return out


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
    conda = _conda_requirements(repo_root)
    assert "pygments" in conda  # snakemake --report needs it (snakemake's reports extra)
    assert conda == _pyproject_requirements(repo_root)


def test_torch_is_only_in_the_measure_extra(repo_root):
    data = _pyproject(repo_root)
    names = {Requirement(r).name for r in data["project"]["dependencies"]}
    assert "torch" not in names
    assert [Requirement(r).name for r in data["project"]["optional-dependencies"]["measure"]] == ["torch"]


def test_torch_range_admits_the_local_cpu_build(repo_root):
    from packaging.version import Version

    spec = Requirement(f"torch{_pyproject_requirements(repo_root)['torch']}").specifier
    assert Version("2.13.0") in spec


def test_mlflow_range_resolves_below_3_18(repo_root):
    from packaging.version import Version

    spec = Requirement(f"mlflow{_pyproject_requirements(repo_root)['mlflow']}").specifier
    assert Version("3.17.2") in spec and Version("3.18.0") not in spec


def test_conda_environment_installs_the_test_extra_with_hypothesis(repo_root):
    """environment.yml's pip section installs this package with its `test` extra, so
    conda users get the same test tools (hypothesis for the property-based suite) as
    pip users."""
    data = tomllib.loads((repo_root / "pyproject.toml").read_text())
    test_extra = {Requirement(r).name for r in data["project"]["optional-dependencies"]["test"]}
    assert {"pytest", "ruff", "hypothesis"} <= test_extra
    env = yaml.safe_load((repo_root / "environment.yml").read_text())
    (pip_section,) = [dep["pip"] for dep in env["dependencies"] if isinstance(dep, dict)]
    extras = [Requirement(f"paraplan{line.split('.', 1)[1]}").extras for line in pip_section if "-e ." in line]
    assert extras and "test" in extras[0], pip_section


def test_sdist_manifest_carries_what_setup_py_copies_into_the_wheel(repo_root):
    """setup.py refuses to build a wheel without config/clusters, config/studies/<stage>
    and config/calibrations, so a wheel built from the source distribution needs them."""
    import ast
    from fnmatch import fnmatch

    setup_tree = ast.parse((repo_root / "setup.py").read_text())
    kinds = next(ast.literal_eval(node.value) for node in ast.walk(setup_tree)
                 if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "_KINDS")
    patterns = [line.split()[1] for line in (repo_root / "MANIFEST.in").read_text().splitlines()
                if line.startswith("include ")]
    for kind, pattern in kinds.items():
        files = sorted((repo_root / "config" / kind).glob(pattern))
        assert files, kind
        for path in files:
            name = path.relative_to(repo_root).as_posix()
            assert any(fnmatch(name, p) for p in patterns), f"MANIFEST.in leaves out {name}"

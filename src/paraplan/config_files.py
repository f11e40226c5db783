"""Where named data files live: `config/clusters/<name>.yaml`,
`config/studies/<stage>/<name>.yaml` (stage `simulate` or `plan`) and
`config/calibrations/<name>.json` and `config/kernels/<device>.json`.

A name is looked up, in order, in the working directory's `config/<kind>/`, in the
checkout paraplan was installed from (`pip install -e .`), and in the copies the
wheel carries as package data (`paraplan/_config/<kind>/`, put there by setup.py), so
`paraplan plan --cluster dgx-a100` and `paraplan simulate --study schedules` work
from any directory with any kind of install. A path (ending in .yaml/.yml) is used
as given.

paraplan 0.1 kept both kinds of study in `config/experiments/`; a name or path there
still resolves (to the file itself when it exists, else to the study of that name)
with a deprecation warning until paraplan 0.2.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Literal

from paraplan.core.errors import ConfigError
from paraplan.core.names import name_problem
from paraplan.typed import warn_renamed

Kind = Literal["clusters", "studies/simulate", "studies/plan", "calibrations", "kernels"]
StudyStage = Literal["simulate", "plan"]
SUFFIXES: dict[str, tuple[str, ...]] = {
    "clusters": (".yaml", ".yml"), "studies/simulate": (".yaml", ".yml"), "studies/plan": (".yaml", ".yml"),
    "calibrations": (".json",), "kernels": (".json",),
}
OLD_STUDY_DIR = Path("config/experiments")

_CHECKOUT_CONFIG = Path(__file__).resolve().parents[2] / "config"


def _packaged(kind: Kind) -> Path | None:
    root = resources.files("paraplan") / "_config" / kind
    path = Path(str(root))
    return path if path.is_dir() else None


def search_dirs(kind: Kind, first: Path | None = None) -> list[Path]:
    """The folders a name of this kind is looked up in, first match wins: `first`
    alone when given, else the working directory's, the checkout's and the wheel's."""
    if first is not None:
        return [first]
    candidates = [Path("config") / kind, _CHECKOUT_CONFIG / kind]
    packaged = _packaged(kind)
    if packaged is not None:
        candidates.append(packaged)
    dirs: list[Path] = []
    for directory in candidates:
        if directory.is_dir() and all(directory.resolve() != d.resolve() for d in dirs):
            dirs.append(directory)
    return dirs or candidates[:1]


def is_path(name_or_path: str | Path, kind: Kind = "clusters") -> bool:
    return Path(name_or_path).suffix in SUFFIXES[kind]


_KEYS: dict[str, str] = {"clusters": "cluster", "studies/simulate": "study", "studies/plan": "study",
                         "calibrations": "calibration"}


def find(kind: Kind, name_or_path: str | Path, first: Path | None = None) -> Path:
    """The file for a name (or the path itself); a name found nowhere gives the path
    it would have in the first folder, so the caller's error names it. A name that
    could not be a file name (`paraplan.core.names`) is a `ConfigError`."""
    if is_path(name_or_path, kind):
        return Path(name_or_path)
    problem = name_problem(str(name_or_path))
    if problem:
        raise ConfigError(_KEYS[kind], f"{problem}; or a path ending in {' or '.join(SUFFIXES[kind])}")
    suffix = SUFFIXES[kind][0]
    dirs = search_dirs(kind, first)
    for directory in dirs:
        path = directory / f"{name_or_path}{suffix}"
        if path.is_file():
            return path
    return dirs[0] / f"{name_or_path}{suffix}"


def find_study(stage: StudyStage, name_or_path: str | Path) -> Path:
    """A study of `stage` by name or path, 0.1's `config/experiments/` included (see
    the module doc)."""
    kind: Kind = "studies/simulate" if stage == "simulate" else "studies/plan"
    new_home = f"config/studies/{stage}/"
    if is_path(name_or_path, kind):
        path = Path(name_or_path)
        if path.is_file():
            if path.parent.name == OLD_STUDY_DIR.name and path.parent.parent.name == "config":
                warn_renamed(str(path), str(OLD_STUDY_DIR) + "/", new_home)
            return path
        if path.parent.name == OLD_STUDY_DIR.name:
            moved = find(kind, path.stem)
            if moved.is_file():
                warn_renamed(str(path), str(path), str(moved))
                return moved
        return path
    path = find(kind, name_or_path)
    if path.is_file():
        return path
    for directory in (OLD_STUDY_DIR, _CHECKOUT_CONFIG / "experiments"):
        old = directory / f"{name_or_path}.yaml"
        if old.is_file():
            warn_renamed(str(old), str(OLD_STUDY_DIR) + "/", new_home)
            return old
    return path


def known_names(kind: Kind, first: Path | None = None) -> list[str]:
    suffix = SUFFIXES[kind][0]
    return sorted({p.stem for d in search_dirs(kind, first) if d.is_dir() for p in d.glob(f"*{suffix}")})

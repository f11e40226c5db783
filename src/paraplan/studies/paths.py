"""Where the files a study names are read from, whatever the working directory.

A relative path in a study file (a planning study's `profile`, a cluster given as a YAML
path, a simulation study's `published.file`) is relative to the root the study came from:
the checkout holding `config/studies/<stage>/<name>.yaml` (or 0.1's
`config/experiments/<name>.yaml`), the installed package holding the wheel's
`_config/studies/<stage>/` copy, or, for a study file kept anywhere else, the folder of
the study file itself. So `cd /tmp && paraplan plan --study dapple_resnet50` reads the
checkout's `data/pipedream-profiles/resnet50-pbs-32.txt`. An absolute path is used as
given; a path given as a command-line option stays relative to the working directory.
"""

from __future__ import annotations

from pathlib import Path

from paraplan.core.errors import ParaplanError
from paraplan.typed import Source

_CONFIG_DIRS = ("config", "_config")
_STUDY_DIRS = (("studies", "simulate"), ("studies", "plan"), ("experiments",))


def study_root(study_file: str | Path) -> Path:
    """The folder a study's relative paths are read from (see the module doc)."""
    folder = Path(study_file).resolve().parent
    for tail in _STUDY_DIRS:
        inside = folder.parts[-len(tail):] == tail
        config = folder.parents[len(tail) - 1] if inside and len(folder.parents) >= len(tail) else None
        if config is not None and config.name in _CONFIG_DIRS:
            return config.parent
    return folder


def resolve(study_file: str | Path, named: str | Path) -> Path:
    """A path the study names, as read: absolute as given, else under `study_root`."""
    path = Path(named).expanduser()
    return path if path.is_absolute() else study_root(study_file) / path


def study_file_path(study_file: str | Path, key: tuple[str | int, ...], named: str | Path) -> Path:
    """The file the study's `key` names (`named`, see `resolve`); when there is no such file,
    an error naming the study, the key and the path tried (`missing`)."""
    tried = resolve(study_file, named)
    if not tried.is_file():
        raise missing(study_file, key, named)
    return tried


def missing(study_file: str | Path, key: tuple[str | int, ...], named: str | Path) -> ParaplanError:
    """`<study>: key '<key>': no file <path tried> ('<named>' is read relative to <root>)`."""
    tried = resolve(study_file, named)
    relative = "" if Path(named).expanduser().is_absolute() else \
        f" ('{named}' is read relative to {study_root(study_file)}, where the study comes from)"
    return Source.file(study_file).error(key, f"no file {tried}{relative}")

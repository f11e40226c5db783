"""Planning studies (`config/studies/plan/<name>.yaml`): a named `PlanRequest`, e.g.
DAPPLE's ResNet-50 sweep on 2x8 and 16x1 V100s. Every key is a field of
`paraplan.plan.hybrid.request.PlanRequest` (the options of `paraplan plan`, in file form) or
one of the three below. The files it names (`profile`, a `cluster` given as a YAML path) are
read from the root the study came from (`paraplan.studies.paths`), whatever the working
directory."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from paraplan.config_files import is_path
from paraplan.core.names import name_problem
from paraplan.plan.hybrid.request import PlanRequest
from paraplan.studies.paths import study_file_path
from paraplan.typed import load_yaml


@dataclass(frozen=True, kw_only=True)
class PlanStudy(PlanRequest):
    """A named planning study."""

    name: str
    """The study's name (its CSVs are <name>__<shape>.csv)."""
    description: str = ""
    """What the study reproduces."""
    stage: Literal["plan"] = field(default="plan", metadata={"checked_first": True})
    """The stage that runs it (config/studies/<stage>/)."""

    def __post_init__(self) -> None:
        problem = name_problem(self.name)
        if problem:  # the study's CSVs and figures are named after it
            raise ValueError(f"key 'name': {problem}")
        if self.profile is None:
            raise ValueError("a planning study needs a profile")
        if self.global_batch_sizes is None:
            raise ValueError("a planning study needs global_batch_sizes")


def load_plan_study(path: str | Path) -> PlanStudy:
    """A planning study file (`paraplan.config_files.find_study` finds one by name), the
    files it names read from its root (`with_study_paths`)."""
    return with_study_paths(load_yaml(PlanStudy, path, "a planning study (config/studies/plan/*.yaml)"), path)


def with_study_paths(study: PlanStudy, study_file: str | Path, given: frozenset[str] = frozenset()) -> PlanStudy:
    """`study` (read from `study_file`) with its relative `profile` and cluster YAML path
    read from the study's root (`paraplan.studies.paths`); a named file that is missing is
    an error naming the study and the path tried. Keys in `given` came from the command
    line (relative to the working directory) and stay as typed."""
    changes: dict[str, object] = {}
    if study.profile is not None and "profile" not in given:
        changes["profile"] = study_file_path(study_file, ("profile",), study.profile)
    if is_path(study.cluster, "clusters") and "cluster" not in given:
        changes["cluster"] = str(study_file_path(study_file, ("cluster",), study.cluster))
    return replace(study, **changes) if changes else study  # type: ignore[arg-type]

"""Planning studies (`config/studies/plan/<name>.yaml`): a named `PlanRequest`, e.g.
DAPPLE's ResNet-50 sweep on 2x8 and 16x1 V100s. Every key is a field of
`paraplan.plan.hybrid.request.PlanRequest` (the options of `paraplan plan`, in file form) or
one of the three below; the profile path is relative to the working directory."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from paraplan.core.names import name_problem
from paraplan.plan.hybrid.request import PlanRequest
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
    """A planning study file (`paraplan.config_files.find_study` finds one by name)."""
    return load_yaml(PlanStudy, path, "a planning study (config/studies/plan/*.yaml)")

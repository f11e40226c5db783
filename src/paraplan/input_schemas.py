"""The JSON schemas of paraplan's input files, written from their typed dataclasses
into workflow/schemas/ (`python -m paraplan.input_schemas`); a test keeps the files
equal to what the dataclasses say, so the schema, the loader and the command line
cannot drift apart.

- `cluster.schema.yaml`: config/clusters/<name>.yaml (`paraplan.clusters.ClusterFile`)
- `study_simulate.schema.yaml`: config/studies/simulate/<name>.yaml
- `study_plan.schema.yaml`: config/studies/plan/<name>.yaml (the options of `paraplan plan`)
- `profile_entry.schema.yaml`: an entry of the workflow config's `profile.models`
  (referenced by config.schema.yaml)
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

HEADER = "# Written by `python -m paraplan.input_schemas` from {source}; do not edit.\n"


def _cluster() -> dict[str, Any]:
    from paraplan.clusters import ClusterFile
    from paraplan.typed import json_schema

    return json_schema(ClusterFile, "paraplan cluster file (config/clusters/<name>.yaml)")


def _study_simulate() -> dict[str, Any]:
    from paraplan.studies.simulate_study import SimulateStudy
    from paraplan.typed import json_schema

    return json_schema(SimulateStudy, "paraplan simulation study (config/studies/simulate/<name>.yaml)")


def _study_plan() -> dict[str, Any]:
    from paraplan.studies.plan import PlanStudy
    from paraplan.typed import json_schema

    return json_schema(PlanStudy, "paraplan planning study (config/studies/plan/<name>.yaml)")


def _profile_entry() -> dict[str, Any]:
    from paraplan.profile.specs import profile_entry_schema
    from paraplan.typed.schema import DRAFT

    return {"$schema": DRAFT, "title": "paraplan workflow config: an entry of profile.models",
            **profile_entry_schema()}


SCHEMAS: dict[str, tuple[str, Callable[[], dict[str, Any]]]] = {
    "cluster.schema.yaml": ("paraplan.clusters.ClusterFile", _cluster),
    "study_simulate.schema.yaml": ("paraplan.studies.simulate_study.SimulateStudy", _study_simulate),
    "study_plan.schema.yaml": ("paraplan.studies.plan.PlanStudy", _study_plan),
    "profile_entry.schema.yaml": ("paraplan.profile.specs.ProfileEntry and the model specs", _profile_entry),
}


def rendered() -> dict[str, str]:
    """Each schema file's text."""
    return {
        name: HEADER.format(source=source) + yaml.safe_dump(build(), sort_keys=False, width=100, allow_unicode=True)
        for name, (source, build) in SCHEMAS.items()
    }


def main(argv: list[str] | None = None) -> int:
    folder = Path((argv if argv is not None else sys.argv[1:] or ["workflow/schemas"])[0])
    for name, text in rendered().items():
        (folder / name).write_text(text)
        print(f"wrote {folder / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

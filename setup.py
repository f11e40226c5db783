"""Build hook: the wheel carries the default cluster, study and calibration files.

config/clusters/*.yaml, config/studies/<stage>/*.yaml, config/calibrations/*.json and config/kernels/*.json
stay the one copy in the repository (Snakemake rules and users edit them there); building the package copies
them into paraplan/_config/, where paraplan.config_files finds them when paraplan
runs outside a checkout. Everything else is declared in pyproject.toml.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

_HERE = Path(__file__).resolve().parent
_KINDS = {"clusters": "*.yaml", "studies/simulate": "*.yaml", "studies/plan": "*.yaml", "calibrations": "*.json",
          "kernels": "*.json"}


class BuildPyWithConfig(build_py):
    def run(self) -> None:
        super().run()
        for kind, pattern in _KINDS.items():
            source = _HERE / "config" / kind
            if not source.is_dir():
                raise SystemExit(f"setup.py: {source} is missing; the wheel must carry the default {kind}")
            target = Path(self.build_lib) / "paraplan" / "_config" / kind
            target.mkdir(parents=True, exist_ok=True)
            for path in sorted(source.glob(pattern)):
                shutil.copyfile(path, target / path.name)


setup(cmdclass={"build_py": BuildPyWithConfig})

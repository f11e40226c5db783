"""Typed inputs: every file kind a user writes (cluster, study, model settings, plan
request) is a frozen dataclass tree whose fields carry their docstrings and bounds.
From it come, in one place each:

- the loader and its errors (`load`, `load_yaml`: file, key, value, what was expected;
  0.1 key names accepted with a deprecation warning);
- the JSON schema (`json_schema`, written to workflow/schemas/);
- the command-line options (`add_options`, `given`).
"""

from paraplan.typed.constraints import (
    Above,
    AtLeast,
    AtMost,
    Count,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
)
from paraplan.typed.convert import load, upgrade_keys
from paraplan.typed.files import load_yaml, read_yaml
from paraplan.typed.options import DeprecatedOption, add_options, deprecated_option, given
from paraplan.typed.schema import json_schema
from paraplan.typed.source import Source, option_name, say_deprecated, warn_renamed
from paraplan.typed.types import field_docs

__all__ = [
    "Above",
    "AtLeast",
    "AtMost",
    "Count",
    "DeprecatedOption",
    "NonNegativeFloat",
    "NonNegativeInt",
    "PositiveFloat",
    "Source",
    "add_options",
    "deprecated_option",
    "field_docs",
    "given",
    "json_schema",
    "load",
    "load_yaml",
    "option_name",
    "read_yaml",
    "say_deprecated",
    "upgrade_keys",
    "warn_renamed",
]

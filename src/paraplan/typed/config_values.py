"""The workflow config's values checked against workflow/schemas/config.schema.yaml, one
line per wrong value, before Snakemake's own schema check.

Snakemake stops at the first wrong value with a 10-to-20-line message that quotes the
schema around it and does not say which config file held it. This check validates the
same way (JSON Schema 2020-12, defaults filled in as Snakemake fills them, `$ref`s to
the sibling schema files), then says each problem in one line with the key's dotted
path and the file that gave it: `config key 'bench.iters' in my.yaml: 'abc' is not of
type 'integer'`. A config Snakemake accepts gives no line here.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlparse
from urllib.request import url2pathname

import yaml

from paraplan.typed.config_check import _given_in, dotted, key_named

_SHOWN = 200  # a message quotes the value; a whole section would drown the line


def _with_defaults(validator_class: Any) -> Any:
    """`validator_class` that fills each property's `default` before checking it (as
    `snakemake.utils.validate(set_default=True)` does, so that the same configs pass)."""
    from jsonschema import validators  # type: ignore[import-untyped]

    check_properties = validator_class.VALIDATORS["properties"]

    def properties(validator: Any, props: Mapping, instance: Any, schema: Mapping) -> Iterator[Any]:
        if isinstance(instance, dict):
            for key, sub in props.items():
                if isinstance(sub, Mapping) and "default" in sub:
                    instance.setdefault(key, copy.deepcopy(sub["default"]))
        yield from check_properties(validator, props, instance, schema)

    return validators.extend(validator_class, {"properties": properties})


def config_value_problems(config: Mapping[str, Any], schema_path: Path,
                          files: Sequence[tuple[str, object]] = ()) -> list[str]:
    """One line per value of `config` (the merged workflow config, not changed) that
    the schema at `schema_path` refuses; `files`: (name, data) of the config files
    merged into it, the one that wins first (a value is said to be in the first that
    holds its key, else in --config)."""
    from jsonschema import Draft202012Validator
    from referencing import Registry, Resource

    def load(path: Path) -> Any:
        return yaml.safe_load(path.read_text())

    schema = load(schema_path)
    schema["$id"] = schema_path.resolve().as_uri()
    registry: Registry = Registry(  # type: ignore[call-arg]
        retrieve=lambda uri: Resource.from_contents(load(Path(url2pathname(urlparse(uri).path)))))
    validator = _with_defaults(Draft202012Validator)(schema, registry=registry)
    problems = []
    for error in sorted(validator.iter_errors(copy.deepcopy(dict(config))), key=lambda e: str(list(e.absolute_path))):
        parts = tuple(error.absolute_path)
        origin = _given_in(parts, files) if files else ""
        message = " ".join(error.message.split())
        if len(message) > _SHOWN:
            message = message[:_SHOWN] + "..."
        problems.append(f"{key_named(dotted(parts) or '<top>', origin)}: {message}")
    return problems

"""The workflow config made ready for Snakemake's schema validation
(workflow/schemas/config.schema.yaml):

- 0.1 key names renamed: wherever the schema declares a key whose glossary term has an
  old name written in the config, the key is renamed (its value converted where the
  concept changed form) and a deprecation line says so;
- text read back as what the schema expects: Snakemake 9 reads a nested `--config
  bench='{iters: 50, world_sizes: [2]}'` with YAML's base loader, so every value in it
  arrives as text ('50', ['2']); where the schema expects a number, a boolean or null
  and gets text, the text is read as YAML (a string the schema allows stays text).

Snakemake merges a user's `--configfile` over config/config.yaml, which uses the new
names only; so an old name always comes from the user, and its value wins over the
default's new key."""

from __future__ import annotations

from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

import yaml

from paraplan.core.glossary import TERMS_BY_NAME
from paraplan.typed.source import warn_renamed


def resolve_ref(schema: dict[str, Any], base: Path) -> tuple[dict[str, Any], Path]:
    """Follow a `$ref` to a sibling schema file (the only kind the workflow uses)."""
    ref = schema.get("$ref")
    if not isinstance(ref, str):
        return schema, base
    path = base / ref
    return yaml.safe_load(path.read_text()), path.parent


def upgrade_config_keys(data: object, schema: dict[str, Any], base: Path, where: str = "") -> None:
    """Rename 0.1 keys of `data` in place (see the module doc); `base`: the folder
    `$ref`s are relative to."""
    schema, base = resolve_ref(schema, base)
    if not isinstance(data, MutableMapping):
        return
    properties = dict(schema.get("properties", {}))
    for case in schema.get("allOf", []):  # `if` a key has a value `then` these properties
        test = case.get("if", {}).get("properties", {})
        if test and all(data.get(k) == v.get("const") for k, v in test.items()):
            properties.update(case.get("then", {}).get("properties", {}))
    for key in list(properties):
        term = TERMS_BY_NAME.get(key)
        for old in term.old_names if term else ():
            declared = properties.get(old)
            if old in data and (declared is None or declared.get("deprecated")):
                warn_renamed(f"config {where or '<top>'}", old, key)
                value = data.pop(old)
                convert = term.convert.get(old) if term else None
                data[key] = convert(value) if convert else value
    for key, value in data.items():
        sub = properties.get(key)
        inner = f"{where}.{key}" if where else str(key)
        if isinstance(sub, dict):
            upgrade_config_keys(value, sub, base, inner)
        elif isinstance(schema.get("additionalProperties"), dict) and isinstance(value, MutableMapping):
            upgrade_config_keys(value, schema["additionalProperties"], base, inner)


_NON_TEXT = {"integer", "number", "boolean", "null"}


def _types(schema: dict[str, Any]) -> set[str]:
    declared = schema.get("type")
    found = set(declared) if isinstance(declared, list) else {declared} if declared else set()
    for option in schema.get("anyOf", []) + schema.get("oneOf", []):
        found |= _types(option)
    if "enum" in schema:
        found |= {"string" if isinstance(v, str) else "number" for v in schema["enum"]}
    return found


def coerce_config_text(data: object, schema: dict[str, Any], base: Path) -> object:
    """`data` with text values read as YAML where `schema` expects no text (see the
    module doc); mappings and lists are updated in place and returned."""
    schema, base = resolve_ref(schema, base)
    types = _types(schema)
    if isinstance(data, str):
        if types and "string" not in types and types & _NON_TEXT:
            try:
                parsed = yaml.safe_load(data)
            except yaml.YAMLError:
                return data  # the schema names the key and what it expected
            return parsed if not isinstance(parsed, dict | list) else data
        return data
    if isinstance(data, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(data):
            data[i] = coerce_config_text(item, schema["items"], base)
    elif isinstance(data, MutableMapping):
        properties = dict(schema.get("properties", {}))
        for case in schema.get("allOf", []):
            properties.update(case.get("then", {}).get("properties", {}))
        extra = schema.get("additionalProperties")
        for key, value in data.items():
            sub = properties.get(key, extra if isinstance(extra, dict) else None)
            if isinstance(sub, dict):
                data[key] = coerce_config_text(value, sub, base)
    return data

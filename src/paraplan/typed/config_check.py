"""The workflow config's keys and names, checked before Snakemake's schema validation.

Snakemake's own check of config/config.yaml against workflow/schemas/config.schema.yaml
prints the whole schema around a misspelled key (140 lines for a nested key, 1,297 for
one at the top). This walk runs first and says the same in one line per mistake:

- a key the schema does not declare, with its path and the nearest declared key:
  `unknown key 'bench.itres' in config.yaml; did you mean 'bench.iters'?`;
- a name that becomes a file or folder name (an entry of `predict.tables`,
  `plan.llm`, ..., or a value such as `cluster`) that breaks the rule of
  `paraplan.core.names` (where the schema carries its pattern).

It also says a value outside the schema's `enum`, `minimum` or `minItems`; anything else
the schema refuses (a wrong type, a maximum) `paraplan.typed.config_values` says after
it, one line per value too.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from paraplan.core.names import NAME_PATTERN, name_problem
from paraplan.typed.config_keys import resolve_ref


def _properties(schema: Mapping[str, Any], data: Mapping) -> dict[str, Any]:
    """The keys `schema` declares for `data`, with those of every `allOf` case whose
    `if` matches (profile entries declare a model's settings this way), merged key by key."""
    properties = dict(schema.get("properties", {}))
    for case in schema.get("allOf", []):
        test = case.get("if", {}).get("properties", {})
        if test and all(data.get(k) == v.get("const") for k, v in test.items()):
            for key, sub in case.get("then", {}).get("properties", {}).items():
                properties[key] = {**properties.get(key, {}), **sub}
    return properties


def _path(where: str, key: object) -> str:
    return f"{where}.{key}" if where else str(key)


_MISSING = object()


def _held(data: object, parts: Sequence[object]) -> Any:
    """The value at the key path `parts` of `data` (mappings and lists), or `_MISSING`."""
    node: Any = data
    for part in parts:
        inside = part in node if isinstance(node, Mapping) else (
            isinstance(node, list) and isinstance(part, int) and part < len(node))
        if not inside:
            return _MISSING
        node = node[part]
    return node


def _given_in(parts: tuple[object, ...], files: Sequence[tuple[str, object]]) -> str:
    """The name of the first file whose data holds the key path `parts`."""
    return next((name for name, data in files if _held(data, parts) is not _MISSING), "--config")


def _unknown(key: object, where: str, known: Sequence[str], origin: str) -> str:
    path = _path(where, key)
    near = difflib.get_close_matches(str(key), known, n=1, cutoff=0.6)
    hint = f"did you mean '{_path(where, near[0])}'?" if near else \
        f"expected one of {', '.join(_path(where, k) for k in known)}"
    return f"unknown key '{path}' in {origin}; {hint}"


def _name(value: object, where: str, parts: tuple[object, ...], files: Sequence[tuple[str, object]]) -> str | None:
    problem = name_problem(value)
    return f"{key_named(where, _given_in(parts, files) if files else '')}: {problem}" if problem else None


def _value(data: object, schema: Mapping[str, Any]) -> str | None:
    """What is wrong with `data` under the schema's `enum`, `minimum` and `minItems`, which
    Snakemake's schema check would report with the whole schema around them."""
    if "enum" in schema and isinstance(data, (str, int, float)) and data not in schema["enum"]:
        return f"{data!r} is not a choice; expected one of {', '.join(str(c) for c in schema['enum'])}"
    number = isinstance(data, (int, float)) and not isinstance(data, bool)
    if "minimum" in schema and number and data < schema["minimum"]:
        return f"{data} is below {schema['minimum']}; expected a number >= {schema['minimum']}"
    if "minItems" in schema and isinstance(data, list) and len(data) < schema["minItems"]:
        return f"{data} has {len(data)} items; expected at least {schema['minItems']}"
    return None


def dotted(parts: Sequence[object]) -> str:
    """A key path as the messages write it: `plan.llm.x.schedules[1]`."""
    where = ""
    for part in parts:
        where += f"[{part}]" if isinstance(part, int) else (f".{part}" if where else str(part))
    return where


def key_named(where: str, origin: str = "") -> str:
    """`config key 'bench.min_bytes'`, and where it was given when known: `in my.yaml`
    (a config file's name) or `in --config` (Snakemake's command line)."""
    return f"config key '{where}'" + (f" in {origin}" if origin else "")


def given_in(dotted: str, config: Mapping, files: Sequence[tuple[str, object]]) -> str:
    """Where the value of the key `dotted` (`plan.llm.ok.cluster`, `fit.logs[1].path`)
    of the merged `config` was given: the first of `files` (the one that wins first)
    that holds the key, when it holds that value; else `--config`, which wins over every
    file. Entry names may hold dots: each step takes the longest key that fits."""
    parts: list[object] = []
    node: Any = config
    rest = dotted
    while rest:
        if rest.startswith("["):
            index, _, rest = rest[1:].partition("]")
            parts.append(int(index))
            node = node[int(index)] if isinstance(node, list) and int(index) < len(node) else None
        else:
            keys = [str(k) for k in node] if isinstance(node, Mapping) else []
            fits = [k for k in keys if rest == k or rest.startswith((k + ".", k + "["))]
            key = max(fits, key=len) if fits else rest.split(".")[0].split("[")[0]
            parts.append(key)
            node = node.get(key) if isinstance(node, Mapping) else None
            rest = rest[len(key):]
        rest = rest.removeprefix(".")
    for name, data in files:
        held = _held(data, parts)
        if held is not _MISSING:
            return name if held == node else "--config"
    return "--config"


def config_key_problems(data: object, schema: Mapping[str, Any], base: Path,
                        files: Sequence[tuple[str, object]] = (), parts: tuple[object, ...] = ()) -> list[str]:
    """One line per unknown key or unusable name in `data` (the merged workflow config)
    under `schema`; `base`: the folder `$ref`s are relative to; `files`: (name, data) of
    the config files merged into `data`, the one that wins first (an unknown key is
    said to be in the first that holds it, else in --config); `parts`: the key path of
    `data` (for the recursion)."""
    schema, base = resolve_ref(dict(schema), base)
    where = dotted(parts)
    problems: list[str] = []
    if schema.get("pattern") == NAME_PATTERN and isinstance(data, str) and (
            problem := _name(data, where, parts, files)):
        return [problem]
    if (problem := _value(data, schema)) is not None:
        return [f"{key_named(where, _given_in(parts, files) if files else '')}: {problem}"]
    for option in schema.get("anyOf", []):  # e.g. an object or null: check against the object
        if isinstance(data, Mapping) and option.get("type") == "object":
            return config_key_problems(data, option, base, files, parts)
    if isinstance(data, list) and isinstance(schema.get("items"), Mapping):
        for i, item in enumerate(data):
            problems += config_key_problems(item, schema["items"], base, files, (*parts, i))
        return problems
    if not isinstance(data, Mapping):
        return problems
    properties = _properties(schema, data)
    names = schema.get("propertyNames", {}).get("pattern") == NAME_PATTERN
    extra = schema.get("additionalProperties")
    for key, value in data.items():
        if key in properties:
            sub = properties[key]
        elif extra is False:
            problems.append(_unknown(key, where, list(properties), _given_in((*parts, key), files)))
            continue
        elif isinstance(extra, Mapping):
            if names and (problem := _name(key, where, (*parts, key), files)):
                problems.append(problem)
                continue
            sub = extra
        else:
            continue
        if isinstance(sub, Mapping) and not sub.get("deprecated"):
            problems += config_key_problems(value, sub, base, files, (*parts, key))
    return problems

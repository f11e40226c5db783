"""Profile files: `<stem>.csv` (one row per layer) and `<stem>.meta.json` beside it.

CSV columns (docs/design.md): `layer, name, fwd_s, bwd_s, activation_bytes, param_bytes`,
optionally `fwd_fixed_s, bwd_fixed_s, flops`; values at the meta's `batch_size`.
Floats are written with `repr`, so a profile read back is bit-for-bit the one written.
Reading checks every value against `LAYER_RULES` (finite, >= 0, below bounds no layer
reaches) and the meta's `batch_size` against `BATCH_SIZE_RULE`; the PipeDream importer
uses the same rules.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from paraplan.core import InputFileError, LayerProfile, ModelProfile
from paraplan.core.names import formula_problem
from paraplan.files import write_json, write_text
from paraplan.inputs import NumberRule, parse_number, read_csv_table, read_json_object, read_text

REQUIRED_COLUMNS = ("layer", "name", "fwd_s", "bwd_s", "activation_bytes", "param_bytes")
OPTIONAL_COLUMNS = ("fwd_fixed_s", "bwd_fixed_s", "flops")
_NUMERIC = ("fwd_s", "bwd_s", "activation_bytes", "param_bytes", "fwd_fixed_s", "bwd_fixed_s", "flops")

# Bounds no layer of any model reaches; beyond them a value is a unit mistake, and the
# simulator's sums over layers, micro-batches and steps would leave floating point.
MAX_LAYER_TIME_S = 1e5  # 28 hours for one layer's pass
MAX_LAYER_BYTES = 2.0**60
_LAYER_TIME = NumberRule("a time in seconds", 0, MAX_LAYER_TIME_S, why="above 1e5 s (28 h) for one layer; wrong unit?")
_LAYER_BYTES = NumberRule("a size in bytes", 0, MAX_LAYER_BYTES, why="above 2^60 bytes (1 EiB)")
LAYER_RULES: dict[str, NumberRule] = {
    "fwd_s": _LAYER_TIME,
    "bwd_s": _LAYER_TIME,
    "fwd_fixed_s": _LAYER_TIME,
    "bwd_fixed_s": _LAYER_TIME,
    "activation_bytes": _LAYER_BYTES,
    "param_bytes": _LAYER_BYTES,
    "flops": NumberRule("floating-point operations", 0, 1e24, why="above 1e24 for one layer's forward pass"),
}
BATCH_SIZE_RULE = NumberRule("a batch size in samples", 1, 2**24, integer=True)
MAX_NAME_CHARS = 4096  # a layer's name or description (PyTorch's longest reprs are a few hundred)


def check_layer_name(path: Path, line: int, field: str, name: str) -> str:
    """`name` if it is at most `MAX_NAME_CHARS` long (what the CSV reader will take back)
    and starts no spreadsheet formula (it is written into profile CSVs)."""
    if len(name) > MAX_NAME_CHARS:
        raise InputFileError(
            path, f"expected a layer name of at most {MAX_NAME_CHARS} characters, got {len(name)}", line,
            field=field,
        )
    formula = formula_problem(name)
    if formula:
        raise InputFileError(path, formula, line, field=field)
    return name


def meta_path(csv_path: str | Path) -> Path:
    """`results/profiles/mlp.csv` -> `results/profiles/mlp.meta.json`."""
    path = Path(csv_path)
    return path.with_name(f"{path.stem}.meta.json")


def _fmt(value: float) -> str:
    """Shortest text that reads back as the same float (integers without '.0')."""
    value = float(value)
    if value.is_integer() and abs(value) < 2**53:
        return str(int(value))
    return repr(value)


def profile_to_csv_text(profile: ModelProfile) -> str:
    """The CSV text of `profile`; optional columns only where they carry information."""
    layers = profile.layers
    columns = list(REQUIRED_COLUMNS)
    if any(la.fwd_fixed_s or la.bwd_fixed_s for la in layers):
        columns += ["fwd_fixed_s", "bwd_fixed_s"]
    if any(la.flops is not None for la in layers):
        columns.append("flops")
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(columns)
    for index, la in enumerate(layers):
        row = []
        for col in columns:
            if col == "layer":
                row.append(str(index))
            elif col == "name":
                row.append(la.name)
            else:
                value = getattr(la, col)
                row.append("" if value is None else _fmt(value))
        writer.writerow(row)
    return out.getvalue()


def write_profile(profile: ModelProfile, csv_path: str | Path) -> tuple[Path, Path]:
    """Write the CSV and its meta JSON atomically; returns both paths.

    The meta holds `name` (the profile's), `model` (the model it profiles; the name when
    `profile.meta` has none), `batch_size`, `num_layers` and everything else in
    `profile.meta` (device, dtype, threads, method, repeats, model_settings, ...).
    """
    csv_path = Path(csv_path)
    meta = {"name": profile.name, "model": profile.meta.get("model", profile.name),
            "batch_size": profile.batch_size, "num_layers": profile.num_layers}
    meta.update({k: v for k, v in profile.meta.items() if k not in meta})
    write_text(csv_path, profile_to_csv_text(profile))
    mpath = meta_path(csv_path)
    write_json(mpath, meta)
    return csv_path, mpath


def parse_profile_csv(
    text: str, path: str | Path, batch_size: int, name: str, meta: Mapping[str, object] | None = None
) -> ModelProfile:
    """Parse CSV text (errors name `path` and the 1-based line)."""
    path = Path(path)
    table = read_csv_table(text, path, REQUIRED_COLUMNS, known=REQUIRED_COLUMNS + OPTIONAL_COLUMNS)
    layers: list[LayerProfile] = []
    for line, cells in table.records:
        if cells["layer"] != str(len(layers)):
            raise InputFileError(
                path, f"expected {len(layers)} (0-based, in order), got '{cells['layer'][:40]}'", line,
                field="column 'layer'",
            )
        values: dict[str, Any] = {}
        for col in _NUMERIC:
            if col not in cells:
                continue
            if col == "flops" and cells[col] == "":
                values[col] = None
                continue
            values[col] = float(parse_number(path, line, f"column '{col}'", cells[col], LAYER_RULES[col]))
        for base, fixed in (("fwd_s", "fwd_fixed_s"), ("bwd_s", "bwd_fixed_s")):
            if fixed in values and values[fixed] > values[base]:
                raise InputFileError(
                    path, f"{values[fixed]!r} exceeds {base} {values[base]!r}; expected fixed <= total", line,
                    field=f"column '{fixed}'",
                )
        layers.append(LayerProfile(name=check_layer_name(path, line, "column 'name'", cells["name"]), **values))
    if not layers:
        raise InputFileError(path, "no layer rows after the header")
    return ModelProfile(name=name, batch_size=batch_size, layers=tuple(layers), meta=dict(meta or {}))


def read_meta(csv_path: str | Path) -> dict:
    mpath = meta_path(csv_path)
    if not mpath.exists():
        raise InputFileError(mpath, "missing (every profile CSV has a meta JSON beside it)")
    return read_json_object(mpath, "a profile's meta JSON")


def _batch_size(path: Path, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputFileError(path, f"expected {BATCH_SIZE_RULE.expected}, got {value!r}", field="key 'batch_size'")
    return int(parse_number(path, None, "key 'batch_size'", str(value), BATCH_SIZE_RULE))


def read_profile(path: str | Path, batch_size: int | None = None) -> ModelProfile:
    """Read `<stem>.csv` and `<stem>.meta.json`.

    `batch_size` overrides the meta's (and makes the meta optional).
    """
    path = Path(path)
    text = read_text(path, "a profile CSV")
    if batch_size is None:
        meta = read_meta(path)
        batch_size = _batch_size(meta_path(path), meta.get("batch_size"))
    else:
        batch_size = _batch_size(path, batch_size)
        meta = read_meta(path) if meta_path(path).is_file() else {}
        meta["batch_size"] = batch_size
    name = str(meta.get("name") or meta.get("model") or path.stem)
    return parse_profile_csv(text, path, batch_size, name, meta)

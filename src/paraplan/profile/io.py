"""Profile files: `<stem>.csv` (one row per layer) and `<stem>.meta.json` beside it.

CSV columns (DESIGN.md): `layer, name, fwd_s, bwd_s, activation_bytes, param_bytes`,
optionally `fwd_fixed_s, bwd_fixed_s, flops`; values at the meta's `batch_size`.
Floats are written with `repr`, so a profile read back is bit-for-bit the one written.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Mapping
from pathlib import Path

from paraplan.core import InputFileError, LayerProfile, ModelProfile
from paraplan.files import write_json, write_text

REQUIRED_COLUMNS = ("layer", "name", "fwd_s", "bwd_s", "activation_bytes", "param_bytes")
OPTIONAL_COLUMNS = ("fwd_fixed_s", "bwd_fixed_s", "flops")
_NUMERIC = ("fwd_s", "bwd_s", "activation_bytes", "param_bytes", "fwd_fixed_s", "bwd_fixed_s", "flops")


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


def _number(path: Path, line: int, column: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise InputFileError(path, f"column '{column}': expected a number, got '{text}'", line) from None
    if not math.isfinite(value) or value < 0:
        raise InputFileError(path, f"column '{column}': expected a finite number >= 0, got '{text}'", line)
    return value


def parse_profile_csv(
    text: str, path: str | Path, batch_size: int, name: str, meta: Mapping[str, object] | None = None
) -> ModelProfile:
    """Parse CSV text (errors name `path` and the 1-based line)."""
    path = Path(path)
    reader = csv.reader(io.StringIO(text))
    try:
        header = [h.strip() for h in next(reader)]
    except StopIteration:
        raise InputFileError(path, "empty file; expected a header row") from None
    missing = [c for c in REQUIRED_COLUMNS if c not in header]
    if missing:
        raise InputFileError(
            path, f"missing column(s) {', '.join(missing)}; expected {', '.join(REQUIRED_COLUMNS)}", 1
        )
    unknown = [c for c in header if c not in REQUIRED_COLUMNS + OPTIONAL_COLUMNS]
    if unknown:
        raise InputFileError(path, f"unknown column '{unknown[0]}'", 1)
    layers = []
    for row in reader:
        line = reader.line_num
        if not row or all(not cell.strip() for cell in row):
            continue
        if len(row) != len(header):
            raise InputFileError(path, f"expected {len(header)} fields, got {len(row)}", line)
        cells = dict(zip(header, (c.strip() for c in row), strict=True))
        if cells["layer"] != str(len(layers)):
            raise InputFileError(
                path, f"column 'layer': expected {len(layers)} (0-based, in order), got '{cells['layer']}'", line
            )
        values: dict[str, float | None] = {}
        for col in _NUMERIC:
            if col not in cells:
                continue
            if col == "flops" and cells[col] == "":
                values[col] = None
                continue
            values[col] = _number(path, line, col, cells[col])
        for base, fixed in (("fwd_s", "fwd_fixed_s"), ("bwd_s", "bwd_fixed_s")):
            if fixed in values and values[fixed] > values[base]:
                raise InputFileError(path, f"column '{fixed}' exceeds '{base}'", line)
        layers.append(LayerProfile(name=cells["name"], **values))
    if not layers:
        raise InputFileError(path, "no layer rows after the header")
    return ModelProfile(name=name, batch_size=batch_size, layers=tuple(layers), meta=dict(meta or {}))


def read_meta(csv_path: str | Path) -> dict:
    mpath = meta_path(csv_path)
    try:
        meta = json.loads(mpath.read_text())
    except FileNotFoundError:
        raise InputFileError(mpath, "missing (every profile CSV has a meta JSON beside it)") from None
    except json.JSONDecodeError as exc:
        raise InputFileError(mpath, f"not valid JSON: {exc.msg}", exc.lineno) from None
    if not isinstance(meta, dict):
        raise InputFileError(mpath, "expected a JSON object")
    return meta


def read_profile(path: str | Path, batch_size: int | None = None) -> ModelProfile:
    """Read `<stem>.csv` and `<stem>.meta.json`.

    `batch_size` overrides the meta's (and makes the meta optional).
    """
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise InputFileError(path, "no such profile file") from None
    if batch_size is None:
        meta = read_meta(path)
        bs = meta.get("batch_size")
        if isinstance(bs, bool) or not isinstance(bs, int) or bs < 1:
            raise InputFileError(meta_path(path), f"'batch_size' must be an integer >= 1, got {bs!r}")
        batch_size = bs
    else:
        meta = read_meta(path) if meta_path(path).is_file() else {}
        meta["batch_size"] = batch_size
    name = str(meta.get("name") or meta.get("model") or path.stem)
    return parse_profile_csv(text, path, batch_size, name, meta)

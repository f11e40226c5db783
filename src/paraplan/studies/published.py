"""Published reference numbers of the DistIR paper (EuroMLSys 2021; data/reference/distir/) in the shape
of a simulation study's results.csv, and the comparison of simulated rows against them.

- `distir_fig3` (fig3_speedups.csv): code_version v0.1 rows are the published figure
  (compared with mode `distir-v0.1`); 83d7fc3 rows are DistIR after its units fix
  (shown beside mode `corrected`, which is not tuned to match them).
- `distir_fig4` (fig4_grid_search_results.csv): throughput per D, H, P, micro-batches
  (compared with mode `distir-v0.1`).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from paraplan.core import InputFileError

KEY_COLUMNS = ["mode", "series", "D", "T", "P", "microbatches", "batch_size"]
COMPARISON_COLUMNS = [
    "experiment", *KEY_COLUMNS, "reference", "quantity", "published", "simulated", "rel_diff",
]
_FIG3_DEVICE_COLUMNS = {"dev2": 2, "dev4": 4, "dev8": 8, "dev16": 16, "dev32": 32}
_FIG3_MODES = {"v0.1": "distir-v0.1", "83d7fc3": "corrected"}
FIG4_BATCH_SIZE = 8192


def _read(path: Path, columns: list[str]) -> pd.DataFrame:
    try:
        frame = pd.read_csv(path)
    except (OSError, pd.errors.ParserError) as exc:
        raise InputFileError(path, f"cannot read published numbers: {exc}") from None
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise InputFileError(path, f"missing column(s) {', '.join(missing)}; expected {', '.join(columns)}")
    return frame


def load_fig3(path: str | Path) -> pd.DataFrame:
    """Long format: KEY_COLUMNS + reference, bandwidth_gbps, devices, speedup."""
    path = Path(path)
    frame = _read(path, ["code_version", "bandwidth_gbps", "series", "param", *_FIG3_DEVICE_COLUMNS])
    rows = []
    for line, rec in enumerate(frame.to_dict("records"), start=2):
        version = str(rec["code_version"])
        if version not in _FIG3_MODES:
            raise InputFileError(path, f"unknown code_version '{version}'", line)
        param = str(rec["param"])
        if rec["series"] == "DP" and param.startswith("batch"):
            series, batch, micro = "DP", int(param[5:]), 1
        elif str(rec["series"]).startswith("PP_bs") and param.startswith("mb"):
            series, batch, micro = "PP", int(str(rec["series"])[5:]), int(param[2:])
        else:
            raise InputFileError(path, f"unknown series/param '{rec['series']}/{param}'", line)
        for column, n in _FIG3_DEVICE_COLUMNS.items():
            D, P = (n, 1) if series == "DP" else (1, n)
            rows.append({
                "mode": _FIG3_MODES[version], "series": series, "D": D, "T": 1, "P": P,
                "microbatches": micro, "batch_size": batch, "reference": f"DistIR {version}",
                "bandwidth_gbps": float(rec["bandwidth_gbps"]), "devices": n,
                "speedup": float(rec[column]),
            })
    return pd.DataFrame(rows)


def load_fig4(path: str | Path) -> pd.DataFrame:
    """Long format: KEY_COLUMNS + reference, devices, throughput."""
    path = Path(path)
    frame = _read(path, ["dp_degree", "hp_degree", "pp_degree", "num_microbatches", "throughput"])
    out = pd.DataFrame({
        "mode": "distir-v0.1", "series": "grid",
        "D": frame["dp_degree"].astype(int), "T": frame["hp_degree"].astype(int),
        "P": frame["pp_degree"].astype(int), "microbatches": frame["num_microbatches"].astype(int),
        "batch_size": FIG4_BATCH_SIZE, "reference": "DistIR v0.1 (published CSV)",
    })
    out["devices"] = out["D"] * out["T"] * out["P"]
    out["throughput"] = frame["throughput"].astype(float)
    return out


def load_published(path: str | Path, fmt: str) -> pd.DataFrame:
    if fmt == "distir_fig3":
        return load_fig3(path)
    if fmt == "distir_fig4":
        return load_fig4(path)
    raise ValueError(f"unknown published format '{fmt}'")


def compare(results: pd.DataFrame, published: pd.DataFrame) -> pd.DataFrame:
    """Simulated rows beside the published ones (same mode, series, degrees, batch):
    rel_diff = simulated / published - 1, on speedup (Figure 3) or throughput (Figure 4)."""
    quantity = "speedup" if "speedup" in published.columns else "throughput"
    keys = results[[*KEY_COLUMNS, "experiment", quantity]].copy()
    merged = published[[*KEY_COLUMNS, "reference", quantity]].merge(
        keys, on=KEY_COLUMNS, suffixes=("_published", "_simulated"), how="inner",
    )
    merged["quantity"] = quantity
    merged["published"] = merged[f"{quantity}_published"]
    merged["simulated"] = merged[f"{quantity}_simulated"]
    merged["rel_diff"] = merged["simulated"] / merged["published"] - 1.0
    return merged[COMPARISON_COLUMNS].reset_index(drop=True)

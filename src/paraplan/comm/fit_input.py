"""Read bench CSVs (ours, or ones `paraplan ingest` wrote) for fitting, and check
the columns fitting needs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from paraplan.comm.results import COLUMNS
from paraplan.core import InputFileError

# Columns a CSV must have to be fitted (the rest are informative).
REQUIRED_FOR_FIT: tuple[str, ...] = ("collective", "world_size", "nodes", "size_bytes", "time_us")


def read_sweep_csv(path: str | Path) -> pd.DataFrame:
    """Read a bench CSV (ours, or one `paraplan ingest` wrote) and check what fitting needs."""
    path = Path(path)
    try:
        frame = pd.read_csv(path)
    except FileNotFoundError:
        raise InputFileError(path, "file not found") from None
    except (pd.errors.EmptyDataError, pd.errors.ParserError, UnicodeDecodeError) as exc:
        raise InputFileError(path, f"not a CSV file: {exc}") from None
    missing = [c for c in REQUIRED_FOR_FIT if c not in frame.columns]
    if missing:
        raise InputFileError(
            path, f"missing column(s) {', '.join(missing)}; expected the bench CSV columns {', '.join(COLUMNS)}"
        )
    if frame.empty:
        raise InputFileError(path, "no rows")
    for column in ("world_size", "nodes", "size_bytes", "time_us"):
        values = pd.to_numeric(frame[column], errors="coerce")
        bad = np.flatnonzero(values.isna().to_numpy() | (values.to_numpy() <= 0))
        if bad.size:
            # +2: header row, 1-based lines
            raise InputFileError(
                path, f"column '{column}' must be a positive number, got '{frame[column].iloc[bad[0]]}'", line=int(bad[0]) + 2
            )
        frame[column] = values
    return frame

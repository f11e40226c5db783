"""Measured vs predicted: step-time statistics and the validation table (pure)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

COLUMNS: tuple[str, ...] = (
    "strategy",
    "measured_s",
    "measured_p10_s",
    "measured_p90_s",
    "predicted_s",
    "rel_err",
)
LOAD_COLUMN = "other_load_per_core"  # optional: other processes' load per core while measuring


@dataclass(frozen=True)
class Measurement:
    """Step times of one strategy: each step's time is the slowest rank's."""

    strategy: str
    step_times_s: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.step_times_s:
            raise ValueError(f"strategy '{self.strategy}': no timed steps")
        if any(not math.isfinite(t) or t <= 0 for t in self.step_times_s):
            raise ValueError(f"strategy '{self.strategy}': step times must be finite and > 0")

    @property
    def median_s(self) -> float:
        return float(np.median(self.step_times_s))

    @property
    def p10_s(self) -> float:
        return float(np.percentile(self.step_times_s, 10))

    @property
    def p90_s(self) -> float:
        return float(np.percentile(self.step_times_s, 90))


def summarise(strategy: str, per_rank_step_times_s: Sequence[Sequence[float]]) -> Measurement:
    """Per-rank step times (ranks x steps) -> one step time per step: the slowest rank's."""
    times = np.asarray(per_rank_step_times_s, dtype=float)
    if times.ndim != 2 or times.shape[1] == 0:
        raise ValueError(f"strategy '{strategy}': expected ranks x steps times, got shape {times.shape}")
    return Measurement(strategy, tuple(float(t) for t in times.max(axis=0)))


def rel_err(predicted_s: float, measured_s: float) -> float:
    """Signed relative error of a prediction: predicted / measured - 1 (0.1 = 10% too slow)."""
    if measured_s <= 0:
        raise ValueError(f"measured time must be > 0, got {measured_s}")
    return predicted_s / measured_s - 1.0


def validation_table(measured: Mapping[str, Measurement], predicted_s: Mapping[str, float],
                     other_load_per_core: float | None = None):
    """One row per measured strategy, in the order given, with the columns of docs/design.md;
    with `other_load_per_core` (`paraplan.validate.load.LoadCheck`), that column too,
    the same on every row: the summary marks a validation measured on a busy machine."""
    import pandas as pd

    missing = [name for name in measured if name not in predicted_s]
    if missing:
        raise ValueError(f"no prediction for strategy '{missing[0]}'")
    rows = [
        {
            "strategy": name,
            "measured_s": m.median_s,
            "measured_p10_s": m.p10_s,
            "measured_p90_s": m.p90_s,
            "predicted_s": float(predicted_s[name]),
            "rel_err": rel_err(float(predicted_s[name]), m.median_s),
        }
        for name, m in measured.items()
    ]
    frame = pd.DataFrame(rows, columns=list(COLUMNS))
    if other_load_per_core is not None:
        frame[LOAD_COLUMN] = float(other_load_per_core)
    return frame


def validation_metrics(table) -> dict[str, float]:
    """MLflow metrics of the whole validation: the median and max |rel_err|."""
    abs_err = table["rel_err"].abs()
    return {"median_abs_rel_err": float(abs_err.median()), "max_abs_rel_err": float(abs_err.max())}


def strategy_metrics(table) -> dict[str, dict[str, float]]:
    """Per strategy, its row's numbers under the column names (`measured_s`,
    `rel_err`, ...): one MLflow table row each, so strategies compare in the chart view."""
    return {str(row["strategy"]): {key: float(row[key]) for key in COLUMNS[1:]}
            for row in table.to_dict("records")}

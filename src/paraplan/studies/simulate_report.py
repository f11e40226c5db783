"""One whole simulation study as a pure call: `simulate(study, ...)` runs every
configuration in each mode (`paraplan.studies.simulate.run_study`), tabulates them
(results.csv) and compares them with the study's published numbers when given.
The `SimulationReport` it returns holds what `paraplan simulate` writes and logs."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from paraplan.studies import published as pb
from paraplan.studies import simulate as st
from paraplan.studies.simulate_study import ModeName, SimulateStudy


@dataclass(frozen=True, eq=False)
class SimulationReport:
    result: st.StudyResult
    rows: pd.DataFrame
    """results.csv: one row per simulated configuration (`st.RESULT_COLUMNS`)."""
    published: pd.DataFrame | None
    comparison: pd.DataFrame | None
    """published_comparison.csv (None: no published numbers)."""
    published_note: str
    """Why the published numbers were not compared ("" when they were, or the study names none)."""

    @property
    def study(self) -> SimulateStudy:
        return self.result.study

    @property
    def timing(self) -> dict[str, object]:
        """timing.json."""
        return {
            "experiment": self.study.name,
            "simulate_s": self.result.simulate_s,
            "simulate_s_by_mode": dict(self.result.simulate_s_by_mode),
            "repeats": self.result.repeats,
            "configurations": len(self.rows),
            **({"published": self.published_note} if self.published_note else {}),
        }

    @property
    def summary(self) -> dict[str, float]:
        """The run's metrics: simulation times, and the differences from the published numbers."""
        out: dict[str, float] = {"simulate_s": self.result.simulate_s, "configurations": float(len(self.rows))}
        for mode, seconds in self.result.simulate_s_by_mode.items():
            out[f"simulate_s__{mode}"] = seconds
        if self.comparison is not None:
            for mode, part in self.comparison.groupby("mode"):
                err = part["rel_diff"].abs()
                out[f"max_abs_rel_diff__{mode}"] = float(err.max())
                out[f"median_abs_rel_diff__{mode}"] = float(err.median())
        return out

    def comparison_lines(self) -> list[str]:
        """Per mode, how far the simulation is from the published numbers."""
        if self.comparison is None:
            return []
        lines = []
        for mode, part in self.comparison.groupby("mode"):
            err = part["rel_diff"].abs()
            lines.append(f"{self.study.name} {mode} vs {part['reference'].iloc[0]}: max |rel diff| {err.max():.3%}, "
                         f"median {err.median():.3%} over {len(part)} points")
        return lines


def simulate(study: SimulateStudy, modes: tuple[ModeName, ...], repeats: int, published: pd.DataFrame | None,
             published_note: str = "", on_point: st.Progress = None) -> SimulationReport:
    """Simulate `study` in `modes` (empty: all of its modes; simulate_s the best of
    `repeats`), compared with `published` (the study's published numbers, read by
    `paraplan.studies.published.load_published`; None: none, `published_note` says why)."""
    result = st.run_study(study, modes, repeats=repeats, on_point=on_point)
    rows = pd.DataFrame(st.result_rows(result), columns=list(st.RESULT_COLUMNS))
    comparison = pb.compare(rows, published) if published is not None else None
    return SimulationReport(result, rows, published, comparison, published_note)

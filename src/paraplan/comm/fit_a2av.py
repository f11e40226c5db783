"""Uneven all_to_allv predicted from the even all_to_all fit (Lin et al.'s DLRM study, HiPC 2022).

A measured exchange is (global batch B, tables per rank T_0..T_{n-1}, dim D),
float32, each rank holding B // n samples. Its effective size, the all_to_all size
whose measured time it should take, in the three variants of the reference:
- `sum`: B/n x sum(T) x D x 4 (the even all_to_all's per-rank total when all T_r
  are equal);
- `max_of_max`: B/n x max_r max(sum(T) - T_r, (n-1) T_r) x D x 4 (the busiest
  rank's larger direction; the study's best);
- `max_of_sum`: B/n x max_r (sum(T) - T_r + (n-1) T_r) x D x 4.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from paraplan.comm.fit_errors import rel_err, summarize
from paraplan.core import Group

VARIANTS: tuple[str, ...] = ("sum", "max_of_max", "max_of_sum")
ELEMENT_BYTES = 4


def sample_rows(frame: pd.DataFrame) -> np.ndarray:
    """Boolean mask of the uneven all_to_allv samples (rows with a `global_batch`);
    all_to_allv rows without one (e.g. PARAM's even all_to_allv sweep) are sweeps."""
    is_a2av = (frame["collective"] == "all_to_allv").to_numpy()
    if "global_batch" not in frame.columns:
        return np.zeros(len(frame), dtype=bool)
    return is_a2av & frame["global_batch"].notna().to_numpy()


def parse_tables(text: str) -> tuple[int, ...]:
    """ "3-17-5" -> (3, 17, 5)."""
    return tuple(int(part) for part in str(text).split("-") if part != "")


def effective_size_bytes(variant: str, global_batch: int, tables: tuple[int, ...], dim: int) -> int:
    n = len(tables)
    local_batch = global_batch // n
    total = sum(tables)
    if variant == "sum":
        t = total
    elif variant == "max_of_max":
        t = max(max(total - tr, (n - 1) * tr) for tr in tables)
    elif variant == "max_of_sum":
        t = max(total - tr + (n - 1) * tr for tr in tables)
    else:
        raise ValueError(f"unknown effective-size variant '{variant}'; known: {', '.join(VARIANTS)}")
    return local_batch * t * dim * ELEMENT_BYTES


@dataclass(frozen=True)
class A2AVResult:
    """One variant's predictions for one world size's measured exchanges."""

    world_size: int
    nodes: int
    variant: str
    gmae: float
    mean_abs_rel_err: float
    std_abs_rel_err: float
    n_points: int
    effective_size_bytes: tuple[int, ...]
    measured_s: tuple[float, ...]
    predicted_s: tuple[float, ...]
    flagged: int  # predictions outside the all_to_all fit's measured range or extrapolated

    @property
    def rel_errors(self) -> np.ndarray:
        return rel_err(np.array(self.predicted_s), np.array(self.measured_s))


def predict_a2av(frame: pd.DataFrame, model) -> list[A2AVResult]:
    """Every variant for every (world size, nodes) of all_to_allv rows in `frame`
    (bench CSV with `global_batch, tables_per_rank, dim`), predicted by `model`
    (`FittedCommModel`) through its `all_to_all` fit."""
    results = []
    rows = frame.loc[sample_rows(frame)]
    for (world, nodes), group_rows in rows.groupby(["world_size", "nodes"], sort=True):
        group = Group(int(world), int(nodes))
        measured = group_rows["time_us"].to_numpy(float) * 1e-6
        tables = [parse_tables(t) for t in group_rows["tables_per_rank"]]
        batches = group_rows["global_batch"].to_numpy(int)
        dims = group_rows["dim"].to_numpy(int)
        for variant in VARIANTS:
            sizes = [effective_size_bytes(variant, int(b), t, int(d))
                     for b, t, d in zip(batches, tables, dims, strict=True)]
            predictions = [model.predict("all_to_allv", s, group) for s in sizes]
            predicted = np.array([p.time_s for p in predictions])
            summary = summarize(rel_err(predicted, measured))
            results.append(
                A2AVResult(
                    world_size=int(world),
                    nodes=int(nodes),
                    variant=variant,
                    gmae=summary.gmae,
                    mean_abs_rel_err=summary.mean_abs_rel_err,
                    std_abs_rel_err=summary.std_abs_rel_err,
                    n_points=summary.n_points,
                    effective_size_bytes=tuple(int(s) for s in sizes),
                    measured_s=tuple(float(v) for v in measured),
                    predicted_s=tuple(float(v) for v in predicted),
                    flagged=sum(1 for p in predictions if p.flags),
                )
            )
    return results


def a2av_frame(results: list[A2AVResult]) -> pd.DataFrame:
    """One row per (world size, nodes, variant): the errors the fit stage reports."""
    return pd.DataFrame(
        {
            "collective": "all_to_allv",
            "world_size": [r.world_size for r in results],
            "nodes": [r.nodes for r in results],
            "variant": [r.variant for r in results],
            "gmae": [r.gmae for r in results],
            "mean_abs_rel_err": [r.mean_abs_rel_err for r in results],
            "std_abs_rel_err": [r.std_abs_rel_err for r in results],
            "n_points": [r.n_points for r in results],
            "n_outside_fit": [r.flagged for r in results],
        }
    )

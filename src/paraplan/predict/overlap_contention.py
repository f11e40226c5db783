"""Occupancy model of a GEMM running beside a collective (issue 22, item 1).

NCCL runs one CTA per channel, each holding an SM for the collective's whole life, and
moves its bytes through HBM. A GEMM launched beside it gets the remaining SMs and the
remaining bandwidth:

- SMs: the GEMM's output tiles (`device_model.TILE` x TILE) run in waves over the free
  SMs, ceil(tiles / (units - ctas)) waves instead of ceil(tiles / units); a one-wave
  GEMM of exactly `units` tiles needs two waves beside any collective (the NVIDIA forum
  report in `data/published/overlap/` measured 1.70x, "nearly doubles"), a many-wave one slows by about
  units / (units - ctas).
- HBM: the GEMM's memory time (its bytes at the device's bandwidth) grows by
  1 / (1 - f), f the fraction of the bandwidth the collective moves; this binds only
  for a GEMM near its memory roof.

The GEMM's slowdown s is the larger of the two. The collective is taken as running at
its own speed (the micro-benchmarks below report compute slowdowns only). If the
collective (time c alone) and the GEMM (time g alone) start together, the GEMM makes
1/s of its progress while the collective runs, so the pair takes

    max(c, g + c (1 - 1/s))

which is paraplan's `max(c, g) + share x min(c, g)` with share = 1 - 1/s when c <= g.
No parameter is fitted: the CTA counts are NCCL's (derived from its source or observed,
`data/published/overlap/collective_ctas.csv`), the tiles and units paraplan's GEMM model's.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from paraplan.core.errors import StrategyError
from paraplan.predict.device_model import TILE

OVERLAP_DATA = Path(__file__).resolve().parents[3] / "data/published/overlap"


@dataclass(frozen=True)
class CollectiveFootprint:
    """What a running collective takes from the device: SMs held by its CTAs and the
    fraction of the HBM bandwidth its traffic uses."""

    ctas: int
    hbm_fraction: float = 0.0


def gemm_tiles(m: npt.ArrayLike, n: npt.ArrayLike, batch: npt.ArrayLike) -> np.ndarray:
    """Output tiles of a GEMM (`device_model.gemm_efficiency`'s tiling)."""
    return np.ceil(np.asarray(m, dtype=float) / TILE) * np.ceil(np.asarray(n, dtype=float) / TILE) * batch


def sm_slowdown(tiles: npt.ArrayLike, compute_units: int, ctas: int) -> np.ndarray:
    """Waves of the GEMM on the SMs the collective leaves over its waves on all of them."""
    if compute_units < 1:
        raise StrategyError("the occupancy model needs the device's compute_units (SMs) in its cluster file")
    if not 0 <= ctas < compute_units:
        raise StrategyError(f"a collective of {ctas} CTAs cannot run beside a GEMM on {compute_units} SMs")
    count = np.maximum(np.asarray(tiles, dtype=float), 1.0)
    return np.ceil(count / (compute_units - ctas)) / np.ceil(count / compute_units)


def hbm_slowdown(gemm_memory_s: npt.ArrayLike, gemm_s: npt.ArrayLike, hbm_fraction: float) -> np.ndarray:
    """The GEMM's time beside the collective's traffic over its time alone, from its
    memory time at the bandwidth left (1 where it stays compute-bound)."""
    if not 0.0 <= hbm_fraction < 1.0:
        raise StrategyError(f"hbm_fraction {hbm_fraction}: expected a fraction in [0, 1)")
    g = np.maximum(np.asarray(gemm_s, dtype=float), 1e-300)
    return np.maximum(np.asarray(gemm_memory_s, dtype=float) / (1.0 - hbm_fraction) / g, 1.0)


def gemm_slowdown(tiles: npt.ArrayLike, gemm_s: npt.ArrayLike, gemm_memory_s: npt.ArrayLike, compute_units: int,
                  footprint: CollectiveFootprint) -> np.ndarray:
    """A GEMM's time beside the collective over its time alone (the larger of the SM
    and the HBM slowdowns)."""
    return np.maximum(sm_slowdown(tiles, compute_units, footprint.ctas),
                      hbm_slowdown(gemm_memory_s, gemm_s, footprint.hbm_fraction))


def overlapped_pair_s(comm_s: npt.ArrayLike, gemm_s: npt.ArrayLike, slowdown: npt.ArrayLike) -> np.ndarray:
    """The pair's time: max(c, g + c (1 - 1/s)) (module doc)."""
    c = np.asarray(comm_s, dtype=float)
    return np.maximum(c, np.asarray(gemm_s, dtype=float) + c * (1.0 - 1.0 / np.asarray(slowdown, dtype=float)))


def equivalent_share(comm_s: npt.ArrayLike, gemm_s: npt.ArrayLike, slowdown: npt.ArrayLike) -> np.ndarray:
    """The single share that would give the same pair time: (pair - max) / min."""
    c, g = np.asarray(comm_s, dtype=float), np.asarray(gemm_s, dtype=float)
    return (overlapped_pair_s(c, g, slowdown) - np.maximum(c, g)) / np.maximum(np.minimum(c, g), 1e-300)


@dataclass(frozen=True)
class SlowdownMeasurement:
    """One published GEMM slowdown beside a collective (`gemm_beside_collective.csv`)."""

    source: str
    device: str
    compute_units: int  # 0: not stated
    gemm_tiles: int  # 0: not stated
    collective: str
    collective_ctas: int  # 0: not stated
    statistic: str  # single, mean or max over the source's experiments
    gemm_slowdown: float


def read_slowdowns(path: Path = OVERLAP_DATA / "gemm_beside_collective.csv") -> list[SlowdownMeasurement]:
    with path.open(newline="") as handle:
        return [SlowdownMeasurement(r["source"], r["device"], int(r["compute_units"] or 0),
                                    int(r["gemm_tiles"] or 0), r["collective"], int(r["collective_ctas"] or 0),
                                    r["statistic"], float(r["gemm_slowdown"]))
                for r in csv.DictReader(handle)]


def many_wave_slowdown(compute_units: int, ctas: int) -> float:
    """The SM slowdown of a GEMM of many waves: units / (units - ctas)."""
    return compute_units / (compute_units - ctas)

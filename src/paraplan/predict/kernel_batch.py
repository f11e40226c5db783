"""The kernels of many run structures priced together (what a calibration evaluates
hundreds of times): merged once per device speed, priced in one vectorised call per
speed, and summed per pass as many passes at a time as have the same number of
kernels, byte-identical to summing each pass alone."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

import numpy as np

from paraplan.predict.device_model import DeviceEfficiency, DeviceSpeed, kernel_times_s
from paraplan.predict.work import Kernels

if TYPE_CHECKING:
    from paraplan.predict.build import RunStructure

KERNEL_FIELDS = tuple(f.name for f in fields(Kernels))


@dataclass(frozen=True, eq=False)
class KernelBatch:
    """The kernels of every pass of some structures, merged once per device speed: the
    part of `kernel_times_by_pass` that does not depend on the calibration (a fit prices
    the same runs hundreds of times)."""

    shapes: tuple[int, ...]  # passes per structure
    groups: tuple[tuple[DeviceSpeed, Kernels, tuple[tuple[int, int, int, int], ...]], ...]
    # per speed: the merged kernels and, per member pass, (structure, pass, first, stop) rows
    sum_rows: tuple[tuple[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray], ...], ...] = ()
    """Per speed, per (kernels summed, all of a pass's or its weight-gradient ones): the
    merged kernels' indices (one row per pass, `_rows_of_equal_length`), the passes'
    structure and pass index, and which sum (0: all, 1: weight gradients)."""

    @staticmethod
    def of(structures: Sequence[RunStructure]) -> KernelBatch:
        by_speed: dict[DeviceSpeed, list[tuple[int, int]]] = {}
        for i, st in enumerate(structures):
            for j in range(len(st.passes)):
                by_speed.setdefault(st.speed, []).append((i, j))
        groups, sum_rows = [], []
        for speed, members in by_speed.items():
            parts = [structures[i].passes[j].kernels for i, j in members]
            merged = Kernels(*(np.concatenate([getattr(k, f) for k in parts]) for f in KERNEL_FIELDS))
            bounds = np.cumsum([0, *[len(k) for k in parts]])
            rows = tuple((i, j, int(lo), int(hi)) for (i, j), lo, hi in zip(members, bounds[:-1], bounds[1:],
                                                                             strict=True))
            groups.append((speed, merged, rows))
            summed = [(i, j, 0, np.arange(lo, hi)) for i, j, lo, hi in rows]
            summed += [(i, j, 1, lo + np.flatnonzero(k.weight_grad)) for (i, j, lo, _), k in zip(rows, parts,
                                                                                                strict=True)]
            sum_rows.append(_rows_of_equal_length(summed))
        return KernelBatch(tuple(len(st.passes) for st in structures), tuple(groups), tuple(sum_rows))

    def times(self, eff: DeviceEfficiency) -> list[list[np.ndarray]]:
        """Kernel device times of every pass of every structure, one vectorised call per speed."""
        return self.priced(eff)[0]

    def priced(self, eff: DeviceEfficiency) -> tuple[list[list[np.ndarray]], list[PassSums]]:
        """`times`, and per structure its passes' sums of those times (`PassSums`),
        summed as many rows at a time as have the same length: numpy sums each row of
        a contiguous 2-D array exactly as it sums that row alone, so every sum is
        byte-identical to `float(times.sum())` of the pass (tested)."""
        out: list[list[np.ndarray]] = [[np.zeros(0)] * n for n in self.shapes]
        totals = [[[0.0] * n, [0.0] * n] for n in self.shapes]
        for (speed, merged, rows), sum_rows in zip(self.groups, self.sum_rows, strict=True):
            times = kernel_times_s(merged, speed, eff)
            for i, j, lo, hi in rows:
                out[i][j] = times[lo:hi]
            for index, structure, pass_index, which in sum_rows:
                for i, j, w, value in zip(structure.tolist(), pass_index.tolist(), which.tolist(),
                                          times[index].sum(axis=1).tolist(), strict=True):
                    totals[i][w][j] = value
        return out, [PassSums(t[0], t[1]) for t in totals]


@dataclass(frozen=True)
class PassSums:
    """Per pass of one structure, the sum of its kernels' device times and of its
    weight-gradient kernels' (`KernelBatch.priced`)."""

    kernel_s: list[float]
    weight_grad_s: list[float]


def _rows_of_equal_length(summed: list[tuple[int, int, int, np.ndarray]]
                          ) -> tuple[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray], ...]:
    """The (structure, pass, which sum, indices) entries grouped by their number of
    indices: per length, the indices as one 2-D array and the entries' labels."""
    by_length: dict[int, list[tuple[int, int, int, np.ndarray]]] = {}
    for entry in summed:
        by_length.setdefault(int(entry[3].shape[0]), []).append(entry)
    return tuple((np.array([e[3] for e in entries], dtype=np.int64).reshape(len(entries), length),
                  np.array([e[0] for e in entries]), np.array([e[1] for e in entries]),
                  np.array([e[2] for e in entries]))
                 for length, entries in by_length.items())

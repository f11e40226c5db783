"""Does the prediction pick the right configuration? Among runs that answer the same
question (same model, same GPU count, same global batch: only the parallel
settings differ), is the measured-fastest among the k predicted fastest?"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class RankingSummary:
    groups: int  # questions with at least two configurations
    top_k: int
    hits: int  # questions whose measured-fastest is in the predicted top k
    picked_within_5pct: int  # questions whose predicted-fastest is within 5% of the measured-fastest

    @property
    def hit_fraction(self) -> float:
        return self.hits / self.groups if self.groups else float("nan")

    @property
    def pick_fraction(self) -> float:
        return self.picked_within_5pct / self.groups if self.groups else float("nan")


def ranking_summary(group_labels: Sequence[object] | np.ndarray, predicted_s: np.ndarray, measured_s: np.ndarray,
                    top_k: int = 3) -> RankingSummary:
    """`group_labels`: one label per run (strings, or any hashable such as their
    hashes); runs with equal labels answer the same question. Grouped by one sort, so
    a million runs take a second, not a pass over the runs per question."""
    labels = np.asarray(group_labels if isinstance(group_labels, np.ndarray) else list(group_labels))
    predicted_s = np.asarray(predicted_s, dtype=float)
    measured_s = np.asarray(measured_s, dtype=float)
    _, inverse = np.unique(labels, return_inverse=True)
    order = np.argsort(inverse, kind="stable")
    bounds = np.flatnonzero(np.diff(inverse[order])) + 1
    groups = hits = picked = 0
    for idx in np.split(order, bounds) if order.size else []:
        if idx.size < 2:
            continue
        groups += 1
        best = idx[np.argmin(measured_s[idx])]
        ranked = idx[np.argsort(predicted_s[idx], kind="stable")]
        hits += int(best in ranked[:top_k])
        picked += int(measured_s[ranked[0]] <= 1.05 * measured_s[best])
    return RankingSummary(groups, top_k, hits, picked)

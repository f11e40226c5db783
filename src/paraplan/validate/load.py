"""Was the machine busy while the validation measured? Other processes' load, from the
1-minute load average before and after the run (pure, but for `read_load_1m`).

A validation times real training steps against a profile taken at another moment:
when other processes compete for the cores, the steps slow down by a factor the
profile never saw, and the error says more about the machine than about the model.
The load average after the run also counts the run's own ranks (one runnable thread
each, for most of the minute), so they are taken off it. Beyond `BUSY_LOAD_PER_CORE`
of the cores, the result is marked busy, and the CLI and the summary say so.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

BUSY_LOAD_PER_CORE = 0.25
"""Other processes' runnable threads per core above which a measurement is marked
busy: a quarter of the cores (on 2 cores, one other process half the time)."""


def read_load_1m() -> float:
    """The system's 1-minute load average (runnable and waiting threads)."""
    return os.getloadavg()[0]


@dataclass(frozen=True)
class LoadCheck:
    load_before_1m: float
    load_after_1m: float
    cores: int
    own_threads: int  # the run's ranks x threads per rank

    @property
    def other_load_per_core(self) -> float:
        """Other processes' load per core: the larger of before, and after less the
        run's own threads."""
        after_others = max(0.0, self.load_after_1m - min(self.own_threads, self.cores))
        return max(self.load_before_1m, after_others) / max(self.cores, 1)

    @property
    def busy(self) -> bool:
        return self.other_load_per_core > BUSY_LOAD_PER_CORE

    def describe(self) -> str:
        return (f"load average {self.load_before_1m:.2f} before, {self.load_after_1m:.2f} after (the run's own "
                f"{self.own_threads} thread(s) included) on {self.cores} cores: other processes "
                f"{self.other_load_per_core:.2f} per core")

    def warning(self) -> str | None:
        """One line when the machine was busy, None when it was not."""
        if not self.busy:
            return None
        return (f"warning: the machine was busy ({self.describe()}, above {BUSY_LOAD_PER_CORE:.2f}): the measured "
                "steps include other processes' work and the errors are not the model's alone; rerun on an idle "
                "machine")

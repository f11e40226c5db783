"""The simulator's answer: what ran where and when, and the step's summary numbers.

Events are stored as columns (numpy arrays) so a timeline of 10^5 events is cheap
to build; `events()` yields them as `Event` rows for readers and exporters.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypedDict

import numpy as np

from paraplan.core.glossary import EVENT_KINDS, STREAMS, EventKind, Stream

KINDS = EVENT_KINDS  # `Timeline.kind` holds indices into this tuple


class TimelineColumns(TypedDict):
    """A timeline's event columns, one entry per event (`Timeline(**columns, ...)`)."""

    device: np.ndarray
    stream: np.ndarray  # indices into STREAMS
    kind: np.ndarray  # indices into KINDS
    stage: np.ndarray
    microbatch: np.ndarray
    start_s: np.ndarray
    end_s: np.ndarray


def timeline_columns(columns: Mapping[str, Any]) -> TimelineColumns:
    """The event columns of `columns` (which may hold more), as TimelineColumns."""
    return TimelineColumns(device=columns["device"], stream=columns["stream"], kind=columns["kind"],
                           stage=columns["stage"], microbatch=columns["microbatch"], start_s=columns["start_s"],
                           end_s=columns["end_s"])


@dataclass(frozen=True)
class Event:
    device: int
    stream: Stream
    kind: EventKind
    stage: int
    microbatch: int  # -1 when the event belongs to no micro-batch (e.g. a gradient all-reduce)
    start_s: float
    end_s: float


@dataclass(frozen=True, eq=False)
class Timeline:
    """Columns (one entry per event) plus the step's summary.

    `stream` and `kind` hold indices into STREAMS and KINDS.
    """

    device: np.ndarray
    stream: np.ndarray
    kind: np.ndarray
    stage: np.ndarray
    microbatch: np.ndarray
    start_s: np.ndarray
    end_s: np.ndarray
    step_time_s: float
    batch_size: int  # samples per step (global batch)
    num_devices: int
    speedup: float  # over one device running the whole batch
    bubble_fraction: float  # idle share of compute-stream time over the step
    peak_mem_bytes: tuple[float, ...] = ()  # per device; empty when a mode does not model memory
    schedule: str = ""  # pipeline schedule that produced the events (empty: none)
    microbatches: int = 0  # per iteration (0: not a pipeline timeline); Gantt labels e x M + i + 1
    iterations: int = 1  # iterations the events cover (step_time_s is per iteration)

    @property
    def throughput(self) -> float:
        """Samples per second."""
        return self.batch_size / self.step_time_s

    @property
    def num_events(self) -> int:
        return int(self.start_s.shape[0])

    def events(self) -> Iterator[Event]:
        for i in range(self.num_events):
            yield Event(
                int(self.device[i]),
                STREAMS[int(self.stream[i])],
                KINDS[int(self.kind[i])],
                int(self.stage[i]),
                int(self.microbatch[i]),
                float(self.start_s[i]),
                float(self.end_s[i]),
            )

"""The iterations of a run table as timelines (`paraplan simulate --runs`): each row
predicted (`paraplan.predict.predictor.predict_rows`, which fills the settings the
row leaves to it), then its iteration executed with events kept, one row at a time
(a timeline holds every event: only one is in memory at once)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from paraplan.core import Cluster, CommModel, StrategyError
from paraplan.core.run_settings import RunSettings
from paraplan.predict.device_model import DeviceEfficiency
from paraplan.predict.runtable import RunRow
from paraplan.sim.execution import IterationResult


@dataclass(frozen=True, eq=False)
class RunTimeline:
    name: str
    settings: RunSettings
    """As predicted (the row's settings with the ones it left empty chosen)."""
    result: IterationResult
    """With its timeline."""

    @property
    def title(self) -> str:
        s = self.settings
        return (f"{self.name}: TP {s.tensor_model_parallel_size}, PP {s.pipeline_model_parallel_size}, DP "
                f"{s.data_parallel_size}, micro-batch {s.micro_batch_size}, v {s.virtual_pipeline_model_parallel_size}"
                f" ({self.result.iteration_s:.3g} s)")


def run_timelines(rows: Sequence[RunRow], cluster: Cluster, comm: CommModel, efficiency: DeviceEfficiency,
                  source: str) -> Iterator[RunTimeline]:
    """Each row's iteration with its events, in row order; every row is predicted
    first, so a row the predictor cannot run is an error (naming `source`, the run
    table) before any timeline."""
    from paraplan.predict.build import build_execution
    from paraplan.predict.predictor import predict_rows
    from paraplan.sim.execution import run_iteration

    try:
        predictions = predict_rows(rows, cluster, comm, efficiency)
    except StrategyError as exc:
        raise StrategyError(f"{source}: {exc}") from None
    return (RunTimeline(row.name, pred.settings,
                        run_iteration(build_execution(row.model, pred.settings, cluster, comm, efficiency)))
            for row, pred in zip(rows, predictions, strict=True))

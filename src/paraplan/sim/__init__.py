"""Simulation: pipeline schedules, the as-soon-as-possible engine, and one training
step of any D x T x P strategy as a `Timeline` (plus its Chrome-trace export).

- `get_schedule(name)`: the schedule objects (`paraplan.core.SCHEDULES` names).
- `execute(orders, costs, num_microbatches)`: run per-device op orders.
- `simulate_pipeline(schedule, p, M, fwd_s, bwd_s, ...)`: a bare pipeline (docs/pipeline-schedules.md).
- `simulate(profile, cluster, comm, strategy, batch_size, ...)`: the physical engine:
  a layer profile's step as an `ExecutionModel` (`profile_execution`, with the run's
  `RunConditions`) run by `run_iteration`; transformer runs build the same model in
  `paraplan.predict.build`.
- `to_chrome_trace(timeline)`: Perfetto / chrome://tracing JSON.
"""

from paraplan.sim.builder.placement import layout
from paraplan.sim.chrome_trace import to_chrome_trace
from paraplan.sim.engine import PipelineCosts, PipelineRun, execute, inflight_peak
from paraplan.sim.execution import ExecutionModel, IterationResult, run_iteration
from paraplan.sim.pipeline import simulate_pipeline
from paraplan.sim.schedules import BWD, FWD, WGT, OpOrder, Schedule, get_schedule
from paraplan.sim.strategy_sim import RunConditions, default_tp_allreduces, profile_execution, simulate

__all__ = [
    "BWD",
    "FWD",
    "WGT",
    "ExecutionModel",
    "IterationResult",
    "OpOrder",
    "PipelineCosts",
    "PipelineRun",
    "RunConditions",
    "Schedule",
    "default_tp_allreduces",
    "execute",
    "get_schedule",
    "inflight_peak",
    "layout",
    "profile_execution",
    "run_iteration",
    "simulate",
    "simulate_pipeline",
    "to_chrome_trace",
]

"""Simulation: pipeline schedules, the as-soon-as-possible engine, and one training
step of any D x T x P strategy as a `Timeline` (plus its Chrome-trace export).

- `get_schedule(name)`: the schedule objects (`paraplan.core.SCHEDULES` names).
- `execute(orders, costs, num_microbatches)`: run per-device op orders.
- `simulate_pipeline(schedule, p, M, fwd_s, bwd_s, ...)`: a bare pipeline (seed 001).
- `simulate(profile, cluster, comm, strategy, batch_size, ...)`: the physical engine.
- `to_chrome_trace(timeline)`: Perfetto / chrome://tracing JSON.
"""

from paraplan.sim.chrome_trace import to_chrome_trace
from paraplan.sim.engine import PipelineCosts, PipelineRun, execute, inflight_peak
from paraplan.sim.pipeline import simulate_pipeline
from paraplan.sim.schedules import BWD, FWD, WGT, OpOrder, Schedule, get_schedule
from paraplan.sim.strategy_sim import default_tp_allreduces, layout, simulate

__all__ = [
    "BWD",
    "FWD",
    "WGT",
    "OpOrder",
    "PipelineCosts",
    "PipelineRun",
    "Schedule",
    "default_tp_allreduces",
    "execute",
    "get_schedule",
    "inflight_peak",
    "layout",
    "simulate",
    "simulate_pipeline",
    "to_chrome_trace",
]

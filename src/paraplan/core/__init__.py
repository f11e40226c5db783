"""The few shared types of paraplan: pure, typed, no I/O, no stage imports.

Seconds and bytes inside the core; microseconds and GB/s only at the edges.
"""

from paraplan.core.cluster import Cluster, Device, Link, Network, RailFit
from paraplan.core.comm import (
    COLLECTIVES,
    CommModel,
    ConstantBandwidthModel,
    Group,
    TieredCommModel,
    busbw_factor,
    ring_time_s,
)
from paraplan.core.errors import (
    ConfigError,
    InputFileError,
    OutputError,
    ParaplanError,
    StrategyError,
    TrackingError,
)
from paraplan.core.glossary import (
    GRADIENT_SYNCS,
    SCHEDULES,
    TERMS,
    GradientSync,
    PipelineOp,
    ScheduleName,
)
from paraplan.core.profile import LayerProfile, ModelProfile
from paraplan.core.strategy import Strategy
from paraplan.core.timeline import Event, Timeline

__all__ = [
    "COLLECTIVES",
    "GRADIENT_SYNCS",
    "SCHEDULES",
    "TERMS",
    "Cluster",
    "CommModel",
    "ConfigError",
    "ConstantBandwidthModel",
    "Device",
    "Event",
    "GradientSync",
    "Group",
    "InputFileError",
    "LayerProfile",
    "Link",
    "ModelProfile",
    "Network",
    "OutputError",
    "ParaplanError",
    "PipelineOp",
    "RailFit",
    "ScheduleName",
    "Strategy",
    "StrategyError",
    "TieredCommModel",
    "Timeline",
    "TrackingError",
    "busbw_factor",
    "ring_time_s",
]

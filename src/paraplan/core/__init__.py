"""The few shared types of paraplan: pure, typed, no I/O, no stage imports.

Seconds and bytes inside the core; microseconds and GB/s only at the edges.
"""

from paraplan.core.cluster import Cluster, Device, Link
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
from paraplan.core.profile import LayerProfile, ModelProfile
from paraplan.core.strategy import SCHEDULES, Strategy
from paraplan.core.timeline import Event, Timeline

__all__ = [
    "COLLECTIVES",
    "SCHEDULES",
    "Cluster",
    "CommModel",
    "ConfigError",
    "ConstantBandwidthModel",
    "Device",
    "Event",
    "Group",
    "InputFileError",
    "LayerProfile",
    "Link",
    "ModelProfile",
    "OutputError",
    "ParaplanError",
    "Strategy",
    "StrategyError",
    "TieredCommModel",
    "Timeline",
    "TrackingError",
    "busbw_factor",
    "ring_time_s",
]

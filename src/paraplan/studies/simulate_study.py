"""A simulation study file (`config/studies/simulate/<name>.yaml`): its typed form.

A study names a model, the modes it is simulated in (DistIR's own semantics to
reproduce the DistIR paper, and/or paraplan's engine) and series of configurations (the
lines of a figure). `paraplan.studies.simulate` runs it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Literal, get_args

from paraplan.core import limits as lim
from paraplan.core.glossary import GradientSync, ScheduleName
from paraplan.core.names import name_problem
from paraplan.sim.distir_compat import CostModelName, Phase2, SendFilter
from paraplan.typed import AtLeast, AtMost

Layers = Annotated[int, AtLeast(1), AtMost(lim.MAX_LAYERS, lim.LAYERS_WHY)]
Width = Annotated[int, AtLeast(0), AtMost(lim.MAX_WIDTH, lim.WIDTH_WHY)]
Seconds = Annotated[float, AtLeast(0), AtMost(lim.MAX_SECONDS, lim.SECONDS_WHY)]
Batch = Annotated[int, AtLeast(1), AtMost(lim.MAX_GLOBAL_BATCH_SIZE, lim.GLOBAL_BATCH_WHY)]
Devices = Annotated[int, AtLeast(1), AtMost(lim.MAX_DEVICES, lim.DEVICES_WHY)]
Microbatches = Annotated[int, AtLeast(1), AtMost(lim.MAX_NUM_MICROBATCHES, lim.MICROBATCHES_WHY)]
Gbit = Annotated[float, AtMost(8 * lim.MAX_BANDWIDTH_GBPS, "above 1 PB/s; wrong unit? (Gbit/s, 1e9 bits per second)")]

ModeName = Literal["distir-v0.1", "corrected"]
MODES: tuple[ModeName, ...] = get_args(ModeName)
Parallelism = Literal["data", "tensor", "pipeline", "grid"]
Figure = Literal["distir_fig3", "distir_fig4", "gantt", "none"]


@dataclass(frozen=True, kw_only=True)
class StudyModel:
    """`mlp`: DistIR's MLP (`num_layers` square layers of `hidden_dim`). `unit`: bare
    pipeline stages of forward `fwd_s` and backward `bwd_s` per micro-batch of
    `micro_batch_size` samples, free communication (the reference charts of docs/pipeline-schedules.md)."""

    kind: Literal["mlp", "unit"]
    """mlp or unit."""
    num_layers: Layers
    """Layers (mlp) or pipeline stages' worth of unit layers (unit)."""
    hidden_dim: Width = 0
    """Width of the square MLP layers (mlp)."""
    fwd_s: Seconds = 1.0
    """Forward seconds per micro-batch of one stage (unit)."""
    bwd_s: Seconds = 2.0
    """Backward seconds per micro-batch of one stage (unit)."""
    micro_batch_size: Batch = 1
    """Samples per micro-batch (unit)."""

    def __post_init__(self) -> None:
        if self.kind == "mlp" and self.hidden_dim < 1:
            raise ValueError("an mlp needs hidden_dim >= 1")


@dataclass(frozen=True, kw_only=True)
class CompatMode:
    """DistIR v0.1's own semantics and cost model (`paraplan.sim.distir_compat`)."""

    bandwidth_Gbit_per_s: Annotated[Gbit, AtLeast(lim.MIN_POSITIVE, "below 1 kbit/s; wrong unit?")]
    """Link bandwidth in Gbit/s, as DistIR states it."""
    cost_model: CostModelName = "v0.1"
    """Which revision of DistIR's cost model (v0.1 carries its unit bugs)."""
    phase2: Phase2 = "v0.1"
    """Phase 2 (gradient reduction) of v0.1, or of the revision that wrote Figure 4's CSV."""
    baseline: Literal["sequential", "one_device_run"] = "sequential"
    """The speedup's reference: the sequential program, or DistIR's 1,1,1,1 run with its Sends."""


@dataclass(frozen=True, kw_only=True)
class CorrectedMode:
    """paraplan's physical engine (`paraplan.sim.simulate`)."""

    bandwidth_Gbit_per_s: Annotated[Gbit, AtLeast(0)] = 0.0
    """Link bandwidth in Gbit/s (an mlp needs > 0; a unit model moves no bytes)."""
    schedule: ScheduleName = "1f1b"
    """Pipeline schedule."""
    gradient_sync: GradientSync = "end"
    """Gradient reduction of data-parallel replicas."""
    latency_s: Annotated[float, AtLeast(0), AtMost(1000, "above 1000 s per message; wrong unit? (seconds)")] = 0.0
    """Per-message latency in seconds."""
    memory_GB: Annotated[float, AtLeast(lim.MIN_POSITIVE, lim.TINY_WHY), AtMost(lim.MAX_MEMORY_GB, lim.MEMORY_WHY)] \
        = 80.0
    """Device memory in GB."""


@dataclass(frozen=True, kw_only=True)
class StudyModes:
    """The modes a study runs in (at least one)."""

    distir_v0_1: CompatMode | None = field(default=None, metadata={"key": "distir-v0.1"})
    """DistIR's own semantics, to reproduce the DistIR paper's published figures."""
    corrected: CorrectedMode | None = None
    """paraplan's physical engine."""

    def __post_init__(self) -> None:
        if not self.names:
            raise ValueError(f"needs at least one of {', '.join(MODES)}")

    @property
    def names(self) -> tuple[ModeName, ...]:
        present = (("distir-v0.1", self.distir_v0_1), ("corrected", self.corrected))
        return tuple(name for name, mode in present if mode is not None)  # type: ignore[misc]


@dataclass(frozen=True, kw_only=True)
class Series:
    """One line of a figure: a sweep over global batch sizes, device counts and
    micro-batch counts of one kind of parallelism."""

    name: str
    """The series' name (results.csv's `series`)."""
    parallelism: Parallelism
    """data, tensor or pipeline over `devices`, or grid: every power-of-two D x T x P
    with D T P = devices."""
    global_batch_sizes: tuple[Batch, ...]
    """Samples per iteration."""
    devices: tuple[Devices, ...] = ()
    """Device counts."""
    num_microbatches: tuple[Microbatches, ...] | Literal["distir_rule"] = (1,)
    """Micro-batch counts of pipelines, or DistIR's Figure 4 rule (distir_rule)."""
    micro_batch_size: Annotated[int, AtLeast(0), AtMost(lim.MAX_GLOBAL_BATCH_SIZE, lim.GLOBAL_BATCH_WHY)] = 0
    """> 0: M = global batch / (D x micro_batch_size), instead of num_microbatches."""
    modes: tuple[ModeName, ...] = ()
    """The modes this series runs in (empty: every mode of the study)."""
    distir_sends: SendFilter = "none"
    """Which Sends DistIR's Figure 3 filtered out (distir-v0.1 mode)."""
    schedule: ScheduleName | None = None
    """Pipeline schedule (corrected mode); absent: the mode's."""
    gradient_sync: GradientSync | None = None
    """Gradient reduction (corrected mode); absent: the mode's."""
    iterations: tuple[Annotated[int, AtLeast(1), AtMost(64, "a timeline shows a few iterations")], ...] = (1,)
    """Iterations a timeline shows."""
    virtual_pipeline_model_parallel_size: Annotated[int, AtLeast(1), AtMost(lim.MAX_LAYERS, lim.LAYERS_WHY)] = 1
    """Model chunks per pipeline device (interleaved 1F1B)."""

    def __post_init__(self) -> None:
        problem = name_problem(self.name)
        if problem:  # the name starts the Gantt charts' and traces' file names
            raise ValueError(f"name: {problem}")


@dataclass(frozen=True, kw_only=True)
class Published:
    """Published numbers to compare with."""

    file: str
    """CSV path, relative to the root the study came from (`paraplan.studies.paths`: the
    checkout holding config/studies/simulate/), whatever the working directory."""
    format: Literal["distir_fig3", "distir_fig4"]
    """How to read it."""


@dataclass(frozen=True, kw_only=True)
class SimulateStudy:
    """A named simulation study."""

    name: str
    """The study's name (results/simulations/<name>/)."""
    description: str = ""
    """What the study reproduces."""
    stage: Literal["simulate"] = field(default="simulate", metadata={"checked_first": True})
    """The stage that runs it (config/studies/<stage>/)."""
    model: StudyModel
    """The model simulated."""
    modes: StudyModes
    """The modes it runs in."""
    series: tuple[Series, ...]
    """The configurations, one series per line of the figure."""
    figure: Figure = "none"
    """The figure drawn from the results."""
    published: Published | None = None
    """Published numbers to compare with."""

    def __post_init__(self) -> None:
        problem = name_problem(self.name)
        if problem:  # results/simulations/<name>/ and its figures
            raise ValueError(f"key 'name': {problem}")
        if not self.series:
            raise ValueError("series needs at least one entry")
        for i, s in enumerate(self.series):
            for mode in s.modes:
                if mode not in self.modes.names:
                    raise ValueError(f"series[{i}].modes: '{mode}' is not a mode of the study "
                                     f"({', '.join(self.modes.names)})")
        if self.modes.distir_v0_1 is not None and self.model.kind != "mlp":
            raise ValueError("modes.distir-v0.1 needs model.kind mlp")
        corrected = self.modes.corrected
        if corrected is not None and self.model.kind == "mlp" and corrected.bandwidth_Gbit_per_s <= 0:
            raise ValueError("modes.corrected.bandwidth_Gbit_per_s must be > 0 for an mlp")

    def mode(self, name: ModeName) -> CompatMode | CorrectedMode:
        chosen = self.modes.distir_v0_1 if name == "distir-v0.1" else self.modes.corrected
        if chosen is None:
            raise ValueError(f"'{name}' is not a mode of study {self.name} ({', '.join(self.modes.names)})")
        return chosen

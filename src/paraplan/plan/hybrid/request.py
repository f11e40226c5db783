"""What `paraplan plan` is asked: a profile, a cluster (and the shapes to plan it in),
global batch sizes, memory and search settings. One typed request, read alike from
the command line and from a planning study (`paraplan.studies.plan`); its two small
value languages (`2x8`, `32:4096:64`) parse here."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar

from paraplan.core import Cluster, CommModel, ModelProfile
from paraplan.core import limits as lim
from paraplan.plan.hybrid.problem import MemorySettings
from paraplan.typed import AtLeast, AtMost, Count

if TYPE_CHECKING:  # the sweep (simulator, process pool) is imported where a profile is planned, not for --help
    from paraplan.plan.hybrid.sweep import PlanSettings

_SHAPE = re.compile(r"^\s*(\d+)\s*[xX]\s*(\d+)\s*$")
_RANGE = re.compile(r"^\s*(\d+)\s*:\s*(\d+)\s*:\s*(\d+)\s*$")


@dataclass(frozen=True)
class ClusterShape:
    """NODESxDEVICES: `2x8` is 2 nodes of 8 devices, `16x1` 16 flat devices."""

    nodes: int
    devices_per_node: int

    SCHEMA: ClassVar[dict[str, Any]] = {"type": "string", "pattern": r"^\s*[0-9]+\s*[xX]\s*[0-9]+\s*$"}
    EXPECTED: ClassVar[str] = "NODESxDEVICES such as 2x8 or 16x1"

    @classmethod
    def parse(cls, value: object) -> ClusterShape:
        found = _SHAPE.match(value) if isinstance(value, str) else None
        if not found:
            raise ValueError(f"expected {cls.EXPECTED}, got {value!r}")
        nodes, per_node = int(found.group(1)), int(found.group(2))
        if nodes < 1 or per_node < 1:
            raise ValueError(f"nodes and devices per node must be >= 1, got {value!r}")
        if nodes * per_node > lim.MAX_DEVICES:
            raise ValueError(f"expected at most {lim.MAX_DEVICES:,} devices, got {value!r} "
                             f"({nodes * per_node:,}): {lim.DEVICES_WHY}")
        return cls(nodes, per_node)

    def __str__(self) -> str:
        return f"{self.nodes}x{self.devices_per_node}"


@dataclass(frozen=True)
class GlobalBatchSizes:
    """Global batch sizes, sorted, without repeats: a list (`[32, 64]`, or `32,64` on
    the command line) or a range `A:B:S` (A, then every multiple of S in (A, B];
    32:4096:64 is DAPPLE's 65 sizes)."""

    values: tuple[int, ...]

    SCHEMA: ClassVar[dict[str, Any]] = {"anyOf": [
        {"type": "array", "items": {"type": "integer", "minimum": 1}, "minItems": 1},
        {"type": "string", "pattern": r"^\s*[0-9]+\s*(:\s*[0-9]+\s*:\s*[0-9]+\s*|(,\s*[0-9]+\s*)*)$"},
    ]}
    EXPECTED: ClassVar[str] = "a list of integers >= 1 (32,64,128) or A:B:S with 1 <= A <= B and S >= 1"
    MAX_SIZES: ClassVar[int] = 10_000
    """Batch sizes one request may sweep (DAPPLE's sweep has 65)."""

    @classmethod
    def parse(cls, value: object) -> GlobalBatchSizes:
        if isinstance(value, str) and ":" in value:
            return cls.from_range(value)
        items = value.split(",") if isinstance(value, str) else value
        if not isinstance(items, list | tuple) or not items:
            raise ValueError(f"expected {cls.EXPECTED}, got {value!r}")
        if len(items) > cls.MAX_SIZES:
            raise ValueError(f"expected at most {cls.MAX_SIZES:,} batch sizes, got {len(items):,}")
        sizes = []
        for item in items:
            text = item.strip() if isinstance(item, str) else item
            if isinstance(text, str) and text.isascii() and text.isdigit() and len(text) <= 20:
                text = int(text)
            if isinstance(text, bool) or not isinstance(text, int) or text < 1:
                raise ValueError(f"expected {cls.EXPECTED}, got {_shown(value)}")
            sizes.append(_checked(text))
        return cls(tuple(sorted(set(sizes))))

    @classmethod
    def from_range(cls, text: str) -> GlobalBatchSizes:
        found = _RANGE.match(text)
        if not found:
            raise ValueError(f"expected A:B:S with three integers, got {text!r}")
        if any(len(g) > 20 for g in found.groups()):
            raise ValueError(f"expected A:B:S with B at most 2^40, got {_shown(text)}")
        start, stop, step = (int(g) for g in found.groups())
        if start < 1 or step < 1 or stop < start:
            raise ValueError(f"expected 1 <= A <= B and S >= 1 in A:B:S, got {text!r}")
        _checked(stop)
        first_multiple = (start // step + 1) * step
        count = 1 + max(0, (stop - first_multiple) // step + 1)
        if count > cls.MAX_SIZES:
            raise ValueError(f"{text!r} holds {count:,} batch sizes; expected at most {cls.MAX_SIZES:,} "
                             "(a larger step S)")
        return cls((start, *range(first_multiple, stop + 1, step)))

    def __str__(self) -> str:
        return ",".join(str(v) for v in self.values)


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:60] + "..."


def _checked(size: int) -> int:
    if size > lim.MAX_GLOBAL_BATCH_SIZE:
        raise ValueError(f"expected a global batch size of at most 2^{lim.MAX_GLOBAL_BATCH_SIZE.bit_length() - 1}, "
                         f"got {size:,}: {lim.GLOBAL_BATCH_WHY}")
    return size


Memory_GB = Annotated[float, AtLeast(lim.MIN_POSITIVE, lim.TINY_WHY), AtMost(lim.MAX_MEMORY_GB, lim.MEMORY_WHY)]


@dataclass(frozen=True, kw_only=True)
class PlanRequest:
    """What to plan: a model's profile on a cluster, for several global batch sizes."""

    profile: Path | None = None
    """Layer profile: a paraplan CSV or a PipeDream TorchGraph .txt."""
    profile_batch_size: Count | None = None
    """The batch size the profile was taken at (PipeDream text: default from '-pbs-N' in the
    file name; CSV: its meta)."""
    cluster: str = "dgx1-v100"
    """Cluster name (config/clusters/<name>.yaml) or YAML path: device memory and links."""
    shapes: tuple[ClusterShape, ...] = ()
    """Cluster shapes (NODESxDEVICES) to plan on, e.g. 2x8 (16x1: flat); none: the cluster's own."""
    global_batch_sizes: GlobalBatchSizes | None = None
    """Global batch sizes: a list such as 32,64,128, or A:B:S (32:4096:64 is 65 sizes)."""
    min_micro_batch_size: Count | None = None
    """Smallest micro-batch of one pipeline copy (default: the profile's batch size)."""
    memory_GB: Memory_GB | None = None
    """Memory a plan may fill per device in GB (1e9 bytes; default: the cluster file's usable memory, its total
    less its reserve: docs/clusters.md#device-memory)."""
    model_state_factor: Annotated[float, AtLeast(1), AtMost(1000, "wrong unit? (parameter bytes per parameter "
                                                                  "byte: DAPPLE 2, Adam 4)")] = 2.0
    """Weights + gradients + optimizer state in parameter bytes (DAPPLE: 2; Adam: 4)."""
    peak_activation_bytes_per_sample: Annotated[float, AtLeast(0), AtMost(1e15, "above 1 PB per sample; "
                                                                           "wrong unit?")] | None = None
    """Whole-model activation bytes per sample (DAPPLE ResNet-50: 7e7); default: the profile's."""
    max_pipeline_devices: Annotated[int, AtLeast(0), AtMost(lim.MAX_DEVICES, lim.DEVICES_WHY)] = 0
    """Widest pipeline copy searched (0: all devices)."""
    candidates: Annotated[int, AtLeast(1), AtMost(100, "each candidate is simulated")] = 3
    """Best plans re-timed with the simulator (the best simulated one is reported)."""

    def settings(self, profile: ModelProfile, cluster: Cluster, comm: CommModel) -> PlanSettings:
        """The planner's settings for `profile` on `cluster` (one of its shapes)."""
        from paraplan.plan.hybrid.sweep import PlanSettings

        memory = MemorySettings(
            memory_bytes=self.memory_GB * 1e9 if self.memory_GB is not None else cluster.device.usable_memory_bytes,
            model_state_factor=self.model_state_factor,
            peak_activation_bytes_per_sample=self.peak_activation_bytes_per_sample,
        )
        return PlanSettings(profile, cluster, comm, memory, self.min_micro_batch_size or profile.batch_size,
                            self.max_pipeline_devices, self.candidates)

    def warnings(self) -> list[str]:
        """What is valid but unusual enough to say (a global batch far beyond any training run's)."""
        sizes = self.global_batch_sizes.values if self.global_batch_sizes is not None else ()
        large = [g for g in sizes if g > lim.LARGE_GLOBAL_BATCH_SIZE]
        if not large:
            return []
        return [f"global batch {large[-1]:,} is above 2^{lim.LARGE_GLOBAL_BATCH_SIZE.bit_length() - 1} samples "
                "per iteration, far beyond published training runs (tens of thousands); planned anyway, with at "
                f"most {lim.MAX_NUM_MICROBATCHES:,} micro-batches per pipeline copy"]

    def clusters(self, base: Cluster) -> list[Cluster]:
        """`base` in each requested shape (itself when none is asked for)."""
        return [base.with_shape(s.nodes, s.devices_per_node) for s in self.shapes] or [base]

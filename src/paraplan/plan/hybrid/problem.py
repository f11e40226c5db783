"""One planning problem: a layer chain, a cluster, a communication model, device memory
and a global batch size; the per-stage cost terms every search shares.

Units: seconds and bytes. A stage covers layers [first, stop) (stop exclusive inside the
planner; records print inclusive ranges). Compute time of layers at a batch follows the
profile's scaling: fixed + variable x batch / profile batch size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from paraplan.core import Cluster, CommModel, ConfigError, Group, ModelProfile
from paraplan.core.limits import MAX_NUM_MICROBATCHES


def divisors(n: int, most: int | None = None) -> list[int]:
    """The divisors of `n` up to `most` (default: all), ascending, in O(sqrt(n)) steps
    (vectorised: n = 2^40 takes milliseconds)."""
    if n < 1:
        return []
    root = math.isqrt(n)
    small = np.arange(1, root + 1, dtype=np.int64)
    small = small[n % small == 0]
    large = (n // small)[::-1]
    found = np.concatenate([small, large[large > root]])
    if most is not None:
        found = found[found <= most]
    return [int(d) for d in found]


@dataclass(frozen=True)
class MemorySettings:
    """Per-device memory budget and how a stage fills it.

    - model state = `model_state_factor` x the stage's parameter bytes (weights, gradients
      and optimizer state together; DAPPLE's ResNet-50 run uses 2);
    - activations = in-flight micro-batches x samples per replica x bytes per sample of
      the stage. `peak_activation_bytes_per_sample` (DAPPLE: 7e7 for ResNet-50) is the
      whole model's; a stage gets the share of the profile's activation bytes it holds.
      None: the profile's own activation bytes per sample.
    """

    memory_bytes: float = 16e9
    model_state_factor: float = 2.0
    peak_activation_bytes_per_sample: float | None = None

    def __post_init__(self) -> None:
        if not self.memory_bytes > 0:
            raise ConfigError("memory_GB", f"must be > 0, got {self.memory_bytes / 1e9}")
        if not self.model_state_factor >= 1:
            raise ConfigError("model_state_factor", f"must be >= 1, got {self.model_state_factor}")
        peak = self.peak_activation_bytes_per_sample
        if peak is not None and not peak >= 0:
            raise ConfigError("peak_activation_bytes_per_sample", f"must be >= 0, got {peak}")


@dataclass(frozen=True, eq=False)
class PlanProblem:
    """Everything a search needs for one global batch size."""

    profile: ModelProfile
    cluster: Cluster
    comm: CommModel
    memory: MemorySettings
    global_batch_size: int
    min_micro_batch_size: int = 1  # samples per micro-batch of one pipeline copy, at least
    max_pipeline_devices: int = 0  # widest pipeline copy searched; 0: all devices
    _ar_cache: dict = field(default_factory=dict, repr=False)
    _send_cache: dict = field(default_factory=dict, repr=False)
    _span_cache: dict = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.global_batch_size < 1:
            raise ConfigError("global_batch_size", f"global batch size must be >= 1, got {self.global_batch_size}")
        if self.min_micro_batch_size < 1:
            raise ConfigError("min_micro_batch_size", f"micro-batch size must be >= 1, got {self.min_micro_batch_size}")

    # ---- layer chain (prefix sums over layers, length L + 1) ----
    @property
    def num_layers(self) -> int:
        return self.profile.num_layers

    @property
    def num_devices(self) -> int:
        return self.cluster.num_devices

    @cached_property
    def _prefix(self) -> dict[str, np.ndarray]:
        p = self.profile
        fixed = p.fwd_fixed_s + p.bwd_fixed_s
        var = (p.fwd_s - p.fwd_fixed_s) + (p.bwd_s - p.bwd_fixed_s)
        act = p.activation_bytes
        total_act = float(act.sum())
        peak = self.memory.peak_activation_bytes_per_sample
        if peak is None:
            stash = act / p.batch_size
        elif total_act > 0:
            stash = act / total_act * peak
        else:
            stash = np.zeros_like(act)

        def cum(x: np.ndarray) -> np.ndarray:
            return np.concatenate([[0.0], np.cumsum(x)])

        return {
            "fixed": cum(fixed),
            "var_per_sample": cum(var / p.batch_size),
            "params": cum(p.param_bytes),
            "stash_per_sample": cum(stash),
        }

    @property
    def fixed_prefix_s(self) -> np.ndarray:
        return self._prefix["fixed"]

    @property
    def var_prefix_s_per_sample(self) -> np.ndarray:
        return self._prefix["var_per_sample"]

    @property
    def param_prefix_bytes(self) -> np.ndarray:
        return self._prefix["params"]

    @property
    def stash_prefix_bytes_per_sample(self) -> np.ndarray:
        return self._prefix["stash_per_sample"]

    @cached_property
    def cut_bytes_per_sample(self) -> np.ndarray:
        """Activation bytes per sample crossing the cut before layer i (index i, 1..L-1)."""
        a = self.profile.activation_bytes / self.profile.batch_size
        return np.concatenate([[0.0], a])

    def compute_s(self, first, stop, samples):
        """Forward + backward time of layers [first, stop) on `samples` samples (arrays ok)."""
        fx, vr = self.fixed_prefix_s, self.var_prefix_s_per_sample
        return (fx[stop] - fx[first]) + (vr[stop] - vr[first]) * samples

    @cached_property
    def single_device_s(self) -> float:
        """T: the whole global batch on one device, forward + backward (no memory limit)."""
        return float(self.compute_s(0, self.num_layers, self.global_batch_size))

    # ---- devices ----
    def nodes_spanned(self, offset: int, width: int, pipeline_devices: int, copies: int) -> int:
        key = ("span", offset, width, pipeline_devices, copies)
        found = self._span_cache.get(key)
        if found is None:
            found = self._span_cache[key] = self._nodes_spanned(offset, width, pipeline_devices, copies)
        return found

    def _nodes_spanned(self, offset: int, width: int, pipeline_devices: int, copies: int) -> int:
        g = self.cluster.devices_per_node
        nodes: set[int] = set()
        for c in range(copies):
            first = c * pipeline_devices + offset
            nodes.update(range(first // g, (first + width - 1) // g + 1))
        return len(nodes)

    def in_one_node(self, first: int, last: int, pipeline_devices: int, copies: int) -> bool:
        """Devices first..last (inclusive, offsets in a copy) share a node in every copy."""
        key = ("one", first, last, pipeline_devices, copies)
        found = self._span_cache.get(key)
        if found is not None:
            return found
        g = self.cluster.devices_per_node
        found = self._span_cache[key] = all(
            (c * pipeline_devices + first) // g == (c * pipeline_devices + last) // g
            for c in range(copies)
        )
        return found

    # ---- communication ----
    def allreduce_s(self, nbytes, group_size: int, nodes: int):
        """Gradient all-reduce of `nbytes` (scalar or array) over a stage's replicas."""
        if group_size <= 1:
            return nbytes * 0.0
        key = (group_size, nodes)
        vectorised = self._ar_cache.get(key)
        group = Group(group_size, nodes)
        if vectorised is None:
            try:
                # a model written for arrays answers an array of sizes with an array of times
                probe = self.comm.time_s("all_reduce", np.array([1.0, 2.0]), group)  # type: ignore[arg-type]
                vectorised = np.shape(probe) == (2,)
            except Exception:  # a model that only takes scalars
                vectorised = False
            self._ar_cache[key] = vectorised
        if vectorised or np.ndim(nbytes) == 0:
            return self.comm.time_s("all_reduce", nbytes, group)
        return np.array([self.comm.time_s("all_reduce", float(b), group) for b in nbytes])

    def transfer_s(self, cut_bytes, intra: bool):
        """One stage boundary per micro-batch: activations forward and gradients back,
        2 x a point-to-point send of `cut_bytes` (DAPPLE). A model without `send_recv`
        falls back to the cluster's link."""
        key = intra
        use_comm = self._send_cache.get(key)
        group = Group(2, 1 if intra else 2)
        if use_comm is None:
            try:
                self.comm.time_s("send_recv", 1.0, group)
                use_comm = True
            except Exception:
                use_comm = False
            self._send_cache[key] = use_comm
        if use_comm:
            return 2.0 * self.comm.time_s("send_recv", cut_bytes, group)
        link = self.cluster.intra if intra else self.cluster.inter
        return 2.0 * (link.latency_s + cut_bytes / link.bandwidth_Bps)

    # ---- search dimensions ----
    def pipeline_widths(self) -> list[int]:
        """Devices of one pipeline copy: divisors of the device count (copies = N / W)."""
        n = self.num_devices
        cap = self.max_pipeline_devices or n
        return [w for w in divisors(n) if w <= cap]

    def microbatch_counts(self, copies: int) -> list[int]:
        """M such that each copy's share of the batch splits into M equal micro-batches
        of at least `min_micro_batch_size` samples, fewest first; at most
        `MAX_NUM_MICROBATCHES` (whatever the batch, the search stays bounded)."""
        if self.global_batch_size % copies:
            return []
        per_copy = self.global_batch_size // copies
        most = min(per_copy // self.min_micro_batch_size, MAX_NUM_MICROBATCHES)
        return divisors(per_copy, most)

    def microbatch_cap_binds(self, copies: int) -> bool:
        """Whether a copy's share could split into more micro-batches than the search
        takes (`MAX_NUM_MICROBATCHES`)."""
        per_copy = self.global_batch_size // copies
        return per_copy // self.min_micro_batch_size > MAX_NUM_MICROBATCHES

    # ---- memory ----
    def stage_max_inflight(self, first, stop, samples_per_replica):
        """Most in-flight micro-batches a stage's device holds within memory (arrays ok):
        -1 when even the model state does not fit, a large number when activations are free."""
        cap = self.memory.memory_bytes
        state = self.memory.model_state_factor * (self.param_prefix_bytes[stop] - self.param_prefix_bytes[first])
        stash = self.stash_prefix_bytes_per_sample
        per_mb = (stash[stop] - stash[first]) * samples_per_replica
        free = cap - state
        if np.ndim(per_mb) == 0:
            if free < 0:
                return -1.0
            return float(free // per_mb) if per_mb > 0 else 1e9
        k = np.full(per_mb.shape, 1e9)
        pos = per_mb > 0
        k[pos] = np.floor(free[pos] / per_mb[pos])
        k[free < 0] = -1.0
        return k

    def max_samples_per_device(self) -> int:
        """Data parallelism: samples one device holds at once (the whole model on it);
        0 when the model state alone does not fit."""
        cap = self.memory.memory_bytes
        state = self.memory.model_state_factor * self.profile.total_param_bytes
        per_sample = float(self.stash_prefix_bytes_per_sample[-1])
        if state > cap:
            return 0
        if per_sample <= 0:
            return 1 << 40
        return math.floor((cap - state) / per_sample)

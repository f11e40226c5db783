"""paraplan's vocabulary: one name, one type and one unit per concept, from the command
line through the input files to the core types.

Names follow Megatron-LM's arguments where Megatron has the concept
(`tensor_model_parallel_size`, `micro_batch_size`, `global_batch_size`, ...), the words
the people who train large models already speak; units sit in names (`_s`, `_bytes`,
`_GB`, `_GBps`, `_Gbit_per_s`). A command-line option is the name in kebab case
(`--micro-batch-size`); a file key is the name itself.

`TERMS` lists every concept with the names it had in paraplan 0.1. The typed input
loaders (`paraplan.typed`) and the command line accept an old name until paraplan
`DEPRECATED_UNTIL`, with a deprecation message naming the new one; the documentation's
vocabulary page (docs/vocabulary.md) is written from this table by docs/gen_pages.py.

Closed choices are `Literal` types (their values as written in files) or, where the
engine stores them in numpy arrays, an `IntEnum`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Literal, get_args

from paraplan.core.run_settings import Dtype, RecomputeGranularity

DEPRECATED_UNTIL = "0.2"

ScheduleName = Literal[
    "gpipe",
    "1f1b",
    "2bw",
    "eager_1f1b",
    "eager_1f1b_noflush",
    "interleaved_1f1b",
    "zb_h1",
    "distir_greedy",
]
"""A pipeline schedule, as written in files (`paraplan.sim.schedules` has one class each)."""
SCHEDULES: tuple[ScheduleName, ...] = get_args(ScheduleName)

GradientSync = Literal["end", "overlap", "p3"]
"""How data-parallel replicas reduce gradients: `end` (one all-reduce after the last
backward), `overlap` (buckets during the last backward; Megatron's
`overlap_grad_reduce`), `p3` (per-layer all-reduces, lowest layer first, also during
the next iteration's forward)."""
GRADIENT_SYNCS: tuple[GradientSync, ...] = get_args(GradientSync)

EventKind = Literal[
    "fwd", "bwd", "bwd_input", "bwd_weight", "allreduce", "allgather", "send", "recv", "optimizer", "other",
]
"""What a `Timeline` event is."""
EVENT_KINDS: tuple[EventKind, ...] = get_args(EventKind)

Stream = Literal["compute", "comm"]
"""Which stream of a device an event runs on."""
STREAMS: tuple[Stream, ...] = get_args(Stream)


class EventKindCode(IntEnum):
    """An `EventKind` as `Timeline.kind` stores it (int8): its index in EVENT_KINDS."""

    FWD = 0
    BWD = 1
    BWD_INPUT = 2
    BWD_WEIGHT = 3
    ALLREDUCE = 4
    ALLGATHER = 5
    SEND = 6
    RECV = 7
    OPTIMIZER = 8
    OTHER = 9

    @property
    def label(self) -> EventKind:
        return EVENT_KINDS[self.value]


class StreamCode(IntEnum):
    """A `Stream` as `Timeline.stream` stores it (int8): its index in STREAMS."""

    COMPUTE = 0
    COMM = 1

    @property
    def label(self) -> Stream:
        return STREAMS[self.value]


NO_MICROBATCH = -1
"""`Timeline.microbatch` of an event that belongs to no micro-batch (a gradient all-reduce)."""

RECOMPUTE_GRANULARITIES: tuple[RecomputeGranularity, ...] = get_args(RecomputeGranularity)
DTYPES: tuple[Dtype, ...] = get_args(Dtype)


class PipelineOp(IntEnum):
    """One operation of a pipeline stage on one micro-batch, as the schedules order
    them and the engine runs them (stored in int8 arrays)."""

    FWD = 0
    """Forward (F)."""
    BWD = 1
    """Backward (B); with a split backward, the input gradient only."""
    WGT = 2
    """Weight gradient (W) of a split backward."""

    @property
    def letter(self) -> str:
        return "FBW"[self.value]


def overlap_flag_as_gradient_sync(value: object) -> object:
    """The 0.1 boolean `overlap_grad_allreduce` as a `gradient_sync` value."""
    if isinstance(value, bool):
        return "overlap" if value else "end"
    return value  # the field's own check names what is expected


@dataclass(frozen=True)
class Term:
    """One concept: its name, what it means (with its unit) and its 0.1 names.

    `old_names`: keys of files (and of the options derived from a typed input) that
    0.1 spelled so; `old_options`: command-line spellings of hand-written options.
    `convert` turns a value written under an old name into the new name's value
    (e.g. a boolean into a `gradient_sync` choice); absent, the value carries over."""

    name: str
    meaning: str
    old_names: tuple[str, ...] = ()
    convert: Mapping[str, Callable[[object], object]] = field(default_factory=dict)
    old_options: tuple[str, ...] = ()


TERMS: tuple[Term, ...] = (
    # ---- parallel layout (Megatron-LM's arguments) ----
    Term("tensor_model_parallel_size", "t: ranks that split every layer (T in results.csv, H in DistIR)",
         ("tensor_degree",)),
    Term("pipeline_model_parallel_size", "p: pipeline stages (P in results.csv)", ("pipeline_degree",)),
    Term("data_parallel_size", "d: model replicas (D in results.csv)", ("data_degree",)),
    Term("virtual_pipeline_model_parallel_size", "v: model chunks per pipeline rank (interleaved 1F1B)",
         ("virtual_stages",)),
    Term("num_microbatches", "M: micro-batches per replica per iteration", ("microbatches",),
         old_options=("--microbatches",)),
    Term("schedule", "pipeline schedule, one of SCHEDULES"),
    Term("gradient_sync", "data-parallel gradient reduction, one of GRADIENT_SYNCS",
         ("grad_sync", "overlap_grad_allreduce"),
         {"overlap_grad_allreduce": overlap_flag_as_gradient_sync}),
    Term("stage_boundaries", "first layer of pipeline stages 1..p-1 (0-based)"),
    Term("stage_replicas", "data-parallel width of each pipeline stage (DAPPLE's uneven 15:1)"),
    # ---- batch ----
    Term("global_batch_size", "B: samples (sequences) per iteration over all replicas",
         ("global_batch", "gbs", "batch"), old_options=("--batch",)),
    Term("global_batch_sizes", "several global batch sizes: a list, or A:B:S (A, then every multiple of S "
         "up to B)", ("gbs", "gbs_range", "batch_sizes")),
    Term("micro_batch_size", "b: samples per micro-batch on one replica", ("microbatch_size", "microbatch_samples")),
    Term("min_micro_batch_size", "smallest micro-batch a planner may choose", ("mbs", "min_microbatch")),
    Term("profile_batch_size", "the batch size a profile was taken at (`batch_size` in its meta JSON)",
         ("pbs",), old_options=("--batch", "--batch-size")),
    Term("profile_batch_sizes", "the batch sizes a profile is measured at (a fit of time over batch)",
         ("batches",), old_options=("--batches",)),
    # ---- model ----
    Term("num_layers", "layers of a model (transformer blocks for GPT, Linear layers for an MLP)",
         ("layers",)),
    Term("hidden_size", "h: the model width", ("hidden",)),
    Term("num_attention_heads", "a: attention heads", ("heads",)),
    Term("seq_length", "s: tokens per sequence", ("seq_len",)),
    Term("vocab_size", "V: vocabulary entries", ("vocab",)),
    Term("hidden_dim", "width of DistIR's square MLP", ("dim",)),
    # ---- memory and hardware (units in the names) ----
    Term("model_state_factor",
         "weights + gradients + optimizer state in parameter bytes (DAPPLE: 2; Adam: 4); the simulator's "
         "`optimizer_state_factor` is this minus 2", ("optimizer_factor",)),
    Term("optimizer_state_factor", "optimizer state alone in parameter bytes (the simulator's memory model)"),
    Term("memory_GB", "device memory in GB (1e9 bytes)", ("memory_gb", "device_memory_bytes"),
         {"device_memory_bytes": lambda v: v / 1e9 if isinstance(v, int | float) and not isinstance(v, bool) else v}),
    Term("bandwidth_GBps", "link bandwidth in GB/s (1e9 bytes per second)"),
    Term("bandwidth_Gbit_per_s", "link bandwidth in Gbit/s (1e9 bits per second), as studies state it",
         ("bandwidth_gbps",)),
    Term("cluster", "a cluster: a name under config/clusters/ or a YAML path", ("cluster_file",),
         old_options=("--cluster-file",)),
    Term("shapes", "cluster shapes (NODESxDEVICES) to plan on", ("layouts",), old_options=("--shape",)),
    Term("study", "a named study: config/studies/<stage>/<name>.yaml or a YAML path", ("experiment",),
         old_options=("--experiment",)),
    Term("studies", "several study names", ("experiments",)),
    # ---- profiles and answers ----
    Term("fwd_s", "forward seconds of one layer at the profile batch size (LayerProfile, profile CSV)"),
    Term("bwd_s", "backward seconds of one layer at the profile batch size"),
    Term("activation_bytes", "bytes of a layer's output activation at the profile batch size"),
    Term("param_bytes", "bytes of a layer's parameters"),
    Term("step_time_s", "seconds per training iteration (Timeline, results.csv)"),
    Term("recompute_granularity", "activation recomputation, one of RECOMPUTE_GRANULARITIES"),
)
TERMS_BY_NAME: dict[str, Term] = {t.name: t for t in TERMS}


def old_names(name: str) -> tuple[str, ...]:
    """The 0.1 names of the concept called `name` (empty when it kept its name)."""
    term = TERMS_BY_NAME.get(name)
    return term.old_names if term else ()

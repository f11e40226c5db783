"""Plausibility limits: numbers that are well formed but beyond any real machine or
training run (most often a value in the wrong unit), and the bounds that keep every
search and simulation finite whatever the input says.

Each limit comes with the reason an error gives when a value crosses it. The typed
loaders (`paraplan.typed`) and the core constructors read them from here, so a file,
an option and a Python caller meet the same bound.

Memory is bounded by design within these limits (docs/limits.md, measured by
benchmarks/bench_memory.py): `paraplan predict` streams its run table (two passes,
one row at a time, 2,048 candidate settings priced together, 40 bytes kept per row
with a measured time) and `paraplan plan` estimates every candidate in closed form
and re-times one at a time, none over `MAX_SIMULATED_OPS`. Either command's peak is
about 100-150 MB plus the one configuration the engine runs, 60-110 bytes per
pipeline operation: at most about 1.2 GB at any size these limits allow (measured:
897 MB for 65,536 layers on 16,384 GPUs).
"""

from __future__ import annotations

MAX_DEVICES = 2**20
"""Devices of one cluster, study configuration or plan: 1,048,576."""
DEVICES_WHY = "more devices than any machine built (the largest hold about 10^5 accelerators)"

MAX_GLOBAL_BATCH_SIZE = 2**40
"""Samples per iteration: about 1.1e12."""
GLOBAL_BATCH_WHY = "more samples per iteration than any data set holds"
LARGE_GLOBAL_BATCH_SIZE = 2**20
"""Above this a global batch is accepted with a warning: published training runs use
at most tens of thousands of samples per iteration."""

MAX_NUM_MICROBATCHES = 2**14
"""Micro-batches per pipeline copy and iteration that a study simulates or the planner
searches: 16,384 (Megatron-scale runs use at most a few thousand)."""
MICROBATCHES_WHY = "training runs use at most a few thousand; paraplan simulates and searches no more than this"

MAX_SIMULATED_OPS = 2**23
"""Pipeline operations (forward, backward per stage and micro-batch, times chunks and
iterations) of one simulated configuration: about 8.4 million, half a minute to a
minute and up to about 1 GB in the exact engine. The LLM planner estimates candidates
beyond it but does not re-time them (it says how many)."""

MAX_LAYERS = 2**16
"""Layers (or transformer blocks) of one model: 65,536."""
LAYERS_WHY = "more layers than any trained model has (the deepest have a few thousand)"

MAX_WIDTH = 2**24
"""Features, channels, tokens or vocabulary entries of one model dimension."""
WIDTH_WHY = "wider than any trained model (the widest dimensions hold a few hundred thousand)"

MAX_PEAK_TFLOPS = 1e6
PEAK_WHY = "above 1 EFLOP/s per device; wrong unit? (peak_tflops is in TFLOP/s)"
MAX_POWER_LIMIT_W = 10_000.0
POWER_LIMIT_WHY = "above 10 kW for one device; wrong unit? (power_limit_w is in watts)"
MAX_BANDWIDTH_GBPS = 1e6
BANDWIDTH_WHY = "above 1 PB/s; wrong unit? (GB/s, 1e9 bytes per second)"
MAX_MEMORY_GB = 1e6
MEMORY_WHY = "above 1 PB per device; wrong unit? (GB, 1e9 bytes)"
MAX_MEMORY_MIB = 1e9
MEMORY_MIB_WHY = "above 1 PiB per device; wrong unit? (MiB, 2**20 bytes)"
MIN_POSITIVE = 1e-6
"""Smallest peak (TFLOP/s), bandwidth (GB/s) or memory (GB) taken: a MFLOP/s, a KB/s, a KB."""
TINY_WHY = "below 1e-6 (1 MFLOP/s, 1 KB/s or 1 KB); wrong unit?"
MAX_LATENCY_US = 1e9
LATENCY_WHY = "above 1000 s per message; wrong unit? (microseconds)"
MAX_SECONDS = 1e6
SECONDS_WHY = "above 11 days; wrong unit? (seconds)"

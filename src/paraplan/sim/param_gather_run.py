"""Where the interleaved schedule's weight all-gathers (`overlap_param_gather`) run, on the
engine's run of the iteration, and what they add to each pipeline rank's end.

Megatron-Core with the interleaved schedule launches each model chunk's parameter
all-gather from the schedule (`align_param_gather`, on by default there;
`forward_backward_pipelining_with_interleaving` in
`megatron/core/pipeline_parallel/schedules.py`): chunks 0 and 1 at the start of the
iteration, chunk c >= 2 when the rank starts its forward of virtual micro-batch
j - r, j the schedule table's first virtual micro-batch of chunk c - 1 and r the
pipeline rank (so every rank launches it when the first rank starts chunk c - 1). The
forward pre-hook of a chunk's first forward waits for that chunk's gather. One
communicator runs them one after another. docs/fsdp.md (parameter all-gather placement)
gives the source lines.

So a gather runs from its launch (or the end of the gather before it) to its chunk's
first forward; what it adds to the rank:
- the time that forward waits for it (its lateness: every later op of the rank starts
  that much later, which also gives the later gathers that much more room);
- the occupancy share x the time it runs beside the rank's ops, as every overlapped
  collective (`overlap_cost`): while the compute stream is idle (the rank waiting for
  micro-batch 0 to come round) it slows nothing.
Both land on the rank's end, as the gradient buckets' contention does (`overlap_cost`):
not passed on to the ranks that wait for its ops (a lower bound there).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from paraplan.sim.overlap_cost import overlap_with_ops_s
from paraplan.sim.schedules import FWD

FIRST_LAUNCHED_CHUNKS = 2
"""Model chunks whose gathers start with the iteration (`param_sync_func[0]`, `[1]`)."""


@dataclass(frozen=True, eq=False)
class ChunkGathers:
    """The weight all-gather of each model chunk of each pipeline rank: `chunk_s[r, c]`
    seconds (dense over the sharding group plus the experts' over theirs), and the share
    of its time beside the rank's ops that those ops lose (`overlap_share`)."""

    chunk_s: np.ndarray  # (pipeline ranks, model chunks)
    share: float


@dataclass(frozen=True, eq=False)
class PlacedGathers:
    """One rank's chunk gathers as placed: what they add to its end, and when each ran, in
    the run's time (the rank's ops as the engine ran them; a gather its chunk's first
    forward waits for runs past that forward's start there)."""

    added_s: float
    start_s: np.ndarray
    end_s: np.ndarray


def place_gathers(chunk_s: np.ndarray, rank: int, fwd_start_s: np.ndarray, fwd_chunk: np.ndarray,
                  op_start_s: np.ndarray, op_end_s: np.ndarray, share: float) -> PlacedGathers:
    """One rank's chunk gathers (`chunk_s`, per chunk) placed as the module doc says.
    `fwd_start_s`, `fwd_chunk`: the rank's forward ops in the order it runs them (its
    virtual micro-batches); `op_start_s`, `op_end_s`: all its ops."""
    v = chunk_s.shape[0]
    first = np.array([int(np.argmax(fwd_chunk == c)) for c in range(v)])
    deadline = fwd_start_s[first]
    shift = 0.0  # how much later the rank's ops run than in the run, from waiting for gathers
    clock = 0.0  # when the communicator is free
    starts, ends, beside_ends = [], [], []
    for c in range(v):
        if c < FIRST_LAUNCHED_CHUNKS:
            launch = 0.0
        else:
            k = int(first[c - 1]) - rank
            launch = float(fwd_start_s[k]) + shift if k >= 0 else float(deadline[c]) + shift  # pre-hook: on demand
        start = max(launch, clock)
        clock = start + float(chunk_s[c])
        due = float(deadline[c]) + shift
        # in the run's time: the ops beside it have run `shift` later; past its chunk's forward the rank waits
        starts.append(start - shift)
        ends.append(clock - shift)
        beside_ends.append(min(clock, due) - shift)
        shift += max(clock - due, 0.0)
    a, b = np.array(starts), np.array(beside_ends)
    keep = b > a
    beside = overlap_with_ops_s(a[keep], b[keep], op_start_s, op_end_s) if keep.any() else 0.0
    return PlacedGathers(shift + share * beside, a, np.array(ends))


def gather_added_s(chunk_s: np.ndarray, rank: int, fwd_start_s: np.ndarray, fwd_chunk: np.ndarray,
                   op_start_s: np.ndarray, op_end_s: np.ndarray, share: float) -> float:
    """What one rank's chunk gathers add to its end (`place_gathers`)."""
    return place_gathers(chunk_s, rank, fwd_start_s, fwd_chunk, op_start_s, op_end_s, share).added_s


def run_gathers(gathers: ChunkGathers, run, p: int) -> list[PlacedGathers]:
    """Per pipeline rank: `place_gathers` on the engine's run (`engine.PipelineRun`)."""
    order = np.lexsort((run.start_s, run.device))  # rank by rank, each in the order it runs its ops
    bounds = np.searchsorted(run.device[order], np.arange(p + 1))
    kind, start, end, chunk = run.kind[order], run.start_s[order], run.end_s[order], run.vstage[order] // p
    out = []
    for r in range(p):
        mine = slice(int(bounds[r]), int(bounds[r + 1]))
        fwd = kind[mine] == FWD
        out.append(place_gathers(gathers.chunk_s[r], r, start[mine][fwd], chunk[mine][fwd], start[mine], end[mine],
                                 gathers.share))
    return out


def run_gather_added_s(gathers: ChunkGathers, run, p: int) -> np.ndarray:
    """Per pipeline rank: what its gathers add to its end (`run_gathers`)."""
    return np.array([g.added_s for g in run_gathers(gathers, run, p)])

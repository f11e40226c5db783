"""Predictions for run-table rows: iteration time, throughput, MFU, memory, bubble.

A row with an empty micro-batch size (or virtual pipeline size) is predicted for
every value it could take and answered with the fastest that fits in device
memory (or, when none fits, the one that needs the least memory, marked as not
fitting): what a tuned run would use.

Metrics:
- `tflops_per_gpu`: model FLOPs per iteration as Megatron-LM's paper counts them
  (`TransformerModel.model_flops_per_iteration`: with the recomputed forward when
  recomputation is full) / iteration time / GPUs;
- `mfu`: 6 x parameters x tokens / iteration time / GPUs / the dtype's dense peak;
- memory: the largest peak over pipeline ranks, the rank it is on and what that rank
  holds at that moment, in parts that add up to it (`peak_memory.PeakMemory`);
- plausibility (`plausibility`): an MFU above the device's GEMM ceiling (the
  calibration's `gemm_efficiency`: the largest GEMMs' share of the peak) or above
  `MAX_PUBLISHED_MFU` for a full training step is outside anything measured.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace

from paraplan.core.cluster import Cluster
from paraplan.core.comm import CommModel
from paraplan.core.errors import StrategyError
from paraplan.core.run_settings import RunSettings, interleaved_uneven_split
from paraplan.core.transformer import TransformerModel
from paraplan.predict.build import kernel_times_by_pass, price, run_structure
from paraplan.predict.device_model import DeviceEfficiency, DeviceSpeed
from paraplan.predict.partial_recompute import recomputed_layer_share
from paraplan.predict.peak_memory import PeakMemory
from paraplan.predict.runtable import RunRow
from paraplan.sim.execution import IterationResult, run_iteration

MAX_PUBLISHED_MFU = 0.65
"""Above this MFU no published full training step runs (the best published dense-model
runs reach 0.4-0.57 of peak: Megatron-LM SC21 52% with recomputation counted, Korthikanti et al.
2022 56.3% MFU at 1T parameters)."""
UNEVEN_SPLIT_COLUMNS = ("decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers")


@dataclass(frozen=True)
class RunPrediction:
    iteration_s: float
    tflops_per_gpu: float
    mfu: float
    peak_memory_bytes: float  # the largest over pipeline ranks
    peak_memory: PeakMemory  # that rank and its parts at its peak
    bubble_fraction: float
    fits_memory: bool
    memory_capacity_bytes: float
    settings: RunSettings  # with the micro-batch size and v that were predicted
    chosen: tuple[str, ...] = ()  # settings the predictor chose (empty cells)


def divisors(n: int) -> list[int]:
    small = [k for k in range(1, int(n**0.5) + 1) if n % k == 0]
    return sorted({*small, *(n // k for k in small)})


def candidate_settings(model: TransformerModel, settings: RunSettings, search_micro_batch_size: bool,
                       search_virtual_stages: bool) -> list[RunSettings]:
    """Every setting a row stands for (one, unless a size is searched)."""
    d, p = settings.data_parallel_size, settings.pipeline_model_parallel_size
    per_replica = settings.global_batch_size // d if settings.global_batch_size % d == 0 else 0
    mbs = divisors(per_replica) if search_micro_batch_size and per_replica else [settings.micro_batch_size]
    first, last = settings.decoder_first_pipeline_num_layers, settings.decoder_last_pipeline_num_layers
    splits: list[tuple[int, int, int]] = []  # (v, first, last)
    if search_virtual_stages:
        splits.append((1, first, last))
        for v in range(2, settings.pipeline_split_slots(model.num_layers) // p + 1) if p > 1 else ():
            split = (first, last) if settings.explicit_pipeline_split else interleaved_uneven_split(
                model.num_layers, p, v)
            if split is not None:
                splits.append((v, *split))
    else:
        splits.append((settings.virtual_pipeline_model_parallel_size, first, last))
    out = []
    for b in mbs:
        for v, f, la in splits:
            schedule = settings.schedule if not search_virtual_stages else ("interleaved_1f1b" if v > 1 else "")
            candidate = replace(settings, micro_batch_size=b, virtual_pipeline_model_parallel_size=v,
                                schedule=schedule, decoder_first_pipeline_num_layers=f,
                                decoder_last_pipeline_num_layers=la)
            try:
                candidate.check(model)
            except StrategyError:
                continue
            out.append(candidate)
    return out


def summarize(model: TransformerModel, settings: RunSettings, result: IterationResult, cluster: Cluster,
              chosen: tuple[str, ...] = ()) -> RunPrediction:
    gpus = settings.num_gpus
    seconds = result.iteration_s
    flops = model.model_flops_per_iteration(settings.global_batch_size, recomputed_layer_share(model, settings))
    peak = DeviceSpeed.of(cluster.device, settings.dtype).peak_flops
    mfu_flops = model.mfu_flops_per_iteration(settings.global_batch_size)
    memory = float(result.peak_memory_bytes.max())
    capacity = float(cluster.device.usable_memory_bytes)
    return RunPrediction(
        iteration_s=seconds,
        tflops_per_gpu=flops / seconds / gpus / 1e12,
        mfu=mfu_flops / seconds / gpus / peak,
        peak_memory_bytes=memory,
        peak_memory=PeakMemory.of(result),
        bubble_fraction=result.bubble_fraction,
        fits_memory=memory <= capacity,
        memory_capacity_bytes=capacity,
        settings=settings,
        chosen=chosen,
    )


def predict_settings(model: TransformerModel, settings: Sequence[RunSettings], cluster: Cluster, comm: CommModel,
                     efficiency: DeviceEfficiency) -> list[tuple[IterationResult, RunSettings]]:
    """Iteration results of many settings of one model, priced in one batch."""
    structures = [run_structure(model, s, cluster, comm) for s in settings]
    kernel_s = kernel_times_by_pass(structures, efficiency)
    return [(run_iteration(price(st, k, efficiency), timeline=False), s)
            for st, k, s in zip(structures, kernel_s, settings, strict=True)]


def _pick(model: TransformerModel, results: list[tuple[IterationResult, RunSettings]], cluster: Cluster,
          chosen: tuple[str, ...]) -> RunPrediction:
    capacity = cluster.device.usable_memory_bytes
    fitting = [(r, s) for r, s in results if r.peak_memory_bytes.max() <= capacity]
    if fitting:
        best = min(fitting, key=lambda rs: rs[0].iteration_s)
    else:
        best = min(results, key=lambda rs: rs[0].peak_memory_bytes.max())
    return summarize(model, best[1], best[0], cluster, chosen)


PREDICT_CHUNK_CANDIDATES = 2048
"""Candidate settings (a row stands for one, or for every micro-batch size / virtual
pipeline size it searches) priced together in one vectorised batch: the memory of
`predict_rows` and `iter_predictions` is that of this many candidates (a few MB) or
of one row's candidates, whatever the table's length; larger batches are not faster
(the engine run of each candidate dominates)."""


def predict_rows(rows: Sequence[RunRow], cluster: Cluster, comm: CommModel, efficiency: DeviceEfficiency,
                 progress: Callable[[int], None] | None = None) -> list[RunPrediction]:
    """One prediction per row (see the module doc), priced in vectorised chunks
    (`PREDICT_CHUNK_CANDIDATES`)."""
    return [pred for _, pred in iter_predictions(rows, cluster, comm, efficiency, progress=progress)]


class RunRowError(StrategyError):
    """A row of a run table that parses but cannot be priced: its line, its name and why
    (the CLI reads it as `FILE:LINE: impossible run (NAME): why`, as a parse error reads)."""

    def __init__(self, line: int, name: str, reason: str):
        self.line, self.name, self.reason = line, name, reason
        super().__init__(f"line {line}" + (f" ({name})" if name else "") + f": {reason}")


def iter_predictions(rows: Iterable[RunRow], cluster: Cluster, comm: CommModel, efficiency: DeviceEfficiency,
                     chunk_candidates: int = PREDICT_CHUNK_CANDIDATES,
                     progress: Callable[[int], None] | None = None) -> Iterator[tuple[RunRow, RunPrediction]]:
    """(row, prediction) for every row, in order, reading `rows` (any iterable, e.g.
    `runtable.iter_run_table`) as far as `chunk_candidates` candidate settings at a
    time: memory bounded by one chunk. A row's prediction does not depend on the rows
    priced beside it, so any chunking gives the same numbers."""
    if chunk_candidates < 1:
        raise ValueError(f"chunk_candidates must be >= 1, got {chunk_candidates}")
    pending: list[tuple[RunRow, list[RunSettings]]] = []
    size = 0
    for row in rows:
        cands = candidate_settings(row.model, row.settings, row.search_micro_batch_size, row.search_virtual_stages)
        if not cands:
            raise RunRowError(row.line, row.name, "no micro-batch size / virtual pipeline size can run this row")
        pending.append((row, cands))
        size += len(cands)
        if size >= chunk_candidates:
            yield from _predict_chunk(pending, cluster, comm, efficiency, progress)
            pending, size = [], 0
    if pending:
        yield from _predict_chunk(pending, cluster, comm, efficiency, progress)


def _predict_chunk(pending: list[tuple[RunRow, list[RunSettings]]], cluster: Cluster, comm: CommModel,
                   efficiency: DeviceEfficiency, progress: Callable[[int], None] | None
                   ) -> list[tuple[RunRow, RunPrediction]]:
    rows = [row for row, _ in pending]
    per_row = [cands for _, cands in pending]
    structures = []
    for row, cands in zip(rows, per_row, strict=True):
        try:
            structures += [run_structure(row.model, s, cluster, comm) for s in cands]
        except StrategyError as exc:
            raise RunRowError(row.line, row.name, str(exc)) from None
    kernel_s = kernel_times_by_pass(structures, efficiency)
    out = []
    k = 0
    for row, cands in zip(rows, per_row, strict=True):
        results = []
        for s in cands:
            results.append((run_iteration(price(structures[k], kernel_s[k], efficiency), timeline=False), s))
            k += 1
        chosen = tuple(name for name, searched in (("micro_batch_size", row.search_micro_batch_size),
                                                   ("virtual_pipeline_model_parallel_size",
                                                    row.search_virtual_stages)) if searched)
        pick = _pick(row.model, results, cluster, chosen)
        if row.search_virtual_stages and pick.settings.uneven_pipeline_split and not row.settings.uneven_pipeline_split:
            pick = replace(pick, chosen=(*chosen, *UNEVEN_SPLIT_COLUMNS))
        out.append((row, pick))
        if progress:
            progress(1)
    return out


def plausibility(mfu: float, efficiency: DeviceEfficiency) -> str:
    """Empty when the MFU is plausible; else why it is not (module doc)."""
    reasons = []
    if mfu > efficiency.gemm_efficiency:
        reasons.append(f"above the device's GEMM ceiling ({efficiency.gemm_efficiency:.1%} of peak)")
    if mfu > MAX_PUBLISHED_MFU:
        reasons.append(f"above {MAX_PUBLISHED_MFU:.0%}, more than any published full training step")
    return f"MFU {mfu:.1%} is " + " and ".join(reasons) if reasons else ""

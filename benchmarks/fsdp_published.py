"""The FSDP sections of `bench_published.py` (test sets only: nothing is fitted on them):

- torchtitan's Llama 3.1 H100 benchmarks (`data/torchtitan_llama31_h100.csv`): per row,
  tokens/s per GPU and peak memory per GPU, published vs predicted, the error of each
  (predicted / published - 1) and their MAPE over the expressible rows; the rows paraplan
  cannot express are counted by reason;
- for reference, never counted: the NeMo AutoModel mixture-of-experts rows that state
  their EP size (FSDP2 with experts), predicted with Megatron-Core's all-to-all
  dispatcher in place of DeepEP, the one thing that keeps them not expressible.
"""

from __future__ import annotations

import csv
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from published import ANNOTATIONS, DATA, PublishedRow

from paraplan.clusters import load_cluster
from paraplan.core.errors import StrategyError
from paraplan.predict.calibration import Calibration
from paraplan.predict.predictor import RunPrediction, predict_rows
from paraplan.predict.runtable import KNOWN, read_run_table

TORCHTITAN_TABLE = "torchtitan_llama31_h100"
AUTOMODEL_TABLE = "automodel_h100_moe"
DEEPEP_ONLY = "DeepEP"  # the rows whose one reason is about DeepEP (docs/moe.md) start with it
GIB = 2**30


@dataclass(frozen=True)
class ThroughputMemory:
    """One predicted row: tokens/s per GPU and peak GiB per GPU, published and predicted."""

    name: str
    tokens_published: float
    tokens_predicted: float
    memory_published_gib: float | None
    memory_predicted_gib: float
    settings_text: str

    @property
    def tokens_error(self) -> float:
        return self.tokens_predicted / self.tokens_published - 1

    @property
    def memory_error(self) -> float | None:
        if self.memory_published_gib is None:
            return None
        return self.memory_predicted_gib / self.memory_published_gib - 1


def tokens_per_gpu_s(row: PublishedRow, pred: RunPrediction) -> float:
    s, m = pred.settings, row.run.model if row.run is not None else None
    assert m is not None
    return s.global_batch_size * m.seq_length / (pred.iteration_s * s.num_gpus)


def throughput_memory(row: PublishedRow, pred: RunPrediction) -> ThroughputMemory:
    memory = row.annotations.get("published_peak_memory_GiB", "")
    s = pred.settings
    text = (f"t{s.tensor_model_parallel_size} p{s.pipeline_model_parallel_size} d{s.data_parallel_size}"
            f"{f' c{s.context_parallel_size}' if s.context_parallel_size > 1 else ''} b{s.micro_batch_size}")
    return ThroughputMemory(row.name, float(row.annotations["published_value"]), tokens_per_gpu_s(row, pred),
                            float(memory) if memory else None, pred.peak_memory_bytes / GIB, text)


def _mape(errors: list[float]) -> str:
    if not errors:
        return "no rows"
    e = np.array(errors)
    return (f"{len(e)} rows, mean signed error {e.mean():+.1%}, MAPE {np.abs(e).mean():.1%}, "
            f"max error {e[np.argmax(np.abs(e))]:+.1%}")


def torchtitan_check(rows: list[PublishedRow], predictions: list[RunPrediction | None]) -> None:
    """Tokens/s per GPU and peak memory per GPU of torchtitan's table, published vs
    predicted (`predictions`: bench_published's, one per row, None where not predicted)."""
    print("\n== torchtitan Llama 3.1 on H100 (benchmarks/llama3_h100_202412_torchtitan.md): tokens/s per GPU and "
          "peak memory per GPU, published vs predicted (error = predicted / published - 1)")
    print(f"   {'run':34s} {'tok/s/GPU':>9s} {'pred':>7s} {'error':>7s}  {'GiB':>5s} {'pred':>6s} {'error':>7s}  "
          "settings")
    done: list[ThroughputMemory] = []
    reasons: Counter[str] = Counter()
    notes: set[str] = set()
    for row, pred in zip(rows, predictions, strict=True):
        if row.run is None or pred is None:
            for reason in row.not_expressible.split("; "):
                reasons[reason.split(" (")[0]] += 1
            continue
        tm = throughput_memory(row, pred)
        done.append(tm)
        notes.update(clause.strip() for clause in row.annotations.get("note", "").split("; "))
        memory = (f"{tm.memory_published_gib:5.1f} {tm.memory_predicted_gib:6.1f} {tm.memory_error:+7.1%}"
                  if tm.memory_error is not None else f"{'-':>5s} {tm.memory_predicted_gib:6.1f} {'-':>7s}")
        usable_gib = pred.memory_capacity_bytes / GIB
        fits = "" if pred.fits_memory else f" (over the {usable_gib:.1f} GiB usable per GPU)"
        print(f"   {tm.name[:34]:34s} {tm.tokens_published:9.0f} {tm.tokens_predicted:7.0f} {tm.tokens_error:+7.1%}  "
              f"{memory}  {tm.settings_text}{fits}")
    print(f"   throughput: {_mape([t.tokens_error for t in done])}")
    print(f"   memory:     {_mape([t.memory_error for t in done if t.memory_error is not None])}")
    print(f"   not expressible: {len(rows) - len(done)} of {len(rows)} rows"
          + "".join(f"; {reason}: {n}" for reason, n in reasons.most_common()))
    if notes - {""}:
        print("   assumed (each once, from the rows' notes):")
    for note in sorted(n for n in notes if n):
        print(f"     - {note}")


def _reference_rows(path: Path, reason: str) -> tuple[list[dict[str, str]], list]:
    """The rows of a published table whose only reason starts with `reason`, read as run rows."""
    with path.open(newline="", encoding="utf-8") as handle:
        records = [r for r in csv.DictReader(handle) if (r.get("not_expressible") or "").strip().startswith(reason)]
    if not records:
        return [], []
    columns = [c for c in records[0] if c in KNOWN and c not in ANNOTATIONS]
    with tempfile.TemporaryDirectory() as tmp:
        run_path = Path(tmp) / path.name
        with run_path.open("w", newline="", encoding="utf-8") as handle:
            writer = csv.DictWriter(handle, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
            writer.writeheader()
            writer.writerows(records)
        _, runs = read_run_table(run_path)
    return records, runs


def automodel_reference(calibration: Calibration) -> None:
    """AutoModel's FSDP2 + EP rows, DeepEP priced as Megatron-Core's all-to-all (reference)."""
    records, runs = _reference_rows(DATA / f"{AUTOMODEL_TABLE}.csv", DEEPEP_ONLY)
    if not runs:
        return
    cluster = load_cluster("dgx-h100")
    print("\n== NeMo AutoModel, FSDP2 with experts sharded over the expert-data-parallel group (reference, not "
          "counted: "
          "DeepEP priced as Megatron-Core's all-to-all)")
    print(f"   {'run':34s} {'GPUs':>5s} {'measured s':>10s} {'predicted s':>11s} {'error':>7s}  peak GiB")
    for record, run in zip(records, runs, strict=True):
        try:
            pred = predict_rows([run], cluster, calibration.comm_model(cluster), calibration.efficiency)[0]
        except StrategyError as exc:
            print(f"   {record['name'][:34]:34s} failed: {exc}")
            continue
        measured = run.measured_iteration_s or float("nan")
        over = f" (over the {pred.memory_capacity_bytes / GIB:.1f} GiB usable of dgx-h100)"
        print(f"   {record['name'][:34]:34s} {run.settings.num_gpus:5d} {measured:10.4g} {pred.iteration_s:11.4g} "
              f"{pred.iteration_s / measured - 1:+7.1%}  {pred.peak_memory_bytes / GIB:.0f}"
              f"{'' if pred.fits_memory else over}")

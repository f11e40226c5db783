"""The published training measurements under `benchmarks/data/` (test sets: nothing is
fitted on them) and the conversions from what the papers publish to iteration seconds.

A table is a paraplan run table (Megatron-LM argument names, `paraplan predict`'s
columns) plus annotation columns that keep what was published and where:

- `published_value`, `published_unit`: the number as printed (`s`, `ms`, `TFLOP/s/GPU`);
- `flops_convention`: for a throughput, the FLOP count the authors divided by time
  (`sc21_with_recompute`, `megatron_model` or `palm`), so `measured_iteration_s` = FLOPs per iteration / (value x GPUs);
- `source`: paper or repository, table and row;
- `note`: framework behaviour the run table cannot state yet (kept for the reader);
- `not_expressible`: why paraplan cannot express the run as its authors ran it; such a
  row is listed, never predicted, and counts in no error figure;
- `published_peak_memory_GiB`: peak memory per GPU as printed, where the source prints it
  (torchtitan: the maximum over all GPUs).

Throughput in
`tokens/s/GPU` converts as `measured_iteration_s` = global batch x sequence / (value x
GPUs); `GPU-hours per 1e12 tokens` as global batch x sequence x value x 3600 / (1e12 x
GPUs).

`load_table` splits the two kinds of columns and reads the run-table part through
`paraplan.predict.runtable.read_run_table`, so a schema change there breaks here loudly.
"""

from __future__ import annotations

import csv
import io
import tempfile
from dataclasses import dataclass
from pathlib import Path

from paraplan.predict.runtable import KNOWN, RunRow, read_run_table

DATA = Path(__file__).resolve().parent / "data"
ANNOTATIONS: tuple[str, ...] = ("published_value", "published_unit", "flops_convention", "source", "note",
                                "not_expressible", "published_peak_memory_GiB")
TABLES: dict[str, tuple[str, str]] = {
    # file stem: (cluster, what it is)
    "megatron_sc21_table1": ("dgx-a100", "Megatron-LM SC21 Table 1, weak scaling, A100 (32-3,072 GPUs)"),
    "korthikanti2022_table5": ("dgx-a100", "Korthikanti et al. 2022 Table 5 (+ Sec. 6.3 DP8 row), A100 (8-2,240)"),
    "megatron_core_h100_weak_scaling": ("dgx-h100", "Megatron-Core weak scaling, H100 (48-6,144 GPUs)"),
    "megatron_deepspeed_vtrain_multinode": ("vtrain-a100", "Megatron-DeepSpeed multi-node (vTrain), A100 (64-512)"),
    "llama3_405b_table4": ("dgx-h100", "Llama 3 405B, Dubey et al. 2024 Table 4, H100 (8,192-16,384)"),
    "megatron_bridge_h100_moe": ("dgx-h100", "Megatron-Bridge performance summaries, MoE on H100 (16-1,024)"),
    "automodel_h100_moe": ("dgx-h100", "NeMo AutoModel performance summary, MoE on H100, BF16 (8-1,024)"),
    "deepseek_v3_report": ("dgx-h800", "DeepSeek-V3 technical report, pre-training on 2,048 H800"),
    "megatron_bridge_h100_llama3_fp8": ("dgx-h100",
                                        "Megatron-Bridge performance summaries, Llama 3 FP8 on H100 (8-1,024)"),
    "torchtitan_llama31_h100": ("grand-teton-h100-500w",  # Meta's 96 GB HBM2e H100s at 500 W
                                "torchtitan Llama 3.1 8B/70B/405B, FSDP2 (+TP/PP/CP), H100 (8-512)"),
}
MOE_TABLES: tuple[str, ...] = ("megatron_bridge_h100_moe", "automodel_h100_moe", "deepseek_v3_report")


@dataclass(frozen=True)
class PublishedRow:
    """One published run: its annotations and, unless it is not expressible, the run row."""

    name: str
    annotations: dict[str, str]
    run: RunRow | None  # None when the row is not expressible
    cells: dict[str, str]  # the row as written (every column)

    @property
    def not_expressible(self) -> str:
        return self.annotations.get("not_expressible", "")


def sc21_flops(batch: int, seq: int, layers: int, hidden: int, vocab: int) -> float:
    """FLOPs per iteration as Narayanan et al. 2021 (SC21) count them, eq. (3): with the
    recomputed forward of full activation recomputation, 96 B s l h^2 (1 + s/6h + V/16lh)."""
    return 96.0 * batch * seq * layers * hidden**2 * (1 + seq / (6 * hidden) + vocab / (16 * layers * hidden))


def megatron_model_flops(batch: int, seq: int, layers: int, hidden: int, vocab: int, ffn_hidden: int | None = None,
                         heads: int = 1, query_groups: int | None = None, swiglu: bool = False) -> float:
    """Model FLOPs per iteration (no recomputation) as Megatron-LM's
    `num_floating_point_operations` counts them (megatron/training/training.py, July 2024);
    for a GPT with a 4h MLP this is Korthikanti et al. 2022's 72 B s l h^2 (1 + s/6h + V/12lh)."""
    ffn = 4 * hidden if ffn_hidden is None else ffn_hidden
    groups = heads if query_groups is None else query_groups
    gated = 1.5 if swiglu else 1.0
    return 12.0 * batch * seq * layers * hidden**2 * (
        (1 + groups / heads + seq / hidden) + ffn / hidden * gated + vocab / (2 * layers * hidden))


def palm_flops(tokens: int, parameters: int, layers: int, hidden: int, seq: int) -> float:
    """Model FLOPs as Chowdhery et al. 2022 (PaLM, Appendix B) count them, which Llama 3
    cites for its MFU: (6 N + 12 L H Q T) per token, H Q = the hidden size."""
    return float(tokens) * (6.0 * parameters + 12.0 * layers * hidden * seq)


def published_seconds(cells: dict[str, str]) -> float | None:
    """The iteration time a throughput in tokens (or GPU-hours per token) stands for,
    from the row's own cells; None for the other units."""
    unit, value = cells.get("published_unit", ""), float(cells.get("published_value") or "nan")
    tokens = float(cells["global_batch_size"]) * float(cells["seq_length"])
    gpus = float(cells["num_gpus"])
    if unit == "tokens/s/GPU":
        return tokens / (value * gpus)
    if unit == "GPU-hours per 1e12 tokens":
        return tokens * value * 3600 / (1e12 * gpus)
    return None


def _split(path: Path) -> tuple[str, list[dict[str, str]]]:
    """The run-table CSV text (annotation columns removed, not-expressible rows dropped)
    and every row's annotations, in file order."""
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        header = list(reader.fieldnames or [])
        records = list(reader)
    unknown = [c for c in header if c not in KNOWN and c not in ANNOTATIONS]
    if unknown:
        raise ValueError(f"{path}: column '{unknown[0]}' is neither a run-table column nor an annotation "
                         f"({', '.join(ANNOTATIONS)})")
    run_columns = [c for c in header if c in KNOWN]
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=run_columns, lineterminator="\n", extrasaction="ignore")
    writer.writeheader()
    notes = []
    for record in records:
        annotations = {c: (record.get(c) or "").strip() for c in ANNOTATIONS if c in header}
        annotations["name"] = (record.get("name") or "").strip()
        notes.append(annotations)
        if not annotations.get("not_expressible"):
            writer.writerow(record)
    return out.getvalue(), notes


def load_table(path: str | Path) -> list[PublishedRow]:
    """Every row of a published table (see the module doc)."""
    path = Path(path)
    text, notes = _split(path)
    with path.open(newline="", encoding="utf-8") as handle:
        raw = [{k: (v or "").strip() for k, v in r.items()} for r in csv.DictReader(handle)]
    runs: list[RunRow] = []
    if any(not n.get("not_expressible") for n in notes):
        with tempfile.TemporaryDirectory() as tmp:
            run_path = Path(tmp) / path.name
            run_path.write_text(text, encoding="utf-8")
            _, runs = read_run_table(run_path)
    rows, k = [], 0
    for note, cells in zip(notes, raw, strict=True):
        run = None
        if not note.get("not_expressible"):
            run = runs[k]
            k += 1
        rows.append(PublishedRow(note["name"], note, run, cells))
    return rows


def table_paths(data: Path = DATA) -> dict[str, Path]:
    return {stem: data / f"{stem}.csv" for stem in TABLES}

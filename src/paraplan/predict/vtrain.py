"""vTrain's measured iteration times (VIA-Research/vTrain `data/ground_truth_*.csv`)
as a paraplan run table.

Columns in: `# GPUs, global batch, micro batch, hidden size, attention heads,
# layers, sequence length, tensor parallelism, data parallelism, pipeline
parallelism, iteration time (ms)`. What the file does not say is taken from
vTrain's repository and written into every row (`ASSUMPTIONS`): GPT-2's
vocabulary (50,257), Megatron-DeepSpeed's GPT (learned positions, LayerNorm,
biases, dropout 0.1, tied embeddings), full activation recomputation of every
layer, fp16, 1F1B, the unfused attention path (baddbmm, fused scale-mask-softmax,
dropout, bmm), no overlap of the gradient all-reduce (`use_gradient_bucket`
false), and the backward tensor-parallel all-reduce blocking (Megatron-DeepSpeed turns
`async_tensor_model_parallel_allreduce` off whenever it runs under DeepSpeed), and
DeepSpeed's pipeline engine's transfers: activations and gradients partitioned over the
tensor-parallel ranks and all-gathered by the receiver (`is_pipe_partitioned`,
`is_grad_partitioned`), sent with `dist.send` / `dist.recv` and no
`torch.cuda.synchronize()` (`scatter_gather_tensors_in_pipeline` true, `batch_p2p_sync`
false).
"""

from __future__ import annotations

from pathlib import Path

from paraplan.core.errors import InputFileError
from paraplan.inputs import NumberRule, parse_number, read_csv_table, read_text

COLUMNS: dict[str, str] = {
    "# GPUs": "num_gpus",
    "global batch": "global_batch_size",
    "micro batch": "micro_batch_size",
    "hidden size": "hidden_size",
    "attention heads": "num_attention_heads",
    "# layers": "num_layers",
    "sequence length": "seq_length",
    "tensor parallelism": "tensor_model_parallel_size",
    "data parallelism": "data_parallel_size",
    "pipeline parallelism": "pipeline_model_parallel_size",
}
TIME_COLUMN = "iteration time (ms)"
ASSUMPTIONS: dict[str, str] = {
    "vocab_size": "50257",
    "recompute_granularity": "full",
    "dtype": "fp16",
    "use_flash_attn": "false",
    "overlap_grad_reduce": "false",
    "schedule": "1f1b",
    "async_tensor_model_parallel_allreduce": "false",
    "scatter_gather_tensors_in_pipeline": "true",
    "batch_p2p_sync": "false",
}
RUN_TABLE_COLUMNS: tuple[str, ...] = ("name", *COLUMNS.values(), *ASSUMPTIONS, "measured_iteration_s")


_COUNT = NumberRule("a count", 1, 2**40, integer=True)
_MS = NumberRule("a time in ms", 0, 1e10, low_inclusive=False)


def read_vtrain(path: str | Path) -> list[dict[str, str]]:
    """Rows of the run table (strings, in `RUN_TABLE_COLUMNS`). The file is read as every
    input is (`paraplan.inputs`): UTF-8 with or without a byte-order mark, each column
    once, each record as wide as the header, whole numbers in plain ASCII digits."""
    path = Path(path)
    text = read_text(path, "a vTrain measurement CSV (its data/ground_truth_*.csv)")
    table = read_csv_table(text, path, required=(*COLUMNS, TIME_COLUMN))
    rows = []
    for line, cells in table.records:
        row = {target: str(parse_number(path, line, f"column '{source}'", cells[source], _COUNT))
               for source, target in COLUMNS.items()}
        ms = parse_number(path, line, f"column '{TIME_COLUMN}'", cells[TIME_COLUMN], _MS)
        name = (f"h{row['hidden_size']}-a{row['num_attention_heads']}-L{row['num_layers']}"
                f"-s{row['seq_length']}")
        rows.append({"name": name, **row, **ASSUMPTIONS, "measured_iteration_s": repr(ms / 1e3)})
    if not rows:
        raise InputFileError(path, "no rows")
    return rows

"""Validate: run real distributed training steps of a profiled model, predict the
same strategies with the simulator, and report predicted / measured - 1.

- `strategies`: the strategy names (`dp`, `dp_overlap`, `pp_1f1b`, `pp_gpipe`, `tp2`).
- `workload`: the profile stage's model as an ordered list of layers, inputs, loss.
- `data_parallel`, `pipeline`, `tensor_parallel`: the real parallel training code
  (contiguous gradient buffer, 2-stage GPipe / 1F1B with send/recv, Megatron split).
- `ranks`: spawns N ranks of a torch.distributed process group (gloo or NCCL).
- `runner`: builds every strategy's step and times them, with the contention
  calibration, in interleaved rounds.
- `predict`: the simulator's prediction of the same runs and its documented
  corrections (contention, overlap on a saturated CPU, tensor-parallel layout).
- `compare`: step-time statistics, the validation table and its metrics (pure).
"""

from paraplan.validate.compare import (
    COLUMNS,
    Measurement,
    rel_err,
    strategy_metrics,
    summarise,
    validation_metrics,
    validation_table,
)
from paraplan.validate.strategies import STRATEGIES

__all__ = [
    "COLUMNS",
    "STRATEGIES",
    "Measurement",
    "rel_err",
    "strategy_metrics",
    "summarise",
    "validation_metrics",
    "validation_table",
]

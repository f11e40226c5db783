"""Validate: run real distributed training steps of a profiled model, predict the
same strategies with the simulator, and report predicted / measured - 1.

- `strategies`: the strategy names (`dp`, `dp_overlap`, `pp_1f1b`, `pp_gpipe`, `tp2`)
  and what each one means.
- `workload`: the model as an ordered list of layers plus its inputs and loss.
- `tensor_parallel`, `pipeline`, `data_parallel`: one training step per strategy.
- `runner`: spawns the ranks (torch.distributed, gloo or NCCL) and times the steps.
- `predict`: the simulator's prediction of the same runs.
- `compare`: measured vs predicted table (pure).
"""

from paraplan.validate.compare import (
    COLUMNS,
    Measurement,
    rel_err,
    summarise,
    validation_metrics,
    validation_table,
)
from paraplan.validate.strategies import STRATEGIES

__all__ = ["COLUMNS", "STRATEGIES", "Measurement", "rel_err", "summarise", "validation_metrics", "validation_table"]

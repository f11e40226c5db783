"""The transformer planner of `paraplan plan --model`: the request (`request`), the
space of Megatron-LM settings (`space`, `experts`), their closed-form estimate
(`layer_table`, `columns`, `estimate`), the search that re-times the best with the
exact engine (`search`) and its CSV rows (`output`)."""

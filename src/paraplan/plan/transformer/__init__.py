"""The transformer planner of `paraplan plan --model`: the space of Megatron-LM
settings and its closed-form estimate (`space`, `experts`), the search that re-times
the best with the exact engine (`search`) and its CSV rows (`output`)."""

"""plan: the two planners of `paraplan plan`.

- `plan.transformer` (`--model`): a transformer on a GPU cluster, searched over
  Megatron-LM's settings (TP, CP, PP, DP, EP, micro-batch, interleaving, schedule,
  recomputation, ZeRO), estimated in closed form and re-timed with `paraplan.predict`;
- `plan.hybrid` (`--profile`, `--study`): DAPPLE-style hybrid pipeline x data plans of
  a layer profile, an exact search with baselines, verification with the simulator and
  batch-size sweeps."""

"""The profile-driven (DAPPLE-style) hybrid planner: the problem and its objective
(`problem`, `objective`), the exact search (`search` over `labels`, `bounds` and the
dynamic program in `pipelines`), the data-parallel baselines, verification with the
simulator, batch-size sweeps and the request of `paraplan plan --profile`."""

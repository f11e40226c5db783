"""Collective communication: the benchmark harness (`bench`, `bench_rank`, `sizes`,
`a2av`, `results`), log importers and cost-model fitting."""

"""Compute kernels (GEMM, fused attention): the benchmark, the importers of published
tables, and the fit of the device model's ceilings to them (`paraplan bench --kind
gemm|attention`, `paraplan ingest --format mamf`, `paraplan fit --kind kernels`)."""

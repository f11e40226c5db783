"""Studies: named, reproducible questions answered with the stages' pure functions,
kept apart from them (files, published numbers, timing loops, pandas live here, never
in `paraplan.sim` or `paraplan.plan`).

- `simulate_study`, `simulate`: simulation studies (`config/studies/simulate/`):
  DistIR's Figures 3 and 4, the reference schedules.
- `published`: the DistIR paper's published numbers and the comparison with them.
- `plan`: planning studies (`config/studies/plan/`), e.g. DAPPLE's ResNet-50 sweep.
"""

"""plan: DAPPLE-style hybrid (pipeline x data) planning, exact search, baselines,
verification with the simulator and batch-size sweeps."""

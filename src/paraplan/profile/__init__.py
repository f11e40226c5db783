"""Layer profiles: the torch layer profiler, profile files (CSV + meta), the PipeDream
TorchGraph importer/exporter and analytic (FLOPs and bytes) profiles.

A "layer" is the unit a planner may cut at. Profiles are `paraplan.core.ModelProfile`.
"""

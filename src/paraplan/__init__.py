"""paraplan: measure collectives, fit cost models, profile layers, simulate and plan
data/tensor/pipeline parallelism, and track every run in MLflow."""

__version__ = "0.1.0"

"""A plan's peak memory in words, for the lines `paraplan plan --model` prints: the
pipeline rank whose peak is the largest and what it holds then
(`paraplan.predict.peak_memory.PeakMemory`), in GB."""

from __future__ import annotations

from paraplan.predict.peak_memory import PeakMemory


def peak_parts_text(at: PeakMemory) -> str:
    """'pipeline rank 1: 43.9 GB of weights, gradients and optimizer state, 0.0 GB of
    working buffers, 28.0 GB of activations' (gradient accumulators named only where
    the settings have them)."""
    accumulators = (f"{at.gradient_accumulator_bytes / 1e9:.1f} GB of gradient accumulators, "
                    if at.gradient_accumulator_bytes else "")
    return (f"pipeline rank {at.rank}: {at.model_state_bytes / 1e9:.1f} GB of weights, gradients and optimizer "
            f"state, {at.working_bytes / 1e9:.1f} GB of working buffers, {accumulators}"
            f"{at.activation_bytes / 1e9:.1f} GB of activations")

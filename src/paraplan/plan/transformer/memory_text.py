"""A plan's peak memory in words, for the lines `paraplan plan --model` prints: the
pipeline rank whose peak is the largest and what it holds then
(`paraplan.predict.peak_memory.PeakMemory`), in GB; and, for a model that fits nowhere,
what would make it fit, from the largest of those parts."""

from __future__ import annotations

from paraplan.core.run_settings_checks import context_parallel_unpriced
from paraplan.core.transformer import TransformerModel
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


def fits_nowhere_advice(at: PeakMemory, model: TransformerModel, searched_cp: int) -> str:
    """What would make the smallest plan (`at`) fit, from its largest part: its model
    state: more GPUs to shard it over, a smaller model or a larger device; its
    activations, working buffers or gradient accumulators (all grow with the sequence):
    a shorter sequence first, then context parallelism where it is priced for the
    model's attention and was not searched (`searched_cp`: the largest CP degree the
    search tried), then more GPUs or a larger device."""
    parts = {"its weights, gradients and optimizer state": at.model_state_bytes,
             "its working buffers": at.working_bytes, "its gradient accumulators": at.gradient_accumulator_bytes,
             "its activations": at.activation_bytes}
    largest = max(parts, key=lambda name: parts[name])
    if largest == "its weights, gradients and optimizer state":
        return "more GPUs, a smaller model or a device with more memory would do"
    unpriced = context_parallel_unpriced(model)
    cp = ", context parallelism (--context-parallel-sizes, e.g. 1,2,4,8)" if searched_cp == 1 and not unpriced else ""
    text = (f"{largest} are the largest part ({parts[largest] / 1e9:.1f} GB): a shorter sequence than its "
            f"{model.seq_length:,} tokens (--seq-length){cp}, more GPUs or a device with more memory would do")
    if unpriced:
        return f"{text}; context parallelism, which splits a sequence's activations, is not priced for {unpriced}"
    return text

"""`paraplan plan`'s summary line says the MFU with the attention FLOPs beside predict's
6 x parameters x tokens one where attention is a large share (long sequences), so an
MFU of 2% beside 683 TFLOP/s per H100 (Llama 3 8B at 1M tokens) reads as what it is."""

from dataclasses import replace

from paraplan.cli.plan import mfu_text
from paraplan.predict.models import PRESETS


def test_gpt3_at_128k_tokens_counts_attention_as_megatron_does():
    """Megatron-LM's model FLOPs without recomputation, 72 B s l h^2 (1 + s / 6h + V / 12 l h),
    over 6 x parameters x tokens."""
    model = replace(PRESETS["gpt3-175b"], seq_length=131072)
    layers, h, s, v = model.num_layers, model.hidden_size, model.seq_length, model.vocab_size
    ratio = 72 * s * layers * h * h * (1 + s / (6 * h) + v / (12 * layers * h)) / (6 * model.active_parameters * s)
    assert 2.7 < ratio < 2.8  # s / 6h = 1.78: attention is most of the FLOPs
    assert mfu_text(model, 16, 0.10) == (f"MFU 10.0% (6 x parameters x tokens; {0.10 * ratio:.1%} counting the "
                                         "attention FLOPs)")


def test_short_sequences_say_the_mfu_alone():
    """At 2,048 tokens GPT-3 175B's attention adds s / 6h = 2.8% to its FLOPs; at 8,192
    Llama 3 8B's about 20%: the MFU alone."""
    assert mfu_text(PRESETS["gpt3-175b"], 1536, 0.5) == "MFU 50.0%"
    assert mfu_text(PRESETS["llama3-8b"], 256, 0.49) == "MFU 49.0%"

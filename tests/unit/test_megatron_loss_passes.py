"""Megatron-Core's cross-entropy loss (`cross_entropy_impl megatron`) as its source issues
it (`paraplan.predict.loss_ops.megatron_loss_kernels`): per logit, forward the cast
e + 4, max 4, subtract 8, exp 8, sum 4, divide 8 = 36 + e; backward the multiply by
grad_output 8 and the cast back 4 + e = 12 + e (no casts in fp32). Per token, 14 small
forward kernels (187 bytes) and 6 small backward ones (+ the multiply's read of
grad_output: 85 bytes). Three all-reduces in the forward, issued with t = 1 too."""

import numpy as np
import pytest

from paraplan.clusters import load_cluster
from paraplan.core.run_settings import RunSettings
from paraplan.core.transformer import TransformerModel
from paraplan.predict.device_model import DeviceEfficiency, DeviceSpeed, kernel_times_s
from paraplan.predict.edge_ops import head_work
from paraplan.predict.loss_ops import loss_backward, loss_forward, megatron_loss_kernels
from paraplan.predict.work import KernelKind, _Builder

GPT = TransformerModel("gpt", num_layers=4, hidden_size=1024, num_attention_heads=16, seq_length=2048,
                       vocab_size=50304)  # a multiple of 128 x 4: no padding at t = 1, 2, 4
B = 2
TOKENS = B * 2048
A100 = load_cluster("dgx-a100")


def settings(**kw) -> RunSettings:
    return RunSettings(**{"micro_batch_size": B, "global_batch_size": B, **kw})


def _loss(e: int, vocab: float, backward: bool = False) -> tuple[int, float]:
    """Launches and bytes of the loss alone, built into an empty pass."""
    w = _Builder(2)
    (loss_backward if backward else loss_forward)(w, TOKENS, vocab, e, "megatron")
    work = w.build().kernels
    assert (work.kind == KernelKind.MEMORY).all()
    return len(work), float(work.bytes.sum())


@pytest.mark.parametrize(("e", "forward_per_logit", "backward_per_logit", "forward_launches", "backward_launches"), [
    (2, 36 + 2, 12 + 2, 6 + 14, 2 + 6),  # bf16 / fp16 / fp8 runs: 16-bit logits, cast there and back
    (4, 32, 8, 5 + 14, 1 + 6),  # fp32: .float() is the logits themselves, the gradient is not cast
])
def test_closed_form_per_logit_and_per_token(e, forward_per_logit, backward_per_logit, forward_launches,
                                             backward_launches):
    vocab = 50304.0
    assert _loss(e, vocab) == (forward_launches, pytest.approx(forward_per_logit * TOKENS * vocab + 187 * TOKENS))
    assert _loss(e, vocab, backward=True) == (
        backward_launches, pytest.approx(backward_per_logit * TOKENS * vocab + 85 * TOKENS))


def test_passes_over_the_logits_in_source_order():
    """cast, max, subtract (in place), exp (in place), sum, divide (the softmax kept);
    backward multiply by grad_output (in place), cast back: one launch each."""
    forward, backward = megatron_loss_kernels(2)
    assert [k.logit_bytes for k in forward if k.logit_bytes] == [6, 4, 8, 8, 4, 8]
    assert [k.logit_bytes for k in backward if k.logit_bytes] == [8, 6]
    assert [k.op for k in backward if k.logit_bytes] == ["grad_input.mul_(grad_output)", "cast to the logits' dtype"]
    assert sum(1 for k in forward if not k.logit_bytes) == 14  # targets, masks, gather, loss, transposes
    assert sum(1 for k in backward if not k.logit_bytes) == 6  # arange, mask cast, 1 -, gather, subtract, scatter


def test_head_prices_the_loss_kernels_at_the_memory_roofline():
    """The loss's part of the head's forward on an A100 at the t = 4 vocabulary slice:
    (38 x logits + 187 x tokens) / (bandwidth x memory_efficiency) + 20 latencies."""
    t4 = settings(tensor_model_parallel_size=4)
    vocab = GPT.padded_vocab_size(4) / 4
    head = head_work(GPT, t4).forward.kernels
    speed = DeviceSpeed.of(A100.device, "bf16")
    eff = DeviceEfficiency(memory_efficiency=0.8, kernel_latency_s=5e-6)
    times = kernel_times_s(head, speed, eff)
    is_gemm = np.flatnonzero(head.kind == KernelKind.GEMM)
    loss_s = float(times[is_gemm[-1] + 1:].sum())  # everything after the LM head's GEMM
    expected = (38 * TOKENS * vocab + 187 * TOKENS) / (A100.device.mem_bandwidth_Bps * 0.8) + 20 * 5e-6
    assert loss_s == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("t", [1, 4])
def test_three_small_all_reduces_with_any_tensor_parallel_size(t):
    """max, predicted logit, sum of exponentials: per-token fp32 values; with t = 1 on a
    group of one rank (Megatron calls them regardless), which costs host time only."""
    forward = head_work(GPT, settings(tensor_model_parallel_size=t)).forward
    reduces = [c for c in forward.collectives if c.collective == "all_reduce" and c.nbytes == 4 * TOKENS]
    assert len(reduces) == 3


def test_torch_loss_keeps_no_all_reduce_at_t1():
    forward = head_work(GPT, settings(cross_entropy_impl="torch")).forward
    assert [c for c in forward.collectives if c.nbytes == 4 * TOKENS] == []


def test_fp8_logits_are_16_bit():
    """Transformer Engine keeps the LM head in bf16: an fp8 run's loss backward is the
    bf16 run's (14 bytes per logit, 8 launches, first in the head's backward)."""
    fp8 = head_work(GPT, settings(dtype="fp8", fp8_recipe="delayed")).backward.kernels
    bf16 = head_work(GPT, settings()).backward.kernels
    for k in (fp8, bf16):
        assert (k.kind[:8] == KernelKind.MEMORY).all() and k.kind[8] != KernelKind.MEMORY
        assert float(k.bytes[:8].sum()) == pytest.approx(14 * TOKENS * 50304 + 85 * TOKENS)

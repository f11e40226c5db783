"""The real parallel runs compute what the single-process model computes:
Megatron's split (MLP pairs, transformer blocks) and a 2-stage pipeline give the
same outputs, losses and gradients (2 gloo ranks, small sizes, float64)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from paraplan.validate.data_parallel import GradientBuffer
from paraplan.validate.pipeline import PipelineStage, stage_order
from paraplan.validate.ranks import run_ranks
from paraplan.validate.tensor_parallel import (
    tensor_parallel_layers,
)
from paraplan.validate.workload import WorkloadSpec

BUILDER = "paraplan.validate.workload:profile_model_workload"
MLP = WorkloadSpec(BUILDER, {"model": "mlp", "settings": {
    "num_layers": 5, "input_dim": 6, "hidden_dim": 16, "output_dim": 4}, "seed": 0})
GPT = WorkloadSpec(BUILDER, {"model": "gpt", "settings": {
    "num_layers": 2, "hidden_size": 8, "num_attention_heads": 2, "seq_length": 5, "vocab_size": 11}, "seed": 3})
BATCH = 6


def _run(spec: WorkloadSpec, layers: list[nn.Module]) -> tuple[torch.Tensor, float, dict]:
    """Output, loss and named gradients of `layers` on the spec's batch (float64)."""
    work = spec.build()
    model = nn.Sequential(*layers).double()
    x, y = work.make_batch(BATCH, torch.Generator().manual_seed(7))
    out = model(x if not x.is_floating_point() else x.double())
    loss = work.loss(out, y if not y.is_floating_point() else y.double())
    loss.backward()
    return out.detach(), float(loss.detach()), {n: p.grad for n, p in model.named_parameters()}


def _rank(rank: int, world: int) -> dict:
    """Everything the tests below check, in one launch of 2 ranks (spawning is slow)."""
    out = {
        name: _run(spec, tensor_parallel_layers(list(spec.build().layers), rank, world))
        for name, spec in (("mlp", MLP), ("gpt", GPT))
    }
    for schedule in ("1f1b", "gpipe"):
        out[schedule] = _pp_rank(rank, world, schedule, 3)
    for overlap in (False, True):
        out[f"dp_overlap={overlap}"] = _dp_rank(rank, world, overlap)
    return out


def _dp_rank(rank: int, world: int, overlap: bool) -> dict:
    """Each rank the half of the batch; gradients summed through the flat buffer."""
    work = MLP.build()
    layers = [layer.double() for layer in work.layers]
    grads = GradientBuffer(layers, overlap)
    x, y = work.make_batch(BATCH, torch.Generator().manual_seed(7))
    xs, ys = x.double().chunk(world), y.double().chunk(world)
    for _ in range(2):  # a second step after zero() must give the same gradients
        grads.zero()
        (work.loss(nn.Sequential(*layers)(xs[rank]), ys[rank]) / world).backward()
        grads.synchronise()
    return {f"{i}.{n}": p.grad.clone() for i, layer in enumerate(layers) for n, p in layer.named_parameters()}


@pytest.fixture(scope="module")
def ranks():
    return run_ranks(_rank, world_size=2)


def test_megatron_split_of_mlp_pairs_matches_the_unsplit_mlp(ranks):
    ref_out, ref_loss, ref = _run(MLP, copy.deepcopy(list(MLP.build().layers)))
    # no dead ReLU hides a missing gradient reduction
    assert all(float(ref[f"{i}.linear.weight"].norm()) > 1e-3 for i in range(5))
    for rank, res in enumerate(ranks):
        out, loss, grads = res["mlp"]
        # every rank sees the full output after the forward all-reduce
        torch.testing.assert_close(out, ref_out)
        assert loss == pytest.approx(ref_loss, rel=1e-12)
        # pair 0 = layers 0,1 and pair 1 = layers 2,3: rows of A, columns of B
        for pair, (a, b) in enumerate([(0, 1), (2, 3)]):
            torch.testing.assert_close(grads[f"{pair}.weight_a"], ref[f"{a}.linear.weight"].chunk(2, 0)[rank])
            torch.testing.assert_close(grads[f"{pair}.bias_a"], ref[f"{a}.linear.bias"].chunk(2, 0)[rank])
            torch.testing.assert_close(grads[f"{pair}.weight_b"], ref[f"{b}.linear.weight"].chunk(2, 1)[rank])
            torch.testing.assert_close(grads[f"{pair}.bias_b"], ref[f"{b}.linear.bias"])
        # the odd last layer stays whole on both ranks
        torch.testing.assert_close(grads["2.linear.weight"], ref["4.linear.weight"])


def test_megatron_split_of_transformer_blocks_matches_the_unsplit_gpt(ranks):
    ref_out, ref_loss, ref = _run(GPT, copy.deepcopy(list(GPT.build().layers)))
    hidden = 8
    for rank, res in enumerate(ranks):
        out, loss, grads = res["gpt"]
        torch.testing.assert_close(out, ref_out)
        assert loss == pytest.approx(ref_loss, rel=1e-12)
        for layer in (1, 2):  # the blocks; embedding (0) and head (3) are replicated
            q, k, v = ref[f"{layer}.qkv.weight"].split(hidden)
            expect_qkv = torch.cat([t.chunk(2, 0)[rank] for t in (q, k, v)])
            torch.testing.assert_close(grads[f"{layer}.qkv_weight"], expect_qkv)
            torch.testing.assert_close(grads[f"{layer}.proj_weight"], ref[f"{layer}.proj.weight"].chunk(2, 1)[rank])
            torch.testing.assert_close(grads[f"{layer}.fc1_weight"], ref[f"{layer}.fc1.weight"].chunk(2, 0)[rank])
            torch.testing.assert_close(grads[f"{layer}.fc2_weight"], ref[f"{layer}.fc2.weight"].chunk(2, 1)[rank])
            torch.testing.assert_close(grads[f"{layer}.ln1.weight"], ref[f"{layer}.ln1.weight"])
            torch.testing.assert_close(grads[f"{layer}.fc2_bias"], ref[f"{layer}.fc2.bias"])
        torch.testing.assert_close(grads["0.token.weight"], ref["0.token.weight"])
        torch.testing.assert_close(grads["3.out.weight"], ref["3.out.weight"])


def _pp_rank(rank: int, world: int, schedule: str, microbatches: int) -> dict:
    work = MLP.build()
    layers = [layer.double() for layer in work.layers]
    cut = 2
    stages = [nn.Sequential(*layers[:cut]), nn.Sequential(*layers[cut:])]
    x, y = work.make_batch(BATCH, torch.Generator().manual_seed(7))
    xs, ys = x.double().chunk(microbatches), y.double().chunk(microbatches)
    shape = stages[0](xs[0]).shape
    stage = PipelineStage(stages[rank], rank, world, work.loss, shape, torch.float64, shape, torch.device("cpu"))
    loss = stage.run(stage_order(schedule, rank, world, microbatches), xs, ys)
    offset = 0 if rank == 0 else cut
    grads = {}
    for name, p in stages[rank].named_parameters():
        index, rest = name.split(".", 1)
        grads[f"{int(index) + offset}.{rest}"] = p.grad
    return {"loss": loss, "grads": grads}


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_two_stage_pipeline_matches_single_process(ranks, schedule):
    _, ref_loss, ref = _run(MLP, copy.deepcopy(list(MLP.build().layers)))
    stages = [res[schedule] for res in ranks]
    assert stages[0]["loss"] == 0.0  # only the last stage computes the loss
    assert stages[1]["loss"] == pytest.approx(ref_loss, rel=1e-12)
    assert set(stages[0]["grads"]) | set(stages[1]["grads"]) == set(ref)
    for res in stages:
        for name, grad in res["grads"].items():
            torch.testing.assert_close(grad, ref[name])


@pytest.mark.parametrize("overlap", [False, True])
def test_data_parallel_gradients_equal_the_whole_batch(ranks, overlap):
    _, _, ref = _run(MLP, copy.deepcopy(list(MLP.build().layers)))
    for res in ranks:
        grads = res[f"dp_overlap={overlap}"]
        assert set(grads) == set(ref)
        for name, grad in grads.items():
            torch.testing.assert_close(grad, ref[name])







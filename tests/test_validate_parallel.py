"""The real parallel runs compute what the single-process model computes:
Megatron's split of an MLP pair and a 2-stage pipeline give the same outputs,
losses and gradients (2 gloo ranks, small sizes)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from paraplan.core import StrategyError
from paraplan.validate.pipeline import PipelineStage, balanced_boundary, schedule_ops
from paraplan.validate.ranks import run_ranks
from paraplan.validate.tensor_parallel import pair_count, tensor_parallel_layers
from paraplan.validate.workload import WorkloadSpec

SPEC = WorkloadSpec(
    "paraplan.validate.workload:mlp_workload",
    {"num_layers": 5, "input_dim": 6, "hidden_dim": 8, "output_dim": 4, "bias": True},
    seed=3,
)


def _reference(batch: int):
    """Loss, output and gradients of the whole model in one process."""
    work = SPEC.build()
    model = nn.Sequential(*copy.deepcopy(list(work.layers))).double()
    x, y = work.make_batch(batch, torch.Generator().manual_seed(7))
    out = model(x.double())
    loss = work.loss(out, y.double())
    loss.backward()
    return model, out.detach(), float(loss.detach()), [p.grad.clone() for p in model.parameters()]


def _tp_rank(rank: int, world: int) -> dict:
    work = SPEC.build()
    layers = [layer.double() for layer in tensor_parallel_layers(list(work.layers), rank, world)]
    model = nn.Sequential(*layers)
    x, y = work.make_batch(12, torch.Generator().manual_seed(7))
    out = model(x.double())
    loss = work.loss(out, y.double())
    loss.backward()
    return {"out": out.detach(), "loss": float(loss.detach()), "grads": {n: p.grad for n, p in model.named_parameters()}}


@pytest.mark.slow
def test_megatron_split_matches_unsplit_mlp_pairs():
    ref_model, ref_out, ref_loss, _ = _reference(12)
    ranks = run_ranks(_tp_rank, world_size=2)
    full = dict(ref_model.named_parameters())
    for rank, res in enumerate(ranks):
        # every rank sees the full output after the forward all-reduce
        torch.testing.assert_close(res["out"], ref_out)
        assert res["loss"] == pytest.approx(ref_loss, rel=1e-12)
        grads = res["grads"]
        # pair 0 = layers 0,1 and pair 1 = layers 2,3: rows of A, columns of B
        for pair, (a, b) in enumerate([(0, 1), (2, 3)]):
            torch.testing.assert_close(grads[f"{pair}.weight_a"], full[f"{a}.0.weight"].grad.chunk(2, 0)[rank])
            torch.testing.assert_close(grads[f"{pair}.bias_a"], full[f"{a}.0.bias"].grad.chunk(2, 0)[rank])
            torch.testing.assert_close(grads[f"{pair}.weight_b"], full[f"{b}.0.weight"].grad.chunk(2, 1)[rank])
            torch.testing.assert_close(grads[f"{pair}.bias_b"], full[f"{b}.0.bias"].grad)
        # the odd last layer stays whole on both ranks
        torch.testing.assert_close(grads["2.0.weight"], full["4.0.weight"].grad)


def _pp_rank(rank: int, world: int, schedule: str, microbatches: int) -> dict:
    work = SPEC.build()
    layers = [layer.double() for layer in work.layers]
    cut = 2
    stages = [nn.Sequential(*layers[:cut]), nn.Sequential(*layers[cut:])]
    x, y = work.make_batch(12, torch.Generator().manual_seed(7))
    xs, ys = x.double().chunk(microbatches), y.double().chunk(microbatches)
    shape = stages[0](xs[0]).shape
    stage = PipelineStage(stages[rank], rank, world, work.loss, shape, torch.float64, shape, torch.device("cpu"))
    loss = stage.run(schedule_ops(schedule, rank, world, microbatches), xs, ys)
    offset = 0 if rank == 0 else cut
    grads = {}
    for name, p in stages[rank].named_parameters():
        index, rest = name.split(".", 1)
        grads[f"{int(index) + offset}.{rest}"] = p.grad
    return {"loss": loss, "grads": grads}


@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_two_stage_pipeline_matches_single_process(schedule):
    ref_model, _, ref_loss, _ = _reference(12)
    ranks = run_ranks(_pp_rank, (schedule, 3), world_size=2)
    assert ranks[0]["loss"] == 0.0
    assert ranks[1]["loss"] == pytest.approx(ref_loss, rel=1e-12)
    full = dict(ref_model.named_parameters())
    names = set(ranks[0]["grads"]) | set(ranks[1]["grads"])
    assert names == set(full)
    for res in ranks:
        for name, grad in res["grads"].items():
            torch.testing.assert_close(grad, full[name].grad)


def test_1f1b_order_for_two_stages_and_four_microbatches():
    assert schedule_ops("1f1b", 0, 2, 4) == [
        ("F", 0), ("F", 1), ("B", 0), ("F", 2), ("B", 1), ("F", 3), ("B", 2), ("B", 3),
    ]
    assert schedule_ops("1f1b", 1, 2, 4) == [
        ("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2), ("B", 2), ("F", 3), ("B", 3),
    ]
    assert schedule_ops("gpipe", 0, 2, 2) == [("F", 0), ("F", 1), ("B", 0), ("B", 1)]
    with pytest.raises(StrategyError, match="gpipe and 1f1b"):
        schedule_ops("zb_h1", 0, 2, 4)


def test_balanced_boundary_minimises_the_slower_stage():
    assert balanced_boundary([1, 1, 1, 1]) == 2
    assert balanced_boundary([5, 1, 1, 1]) == 1
    assert balanced_boundary([1, 1, 1, 4]) == 3
    with pytest.raises(StrategyError):
        balanced_boundary([1.0])


def test_pair_count_and_unsplittable_models():
    work = SPEC.build()
    assert pair_count(work.layers) == 2
    with pytest.raises(StrategyError, match="no layer pair"):
        tensor_parallel_layers([nn.Conv1d(2, 2, 1)], 0, 2)

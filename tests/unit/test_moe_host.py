"""The alltoall dispatcher's preprocessing as Megatron-Core 0d8e0714 (core_r0.15.0 line,
Megatron-Bridge v0.2.0) runs it: count kernels, device-to-host copies and one host
synchronisation per MoE layer forward (`token_dispatcher.py`, `preprocess` and
`_maybe_dtoh_and_synchronize`), none in the backward."""

import numpy as np
import pytest

from paraplan.core.comm import Group
from paraplan.core.run_settings import RunSettings
from paraplan.predict.device_model import DeviceEfficiency
from paraplan.predict.models import PRESETS
from paraplan.predict.moe_host import DispatchHostWork, chunk_sort_map, dispatch_host_work, permute_row_map
from paraplan.predict.moe_ops import moe_layer_work
from paraplan.predict.mtp_ops import concat
from paraplan.predict.pass_cost import PassCost
from paraplan.predict.work import _Builder

QWEN = PRESETS["qwen3-30b-a3b"]  # 128 experts, top-8


def settings(**kw) -> RunSettings:
    base = dict(tensor_model_parallel_size=1, pipeline_model_parallel_size=1, data_parallel_size=8,
                global_batch_size=8, micro_batch_size=1, expert_model_parallel_size=8)
    return RunSettings(**{**base, **kw})


@pytest.mark.parametrize(("kw", "expected"), [
    # dropless, EP 8: sum + cast, input_splits, contiguous slice, per-rank sum, output_splits_tp,
    # per-local-expert sum; copies of tokens_per_expert, input/output splits, output_splits_tp
    ({}, DispatchHostWork(7, 4, 1, "before_ep_alltoall")),
    # a capacity factor: also the output size (a sum, and its copy), waited for before permutation 1
    ({"moe_expert_capacity_factor": 1.0}, DispatchHostWork(8, 5, 1, "before_permutation_1")),
    # padded to capacity: every count is a host constant
    ({"moe_expert_capacity_factor": 1.0, "moe_pad_expert_input_to_capacity": True},
     DispatchHostWork(0, 0, 0, "no_sync")),
    # one rank holds every expert: only the counts per expert, waited for before the experts
    ({"expert_model_parallel_size": 1, "data_parallel_size": 8}, DispatchHostWork(2, 1, 1, "before_finish")),
])
def test_preprocessing_counts_follow_the_sync_point_logic(kw, expected):
    assert dispatch_host_work(settings(**kw)) == expected


def test_expert_tensor_parallel_alone_needs_the_split_sizes():
    s = settings(tensor_model_parallel_size=2, sequence_parallel=True, expert_model_parallel_size=1,
                 expert_tensor_parallel_size=2, data_parallel_size=4)
    assert dispatch_host_work(s) == DispatchHostWork(7, 4, 1, "before_ep_alltoall")


def test_a_layer_forward_waits_once_and_its_backward_never():
    work = moe_layer_work(QWEN, settings())
    assert [len(p.host_syncs) for p in (work.forward, work.backward, work.recompute)] == [1, 0, 0]
    padded = moe_layer_work(QWEN, settings(moe_expert_capacity_factor=1.0, moe_pad_expert_input_to_capacity=True))
    # the 7 kernels and 4 copies are rows of the forward; the backward is unchanged (but for the
    # router's token dropping with the capacity: 6 kernels forward, 1 backward, `moe_router`)
    assert len(work.forward.kernels) - len(padded.forward.kernels) == 11 - 6
    assert len(work.backward.kernels) + 1 == len(padded.backward.kernels)
    assert padded.forward.host_syncs == ()


@pytest.mark.parametrize(("kw", "queued"), [
    ({}, 4),  # before the EP all-to-all: permutation 1's three row-map passes and the permute
    ({"moe_expert_capacity_factor": 1.0}, 0),  # before permutation 1: nothing issued since the copies
    # before the experts (EP 1): permutation 1 (4) and sort_chunks' map and sort (128 local experts)
    ({"expert_model_parallel_size": 1}, 6),
])
def test_the_wait_ends_with_the_kernels_issued_since_the_copies_still_queued(kw, queued):
    (first, end), = moe_layer_work(QWEN, settings(**kw)).forward.host_syncs
    assert end - first == queued


def test_recomputation_and_a2a_overlap_keep_the_wait():
    assert len(moe_layer_work(QWEN, settings(recompute_granularity="full")).recompute.host_syncs) == 1
    moe = settings(recompute_granularity="selective", recompute_modules=("moe",))
    assert len(moe_layer_work(QWEN, moe).recompute.host_syncs) == 1
    act = settings(recompute_granularity="selective", recompute_modules=("moe_act",))
    assert moe_layer_work(QWEN, act).recompute.host_syncs == ()
    overlapped = moe_layer_work(QWEN, settings(overlap_moe_expert_parallel_comm=True))
    assert len(overlapped.forward.host_syncs) == 1


def test_flex_dispatcher_waits_once_for_deepeps_counts_with_nothing_queued():
    """No preprocessing wait; DeepEP's forward dispatch polls its notify kernel's counts
    (`moe_deepep.deepep_host_work`), the backward's cached calls do not."""
    s = settings(moe_token_dispatcher_type="flex", expert_model_parallel_size=16, data_parallel_size=16,
                 global_batch_size=16)
    work = moe_layer_work(QWEN, s)
    ((first, end),) = work.forward.host_syncs
    assert first == end
    assert work.backward.host_syncs == ()


def test_a_wait_idles_the_device_for_one_host_issue_less_what_is_still_queued():
    w = _Builder(2)
    for _ in range(3):
        w.memory(1e6)
    w.host_syncs += [(0, 0), (1, 3)]  # a drained queue; two kernels queued
    cost = PassCost.of(w.build(), comm=None, group=Group(1, 1))  # no collectives: the model is not asked
    eff = DeviceEfficiency(host_kernel_s=50e-6)
    kernel_s = np.array([1e-3, 10e-6, 15e-6])
    assert cost.sync_idle_s(kernel_s, eff) == pytest.approx(50e-6 + 25e-6)
    assert cost.device_s(kernel_s, eff) == pytest.approx(kernel_s.sum() + 75e-6)
    assert cost.host_s(eff) == pytest.approx(3 * 50e-6)  # the waits are device idle time, not host issue
    assert cost.sync_idle_s(np.array([1e-3, 40e-6, 15e-6]), eff) == pytest.approx(50e-6)  # queue outlasts it


def test_passes_run_one_after_another_keep_their_waits_at_their_kernels():
    a, b = _Builder(2), _Builder(2)
    a.memory(1.0)
    a.memory(1.0)
    a.host_syncs.append((1, 2))
    b.host_syncs.append((0, 0))
    assert concat(a.build(), b.build()).host_syncs == ((1, 2), (2, 2))


def test_fused_permutation_launches_its_row_maps_in_the_forward_only():
    T, E = 4096, 128
    w = _Builder(2)
    permute_row_map(w, T, E)
    chunk_sort_map(w, 2048.0)
    # three passes over the bool routing map and the T x (2E + 1) int32 row map; one int32 per token
    assert list(w.build().kernels.bytes) == [T * (E + 4 * (2 * E + 1))] * 3 + [4 * 2048.0]
    many = moe_layer_work(QWEN, settings())  # 16 local experts: both sort_chunks run
    one = moe_layer_work(QWEN, settings(expert_model_parallel_size=128, data_parallel_size=128,
                                        global_batch_size=128))  # 1 local expert: neither
    # forward: a map and a sort per sort_chunks; backward: the sort alone (the map is reused)
    assert len(many.forward.kernels) - len(one.forward.kernels) == 4
    assert len(many.backward.kernels) - len(one.backward.kernels) == 2

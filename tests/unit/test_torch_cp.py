"""PyTorch's context parallelism (`cp_comm_type torch_allgather` / `torch_alltoall`, what
torchtitan runs) against the closed forms of `torch.distributed.tensor.experimental.
_attention`: c flash calls per pass of (s / c)^2 / 2 pairs each, fp32 merges, one K/V
all-gather or c - 1 neighbour transfers, c fp32 key/value-gradient transfers."""

import csv
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from test_context_parallel import LONG

from paraplan.core.run_settings import RunSettings
from paraplan.predict.cp_ops import (
    CP_GROUP,
    CP_RING,
    AttentionShape,
    cp_attention_backward,
    cp_attention_forward,
    torch_cp_flat_copies,
    torch_cp_kernel_shapes,
    torch_cp_slowest_rank,
)
from paraplan.predict.ops import ATTENTION, MEMORY, layer_work
from paraplan.predict.runtable import read_run_table
from paraplan.predict.work import NOT_HIDDEN, _Builder

ROOT = Path(__file__).resolve().parents[2]
# Llama 3.1 8B's attention at torchtitan's CP 8 row: 262,144 tokens, 32 heads, 8 key/value groups
B, S, HEADS, GROUPS, D, E = 1, 262144.0, 32.0, 8.0, 128.0, 2
CAUSAL_FWD_FLOPS = 4.0 * B * HEADS * S * S * D / 2
KV_HEADS = HEADS  # torchtitan repeats keys and values to every query head before SDPA (`repeat_kv`)


def shape(cp: int, compiled: bool = False) -> AttentionShape:
    return AttentionShape(B, S, HEADS, GROUPS, D, E, cp, compiled)


def run(cp: int, comm_type: str, backward: bool, compiled: bool = False):
    w = _Builder(gemm_bytes=2)
    (cp_attention_backward if backward else cp_attention_forward)(w, shape(cp, compiled), comm_type)
    return w.build()


def calls(work):
    k = work.kernels
    return k.flops[k.kind == ATTENTION], k.m[k.kind == ATTENTION]


def comms(work):
    return [(c.collective, c.nbytes, c.hidden_by, c.group) for c in work.collectives]


@pytest.mark.parametrize("cp", [2, 4, 8])
def test_every_rank_makes_c_calls_of_half_a_block_square_of_pairs(cp):
    for rank in range(cp):
        shapes = torch_cp_kernel_shapes(cp, rank)
        pairs = [q * k / 2 if causal else q * k for q, k, causal in shapes]
        assert len(shapes) == cp and pairs == [0.5] * cp  # load balanced: (s / c)^2 / 2 per call
        assert shapes[0] == (1.0, 1.0, True)
        assert shapes[1:] == [(1.0, 0.5, False)] * rank + [(0.5, 1.0, False)] * (cp - 1 - rank)
    # the last rank's rows are the shortest (s / 2c keys each): it sets the step
    assert torch_cp_slowest_rank(cp) == cp - 1


@pytest.mark.parametrize("comm_type", ["torch_allgather", "torch_alltoall"])
@pytest.mark.parametrize("cp", [2, 4, 8])
def test_forward_and_backward_run_c_calls_that_sum_to_one_cth_of_causal_attention(cp, comm_type):
    local = S / cp
    for backward, factor in ((False, 1.0), (True, 2.5)):
        flops, seq = calls(run(cp, comm_type, backward))
        assert np.allclose(flops, factor * CAUSAL_FWD_FLOPS / cp**2) and len(flops) == cp
        assert flops.sum() == pytest.approx(factor * CAUSAL_FWD_FLOPS / cp)
        # the causal call over s / c tokens, then rows of s / 2c keys: priced as causal rows of s / c
        assert seq.tolist() == [local] * cp


def memory_bytes(cp: int, comm_type: str, backward: bool, compiled: bool) -> list[float]:
    k = run(cp, comm_type, backward, compiled).kernels
    return k.bytes[k.kind == MEMORY].tolist()


def test_eager_forward_runs_the_merger_op_by_op_in_fp32():
    cp = 8
    n = B * (S / cp) * HEADS * D  # output elements on the rank
    r = n / D  # softmax rows (logsumexp)
    m = B * (S / cp) * KV_HEADS * D  # key (or value) elements on the rank
    flat = 2 * 2 * E * m  # keys and values read and written into the flat send buffer
    contiguous = [2 * E * m, 2 * E * m]  # key.contiguous(), value.contiguous() of torchtitan's transposed views
    cast = (E + 4) * n
    # out - sigmoid(block_lse - lse) * (out - block_out); lse - logsigmoid(lse - block_lse)
    merge = [cast, 12 * r, 8 * r, 12 * n, 8 * n + 4 * r, 12 * n, 12 * r, 8 * r, 12 * r]
    calls = [[flat, cast]] + [[flat, *merge]] * (cp - 2) + [merge]
    assert memory_bytes(cp, "torch_allgather", False, False) == pytest.approx(
        contiguous + [x for c in calls for x in c] + [(4 + E) * n])


def test_compiled_forward_fuses_each_merge_and_keeps_one_flat_copy():
    cp = 8
    n, m = B * (S / cp) * HEADS * D, B * (S / cp) * KV_HEADS * D
    r = n / D
    flat = 2 * 2 * E * m
    merges = [(2 * E + 4) * n + 12 * r] + [(E + 8) * n + 12 * r] * (cp - 2)  # the second reads the first in 16 bits
    assert memory_bytes(cp, "torch_allgather", False, True) == pytest.approx([flat, *merges, (4 + E) * n])
    # alltoall: every block but the last is copied, as each travels
    assert memory_bytes(cp, "torch_alltoall", False, True) == pytest.approx(
        [flat, *[x for mg in merges[:-1] for x in (flat, mg)], merges[-1], (4 + E) * n])


def test_eager_backward_accumulates_gradients_in_fp32_op_by_op():
    cp = 4
    n, m = B * (S / cp) * HEADS * D, B * (S / cp) * KV_HEADS * D
    flat = 2 * 2 * E * m
    enter = [4 * n, 4 * m, 4 * m, 2 * E * m, 2 * E * m]  # zeroed fp32 sums; contiguous keys and values
    first = [(8 + E) * n, (8 + E) * m, (8 + E) * m, 16 * m]
    # dQ added; the first halves of dK, dV added in place, each block rebuilt by torch.cat, both flattened
    later = [(8 + E) * n, (8 + E) * m / 2, (8 + E) * m / 2, 8 * m, 8 * m, 16 * m]
    calls = [[flat, *first]] + [[flat, *later]] * (cp - 2) + [later]
    assert memory_bytes(cp, "torch_allgather", True, False) == pytest.approx(
        enter + [x for c in calls for x in c] + [(4 + E) * n, (4 + E) * 2 * m])


def test_compiled_backward_fuses_each_gradient_sum():
    cp = 4
    n, m = B * (S / cp) * HEADS * D, B * (S / cp) * KV_HEADS * D
    flat = 2 * 2 * E * m
    first = [(4 + E) * n, (8 + 2 * E) * m]  # the zeros folded in
    later = [(8 + E) * n, (16 + E) * m]  # the flat buffer written from the received block and the two halves
    assert memory_bytes(cp, "torch_allgather", True, True) == pytest.approx(
        [flat, *first, *later * (cp - 1), (4 + E) * n, (4 + E) * 2 * m])


@pytest.mark.parametrize("cp", [2, 8])
def test_allgather_gathers_keys_and_values_once_beside_the_first_call(cp):
    gathered = 2 * B * S * KV_HEADS * D * E
    grads = 2 * (S / cp) * B * KV_HEADS * D * 4  # fp32 key/value gradients of the rank's block
    fwd, bwd = run(cp, "torch_allgather", False), run(cp, "torch_allgather", True)
    first_fwd, first_bwd = (int(np.flatnonzero(w.kernels.kind == ATTENTION)[0]) for w in (fwd, bwd))
    assert comms(fwd) == [("all_gather", gathered, first_fwd, CP_GROUP)]
    bwd_calls = [int(i) for i in np.flatnonzero(bwd.kernels.kind == ATTENTION)]
    # backward: gathered again; gradients of call i travel beside call i + 1, the last one awaited
    assert comms(bwd) == [("all_gather", gathered, first_bwd, CP_GROUP)] + \
        [("send_recv", grads, i, CP_RING) for i in [*bwd_calls[1:], NOT_HIDDEN]]


def test_alltoall_passes_blocks_to_the_neighbour_beside_each_call_but_the_last():
    cp = 4
    block = 2 * (S / cp) * B * KV_HEADS * D * E
    grads = 2 * (S / cp) * B * KV_HEADS * D * 4
    fwd, bwd = run(cp, "torch_alltoall", False), run(cp, "torch_alltoall", True)
    fwd_calls = [int(i) for i in np.flatnonzero(fwd.kernels.kind == ATTENTION)]
    bwd_calls = [int(i) for i in np.flatnonzero(bwd.kernels.kind == ATTENTION)]
    assert comms(fwd) == [("send_recv", block, i, CP_RING) for i in fwd_calls[:-1]]
    assert comms(bwd) == [("send_recv", block, i, CP_RING) for i in bwd_calls[:-1]] + \
        [("send_recv", grads, i, CP_RING) for i in [*bwd_calls[1:], NOT_HIDDEN]]


def test_same_flops_as_the_megatron_ring_more_kernels_than_the_all_gather():
    s = RunSettings(tensor_model_parallel_size=2, context_parallel_size=4, micro_batch_size=1, global_batch_size=1)
    works = {t: layer_work(LONG, replace(s, cp_comm_type=t)) for t in ("p2p", "all_gather", "torch_allgather")}
    flops = {t: calls(w.forward)[0] for t, w in works.items()}
    assert flops["torch_allgather"].sum() == pytest.approx(flops["p2p"].sum())
    assert flops["torch_allgather"].sum() == pytest.approx(flops["all_gather"].sum())
    assert (len(flops["torch_allgather"]), len(flops["all_gather"])) == (4, 1)


def test_run_table_reads_torch_cp(tmp_path):
    path = tmp_path / "runs.csv"
    path.write_text("name,num_layers,hidden_size,num_attention_heads,seq_length,vocab_size,"
                    "tensor_model_parallel_size,pipeline_model_parallel_size,data_parallel_size,global_batch_size,"
                    "context_parallel_size,cp_comm_type,num_gpus\nx,24,2048,16,32768,50257,1,1,2,2,4,torch_alltoall,8\n")
    (row,) = read_run_table(path)[1]
    assert (row.settings.context_parallel_size, row.settings.cp_comm_type) == (4, "torch_alltoall")


def test_torchtitan_cp_rows_run_pytorchs_context_parallel():
    with (ROOT / "benchmarks/data/torchtitan_llama31_h100.csv").open(newline="") as handle:
        rows = [r for r in csv.DictReader(handle) if int(r["context_parallel_size"]) > 1]
    assert len(rows) == 6 and {r["cp_comm_type"] for r in rows} == {"torch_allgather"}


def test_keys_and_values_travel_with_every_query_head_as_torchtitan_repeats_them():
    cp = 8
    torch_gather = comms(run(cp, "torch_allgather", False))[0]
    megatron_gather = comms(run(cp, "all_gather", False))[0]
    assert torch_gather[1] == megatron_gather[1] * HEADS / GROUPS == 2 * B * S * HEADS * D * E


@pytest.mark.parametrize("cp", [2, 4, 8])
def test_compiled_allgather_keeps_only_the_flat_copy_the_all_gather_sends(cp):
    # `_AllGatherRotater.exchange_buffers` reads its argument once; torch.compile drops the later copies
    assert (torch_cp_flat_copies(cp, "allgather", True), torch_cp_flat_copies(cp, "allgather", False)) == (1, cp - 1)
    assert torch_cp_flat_copies(cp, "alltoall", True) == torch_cp_flat_copies(cp, "alltoall", False) == cp - 1


@pytest.mark.parametrize("comm_type", ["torch_allgather", "torch_alltoall"])
def test_compiled_ring_awaits_every_collective_where_it_is_issued(comm_type):
    # traced functional collectives return wait_tensor(...) at once; Inductor does not move it by default
    cp = 4
    for backward in (False, True):
        eager, compiled = comms(run(cp, comm_type, backward)), comms(run(cp, comm_type, backward, True))
        assert [c[2] for c in compiled] == [NOT_HIDDEN] * len(eager)
        assert [(c[0], c[1], c[3]) for c in compiled] == [(c[0], c[1], c[3]) for c in eager]
        assert sum(c[2] != NOT_HIDDEN for c in eager) == len(eager) - (1 if backward else 0)


def test_layer_work_compiles_the_ring_unless_elementwise_kernels_are_eager():
    s = RunSettings(context_parallel_size=4, micro_batch_size=1, global_batch_size=1, cp_comm_type="torch_allgather")
    fused = layer_work(LONG, s).forward.collectives
    eager = layer_work(LONG, replace(s, elementwise_kernels="eager")).forward.collectives
    assert [c.hidden_by for c in fused] == [NOT_HIDDEN] and eager[0].hidden_by != NOT_HIDDEN

"""torchao's Float8 training as torchtitan runs it (`fp8_recipe torchao_tensorwise`,
paraplan.predict.torchao_fp8, docs/fp8.md): the casts each pass adds, in closed form
from Llama 3 8B's shapes; the float8 FSDP all-gather (1 byte per weight, the amax
all-reduces); the memory; and the exact errors for what is not modelled."""

from dataclasses import replace

import numpy as np
import pytest

from paraplan.clusters import load_cluster
from paraplan.core import ConstantBandwidthModel, StrategyError
from paraplan.core.comm import Group
from paraplan.core.errors import InputFileError
from paraplan.core.run_settings import RunSettings
from paraplan.predict import torchao_fp8
from paraplan.predict.build import RunWork, run_structure
from paraplan.predict.fp8_ops import scaled_passes, stage_weight_copy_bytes
from paraplan.predict.models import load_model
from paraplan.predict.ops import MEMORY
from paraplan.predict.pass_times import MOE_PASSES, PASSES
from paraplan.predict.runtable import read_run_table

SEQ = 4096
LLAMA = load_model("llama3-8b", SEQ)
H, F, Q, KV, LAYERS = 4096, 14336, 4096, 1024, 32  # hidden, ffn, query and key/value widths, layers
X = SEQ * (H + Q + H + F)  # elements of the FP8 GEMMs' inputs: QKV, wo, w1|w3, w2
Y = SEQ * ((Q + 2 * KV) + H + 2 * F + H)  # their outputs (the backward's output gradients)
WEIGHTS = H * (Q + 2 * KV) + Q * H + H * 2 * F + F * H  # their weights
S = 8  # FSDP shard degree
H100 = load_cluster("dgx-h100")
COMM = ConstantBandwidthModel(100e9, 20e9)


def torchao(**kw) -> RunSettings:
    base = dict(data_parallel_size=S, micro_batch_size=1, global_batch_size=S, zero_stage=3, dtype="fp8",
                fp8_recipe="torchao_tensorwise", recompute_granularity="full", attention_backend="flash",
                enable_fsdp_float8_all_gather=True, precompute_float8_dynamic_scale_for_fsdp=True,
                use_torch_fsdp2=True)
    return RunSettings(**{**base, **kw})


def added(settings: RunSettings) -> dict[str, tuple[float, int]]:
    """Bytes and kernel count each layer pass gains from torchao's casts."""
    works = RunWork.of(LLAMA, settings).passes()
    names = (PASSES + MOE_PASSES)[:len(works)]
    out = {}
    for before, after, name in zip(works, scaled_passes(works, names, settings), names, strict=True):
        new = after.kernels.kind[len(before.kernels):]
        assert (new == MEMORY).all()
        out[name] = (float(after.kernels.bytes[len(before.kernels):].sum()), len(new))
    return out


def test_the_fp8_gemms_of_a_layer_are_its_four_linear_gemms():
    lin = torchao_fp8.LinearElements.of(RunWork.of(LLAMA, torchao()).layer.forward)
    assert (lin.inputs, lin.outputs, lin.weights, lin.gemms) == (X, Y, WEIGHTS, 4)


def test_with_the_float8_all_gather_the_forward_casts_inputs_and_the_weight_shards():
    """Forward: amax (2 bytes) and cast (2 + 1) of each input; each fp32 weight shard cast
    before the gather (4 + 4, 4 + 4, 4 + 1 = 21 bytes, 3 kernels per weight) and read once
    by the precomputed scales' _foreach_norm (4 bytes). Backward: each output gradient's
    amax and two-orientation cast (2 + 2 + 1 + 1), transposed copies of inputs and weights
    (1 + 1), and the backward gather's shard casts. Full recomputation: the inputs again;
    the embedding and head passes gain nothing."""
    got = added(torchao())
    assert got["layer_fwd"] == (pytest.approx(5 * X + 21 * WEIGHTS / S + 4 * WEIGHTS / S), 2 * 4 + 3 * 4 + 1)
    assert got["layer_recompute"] == (pytest.approx(5 * X), 2 * 4)
    assert got["layer_bwd"] == (pytest.approx(6 * Y + 2 * (X + WEIGHTS) + 21 * WEIGHTS / S), 2 * 4 + 2 * 4 + 3 * 4)
    for name in ("embedding_fwd", "embedding_bwd", "head_fwd", "head_bwd"):
        assert got[name] == (0.0, 0)


def test_without_the_float8_all_gather_each_gathered_weight_is_cast_in_every_forward():
    got = added(torchao(enable_fsdp_float8_all_gather=False, precompute_float8_dynamic_scale_for_fsdp=False))
    assert got["layer_fwd"] == (pytest.approx(5 * (X + WEIGHTS)), 4 * 4)
    assert got["layer_recompute"] == (pytest.approx(5 * (X + WEIGHTS)), 4 * 4)
    assert got["layer_bwd"] == (pytest.approx(6 * Y + 2 * (X + WEIGHTS)), 4 * 4)


def test_without_precomputed_scales_each_shard_gather_reduces_its_own_amax():
    """abs (4 + 4) and max (4) of each fp32 shard, and 4 small scale kernels, per weight."""
    got = added(torchao(precompute_float8_dynamic_scale_for_fsdp=False))
    assert got["layer_fwd"] == (pytest.approx(5 * X + (21 + 12) * WEIGHTS / S), 2 * 4 + (3 + 6) * 4)


def test_the_per_op_policy_keeps_the_amaxes_and_recasts_every_input():
    got = added(torchao(recompute_granularity="selective", selective_ac_option="op"))
    assert got["layer_recompute"] == (pytest.approx(3 * X), 4)
    got = added(torchao(recompute_granularity="selective", selective_ac_option="op",
                        enable_fsdp_float8_all_gather=False, precompute_float8_dynamic_scale_for_fsdp=False))
    assert got["layer_recompute"] == (pytest.approx(3 * (X + WEIGHTS)), 8)


def test_the_float8_all_gather_moves_one_byte_per_weight():
    st = run_structure(LLAMA, torchao(), H100, COMM)
    group = Group(S, 1)
    assert st.fsdp is not None
    assert st.fsdp.layer_gather_s == pytest.approx(COMM.time_s("all_gather", LLAMA.layer_params * 1, group))
    # precomputed scales: one all-reduce of every weight's amax (fp32) per iteration
    bf16 = run_structure(LLAMA, torchao(enable_fsdp_float8_all_gather=False,
                                        precompute_float8_dynamic_scale_for_fsdp=False), H100, COMM)
    assert bf16.fsdp is not None
    assert bf16.fsdp.layer_gather_s == pytest.approx(COMM.time_s("all_gather", LLAMA.layer_params * 2, group))
    assert st.after_sync_comm_s[0] - bf16.after_sync_comm_s[0] == pytest.approx(
        COMM.time_s("all_reduce", 4 * LAYERS * 7, group))
    # without: before each gather, one all-reduce of one amax per nn.Linear (wq wk wv wo w1 w2 w3)
    each = run_structure(LLAMA, torchao(precompute_float8_dynamic_scale_for_fsdp=False), H100, COMM)
    assert each.fsdp is not None
    assert each.fsdp.layer_gather_s == pytest.approx(st.fsdp.layer_gather_s + 7 * COMM.time_s("all_reduce", 4, group))
    assert each.after_sync_comm_s[0] == bf16.after_sync_comm_s[0]


def test_memory_holds_gathered_layers_in_fp8_and_the_computing_layers_transient_fp8_weights():
    """Against the same run in bf16: the two gathered layer units in 1 byte instead of 2
    (2 u less in the working set), the layer being recomputed holding its linears'
    inputs as their FP8 casts (X less: torchao saves `input_fp8`), and beside the
    weights the computing layer's transposed FP8 copy (W); without the float8
    all-gather its FP8 cast too (2 W)."""
    bf16 = run_structure(LLAMA, torchao(dtype="bf16", fp8_recipe="", enable_fsdp_float8_all_gather=False,
                                        precompute_float8_dynamic_scale_for_fsdp=False), H100, COMM).memory[0]
    fp8 = run_structure(LLAMA, torchao(), H100, COMM).memory[0]
    assert fp8.working_bytes - bf16.working_bytes == pytest.approx(-2 * LLAMA.layer_params - X)
    assert fp8.weights_bytes - bf16.weights_bytes == pytest.approx(WEIGHTS)
    plain = torchao(enable_fsdp_float8_all_gather=False, precompute_float8_dynamic_scale_for_fsdp=False)
    work = RunWork.of(LLAMA, plain)
    copies = stage_weight_copy_bytes(work.layer.forward, None, work.head.forward, np.array([LAYERS]),
                                     np.array([0]), plain)
    assert copies.tolist() == [2 * WEIGHTS]


@pytest.mark.parametrize(("kw", "message"), [
    (dict(fp8_recipe="tensorwise"),
     "enable_fsdp_float8_all_gather needs dtype fp8 with fp8_recipe torchao_tensorwise, got dtype fp8 fp8_recipe "
     "'tensorwise'"),
    (dict(enable_fsdp_float8_all_gather=False),
     "precompute_float8_dynamic_scale_for_fsdp needs enable_fsdp_float8_all_gather (it precomputes the scales of "
     "the float8 all-gather)"),
    (dict(data_parallel_size=1, context_parallel_size=8, global_batch_size=1, seq_length=8192),
     "enable_fsdp_float8_all_gather needs zero_stage 3 sharded over >= 2 data-parallel ranks (torchtitan turns it "
     "off without dp_shard), got zero_stage 3, data-parallel shard degree 1"),
    (dict(zero_stage=2, use_torch_fsdp2=False),
     "enable_fsdp_float8_all_gather needs zero_stage 3 sharded over >= 2 data-parallel ranks (torchtitan turns it "
     "off without dp_shard), got zero_stage 2, data-parallel shard degree 8"),
    (dict(use_torch_fsdp2=False),
     "enable_fsdp_float8_all_gather needs use_torch_fsdp2 true: torchao's float8 all-gather is an extension of "
     "PyTorch's FSDP2 (fully_shard), got use_torch_fsdp2 false"),
    (dict(tensor_model_parallel_size=8, data_parallel_size=1, global_batch_size=1,
          enable_fsdp_float8_all_gather=False, precompute_float8_dynamic_scale_for_fsdp=False),
     "fp8_recipe torchao_tensorwise with tensor_model_parallel_size 8 needs sequence_parallel (torchtitan's Float8 "
     "tensor parallelism shards the norms along the sequence and all-gathers FP8 inputs)"),
    (dict(elementwise_kernels="eager"),
     "fp8_recipe torchao_tensorwise is priced as torch.compile runs it (elementwise_kernels fused, torchtitan's "
     "`training.compile`); eager Float8 casts are not modelled, got elementwise_kernels eager"),
    (dict(recompute_granularity="none"),
     "fp8_recipe torchao_tensorwise needs recompute_granularity full or selective with selective_ac_option op "
     "(torchtitan's activation checkpointing): without it each linear keeps its FP8 weight for the backward, which "
     "is not modelled; got recompute_granularity none"),
])
def test_what_is_not_modelled_is_refused_by_name(kw, message):
    seq = kw.pop("seq_length", SEQ)
    with pytest.raises(StrategyError) as err:
        torchao(**kw).check(load_model("llama3-8b", seq))
    assert str(err.value) == message


def test_a_mixture_of_experts_model_is_refused():
    moe = load_model("mixtral-8x7b", 4096)
    with pytest.raises(StrategyError) as err:
        torchao().check(moe)
    assert str(err.value) == ("fp8_recipe torchao_tensorwise prices torchtitan's dense Llama linears; "
                              f"'{moe.name}' has experts")
    with pytest.raises(StrategyError) as err:
        torchao().check(replace(LLAMA, mtp_num_layers=1))
    assert str(err.value) == ("fp8_recipe torchao_tensorwise prices torchtitan's dense Llama linears; "
                              "'llama3-8b' has multi-token-prediction layers")


def test_the_run_table_reads_torchtitans_float8_options(tmp_path):
    path = tmp_path / "runs.csv"
    path.write_text("model,tensor_model_parallel_size,pipeline_model_parallel_size,data_parallel_size,"
                    "global_batch_size,micro_batch_size,zero_stage,recompute_granularity,dtype,fp8_recipe,"
                    "enable_fsdp_float8_all_gather,precompute_float8_dynamic_scale_for_fsdp,use_torch_fsdp2\n"
                    "llama3-8b,1,1,8,8,1,3,full,fp8,torchao_tensorwise,true,true,true\n")
    _, (row,) = read_run_table(path)
    s = row.settings
    assert (s.dtype, s.fp8_recipe, s.enable_fsdp_float8_all_gather, s.precompute_float8_dynamic_scale_for_fsdp) == (
        "fp8", "torchao_tensorwise", True, True)
    path.write_text(path.read_text().replace("torchao_tensorwise", "torchao"))
    with pytest.raises(InputFileError) as err:
        read_run_table(path)
    assert "column 'fp8_recipe'" in str(err.value) and "mxfp8, torchao_tensorwise" in str(err.value)


def test_tensor_parallelism_casts_sequence_shards_and_gathers_fp8():
    """TP 2 with sequence parallelism (torchao's PrepareFloat8ModuleInput, Float8Colwise /
    RowwiseParallel): QKV's and fc1's inputs (s x h each) cast on their half of the
    sequence, then all-gathered in 1 byte; the projection's and fc2's output gradients
    likewise cast on their half and gathered in FP8 in the backward, then transposed by
    a copy; one amax all-reduce over the group per cast; reduce-scatters stay bf16."""
    t = 2
    tp = torchao(tensor_model_parallel_size=t, sequence_parallel=True, data_parallel_size=4, global_batch_size=4)
    x_local = SEQ * (H + Q / t + H + F / t)  # the GEMMs' inputs on one rank
    y_local = SEQ * ((Q + 2 * KV) / t + H + 2 * F / t + H)
    w_local = WEIGHTS / t
    gathered = scattered = 2 * SEQ * H
    got = added(tp)
    shard = 4
    assert got["layer_fwd"][0] == pytest.approx(5 * (x_local - gathered + gathered / t) + 25 * w_local / shard)
    assert got["layer_bwd"][0] == pytest.approx(
        6 * (y_local - scattered) + 5 * scattered / t + 2 * scattered + 2 * (x_local + w_local) + 21 * w_local / shard)
    works = RunWork.of(LLAMA, tp).passes()
    names = (PASSES + MOE_PASSES)[:len(works)]
    before, after = works[0], scaled_passes(works, names, tp)[0]
    gathers = [c.nbytes for c in before.collectives if c.collective == "all_gather"]
    assert gathers == [SEQ * H * 2] * 2
    assert [c.nbytes for c in after.collectives if c.collective == "all_gather"] == [SEQ * H] * 2
    scatters = [c.nbytes for c in after.collectives if c.collective == "reduce_scatter"]
    assert scatters == [SEQ * H * 2] * 2
    amaxes = [c for c in after.collectives if c.collective == "all_reduce"]
    assert [(c.nbytes, c.group) for c in amaxes] == [(4.0, "tp")] * 4

"""Megatron-LM's `attention_backend` (paraplan.kernels.attention_backends, docs/kernels.md):
which kernel each value runs on H100 and A100, priced at that kernel's measured ceilings
from the device's kernel file; inconsistent pairs with `use_flash_attn` and kernels a
device has not measured are one-line errors."""

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from paraplan.cli.main import main
from paraplan.clusters import load_cluster
from paraplan.core import ConstantBandwidthModel
from paraplan.core.errors import InputFileError, StrategyError
from paraplan.core.run_settings import RunSettings
from paraplan.core.transformer import TransformerModel
from paraplan.kernels.attention_backends import with_attention_kernel
from paraplan.kernels.ceilings import KernelCeilings, load_kernel_ceilings
from paraplan.predict.build import run_structure
from paraplan.predict.calibration import load_calibration
from paraplan.predict.device_model import ATTENTION_PARAMETERS, AttentionCeiling, DeviceSpeed, kernel_times_s
from paraplan.predict.ops import ATTENTION, Kernels
from paraplan.predict.predictor import predict_settings
from paraplan.predict.runtable import read_run_table

REPO = Path(__file__).resolve().parents[2]
H100, A100 = load_cluster("dgx-h100"), load_cluster("dgx-a100")
GPT = TransformerModel("gpt", num_layers=4, hidden_size=2048, num_attention_heads=16, seq_length=4096,
                       vocab_size=51200, hidden_dropout=0.0, attention_dropout=0.0)
RUN = RunSettings(tensor_model_parallel_size=1, micro_batch_size=1, global_batch_size=8, data_parallel_size=8)
COMM = ConstantBandwidthModel(100e9, 20e9)
HEADER = "model,tensor_model_parallel_size,pipeline_model_parallel_size,data_parallel_size,global_batch_size"


def _table(tmp_path, columns: str, cells: str) -> Path:
    path = tmp_path / "runs.csv"
    path.write_text(f"{HEADER},{columns}\nllama3-8b,1,1,8,8,{cells}\n")
    return path


# the H100's own sustained/burst BF16 GEMM rows (data/measured/h100-sxm5/gemm_sustained.csv)
H100_FACTOR = (675.6360111009028 / 749.7051786748794 * 686.9345871600462 / 723.8200461476481) ** 0.5


def test_the_h100_file_carries_cudnn_first_and_flash_attention_2():
    ceilings = load_kernel_ceilings("H100-SXM5-80GB").attention_ceilings()
    assert list(ceilings) == ["cudnn", "flash-attention-2", "flash-attention-3",
                              "cudnn@hdim64", "flash-attention-2@hdim64", "flash-attention-3@hdim64"]
    kernels = load_kernel_ceilings("H100-SXM5-80GB").attention_kernels
    # FA2 (torch's SDPA flash kernel) measured on the lent H100, causal, head dim 128, held at
    # the 700 W limit: fitted as measured, no sustained factor
    fa2 = kernels["flash-attention-2"]
    assert [d["path"] for d in fa2["data"]] == ["data/measured/h100-sxm5/attention_fa2_held.csv"]
    assert "sustained" not in fa2 and "power limit" in fa2["held"]
    assert fa2["params"]["attention_fwd_efficiency"] == pytest.approx(0.3647, abs=5e-5)
    assert fa2["params"]["attention_bwd_efficiency"] == pytest.approx(0.2934, abs=5e-5)
    assert ceilings["flash-attention-2"] == fa2["params"]
    assert ceilings["flash-attention-2"]["attention_seq_half"] == pytest.approx(643.2, abs=0.1)  # a shape, not a rate
    assert ceilings["cudnn"]["attention_fwd_efficiency"] == pytest.approx(0.6353, abs=5e-5)
    assert ceilings["cudnn"]["attention_bwd_efficiency"] == pytest.approx(0.5060, abs=5e-5)
    # FA3 from its paper's burst figures, held by the H100's own factor
    fa3 = kernels["flash-attention-3"]
    assert fa3["sustained"]["factor"] == pytest.approx(H100_FACTOR, rel=1e-12) and 0.92 < H100_FACTOR < 0.93
    assert fa3["sustained"]["from_device"] == "H100-SXM5-80GB"
    assert ceilings["flash-attention-3"]["attention_fwd_efficiency"] == pytest.approx(
        fa3["params"]["attention_fwd_efficiency"] * H100_FACTOR, rel=1e-12)
    assert fa3["params"]["attention_fwd_efficiency"] == pytest.approx(0.7044, abs=5e-5)
    assert list(load_kernel_ceilings("A100-SXM4-80GB").attention_ceilings()) == ["flash-attention-2"]


def test_an_attention_kernel_prices_its_passes_at_its_own_ceilings():
    s, flops = 4096.0, 1e12
    kernels = Kernels(np.full(2, ATTENTION, dtype=np.int8), np.full(2, flops), np.zeros(2), np.full(2, s),
                      np.array([0.0, 1.0]), np.zeros(2), np.ones(2), np.zeros(2, dtype=bool), np.ones(2))
    eff = load_calibration("h100-transfer").efficiency
    fa2 = AttentionCeiling("flash-attention-2", 0.36, 0.31, 450.0)
    speed = DeviceSpeed.of(H100.device, "bf16")
    times = kernel_times_s(kernels, replace(speed, attention=fa2), eff)
    expected = [flops / (speed.peak_flops * top * s / (s + 450.0)) + eff.kernel_latency_s for top in (0.36, 0.31)]
    assert times == pytest.approx(expected, rel=1e-12)
    # without one, the calibration's (cuDNN's on H100)
    cal = [flops / (speed.peak_flops * top * s / (s + eff.attention_seq_half)) + eff.kernel_latency_s
           for top in (eff.attention_fwd_efficiency, eff.attention_bwd_efficiency)]
    assert kernel_times_s(kernels, speed, eff) == pytest.approx(cal, rel=1e-12)


@pytest.mark.parametrize(("backend", "version", "kernel"), [
    ("auto", 0, None), ("fused", 0, None), ("flash", 0, "flash-attention-2"), ("flash", 3, "flash-attention-3"),
    ("auto", 3, None),  # Transformer Engine prefers cuDNN on Hopper whatever FlashAttention is pinned
])
def test_each_backend_runs_its_kernel_on_h100(backend, version, kernel):
    settings = replace(RUN, attention_backend=backend, flash_attention_version=version)
    speed = run_structure(GPT, settings, H100, COMM).speed
    if kernel is None:  # cuDNN: the calibration's attention parameters price it
        assert speed.attention is None
    else:
        params = load_kernel_ceilings("H100-SXM5-80GB").attention_ceilings()[kernel]
        assert speed.attention == AttentionCeiling(kernel, *(params[k] for k in ATTENTION_PARAMETERS))


def test_flash_attention_2_on_h100_is_slower_than_cudnn_by_its_attention_time_alone():
    eff = load_calibration("h100-transfer").efficiency
    (fused, _), (flash, _), (unfused, _) = predict_settings(
        GPT, [replace(RUN, attention_backend=b, use_flash_attn=b != "unfused") for b in ("fused", "flash", "unfused")],
        H100, COMM, eff)
    assert fused.iteration_s < flash.iteration_s < unfused.iteration_s
    # A100: auto and flash both run FlashAttention-2, the A100 calibration's kernel
    a100 = load_calibration("a100-vtrain").efficiency
    (auto, _), (fa2, _) = predict_settings(GPT, [RUN, replace(RUN, attention_backend="flash")], A100, COMM, a100)
    assert auto.iteration_s == fa2.iteration_s


def test_a_kernel_the_device_file_lacks_is_an_error_naming_the_device_and_its_kernels():
    with pytest.raises(StrategyError) as err:
        run_structure(GPT, replace(RUN, attention_backend="fused"), A100, COMM)
    assert str(err.value) == (
        "attention_backend fused runs cudnn, whose ceilings device A100-SXM4-80GB has not measured "
        "(config/kernels/A100-SXM4-80GB.json has attention kernels: flash-attention-2); fit them with "
        "`paraplan fit --kind kernels --attention-kernel` (docs/kernels.md) or use attention_backend auto")
    with pytest.raises(StrategyError, match=r"^attention_backend auto \(flash_attention_version 3\) runs "
                                            r"flash-attention-3, whose ceilings device A100-SXM4-80GB"):
        run_structure(GPT, replace(RUN, flash_attention_version=3), A100, COMM)
    with pytest.raises(StrategyError, match=r"device V100-SXM2-16GB has not measured \(no kernel file "):
        run_structure(GPT, replace(RUN, attention_backend="flash", dtype="fp16"), load_cluster("dgx1-v100"), COMM)


@pytest.mark.parametrize(("backend", "flash", "message"), [
    ("flash", False, "attention_backend flash runs a fused attention kernel but use_flash_attn is false (the "
                     "unfused path); set use_flash_attn true, or attention_backend unfused"),
    ("local", True, "attention_backend local runs the unfused attention path but use_flash_attn is true; set "
                    "use_flash_attn false, or attention_backend flash, fused or auto"),
    ("fused,3", True, "flash_attention_version 3 pins FlashAttention's generation, but attention_backend fused "
                      "runs cuDNN's fused attention; expected attention_backend flash or auto"),
])
def test_an_inconsistent_pair_with_use_flash_attn_is_one_line(tmp_path, backend, flash, message):
    backend, _, version = backend.partition(",")
    settings = replace(RUN, attention_backend=backend, use_flash_attn=flash, flash_attention_version=int(version or 0))
    with pytest.raises(StrategyError) as err:
        settings.check(GPT)
    assert str(err.value) == message
    path = _table(tmp_path, "attention_backend,use_flash_attn,flash_attention_version",
                  f"{backend},{str(flash).lower()},{version}")
    with pytest.raises(InputFileError) as err2:
        read_run_table(path)
    assert str(err2.value) == f"{path}:2: impossible run: {message}"


def test_the_run_table_column_sets_use_flash_attn_when_it_is_empty(tmp_path):
    _, rows = read_run_table(_table(tmp_path, "dtype,attention_backend", "bf16,unfused"))
    assert (rows[0].settings.attention_backend, rows[0].settings.use_flash_attn) == ("unfused", False)
    _, rows = read_run_table(_table(tmp_path, "dtype,attention_backend", "fp16,flash"))
    assert (rows[0].settings.attention_backend, rows[0].settings.use_flash_attn) == ("flash", True)
    _, rows = read_run_table(_table(tmp_path, "dtype,attention_backend", "fp16,"))
    assert (rows[0].settings.attention_backend, rows[0].settings.use_flash_attn) == ("auto", False)
    with pytest.raises(InputFileError, match=r"column 'attention_backend'.*flash, fused, unfused, local, auto"):
        read_run_table(_table(tmp_path, "attention_backend", "sdpa"))


def test_a_kernel_file_round_trips_and_refuses_a_bad_kernel_section():
    path = REPO / "config/kernels/H100-SXM5-80GB.json"
    data = json.loads(path.read_text())
    assert KernelCeilings.from_dict(data, str(path)).to_dict() == data
    data["attention_kernels"]["flash-attention-2"]["params"]["attention_bwd_efficiency"] = 1.5
    with pytest.raises(InputFileError, match=r"attention_kernels\.flash-attention-2\.params\.attention_bwd_efficiency"):
        KernelCeilings.from_dict(data, str(path))
    data = json.loads(path.read_text())
    data["attention_kernels"]["cudnn"] = data["attention_kernels"]["flash-attention-2"]
    with pytest.raises(InputFileError, match="kernel cudnn is the first attention kernel"):
        KernelCeilings.from_dict(data, str(path))


def _h100_fit_arguments() -> list[str]:
    """`paraplan fit --kind kernels` as the workflow runs it for the H100 (config/config.yaml
    kernels.published.H100-SXM5-80GB; workflow/rules/kernels.smk)."""
    import yaml

    entry = yaml.safe_load((REPO / "config" / "config.yaml").read_text())["kernels"]["published"]["H100-SXM5-80GB"]
    return [*(str(REPO / path) for path in entry["inputs"]), "--cluster", entry["cluster"],
            "--attention-kernel", entry["attention_kernel"], "--attention-head-dim", entry["attention_head_dim"],
            *(("--sustained-from", entry["sustained_from"]) if entry.get("sustained_from") else ()),
            "--min-gemm-flops", str(entry["min_gemm_flops"]), "--gemm-latency-s", str(entry["gemm_latency_s"])]


def test_the_published_tables_refit_to_the_shipped_kernels(tmp_path, capsys):
    out = tmp_path / "h100.json"
    assert main(["fit", "--kind", "kernels", "--no-track", *_h100_fit_arguments(), "-o", str(out)]) == 0
    refit = KernelCeilings.from_dict(json.loads(out.read_text()), str(out))
    shipped = load_kernel_ceilings("H100-SXM5-80GB")
    fitted = refit.attention_ceilings()
    for kernel, params in shipped.attention_ceilings().items():
        assert fitted[kernel] == pytest.approx(params, rel=1e-6), kernel
    assert refit.efficiency == pytest.approx(shipped.efficiency, rel=1e-6)
    assert refit.power_limit_w == shipped.power_limit_w == 700.0  # dgx-h100's, recorded by the fit
    assert refit.fp8 is not None and shipped.fp8 is not None
    assert refit.fp8["efficiency"] == pytest.approx(shipped.fp8["efficiency"], rel=1e-6)
    inputs = [REPO / "data/published" / name for name in (
        "gemm/mamf_best_shapes_bf16.csv", "attention/flash2_fwd_bwd.csv")]
    assert main(["fit", "--kind", "kernels", "--no-track", *map(str, inputs), "--cluster", "dgx-a100",
                 "--attention-kernel", "flash-attention-2,cudnn", "-o", str(tmp_path / "a100.json")]) != 0
    assert ("option --attention-kernel: no attention rows of 'A100-SXM4-80GB' (cudnn) in the inputs to fit; "
            "expected one of the kernels there: flash-attention-2") in capsys.readouterr().err
    assert not (tmp_path / "a100.json").exists()


# ---- head dimension 64 (GPT-OSS): each kernel's ceilings fitted at that width --------

def test_the_h100_file_carries_each_kernel_at_head_dim_64_from_the_fa3_paper():
    ceilings = load_kernel_ceilings("H100-SXM5-80GB").attention_ceilings()
    # cuDNN, head dim 64, measured held at the power limit on the lent H100 (no factor)
    held = load_kernel_ceilings("H100-SXM5-80GB").attention_kernels["cudnn@hdim64"]
    assert "held" in held and "sustained" not in held
    assert ceilings["cudnn@hdim64"] == held["params"]
    assert ceilings["cudnn@hdim64"]["attention_fwd_efficiency"] == pytest.approx(0.4737, abs=5e-5)
    assert ceilings["cudnn@hdim64"]["attention_bwd_efficiency"] == pytest.approx(0.4130, abs=5e-5)
    assert ceilings["cudnn@hdim64"]["attention_seq_half"] == pytest.approx(665.8, abs=0.1)
    # narrower heads run further from the peak than the head-dim-128 fits, every kernel
    for kernel in ("cudnn", "flash-attention-2", "flash-attention-3"):
        for p in ("attention_fwd_efficiency", "attention_bwd_efficiency"):
            assert ceilings[f"{kernel}@hdim64"][p] < ceilings[kernel][p], (kernel, p)


@pytest.mark.parametrize(("backend", "head_dim", "kernel"), [
    ("auto", 64, "cudnn@hdim64"), ("fused", 64, "cudnn@hdim64"), ("flash", 64, "flash-attention-2@hdim64"),
    ("auto", 128, None), ("flash", 128, "flash-attention-2"), ("auto", 96, None),  # 96: no fit, the main one's
])
def test_a_run_is_priced_at_its_kernels_ceilings_for_its_head_width(backend, head_dim, kernel):
    speed = with_attention_kernel(DeviceSpeed.of(H100.device, "bf16"), H100.device.name,
                                  RunSettings(attention_backend=backend), head_dim)
    assert (speed.attention.kernel if speed.attention else None) == kernel
    if kernel is not None:
        assert speed.attention.attention_fwd_efficiency == pytest.approx(
            load_kernel_ceilings("H100-SXM5-80GB").attention_ceilings()[kernel]["attention_fwd_efficiency"])


def test_gpt_oss_attention_is_priced_at_the_head_dim_64_ceilings():
    model = replace(GPT, kv_channels=64, num_attention_heads=32)
    assert run_structure(model, RUN, H100, COMM).speed.attention.kernel == "cudnn@hdim64"
    assert run_structure(GPT, RUN, H100, COMM).speed.attention is None  # head dim 128: the calibration's


def test_a_head_dim_list_must_be_distinct_integers(tmp_path, capsys):
    inputs = [str(REPO / "data/published/gemm/mamf_best_shapes_bf16.csv")]
    assert main(["fit", "--kind", "kernels", "--no-track", *inputs, "--cluster", "dgx-h100",
                 "--attention-head-dim", "128,128", "-o", str(tmp_path / "k.json")]) != 0
    assert "--attention-head-dim" in capsys.readouterr().err
    assert not (tmp_path / "k.json").exists()


# ---- soft-capped attention logits (Gemma 2): FlashAttention, never cuDNN's fused kernel ----
def test_soft_capped_logits_run_flash_attention_where_auto_would_run_cudnn():
    """Transformer Engine disqualifies cuDNN's fused attention for soft-capped logits
    (NVIDIA/TransformerEngine#3391): on H100 `auto` then runs FlashAttention-2 (the pinned
    generation where one is), `fused` is an error; on A100, whose first kernel is
    FlashAttention-2 already, nothing changes; without a cap, nothing changes."""
    capped = replace(GPT, attn_logit_softcapping=50.0)
    params = load_kernel_ceilings("H100-SXM5-80GB").attention_ceilings()
    for version, kernel in ((0, "flash-attention-2"), (3, "flash-attention-3")):
        speed = run_structure(capped, replace(RUN, flash_attention_version=version), H100, COMM).speed
        assert speed.attention == AttentionCeiling(kernel, *(params[kernel][k] for k in ATTENTION_PARAMETERS))
    assert run_structure(GPT, RUN, H100, COMM).speed.attention is None
    assert run_structure(capped, RUN, A100, COMM).speed == run_structure(GPT, RUN, A100, COMM).speed
    with pytest.raises(StrategyError) as err:
        run_structure(capped, replace(RUN, attention_backend="fused"), H100, COMM)
    assert str(err.value) == ("attention_backend fused with attn_logit_softcapping: cuDNN's fused attention takes no "
                              "soft-cap (Transformer Engine runs it on FlashAttention); use attention_backend auto "
                              "or flash")
    with pytest.raises(ValueError, match="attn_logit_softcapping must be a finite number >= 0"):
        replace(GPT, attn_logit_softcapping=-1.0)


def test_a_head_width_the_kernel_file_does_not_measure_is_named(tmp_path, capsys):
    """The H100 file measures head widths 128 (main) and 64: a model of 256 (Gemma 2) or of
    192 (DeepSeek-V3's MLA queries and keys) is priced at 128's ceilings, said in a note by
    plan and predict; 64 and 128 get none, nor does a device whose file has no attention."""
    from paraplan.kernels.attention_backends import unmeasured_head_width

    assert unmeasured_head_width("H100-SXM5-80GB", 256) == (
        "attention at head width 256: config/kernels/H100-SXM5-80GB.json measures head width 64, 128; priced at "
        "128's ceilings (docs/kernels.md, \"Head widths\")")
    assert unmeasured_head_width("H100-SXM5-80GB", 64) == unmeasured_head_width("H100-SXM5-80GB", 128) == ""
    assert unmeasured_head_width("MI300X-192GB", 256) == ""  # GEMMs alone: its calibration prices attention
    assert unmeasured_head_width("A100-SXM4-80GB", 192).startswith("attention at head width 192: ")
    assert main(["plan", "--model", "deepseek-v3", "--cluster", "dgx-h100", "--gpus", "1024", "--global-batch-size",
                 "1024", "--seq-length", "4096", "-o", str(tmp_path / "p.csv"), "--no-track"]) == 0
    assert ("paraplan plan: note: deepseek-v3: attention at head width 192: config/kernels/H100-SXM5-80GB.json "
            "measures head width 64, 128") in capsys.readouterr().err

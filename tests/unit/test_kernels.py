"""Kernel ceilings: the GEMM and attention fits recover known parameters, the
published tables fit with the held-out errors the shipped files state, `bench --kind
gemm` runs on CPU and its fit reports a held-out error, old calibrations keep one
attention efficiency for both passes."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from paraplan.cli.main import main
from paraplan.clusters import load_cluster
from paraplan.core import InputFileError
from paraplan.kernels.ceilings import HELD, held_parameters, load_kernel_ceilings
from paraplan.kernels.fit import fit_attention, fit_gemm, predict_attention_s, predict_gemm_s
from paraplan.kernels.results import AttentionTimes, GemmTimes, read_kernel_csvs
from paraplan.predict.calibration import Calibration, load_calibration
from paraplan.predict.device_model import DeviceEfficiency, DeviceSpeed

H100 = load_cluster("dgx-h100").device
ROOT = Path(__file__).resolve().parents[2]
PUBLISHED = sorted((ROOT / "data" / "published").glob("gemm/*_bf16.csv")) + sorted(
    (ROOT / "data" / "published").glob("attention/*.csv"))
SUSTAINED = ROOT / "data" / "published" / "gemm" / "mamf_msmf_sustained.csv"


def _grid() -> GemmTimes:
    sizes = np.array([1024, 2048, 4096, 8192], dtype=float)
    m, n, k = (a.ravel() for a in np.meshgrid(sizes, sizes, sizes, indexing="ij"))
    return GemmTimes("H100-SXM5-80GB", "bfloat16", m, n, k, np.ones_like(m), np.ones_like(m))


def test_gemm_fit_recovers_the_parameters_it_was_made_with():
    speed = DeviceSpeed.of(H100, "bf16")
    truth = DeviceEfficiency(gemm_efficiency=0.82, gemm_k_half=150.0, kernel_latency_s=3e-6)
    grid = _grid()
    times = replace(grid, time_s=predict_gemm_s(grid, speed, truth))
    report = fit_gemm(times, speed)
    assert report.params["gemm_efficiency"] == pytest.approx(0.82, rel=1e-4)
    assert report.params["gemm_k_half"] == pytest.approx(150.0, rel=1e-3)
    assert report.heldout_mape == pytest.approx(0.0, abs=1e-6)
    assert report.heldout_scheme == "leave one shape out"


def test_one_published_shape_fits_the_ceiling_alone():
    """MAMF's A100 best shape (1024 x 10240 x 5120 at 271.2 TFLOP/s): 8 x 80 = 640 tiles
    over 108 SMs run in 6 waves (640/648), the k-loop at 5120/5184."""
    a100 = load_cluster("dgx-a100").device
    times = GemmTimes("A100-SXM4-80GB", "bfloat16", np.array([1024.0]), np.array([10240.0]), np.array([5120.0]),
                      np.array([1.0]), np.array([2 * 1024 * 10240 * 5120 / 271.2e12]))
    report = fit_gemm(times, DeviceSpeed.of(a100, "bf16"))
    assert report.fitted == ("gemm_efficiency",)
    assert report.heldout_mape is None
    # t = flops / (peak x eff x wave x kloop) + 4 us latency
    t = times.time_s[0] - 4e-6
    expected = 2 * 1024 * 10240 * 5120 / (312e12 * (640 / 648) * (5120 / 5184) * t)
    assert report.params["gemm_efficiency"] == pytest.approx(expected, rel=1e-6)


def test_attention_fit_tells_the_passes_apart_given_forward_rows():
    speed = DeviceSpeed.of(H100, "bf16")
    truth = DeviceEfficiency(attention_fwd_efficiency=0.6, attention_bwd_efficiency=0.45, attention_seq_half=500.0)
    s = np.array([512.0, 1024, 2048, 4096, 8192, 16384] * 2)
    passes = np.array(["fwd"] * 6 + ["fwd_bwd"] * 6, dtype=object)
    grid = AttentionTimes("H100-SXM5-80GB", "float16", passes, 16384 / s, np.full(12, 16.0), s, np.full(12, 128.0),
                          np.ones(12, dtype=bool), np.ones(12))
    times = replace(grid, time_s=predict_attention_s(grid, speed, truth))
    report = fit_attention(times, speed, DeviceEfficiency())
    assert report.params["attention_fwd_efficiency"] == pytest.approx(0.6, rel=1e-4)
    assert report.params["attention_bwd_efficiency"] == pytest.approx(0.45, rel=1e-4)
    assert report.params["attention_seq_half"] == pytest.approx(500.0, rel=1e-3)


def test_published_tables_agree_with_the_gemm_ceiling_measured_on_an_h100(tmp_path):
    """The published burst tables (XLA, MAMF) held by the H200's factor: the H100 file's fit
    until its GEMMs were measured held at the power limit on an H100; now a cross-check."""
    out = tmp_path / "h100.json"
    assert main(["fit", "--kind", "kernels", "--no-track", *map(str, PUBLISHED), str(SUSTAINED), "--cluster",
                 "dgx-h100", "--attention-kernel", "cudnn", "--sustained-from", "H200-SXM-141GB", "-o", str(out)]) == 0
    fitted = json.loads(out.read_text())
    shipped = load_kernel_ceilings("H100-SXM5-80GB")
    # 0.7175 against the measured 0.7116: within 1%
    assert fitted["efficiency"]["gemm_efficiency"] == pytest.approx(shipped.efficiency["gemm_efficiency"], rel=0.01)
    assert fitted["efficiency"]["gemm_efficiency"] == pytest.approx(0.7175, abs=5e-4)
    # XLA's sm_90 table (375 shapes) + MAMF, GEMMs >= 1e10 FLOPs: 109 shapes, held out within 3.5%
    assert fitted["gemm"]["n_points"] == 109
    assert fitted["gemm"]["heldout_mape"] < 0.035
    assert 0.80 < fitted["gemm"]["params"]["gemm_efficiency"] < 0.90  # the burst fit
    # held at the power limit: the H200's (same GH100, 700 W) MSMF / MAMF, four setups of the
    # MAMF finder's tables: 708.5/841.9, 702.9/828.0, 701.3/825.8, 698.6/823.9
    sustained = fitted["gemm"]["sustained"]
    ratios = [708.5 / 841.9, 702.9 / 828.0, 701.3 / 825.8, 698.6 / 823.9]
    assert sustained["factor"] == pytest.approx(float(np.exp(np.mean(np.log(ratios)))), rel=1e-12)
    assert sustained["from_device"] == "H200-SXM-141GB" and sustained["n_rows"] == 4
    assert fitted["efficiency"]["gemm_efficiency"] == pytest.approx(
        fitted["gemm"]["params"]["gemm_efficiency"] * sustained["factor"], rel=1e-12)
    # cuDNN (Transformer Engine's attention on Hopper), causal, head dim 128: forward from the
    # FA3 paper, backward derived from its non-causal backward (paraplan.kernels.causal)
    assert fitted["attention"]["kernel"] == "cudnn"
    assert fitted["attention"]["n_points"] == 12 and fitted["attention"]["derived_causal_backward"] == 6
    assert fitted["attention"]["heldout_mape"] < 0.07
    assert [Path(d["path"]).name for d in fitted["attention"]["data"]] == ["fa3_paper_h100_bwd_and_cudnn_fwd.csv"]


def test_shipped_files_cover_a100_and_h100_with_their_devices():
    # H100: 169 measured shapes determine the GEMM curve (its latency held); A100: one shape, its ceiling
    assert set(held_parameters("H100-SXM5-80GB")) == set(HELD)
    assert set(held_parameters("A100-SXM4-80GB")) == set(HELD) - {"gemm_k_half", "kernel_latency_s"}
    # H100: an 8192^3 GEMM priced as measured held at the 700 W limit on the lent H100 (672.98
    # TFLOP/s; data/measured/h100-sxm5/gemm_bf16_held.csv), within 3%, and below the best
    # sustained GEMM of the same die (H200 MSMF 708.5 at 8192 x 8448 x 20480)
    held = held_parameters("H100-SXM5-80GB")
    big = GemmTimes("x", "bfloat16", np.array([8192.0]), np.array([8192.0]), np.array([8192.0]), np.ones(1), np.ones(1))
    t = predict_gemm_s(big, DeviceSpeed.of(H100, "bf16"), replace(DeviceEfficiency(), **held))[0]
    assert big.flops[0] / t == pytest.approx(672.98e12, rel=0.03)
    assert big.flops[0] / t < 708.5e12
    assert held_parameters("no-such-device") == {}


def test_bench_gemm_on_cpu_and_its_fit_reports_held_out_error(tmp_path):
    pytest.importorskip("torch")  # timing kernels is the measure extra's
    assert main(["bench", "--kind", "gemm", "--device", "cpu", "--device-name", "cpu-core", "--m", "32,64",
                 "--n", "32,64", "--k", "16,64", "--warmup", "1", "--iters", "3", "--no-track",
                 "-o", str(tmp_path)]) == 0
    rows = read_kernel_csvs([tmp_path / "gemm.csv"])
    assert len(rows.gemm) == 8
    out = tmp_path / "cpu.json"
    assert main(["fit", "--kind", "kernels", "--no-track", str(tmp_path / "gemm.csv"), "--cluster", "local-cpu",
                 "--gemm-dtype", "float32", "--min-gemm-flops", "0", "-o", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["gemm"]["n_points"] == 8
    assert doc["gemm"]["heldout_mape"] is not None and doc["gemm"]["heldout_mape"] >= 0
    assert doc["attention"] is None


def test_a_bad_cell_names_file_line_and_column(tmp_path, capsys):
    bad = tmp_path / "g.csv"
    bad.write_text("kind,device,dtype,m,n,k,batch,time_us,time_p10_us,time_p90_us,tflops,source\n"
                   "gemm,cpu,float32,64,64,64,1,-3,,,1,x\n")
    with pytest.raises(InputFileError, match=r"g.csv:2: column 'time_us': expected a positive number, got '-3'"):
        read_kernel_csvs([bad])
    assert main(["fit", "--kind", "kernels", "--no-track", str(bad), "--cluster", "local-cpu",
                 "-o", str(tmp_path / "o.json")]) == 2
    assert not (tmp_path / "o.json").exists()


def test_old_calibrations_keep_one_attention_efficiency_for_both_passes():
    shipped = load_calibration("a100-vtrain").to_dict()
    old = {k: v for k, v in shipped["efficiency"].items() if not k.startswith("attention_")}
    cal = Calibration.from_dict({**shipped, "efficiency": {**old, "attention_efficiency": 0.55}}, "old.json")
    assert cal.efficiency.attention_fwd_efficiency == cal.efficiency.attention_bwd_efficiency == 0.55
    assert "attention_efficiency" in cal.to_dict()["efficiency"]  # written back as it was read
    split = replace(cal.efficiency, attention_bwd_efficiency=0.4)
    doc = Calibration(cal.name, cal.device, split).to_dict()
    assert doc["efficiency"]["attention_bwd_efficiency"] == 0.4 and "attention_efficiency" not in doc["efficiency"]
    assert Calibration.from_dict(doc, "x").efficiency.attention_bwd_efficiency == 0.4
    both = {**doc, "efficiency": {**doc["efficiency"], "attention_efficiency": 0.5}}
    with pytest.raises(InputFileError, match="give either attention_efficiency"):
        Calibration.from_dict(both, "x")

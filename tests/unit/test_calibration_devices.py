"""Which calibration a prediction uses on each device, and calibrations made for a device
without training runs (its kernel fit plus another device's host and memory parameters)."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from paraplan.cli.main import main
from paraplan.clusters import load_cluster
from paraplan.kernels.ceilings import load_kernel_ceilings
from paraplan.predict.calibration import (
    DEFAULT_CALIBRATION,
    calibration_for,
    load_calibration,
    shipped_calibration_for,
    transferred_calibration,
)


def test_a_device_without_a_calibration_gets_the_default_with_a_warning():
    said: list[str] = []
    cluster = load_cluster("dgx1-v100")
    assert shipped_calibration_for(cluster.device.name) is None
    assert calibration_for(cluster, warn=said.append).name == DEFAULT_CALIBRATION
    assert said and said[0].startswith(f"no calibration for {cluster.device.name}: {DEFAULT_CALIBRATION}'s")


def test_a_named_calibration_wins_and_the_a100_gets_its_own():
    a100 = load_cluster("dgx-a100")
    assert calibration_for(a100).device == a100.device.name
    assert calibration_for(load_cluster("dgx-h100"), DEFAULT_CALIBRATION).name == DEFAULT_CALIBRATION


def test_a_transferred_calibration_holds_the_kernel_fit_and_carries_the_rest():
    source = load_calibration(DEFAULT_CALIBRATION)
    ceilings = load_kernel_ceilings("H100-SXM5-80GB")
    made = transferred_calibration(source, "H100-SXM5-80GB", dict(ceilings.efficiency), "device", "h100-test")
    for key, value in ceilings.efficiency.items():
        assert getattr(made.efficiency, key) == value
    carried = set(made.efficiency.as_dict()) - set(ceilings.efficiency)
    for key in carried:
        assert getattr(made.efficiency, key) == getattr(source.efficiency, key)
    assert made.assumptions["carried_from_source"] == sorted(carried)
    assert len(made.efficiency.layer_time_factors) == 0 and made.intra_node_comm is None
    assert made.data["transferred_from"] == source.label


def test_calibrate_transfer_writes_a_calibration_predict_can_use(tmp_path):
    out = tmp_path / "h100.json"
    assert main(["calibrate", "--transfer", DEFAULT_CALIBRATION, "--cluster", "dgx-h100", "-o", str(out),
                 "--no-track"]) == 0
    doc = json.loads(out.read_text())
    assert doc["device"] == "H100-SXM5-80GB" and doc["data"]["kernel_ceilings"] == "device"
    assert load_calibration(out).efficiency.gemm_efficiency == load_kernel_ceilings(
        "H100-SXM5-80GB").efficiency["gemm_efficiency"]
    assert main(["calibrate", "runs.csv", "--transfer", DEFAULT_CALIBRATION, "--cluster", "dgx-h100", "-o",
                 str(tmp_path / "x.json"), "--no-track"]) == 2


def test_a_transfer_for_a_device_of_the_same_compute_holds_that_devices_kernel_fit(tmp_path, capsys):
    """dgx-h200 computes as the H100 SXM5 (`same_compute_as`): `--kernel-ceilings device`
    is the H100's file, the calibration is made for the H200 by name; another device's
    file is refused, saying what the cluster's device computes as."""
    out = tmp_path / "h200.json"
    assert main(["calibrate", "--transfer", DEFAULT_CALIBRATION, "--cluster", "dgx-h200", "-o", str(out),
                 "--no-track"]) == 0
    doc = json.loads(out.read_text())
    assert doc["device"] == "H200-SXM-141GB"
    assert load_calibration(out).efficiency.gemm_efficiency == load_kernel_ceilings(
        "H100-SXM5-80GB").efficiency["gemm_efficiency"]
    capsys.readouterr()
    assert main(["calibrate", "--transfer", DEFAULT_CALIBRATION, "--cluster", "dgx-h200", "--kernel-ceilings",
                 "A100-SXM4-80GB", "-o", str(tmp_path / "x.json"), "--no-track"]) == 2
    assert ("the kernel fit is for A100-SXM4-80GB, the cluster's device H200-SXM-141GB computes as H100-SXM5-80GB "
            "(same_compute_as)") in capsys.readouterr().err


def test_the_mi300x_holds_its_measured_gemm_ceiling_and_says_its_attention_is_carried():
    """MI300X: GEMMs at MAMF's best BF16 shape (668.4 TFLOP/s, burst) from its kernel file, the
    rest (attention among it: no MI300X attention kernel is measured) carried from the A100's
    calibration, which a warning names; an attention backend it has not measured is an error."""
    from paraplan.core import StrategyError
    from paraplan.core.run_settings import RunSettings
    from paraplan.kernels.attention_backends import with_attention_kernel
    from paraplan.predict.device_model import DeviceSpeed, gemm_efficiency

    said: list[str] = []
    cluster = load_cluster("mi300x")
    calibration = calibration_for(cluster, warn=said.append)
    assert calibration.name == "mi300x-transfer" and calibration.device == "MI300X-192GB"
    ceilings = load_kernel_ceilings("MI300X-192GB")
    assert ceilings.attention is None
    assert calibration.efficiency.gemm_efficiency == ceilings.efficiency["gemm_efficiency"]
    speed = DeviceSpeed.of(cluster.device, "bf16")
    held = replace(calibration.efficiency, gemm_k_half=ceilings.gemm["params"]["gemm_k_half"])
    one = np.array([1.0])
    rate = gemm_efficiency(10240 * one, 15360 * one, 8192 * one, one, speed, held)[0] * speed.peak_flops / 1e12
    assert rate == pytest.approx(668.4, rel=2e-3)  # MAMF's best shape, its 4 us launch apart
    source = load_calibration(DEFAULT_CALIBRATION)
    assert calibration.efficiency.attention_fwd_efficiency == source.efficiency.attention_fwd_efficiency
    assert said == ["mi300x-transfer: no attention kernel of MI300X-192GB is measured; its attention efficiencies "
                    "are A100-SXM4-80GB's taken as fractions of this device's peaks (docs/kernels.md)"]
    assert with_attention_kernel(speed, "MI300X-192GB", RunSettings(), head_dim=128) is speed
    with pytest.raises(StrategyError, match="has attention kernels: none"):
        with_attention_kernel(speed, "MI300X-192GB", RunSettings(attention_backend="flash"), head_dim=128)

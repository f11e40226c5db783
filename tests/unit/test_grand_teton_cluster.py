"""grand-teton-h100-500w: the hosts torchtitan's Llama 3.1 benchmarks ran on (Meta Grand
Teton, H100 SXM with 96 GB HBM2e at 2.4 TB/s, 500 W). Only the memory is published for
this part, so only the memory differs from dgx-h100; the compute is the 700 W H100
SXM5's measured kernel ceilings (docs/kernels.md, "H100 at 500 W")."""

from __future__ import annotations

import csv
import dataclasses
from pathlib import Path

from paraplan.clusters import load_cluster
from paraplan.kernels.ceilings import shipped_kernel_ceilings
from script_module import load_script

GIB = 2**30
BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _published_module():
    return load_script(BENCHMARKS / "published.py", register=True)


def test_memory_is_torchtitans_96_gb_hbm2e_at_2_4_tb_s(repo_root):
    """torchtitan's page (commit 31a17bfd): "96GB HBM2e with 2.4 TB/sec peak memory bandwidth";
    no runtime total is published, so 96 GB counts as 96e9 bytes, less the framework's reserve."""
    device = load_cluster("grand-teton-h100-500w", repo_root / "config/clusters").device
    assert device.mem_bandwidth_Bps == 2.4e12
    assert device.memory_bytes == 96e9
    assert device.usable_memory_bytes == 96e9 - (400 + 64) * 2**20 == 95_513_460_736


def test_only_the_memory_differs_from_dgx_h100(repo_root):
    """Peaks, SMs, launch overhead, reserve, links and the 8 x 400 Gb/s network are the
    H100 SXM5 node's: nothing else about the 500 W part is published but its memory and
    its power limit."""
    grand_teton = load_cluster("grand-teton-h100-500w", repo_root / "config/clusters")
    dgx = load_cluster("dgx-h100", repo_root / "config/clusters")
    assert dataclasses.replace(grand_teton.device, name="H100-SXM5-80GB", same_compute_as="",
                               mem_bandwidth_Bps=3.35e12, memory_bytes=dgx.device.memory_bytes,
                               power_limit_w=700.0) == dgx.device
    assert grand_teton.device.power_limit_w == 500.0
    assert (grand_teton.nodes, grand_teton.devices_per_node) == (4, 8)
    assert (grand_teton.intra, grand_teton.inter, grand_teton.network) == (dgx.intra, dgx.inter, dgx.network)


def test_compute_is_priced_by_the_700_w_h100_kernel_file(repo_root):
    """The device, named as its part, computes as the H100 SXM5 (`same_compute_as`) so that
    its measured ceilings price it (held at the 700 W limit: a lower bound on GEMM and
    attention time at 500 W)."""
    device = load_cluster("grand-teton-h100-500w", repo_root / "config/clusters").device
    assert (device.name, device.compute_name) == ("H100-SXM-96GB-HBM2e", "H100-SXM5-80GB")
    assert shipped_kernel_ceilings(device.name) is None
    ceilings = shipped_kernel_ceilings(device.compute_name)
    assert ceilings is not None and ceilings.device == "H100-SXM5-80GB"
    assert round(ceilings.efficiency["gemm_efficiency"], 3) == 0.712  # measured held at the 700 W limit


def test_torchtitans_measured_peaks_fit_here_and_not_on_dgx_h100(repo_root):
    """torchtitan's largest published peak, 84.9 GiB (405B, FSDP 1 CP 8, Table 6) = 91.2e9
    bytes, is over the 84.56e9 bytes a dgx-h100 GPU leaves tensors and under the 95.5e9 here."""
    path = BENCHMARKS / "data" / "torchtitan_llama31_h100.csv"
    with path.open(newline="", encoding="utf-8") as handle:
        peak_gib = max(float(r["published_peak_memory_GiB"]) for r in csv.DictReader(handle))
    assert peak_gib == 84.9
    clusters = repo_root / "config/clusters"
    assert load_cluster("dgx-h100", clusters).device.usable_memory_bytes < peak_gib * GIB
    assert peak_gib * GIB < load_cluster("grand-teton-h100-500w", clusters).device.usable_memory_bytes


def test_the_torchtitan_table_is_predicted_on_grand_teton():
    published = _published_module()
    assert published.TABLES["torchtitan_llama31_h100"][0] == "grand-teton-h100-500w"

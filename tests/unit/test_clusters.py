"""Cluster files load into `Cluster` with SI units; bad keys are named."""

from __future__ import annotations

import pytest
import yaml

from paraplan.clusters import cluster_from_dict, load_cluster
from paraplan.core import ConfigError, InputFileError


@pytest.mark.parametrize("name", ["local-cpu", "dgx1-v100", "dgx-a100", "dgx-h100"])
def test_shipped_clusters_load(repo_root, name):
    cluster = load_cluster(name, repo_root / "config/clusters")
    assert cluster.name == name
    assert cluster.device.peak_flops > 1e10
    assert cluster.intra.bandwidth_Bps >= cluster.inter.bandwidth_Bps


def test_dapple_v100_setting(repo_root):
    c = load_cluster("dgx1-v100", repo_root / "config/clusters")
    assert (c.nodes, c.devices_per_node) == (2, 8)
    assert c.device.memory_bytes == 16_928_342_016  # deviceQuery's total, not 16e9
    assert c.intra.bandwidth_Bps == 25e9 and c.inter.bandwidth_Bps == 3e9


@pytest.mark.parametrize("name,total_bytes,reserved_MiB", [
    ("dgx-a100", 85_100_068_864, 400 + 12.125),  # A100-SXM4-80GB: 81,157.75 MiB (driver 555)
    ("dgx-a100-40gb", 42_298_834_944, 400 + 12.125),
    ("dgx-h100", 85_045_477_376, 400 + 64),  # H100 80GB HBM3: 81,105.69 MiB (driver 565)
    ("dgx-h800", 85_045_477_376, 400 + 64),
    ("dgx-h200", 150_109_880_320, 400 + 64),
    ("gh200-alps", 102_005_473_280, 400 + 64),
    ("dgx1-v100", 16_928_342_016, 400 + 8.125),
    ("mi300x", 196_592 * 2**20, 76),  # hipBLASLt's workspace only: the ROCm context is not published
    ("local-cpu", 12e9, 0),
])
def test_device_memory_is_the_runtime_total_less_the_framework_reserve(repo_root, name, total_bytes, reserved_MiB):
    device = load_cluster(name, repo_root / "config/clusters").device
    assert device.memory_bytes == total_bytes
    assert device.reserved_bytes == reserved_MiB * 2**20
    assert device.usable_memory_bytes == total_bytes - reserved_MiB * 2**20


def test_an_h100_holds_more_than_80e9_bytes_after_its_reserve(repo_root):
    """"80 GB" is 80 GiB of HBM; CUDA shows a process 81,105.69 MiB of it; the context and
    the BLAS workspaces leave 80,641.69 MiB = 84.56e9 bytes for tensors."""
    device = load_cluster("dgx-h100", repo_root / "config/clusters").device
    assert device.usable_memory_bytes == (81_105.6875 - 464) * 2**20 == 84_558_938_112
    assert device.capacity_text() == "84.6 GB usable of 85.0 GB"


@pytest.mark.parametrize("edit,message", [
    (lambda d: d["device"].update(memory_GB=16), "key 'device': give exactly one of memory_MiB (the runtime's "
     "total, 2**20 bytes each) and memory_GB (1e9 bytes each), got both"),
    (lambda d: d["device"].pop("memory_MiB"), "key 'device': give exactly one of memory_MiB (the runtime's total, "
     "2**20 bytes each) and memory_GB (1e9 bytes each), got neither"),
    (lambda d: d["device"]["reserved"].update(cuda_context_MiB=20000),
     "key 'device': reserved (20008.1 MiB) leaves nothing of the device's 16144.1 MiB"),
    (lambda d: d["device"]["reserved"].update(nccl_MiB=100),
     "key 'device.reserved.nccl_MiB': unknown key; expected one of cuda_context_MiB, blas_workspace_MiB"),
])
def test_device_memory_keys_are_checked(repo_root, edit, message):
    data = _base(repo_root)
    edit(data)
    with pytest.raises(InputFileError) as err:
        cluster_from_dict(data, "x.yaml")
    assert str(err.value).startswith("x.yaml: " + message)


def test_memory_gb_still_means_1e9_bytes_with_no_reserve(repo_root):
    data = _base(repo_root)
    del data["device"]["memory_MiB"], data["device"]["reserved"]
    data["device"]["memory_GB"] = 16
    device = cluster_from_dict(data, "x.yaml").device
    assert (device.memory_bytes, device.reserved_bytes, device.usable_memory_bytes) == (16e9, 0.0, 16e9)


def test_topology_helpers(repo_root):
    c = load_cluster("dgx1-v100", repo_root / "config/clusters")
    assert c.num_devices == 16
    assert c.node_of(7) == 0 and c.node_of(8) == 1
    assert c.nodes_spanned([0, 3, 9]) == 2
    assert c.link_between(0, 7) is c.intra and c.link_between(7, 8) is c.inter


def _base(repo_root):
    return yaml.safe_load((repo_root / "config/clusters/dgx1-v100.yaml").read_text())


def test_unknown_device_key_is_named(repo_root):
    data = _base(repo_root)
    data["device"]["peak_tflop"] = 1
    with pytest.raises(InputFileError, match=r"x\.yaml: key 'device\.peak_tflop': unknown key; expected one of name, "
                       r"peak_tflops, mem_bandwidth_GBps"):
        cluster_from_dict(data, "x.yaml")


@pytest.mark.parametrize("edit,message", [
    (lambda d: d["links"]["inter"].update(bandwidth_GBps=-3),
     "key 'links.inter.bandwidth_GBps': expected a number >= 1e-6 and <= 1000000, got -3: negative"),
    (lambda d: d["device"].update(peak_tflops=0),
     "key 'device.peak_tflops': expected a number >= 1e-6 and <= 1000000, got 0"),
    (lambda d: d.update(nodes=1.5), "key 'nodes': expected an integer >= 1 and <= 2^20, got 1.5: not an integer"),
    (lambda d: d["device"].update(memory_GB=float("inf")),
     "key 'device.memory_GB': expected a number >= 1e-6 and <= 1000000, got inf: not a finite number"),
    (lambda d: d["device"].update(mem_bandwidth_GBps=float("nan")),
     "key 'device.mem_bandwidth_GBps': expected a number >= 1e-6 and <= 1000000, got nan: not a finite number"),
    (lambda d: d["links"]["intra"].update(latency_us=-5),
     "key 'links.intra.latency_us': expected a number >= 0 and <= 1e9, got -5: negative"),
    (lambda d: d["device"].update(memory_GB=80e9),
     "key 'device.memory_GB': expected a number >= 1e-6 and <= 1000000, got 80000000000.0: above 1 PB per device; "
     "wrong unit? (GB, 1e9 bytes)"),
    (lambda d: d.update(nodes=10_000_000),
     "key 'nodes': expected an integer >= 1 and <= 2^20, got 10000000: more devices than any machine built"),
    (lambda d: d.update(nodes=2048, devices_per_node=1024),
     "nodes x devices_per_node = 2048 x 1024 is above 1,048,576 devices: more devices than any machine built"),
    (lambda d: d.pop("links"), "key 'links': missing; expected a mapping (intra, inter)"),
])
def test_bad_values_name_the_key_the_value_and_what_was_expected(repo_root, edit, message):
    data = _base(repo_root)
    edit(data)
    with pytest.raises(InputFileError) as err:
        cluster_from_dict(data, "x.yaml")
    assert str(err.value).startswith("x.yaml: " + message)


def test_cluster_file_and_schema_come_from_one_dataclass(repo_root):
    from paraplan.clusters import ClusterFile
    from paraplan.typed import json_schema

    schema = json_schema(ClusterFile)
    assert schema["required"] == ["name", "nodes", "devices_per_node", "device", "links"]
    link = schema["properties"]["links"]["properties"]["inter"]
    assert link["properties"]["bandwidth_GBps"] == {
        "type": "number", "minimum": 1e-06, "maximum": 1000000,
        "description": "Bandwidth per device in GB/s (1e9 bytes per second); bus bandwidth as nccl-tests reports it."}


def test_missing_cluster_lists_known(repo_root):
    with pytest.raises(ConfigError, match=r"known clusters: .*dgx1-v100"):
        load_cluster("nope", repo_root / "config/clusters")


def test_named_cluster_is_found_from_any_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no config/clusters here
    assert load_cluster("dgx1-v100").devices_per_node == 8

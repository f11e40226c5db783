"""PipeDream TorchGraph import/export: the reference totals of
data/reference/dapple/profile_totals.csv (docs/dapple-planner.md), Kahn order, cut
activations, round trips and located errors."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest

from paraplan.core import InputFileError, LayerProfile, ModelProfile
from paraplan.profile.io import read_profile, write_profile
from paraplan.profile.pipedream import (
    batch_size_from_name,
    parse_torchgraph,
    read_pipedream,
    topological_order,
    write_pipedream,
)

# layers, sum F (ms), sum B (ms), sum P (MB = 1e6 bytes), one decimal, counted independently
# of this importer (data/README.md)
_TOTALS = Path(__file__).resolve().parents[2] / "data" / "reference" / "dapple" / "profile_totals.csv"
with _TOTALS.open(newline="") as _handle:
    REFERENCE = {r["profile"]: (int(r["layers"]), float(r["fwd_ms"]), float(r["bwd_ms"]), float(r["param_MB"]))
                 for r in csv.DictReader(_handle)}


def _node(k: int, name: str, f: float = 1.0, b: float = 2.0, a: str = "100", p: float = 8.0) -> str:
    return (f"node{k} -- {name} -- forward_compute_time={f}, backward_compute_time={b}, "
            f"activation_size={a}, parameter_size={p}")


def test_reference_totals_name_five_of_the_profiles(data_dir):
    assert len(REFERENCE) == 5
    assert set(REFERENCE) <= {p.name for p in (data_dir / "pipedream-profiles").glob("*.txt")}


@pytest.mark.parametrize("filename", sorted(REFERENCE))
def test_reference_totals(data_dir, filename):
    layers, fwd_ms, bwd_ms, param_mb = REFERENCE[filename]
    profile = read_pipedream(data_dir / "pipedream-profiles" / filename)
    assert profile.num_layers == layers
    assert round(profile.fwd_s.sum() * 1e3, 1) == fwd_ms
    assert round(profile.bwd_s.sum() * 1e3, 1) == bwd_ms
    assert round(profile.param_bytes.sum() / 1e6, 1) == param_mb
    assert profile.batch_size == batch_size_from_name(filename)


def test_resnet50_input_node_time_is_not_counted(data_dir):
    profile = read_pipedream(data_dir / "pipedream-profiles" / "resnet50-pbs-32.txt")
    assert not any(la.name.startswith("Input") for la in profile.layers)
    # the Input node's 18.962 ms would push the sum to 201.5 ms
    assert profile.fwd_s.sum() * 1e3 == pytest.approx(182.5, abs=0.05)


def test_every_shared_profile_imports(data_dir):
    for path in sorted((data_dir / "pipedream-profiles").glob("*.txt")):
        profile = read_pipedream(path)
        assert profile.num_layers > 0
        assert all(la.activation_bytes >= 0 for la in profile.layers)


def test_kahn_order_smallest_id_first_and_cut_bytes(tmp_path):
    # node5 -> {node3, node9}; node3 -> node7; node9 -> node7 ; Input node1 -> node5
    text = "\n".join([
        _node(7, "join", a="10"),
        _node(9, "right", a="300"),
        _node(3, "left", a="200"),
        _node(5, "fork", a="[40; 60]"),
        _node(1, "Input", f=50.0, a="999"),
        "\tnode1 -- node5",
        "\tnode5 -- node9",
        "\tnode5 -- node3",
        "\tnode3 -- node7",
        "\tnode9 -- node7",
    ]) + "\n"
    path = tmp_path / "toy-pbs-4.txt"
    path.write_text(text)
    graph = parse_torchgraph(text, path)
    assert topological_order(graph) == [1, 5, 3, 9, 7]
    profile = read_pipedream(path)
    assert [la.name for la in profile.layers] == ["fork", "left", "right", "join"]
    assert profile.batch_size == 4
    assert profile.fwd_s.sum() == pytest.approx(4e-3)  # the Input's 50 ms is dropped
    # after fork: both edges of fork cross (100 + 100); after left: left->join (200) and
    # fork->right (100); after right: left->join + right->join; last: own output
    assert list(profile.activation_bytes) == [200.0, 300.0, 500.0, 10.0]


def test_getitem_nodes_are_bypassed(tmp_path):
    text = "\n".join([
        _node(1, "lstm", a="[1000; 24]"),
        _node(2, "__getitem__(0)", f=0.0, b=0.0, a="1000"),
        _node(3, "__getitem__(1)", f=0.0, b=0.0, a="24"),
        _node(4, "dense", a="7"),
        "\tnode1 -- node2", "\tnode1 -- node3", "\tnode2 -- node4",
    ]) + "\n"
    path = tmp_path / "g.txt"
    path.write_text(text)
    profile = read_pipedream(path, batch_size=2)
    assert [la.name for la in profile.layers] == ["lstm", "dense"]
    assert list(profile.activation_bytes) == [1000.0, 7.0]  # the selected item crosses


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("node2 -- b -- forward_compute_time=1, backward_compute_time=2, activation_size=3", "parameter_size"),
        ("node2 -- b -- forward_compute_time=x, backward_compute_time=2, activation_size=3, parameter_size=4",
         r"key 'forward_compute_time': expected a time in milliseconds \(a number >= 0 and <= 1e8\), got 'x'$"),
        ("node2 -- b -- forward_compute_time=-1, backward_compute_time=2, activation_size=3, parameter_size=4",
         r"key 'forward_compute_time': .*, got '-1': negative$"),
        ("node2 -- b -- forward_compute_time=1, backward_compute_time=nan, activation_size=3, parameter_size=4",
         r"key 'backward_compute_time': .*, got 'nan': not a finite number$"),
        ("node2 -- b -- forward_compute_time=1, backward_compute_time=2, activation_size=[1e300; 1e300; 1e300], "
         "parameter_size=4", r"key 'activation_size': .*, got '1e300': above 2\^60 bytes \(1 EiB\)$"),
        ("node2 -- b -- forward_compute_time=1, backward_compute_time=2, activation_size=[1e18; 1e18; 1e18], "
         "parameter_size=4", r"key 'activation_size' \(sum of the list\): .*, got 3e\+18: above 2\^60 bytes"),
        ("node2 -- b", "expected 'nodeK"),
        ("\tnode1 -- node8", "node8"),
    ],
)
def test_malformed_lines_name_file_and_line(tmp_path, line, message):
    path = tmp_path / "bad-pbs-1.txt"
    path.write_text(_node(1, "a") + "\n" + line + "\n")
    with pytest.raises(InputFileError, match=message) as info:
        read_pipedream(path)
    assert info.value.line == 2
    assert str(path) in str(info.value)


def test_cycle_is_an_error_with_a_line(tmp_path):
    path = tmp_path / "cyc-pbs-1.txt"
    path.write_text("\n".join([_node(1, "a"), _node(2, "b"), _node(3, "c"),
                               "\tnode1 -- node2", "\tnode2 -- node3", "\tnode3 -- node2"]) + "\n")
    with pytest.raises(InputFileError, match="cycle") as info:
        read_pipedream(path)
    assert info.value.line == 5


def test_missing_batch_size_is_an_error(tmp_path):
    path = tmp_path / "nopbs.txt"
    path.write_text(_node(1, "a") + "\n")
    with pytest.raises(InputFileError, match="pbs"):
        read_pipedream(path)


def test_csv_to_text_to_csv_is_exact(tmp_path):
    values = [0.1, 1 / 3, 2.5e-5, 0.0123456789012345, 7e-9, 0.3, 1.1e-3, math.pi / 100]
    layers = tuple(
        LayerProfile(f"block {i}", fwd_s=v, bwd_s=v * 2.7, activation_bytes=4096.0 * (i + 1),
                     param_bytes=float(4 * (i + 3) ** 3))
        for i, v in enumerate(values)
    )
    original = ModelProfile("toy", 16, layers, meta={"method": "test"})
    csv_path, _ = write_profile(original, tmp_path / "toy.csv")
    from_csv = read_profile(csv_path)
    text_path = write_pipedream(from_csv, tmp_path / "toy-pbs-16.txt")
    back = read_pipedream(text_path)
    back_csv, _ = write_profile(back, tmp_path / "back.csv")
    assert back.batch_size == 16
    for a, b in zip(from_csv.layers, back.layers, strict=True):
        assert (a.name, a.fwd_s, a.bwd_s, a.activation_bytes, a.param_bytes) == (
            b.name, b.fwd_s, b.bwd_s, b.activation_bytes, b.param_bytes)
    assert back_csv.read_text() == csv_path.read_text()


def test_shared_profile_round_trips_through_text(data_dir, tmp_path):
    first = read_pipedream(data_dir / "pipedream-profiles" / "vgg-19-pbs-32.txt")
    again = read_pipedream(write_pipedream(first, tmp_path / "vgg-pbs-32.txt"))
    assert [la.fwd_s for la in again.layers] == [la.fwd_s for la in first.layers]
    assert list(again.activation_bytes) == list(first.activation_bytes)

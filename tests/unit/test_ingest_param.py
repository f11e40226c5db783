"""PARAM comms importer: the real 2-rank gloo output, both row layouts, bad rows,
and the `paraplan ingest` command end to end."""

from __future__ import annotations

import pandas as pd
import pytest

from paraplan.cli.main import main
from paraplan.comm.log_common import ImportOptions, rows_frame
from paraplan.comm.param_log import parse_param, read_param
from paraplan.core import InputFileError


def _param_file(data_dir):
    return data_dir / "param" / "param_gloo_cpu_2ranks_blocking.txt"


def test_real_param_output(data_dir):
    result = read_param(_param_file(data_dir))
    frame = rows_frame(result.rows)
    assert frame.groupby("collective").size().to_dict() == {
        "all_gather": 15, "all_reduce": 15, "all_to_all": 15, "reduce_scatter": 15,
    }
    assert set(frame["world_size"]) == {2} and set(frame["nodes"]) == {1}
    assert set(frame["backend"]) == {"gloo"} and set(frame["dtype"]) == {"float32"}
    reduce = frame[frame["collective"] == "all_reduce"]
    assert reduce["size_bytes"].iloc[0] == 1024 and reduce["size_bytes"].iloc[-1] == 16777216
    assert reduce["time_us"].iloc[0] == pytest.approx(2216.3)  # p50
    gather = frame[frame["collective"] == "all_gather"].set_index("size_bytes")
    # 2 MiB in 2049.5 us: algbw 1.023, busbw (n-1)/n x algbw = 0.512 (as printed)
    assert gather.loc[2097152, "algbw_GBps"] == pytest.approx(1.023, abs=5e-4)
    assert gather.loc[2097152, "busbw_GBps"] == pytest.approx(0.512, abs=5e-4)
    assert result.warnings == ()


def test_seed_fork_layout_and_upstream_layout():
    fork = (
        "world_size: 4\n"
        "COMMS-RES-all_to_allv-float32  4096  256  100.0  110.0  120.0  90.0  130.0  0.041  0.031\n"
        "COMMS-RES-all_to_allv-float32  8192  512  150.0  160.0  170.0  140.0  180.0  0.055  0.041\n"
    )
    rows = parse_param(fork, "fork.txt").rows
    assert [(r.collective, r.size_bytes, r.time_us, r.world_size) for r in rows] == [
        ("all_to_allv", 4096, 100.0, 4), ("all_to_allv", 8192, 150.0, 4)
    ]
    upstream = (
        "\t collective=all_reduce, src_ranks=None\n"
        "[Rank   0] host nodeA, device: cuda:0 world_size: 2\n"
        "[Rank   1] host nodeB, device: cuda:0 world_size: 2\n"
        "\tCOMMS-RES   total-size (B)  nElementsPerRank  Time(us):p50  p75  p95  Min  Max  AlgBW(GB/s)  BusBW(GB/s)\n"
        "\tCOMMS-RES   1048576   262144   500.0   510.0   520.0   490.0   530.0   2.097   2.097\n"
    )
    (row,) = parse_param(upstream, "up.txt").rows
    assert (row.collective, row.world_size, row.nodes, row.time_us) == ("all_reduce", 2, 2, 500.0)


def test_printed_bandwidth_mismatch_warns():
    text = "world_size: 2\nCOMMS-RES-all_reduce-float32  1048576  262144  500.0  1 1 1 1  3.000  3.000\n"
    warnings = [w for w in parse_param(text, "w.txt").warnings if "printed" in w]
    # 1 MiB in 500 us is 2.10 GB/s
    assert len(warnings) == 2
    assert warnings[0].startswith("w.txt:2: printed algbw 3.00 GB/s differs from the recomputed 2.10")


def test_bad_param_inputs(tmp_path):
    with pytest.raises(InputFileError, match=r"t\.txt:2: truncated"):
        parse_param("world_size: 2\nCOMMS-RES-all_reduce-float32  1024  256  2216.3\n", "t.txt")
    with pytest.raises(InputFileError, match="no PARAM result rows"):
        parse_param("Hello from Rank 0\n", "none.txt")
    with pytest.raises(InputFileError, match="world size"):
        parse_param("COMMS-RES-all_reduce-float32 1024 256 1 1 1 1 1 0 0\n", "nw.txt")
    line = "COMMS-RES-all_reduce-float32 1024 256 1 1 1 1 1 0 0\n"
    rows = parse_param(line, "nw.txt", ImportOptions(world_size=8)).rows
    assert rows[0].world_size == 8


def test_ingest_command_round_trip(data_dir, tmp_path, capsys):
    out = tmp_path / "param.csv"
    assert main(["ingest", "--no-track", "--format", "param", str(_param_file(data_dir)), "-o", str(out)]) == 0
    frame = pd.read_csv(out)
    assert list(frame.columns[:12]) == [
        "collective", "backend", "world_size", "nodes", "size_bytes", "count", "dtype",
        "time_us", "time_p10_us", "time_p90_us", "algbw_GBps", "busbw_GBps",
    ]
    assert len(frame) == 60
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    assert main(["ingest", "--no-track", "--format", "nccl-tests", str(empty), "-o", str(tmp_path / "e.csv")]) == 2
    assert f"{empty}: empty file" in capsys.readouterr().err
    assert not (tmp_path / "e.csv").exists()


def test_in_place_is_refused_for_param(data_dir, tmp_path, capsys):
    args = ["ingest", "--no-track", "--format", "param", "--in-place", str(_param_file(data_dir)),
            "-o", str(tmp_path / "p.csv")]
    assert main(args) == 2
    assert capsys.readouterr().err == ("paraplan ingest: error: option --in-place: PARAM output has one time per "
                                       "size; --in-place applies to nccl-tests logs\n")

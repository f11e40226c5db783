"""nccl-tests / rccl-tests importer: round trips on the shared logs, and the errors
promised for bad input (file and line named)."""

from __future__ import annotations

import pytest

from paraplan.comm.log_common import ImportOptions, rows_frame
from paraplan.comm.nccl_tests import parse_nccl_tests, read_nccl_tests
from paraplan.core import InputFileError

# file stem: rows, first size, last size, world, nodes, collective, backend, last printed busbw
SHARED_LOGS = {
    "02_gh200_alps_2x4_slingshot_all_reduce": (25, 8, 134217728, 8, 2, "all_reduce", "nccl", 122.57),
    "04_gh200_alps_2node_1gpu_all_reduce": (8, 1048576, 134217728, 2, 2, "all_reduce", "nccl", 22.86),
    "05_a100_oci_bm_gpu4_1x8_all_reduce": (28, 64, 8589934592, 8, 1, "all_reduce", "nccl", 235.14),
    "07_mi355x_vultr_1x8_rccl_all_reduce": (29, 4, 1073741824, 8, 1, "all_reduce", "rccl", 402.55),
    "08_mi355x_vultr_1x8_rccl_alltoall": (21, 128, 134217728, 8, 1, "all_to_all", "rccl", 322.22),
}


def _log(data_dir, stem):
    return data_dir / "nccl-tests" / f"{stem}.txt"


@pytest.mark.parametrize("stem", sorted(SHARED_LOGS))
def test_shared_log_round_trip(data_dir, stem):
    rows, first, last, world, nodes, collective, backend, busbw = SHARED_LOGS[stem]
    result = read_nccl_tests(_log(data_dir, stem))
    frame = rows_frame(result.rows)
    assert len(frame) == rows
    assert frame["size_bytes"].iloc[0] == first
    assert frame["size_bytes"].iloc[-1] == last
    assert set(frame["world_size"]) == {world}
    assert set(frame["nodes"]) == {nodes}
    assert set(frame["collective"]) == {collective}
    assert set(frame["backend"]) == {backend}
    assert not frame["in_place"].any()
    # busbw recomputed from size and time agrees with the printed two decimals
    assert frame["busbw_GBps"].iloc[-1] == pytest.approx(busbw, abs=0.01)
    assert result.warnings == ()


def test_in_place_columns(data_dir):
    log = _log(data_dir, "02_gh200_alps_2x4_slingshot_all_reduce")
    frame = rows_frame(read_nccl_tests(log, ImportOptions(in_place=True)).rows)
    assert frame["time_us"].iloc[0] == pytest.approx(17.72)
    assert frame["time_us"].iloc[16] == pytest.approx(349.6)  # the in-place outlier at 512 KiB
    assert frame["in_place"].all()


def test_zero_size_rows_dropped_and_na_tolerated(data_dir):
    # 08 starts with four 0-byte rows whose in-place #wrong is N/A
    log = _log(data_dir, "08_mi355x_vultr_1x8_rccl_alltoall")
    frame = rows_frame(read_nccl_tests(log, ImportOptions(in_place=True)).rows)
    assert (frame["size_bytes"] > 0).all()
    assert frame["time_us"].iloc[0] == pytest.approx(59.46)


def test_world_size_from_busbw_ratio_without_rank_lines(data_dir, tmp_path):
    text = _log(data_dir, "05_a100_oci_bm_gpu4_1x8_all_reduce").read_text()
    stripped = "\n".join(line for line in text.splitlines() if "Rank" not in line)
    result = parse_nccl_tests(stripped, "x.log")
    assert {r.world_size for r in result.rows} == {8}
    assert any("inferred from busbw/algbw" in w for w in result.warnings)
    assert any("assuming 1 node" in w for w in result.warnings)


def test_wrong_world_size_warns_with_file_and_line(data_dir):
    path = _log(data_dir, "05_a100_oci_bm_gpu4_1x8_all_reduce")
    result = read_nccl_tests(path, ImportOptions(world_size=4))
    assert {r.world_size for r in result.rows} == {4}
    mismatches = [w for w in result.warnings if "printed busbw" in w]
    # busbw 2(n-1)/n: 1.5 instead of 1.75, a 14% mismatch on every row printed >= 1.00
    assert mismatches and all(w.startswith(f"{path}:") for w in mismatches)
    assert mismatches[0].startswith(f"{path}:26: ")  # 32 KiB, the first row with busbw >= 1.00


def test_concatenated_logs_keep_their_collectives(data_dir):
    text = _log(data_dir, "05_a100_oci_bm_gpu4_1x8_all_reduce").read_text() + _log(
        data_dir, "08_mi355x_vultr_1x8_rccl_alltoall"
    ).read_text()
    frame = rows_frame(parse_nccl_tests(text, "both.log").rows)
    assert frame.groupby("collective").size().to_dict() == {"all_reduce": 28, "all_to_all": 21}


def test_prose_and_prompts_are_skipped():
    text = (
        "$ mpirun -np 2 ./build/all_gather_perf -b 8 -e 64\n"
        "2 nodes were allocated\n"
        "#  Rank  0 Group  0 Pid  1 on  hostA device  0 [0x1] GPU\n"
        "#  Rank  1 Group  0 Pid  2 on  hostB device  0 [0x1] GPU\n"
        "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong\n"  # noqa: E501 (a log line as printed)
        "           8             1     float    none      -1    10.00    0.00    0.00      0    10.00    0.00    0.00    N/A\n"  # noqa: E501
        "          64             8     float    none      -1    20.00    0.00    0.00      0    20.00    0.00    0.00    N/A\n"  # noqa: E501
        "# Avg bus bandwidth    : 0.0\n"
    )
    result = parse_nccl_tests(text, "ag.log")
    assert [r.size_bytes for r in result.rows] == [8, 64]
    assert {(r.collective, r.world_size, r.nodes) for r in result.rows} == {("all_gather", 2, 2)}


ROW_LOG = (
    "# Collective test starting: all_reduce_perf\n"
    "#  Rank  0 Group  0 Pid  1 on  h device  0 [0x1] GPU\n"
    "#  Rank  1 Group  0 Pid  1 on  h device  1 [0x2] GPU\n"
    "        1024           256     float     sum      -1    20.00    0.05    0.05      0    20.00    0.05    0.05      0\n"  # noqa: E501
    "{bad}\n"
)


@pytest.mark.parametrize(
    "bad",
    [
        "        2048           512",  # truncated after the count
        "        2048           512     float     sum      -1    ",  # no times
        "        2048           512     float     sum      -1    abc    0.05    0.05      0",  # not a number
    ],
)
def test_row_that_cannot_be_parsed_names_file_and_line(tmp_path, bad):
    path = tmp_path / "bad.log"
    path.write_text(ROW_LOG.format(bad=bad))
    with pytest.raises(InputFileError, match=r"bad\.log:5: ") as info:
        read_nccl_tests(path)
    assert info.value.line == 5


def test_empty_binary_and_tableless_files_are_errors(tmp_path):
    empty = tmp_path / "empty.log"
    empty.write_text("  \n")
    with pytest.raises(InputFileError, match=r"empty\.log: empty file"):
        read_nccl_tests(empty)
    binary = tmp_path / "binary.log"
    binary.write_bytes(bytes(range(256)) * 8)
    with pytest.raises(InputFileError, match=r"binary\.log:1: NUL byte at column 1: binary data"):
        read_nccl_tests(binary)
    prose = tmp_path / "prose.log"
    prose.write_text("$ ./all_reduce_perf\nsegmentation fault\n")
    with pytest.raises(InputFileError, match="no nccl-tests table rows"):
        read_nccl_tests(prose)
    with pytest.raises(InputFileError, match="file not found"):
        read_nccl_tests(tmp_path / "missing.log")


def test_unknown_collective_needs_the_option():
    text = ("# Collective test starting: hypercube_perf\n"
            "#  Rank  0 Group  0 Pid 1 on h device 0 [0] G\n#  Rank  1 Group  0 Pid 1 on h device 1 [0] G\n"
            " 8 2 float none -1 10.0 0.00 0.00 0 10.0 0.00 0.00 0\n")
    with pytest.raises(InputFileError, match="unknown collective 'hypercube'"):
        parse_nccl_tests(text, "h.log")
    rows = parse_nccl_tests(text, "h.log", ImportOptions(collective="all_to_all")).rows
    assert rows[0].collective == "all_to_all"


@pytest.mark.parametrize("tag", ["[1,0]<stdout>:", "0: "])
def test_launcher_tags_are_removed(data_dir, tag):
    text = _log(data_dir, "04_gh200_alps_2node_1gpu_all_reduce").read_text()
    tagged = "\n".join(tag + line for line in text.splitlines())
    rows = parse_nccl_tests(tagged, "tagged.log").rows
    assert len(rows) == 8 and rows[0].size_bytes == 1048576 and rows[0].world_size == 2


def test_old_nccl_tests_layout_without_group_redop_or_root():
    """nccl-tests 2.0-era output: no `Group` in rank lines, all_gather rows without
    redop/root, an `error` column printed as a float."""
    text = (
        "# nThread 1 nGpus 1 minBytes 1024 maxBytes 4096 step: 2(factor) warmup iters: 5 iters: 20 validation: 1\n"
        "#   Rank  0 Pid  40017 on     node1 device  0 [0x06] Tesla V100-SXM2-16GB\n"
        "#   Rank  1 Pid  40018 on     node1 device  1 [0x07] Tesla V100-SXM2-16GB\n"
        "#                                                     out-of-place                       in-place\n"
        "#       size         count    type     time   algbw   busbw  error     time   algbw   busbw  error\n"
        "        1024           128   float    10.00    0.10    0.05  0e+00    10.00    0.10    0.05  0e+00\n"
        "     4194304        524288   float   400.00   10.49    5.24  0e+00   400.00   10.49    5.24  0e+00\n"
    )
    rows = parse_nccl_tests(text, "old.log", ImportOptions(collective="all_gather")).rows
    assert [(r.size_bytes, r.time_us, r.world_size, r.nodes) for r in rows] == [
        (1024, 10.0, 2, 1), (4194304, 400.0, 2, 1)]

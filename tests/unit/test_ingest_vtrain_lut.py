"""vTrain all-reduce tables (`AR_GPU<n>_*_LUT`): round trips on the shipped tables and the
errors promised for bad input (file and line named)."""

from __future__ import annotations

import pytest

from paraplan.comm.log_common import ImportOptions, rows_frame
from paraplan.comm.vtrain_lut import read_vtrain_lut
from paraplan.core import InputFileError

HEADER = "size(B),count,type,time(ns),busbw(GB/s),time(ns),busbw(GB/s)\n"


def _lut(data_dir, world):
    return data_dir / "published" / "allreduce" / "vtrain_a100" / f"AR_GPU{world}_1M_1024M_LUT"


@pytest.mark.parametrize("world", range(2, 9))
def test_shipped_tables_round_trip(data_dir, world):
    result = read_vtrain_lut(_lut(data_dir, world))
    frame = rows_frame(result.rows)
    assert len(frame) == 1024 and not result.warnings  # every printed busbw within 5% of size / time
    assert frame["size_bytes"].iloc[0] == 2**20 and frame["size_bytes"].iloc[-1] == 2**30
    assert set(frame["world_size"]) == {world} and set(frame["nodes"]) == {1}
    assert set(frame["collective"]) == {"all_reduce"} and set(frame["dtype"]) == {"float32"}


def test_first_and_last_rows_of_the_two_rank_table(data_dir):
    out = read_vtrain_lut(_lut(data_dir, 2)).rows
    assert (out[0].size_bytes, out[0].count, out[0].time_us) == (1048576, 262144, pytest.approx(44.21))
    assert out[-1].time_us == pytest.approx(5442.8)  # 1 GiB in 5.44 ms: busbw 197.3 GB/s, as printed
    assert rows_frame(out)["busbw_GBps"].iloc[-1] == pytest.approx(197.28, abs=0.01)
    in_place = read_vtrain_lut(_lut(data_dir, 2), ImportOptions(in_place=True)).rows
    assert in_place[0].time_us == pytest.approx(45.10) and in_place[0].in_place


def test_world_size_option_and_missing_name(tmp_path):
    path = tmp_path / "allreduce.csv"
    path.write_text(HEADER + "1048576,262144,float,92790,19.78,92150,19.91\n")
    with pytest.raises(InputFileError, match="does not say the world size"):
        read_vtrain_lut(path)
    rows = read_vtrain_lut(path, ImportOptions(world_size=8)).rows
    assert rows[0].world_size == 8 and rows[0].time_us == pytest.approx(92.79)


def test_printed_busbw_checked(tmp_path):
    path = tmp_path / "AR_GPU4_1M_LUT"
    path.write_text(HEADER + "1048576,262144,float,51400,30.60,52740,29.82\n")
    assert not read_vtrain_lut(path).warnings
    wrong = read_vtrain_lut(path, ImportOptions(world_size=2)).warnings  # busbw of 2 ranks: 20.4
    assert len(wrong) == 1 and f"{path}:2:" in wrong[0] and "busbw 30.60" in wrong[0]


@pytest.mark.parametrize(("text", "message", "line"), [
    ("size,count\n1,2\n", "expected the header", 1),
    (HEADER + "1048576,262144,float,51400,30.60\n", "expected 7 comma-separated values, got 5", 2),
    (HEADER + "1e6,262144,float,51400,30.60,52740,29.82\n", "expected an integer, got '1e6'", 2),
    (HEADER + "1048576,262144,float,fast,30.60,52740,29.82\n", "expected a time in ns, got 'fast'", 2),
    (HEADER, "no table rows", None),
])
def test_bad_tables_name_file_and_line(tmp_path, text, message, line):
    path = tmp_path / "AR_GPU4_1M_LUT"
    path.write_text(text)
    with pytest.raises(InputFileError, match=message) as caught:
        read_vtrain_lut(path)
    assert str(path) in str(caught.value)
    if line is not None:
        assert f"line {line}" in str(caught.value) or f":{line}" in str(caught.value)


def test_ingest_command_writes_a_bench_csv_that_fit_reads(data_dir, tmp_path):
    from paraplan.cli.main import main
    from paraplan.comm.fit_input import read_sweeps

    out = tmp_path / "ar4.csv"
    assert main(["ingest", "--format", "vtrain-allreduce", str(_lut(data_dir, 4)), "-o", str(out),
                 "--no-track"]) == 0
    frame = read_sweeps([out])
    assert len(frame) == 1024 and set(frame["world_size"]) == {4}
    assert frame["time_us"].iloc[0] == pytest.approx(51.40)

"""Bad inputs that once crashed an importer, a reader or `paraplan fit`, or passed
through silently; each is now an error naming the file, the line, the column or key,
the value and what was expected. Found by fuzzing (tests/fuzz_harness.py, issue 15);
"was:" says what happened before."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from paraplan.cli.main import main
from paraplan.comm.fit_input import read_sweep_csv, read_sweeps
from paraplan.comm.nccl_tests import read_nccl_tests
from paraplan.comm.param_log import read_param
from paraplan.comm.results import bench_frame
from paraplan.core import InputFileError
from paraplan.files import write_csv
from paraplan.profile.io import read_profile
from paraplan.profile.pipedream import read_pipedream

NCCL_HEAD = (
    "# Collective test starting: all_reduce_perf\n"
    "#  Rank  0 Group  0 Pid  1 on  h device  0 [0x1] GPU\n"
    "#  Rank  1 Group  0 Pid  1 on  h device  1 [0x2] GPU\n"
    "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong\n"  # noqa: E501 (a log line as printed)
)
GOOD_ROW = "        1024           256     float     sum      -1    20.00    0.05    0.05      0    20.00    0.05    0.05      0"  # noqa: E501
PARAM_HEAD = "world_size: 2\n[Rank   0] host vm, device: cpu\n"
PARAM_ROW = "COMMS-RES-all_reduce-float32 {size} {elements} {p50} 1 1 1 1 0.0 0.0"
PROFILE_HEADER = "layer,name,fwd_s,bwd_s,activation_bytes,param_bytes\n"
NODE = ("node{i} -- {name} -- forward_compute_time=1.0, backward_compute_time=2.0, activation_size={act}, "
        "parameter_size=4.0")


def _nccl(tmp_path, row: str):
    path = tmp_path / "log.txt"
    path.write_text(NCCL_HEAD + GOOD_ROW + "\n" + row + "\n")
    return path


def _message(exc_info) -> str:
    return str(exc_info.value)


# ---- nccl-tests --------------------------------------------------------------------


def test_nccl_size_of_2_to_the_63(tmp_path):
    """was: OverflowError in bench_frame (int64)."""
    path = _nccl(tmp_path, GOOD_ROW.replace("1024", str(2**63), 1))
    with pytest.raises(InputFileError) as info:
        read_nccl_tests(path)
    assert _message(info) == (
        f"{path}:6: column 'size': expected a message size in bytes (an integer >= 0 and <= 2^50), "
        "got '9223372036854775808': above 1 PiB"
    )


@pytest.mark.parametrize(
    ("time", "why"),
    [
        ("1e308", "a collective call takes between 1 ns and 1000 s; wrong unit?"),
        ("1e-300", "a collective call takes between 1 ns and 1000 s; wrong unit?"),
        ("nan", "not a finite number"),
        ("-20.0", "negative"),
    ],
)
def test_nccl_time_that_would_overflow_later(tmp_path, time, why):
    """was: 1e308 and 1e-300 accepted (algbw 0 or inf downstream)."""
    path = _nccl(tmp_path, GOOD_ROW.replace("20.00", time, 1))
    with pytest.raises(InputFileError) as info:
        read_nccl_tests(path)
    assert _message(info) == (
        f"{path}:6: column 'time' (out-of-place): expected a time in microseconds "
        f"(a number >= 0.001 and <= 1e9), got '{time}': {why}"
    )


def test_nccl_row_with_a_non_number_size_is_not_skipped_as_prose(tmp_path):
    """was: a row whose size read 'nan' (or Arabic-Indic digits, taken by int()) was
    skipped as prose, or read as 12."""
    for size in ("nan", "\u0661\u0662"):
        path = _nccl(tmp_path, GOOD_ROW.replace("1024", size, 1))
        with pytest.raises(InputFileError, match=rf"log\.txt:6: column 'size': .*, got '{size}'"):
            read_nccl_tests(path)


def test_nccl_row_that_lost_a_token(tmp_path):
    """was: the in-place time read as the out-of-place one (every column shifted)."""
    path = _nccl(tmp_path, GOOD_ROW.replace("    20.00", "", 1))
    with pytest.raises(InputFileError, match=r"log\.txt:6: expected 4 values .* got 7 in '1024 256 float"):
        read_nccl_tests(path)


def test_a_non_utf8_byte_is_an_error_with_line_and_column(tmp_path):
    """was: decoded as Latin-1 and accepted."""
    path = tmp_path / "log.txt"
    path.write_bytes((NCCL_HEAD + GOOD_ROW + "\n# host caf\xe9\n").encode("latin-1"))
    with pytest.raises(InputFileError) as info:
        read_nccl_tests(path)
    assert _message(info) == (
        f"{path}:6: byte 0xe9 at column 11 is not UTF-8; expected a text benchmark log as UTF-8 text"
    )


def test_more_nodes_than_ranks(tmp_path):
    from paraplan.comm.log_common import ImportOptions

    with pytest.raises(InputFileError) as info:
        read_nccl_tests(_nccl(tmp_path, GOOD_ROW), ImportOptions(nodes=4))
    assert _message(info).endswith(":5: 4 nodes for 2 ranks; expected nodes <= ranks")


# ---- PARAM -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("size", "elements", "p50", "column", "value", "why"),
    [
        ("inf", "256", "10.0", "total-size (B)", "inf", "not a finite number"),  # was: OverflowError
        ("1024", "nan", "10.0", "nElementsPerRank", "nan", "not a finite number"),  # was: ValueError int(nan)
        ("1024", "-256", "10.0", "nElementsPerRank", "-256", "negative"),  # was: kept silently
        ("1024", "256", "nan", "Time(us):p50", "nan", "not a finite number"),  # was: ValueError in bench_frame
    ],
)
def test_param_row_values(tmp_path, size, elements, p50, column, value, why):
    path = tmp_path / "param.txt"
    path.write_text(PARAM_HEAD + PARAM_ROW.format(size=size, elements=elements, p50=p50) + "\n")
    with pytest.raises(InputFileError) as info:
        read_param(path)
    assert _message(info).startswith(f"{path}:3: column '{column}': expected ")
    assert _message(info).endswith(f", got '{value}': {why}")


def test_param_row_with_garbage_size_is_not_taken_for_the_header(tmp_path):
    """was: skipped silently as the column header."""
    path = tmp_path / "param.txt"
    path.write_text(PARAM_HEAD + PARAM_ROW.format(size="x1024", elements="256", p50="10.0") + "\n")
    with pytest.raises(InputFileError, match=r"param\.txt:3: column 'total-size \(B\)': .*, got 'x1024'$"):
        read_param(path)


# ---- bench CSV (fit) ---------------------------------------------------------------


def _bench_csv(tmp_path, **changes) -> str:
    sizes = 2 ** np.arange(10, 15)
    frame = bench_frame("all_reduce", "gloo", 2, 1, sizes, sizes // 4, "float32", 20 + sizes / 1e3)
    for column, (row, value) in changes.items():
        frame[column] = frame[column].astype(object)
        frame.loc[row, column] = value
    path = tmp_path / "sweep.csv"
    write_csv(path, frame)
    return path


def test_bench_csv_size_of_2_to_the_63(tmp_path):
    """was: OverflowError inside pandas."""
    path = _bench_csv(tmp_path, size_bytes=(2, str(2**63)))
    with pytest.raises(InputFileError) as info:
        read_sweep_csv(path)
    assert _message(info) == (
        f"{path}:4: column 'size_bytes': expected a message size in bytes (an integer > 0 and <= 2^50), "
        "got '9223372036854775808': zero-size rows are never written; above 1 PiB"
    )


def test_fit_on_world_size_1_is_an_error_not_nan_in_json(tmp_path, capsys):
    """was: exit 0 and NaN (not JSON) in comm_model.json."""
    sizes = 2 ** np.arange(10, 16)
    path = tmp_path / "n1.csv"
    write_csv(path, bench_frame("all_reduce", "nccl", 1, 1, sizes, sizes // 4, "float32", 5 + sizes / 1e4))
    assert main(["fit", str(path), "-o", str(tmp_path / "cm.json"), "--no-track"]) == 2
    assert capsys.readouterr().err == (
        f"paraplan fit: error: {path}:2: column 'world_size': expected ranks (an integer >= 2 and <= 2^20), "
        "got '1': one rank moves no data; the comm model prices a group of one rank at 0\n"
    )
    assert not (tmp_path / "cm.json").exists()


def test_a_sweep_of_one_size_names_its_file_and_line(tmp_path):
    path = _bench_csv(tmp_path)
    frame = pd.read_csv(path)
    frame.loc[frame["collective"] == "all_reduce", "size_bytes"] = 4096
    frame["count"] = 1024
    frame.to_csv(path, index=False)
    with pytest.raises(InputFileError) as info:
        read_sweeps([path])
    assert _message(info) == (
        f"{path}:2: all_reduce at 2 ranks on 1 node(s) has one message size (4096 B); "
        "a fit needs at least 2 distinct sizes"
    )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"global_batch": [256, 1]}, "column 'global_batch': expected at least one sample per rank (2), got 1"),
        ({"tables_per_rank": ["1-2", "0-0"]},
         "column 'tables_per_rank': expected 2 table counts joined by '-' (e.g. 3-17), not all 0, got '0-0'"),
    ],
)
def test_all_to_allv_sample_with_an_empty_exchange(tmp_path, capsys, change, message):
    """was: ValueError from np.geomspace in the a2av figure (an effective size of 0)."""
    sizes = 2 ** np.arange(10, 16)
    sweep = bench_frame("all_to_all", "gloo", 2, 1, sizes, sizes // 8, "float32", 30 + sizes / 2e3)
    extra = {"sample": [0, 1], "global_batch": [256, 512], "tables_per_rank": ["1-2", "3-3"], "dim": [32, 64]}
    samples = bench_frame("all_to_allv", "gloo", 2, 1, [8192, 65536], [2048, 16384], "float32", [40.0, 70.0],
                          extra={**extra, **change})
    path = tmp_path / "a2av.csv"
    write_csv(path, pd.concat([sweep, samples], ignore_index=True))
    assert main(["fit", str(path), "-o", str(tmp_path / "cm.json"), "--plots", str(tmp_path / "f"), "--no-track"]) == 2
    assert capsys.readouterr().err == f"paraplan fit: error: {path}:9: {message}\n"


# ---- profile CSV and meta ----------------------------------------------------------


def test_profile_csv_field_over_128_kib(tmp_path):
    """was: _csv.Error (field larger than field limit)."""
    path = tmp_path / "p.csv"
    path.write_text(PROFILE_HEADER + "0,a,1,2,3,4\n" + "1,b" + "7" * 140_000 + ",1,2,3,4\n")
    with pytest.raises(InputFileError) as info:
        read_profile(path, batch_size=8)
    assert _message(info) == f"{path}:3: not a readable CSV record: a field longer than 131072 characters"


def test_profile_csv_non_utf8_byte(tmp_path):
    """was: UnicodeDecodeError."""
    path = tmp_path / "p.csv"
    path.write_bytes(PROFILE_HEADER.encode() + b"0,conv\x94,1,2,3,4\n")
    with pytest.raises(InputFileError) as info:
        read_profile(path, batch_size=8)
    assert _message(info) == f"{path}:2: byte 0x94 at column 7 is not UTF-8; expected a profile CSV as UTF-8 text"


def test_profile_value_just_above_a_bound_is_not_rounded_onto_it(tmp_path):
    """was: 2^60 + 1 read as the float 2^60 and accepted."""
    path = tmp_path / "p.csv"
    path.write_text(PROFILE_HEADER + f"0,a,1,2,3,{2**60 + 1}\n")
    with pytest.raises(InputFileError, match=r"p\.csv:2: column 'param_bytes': .*, got '1152921504606846977': "
                                             r"above 2\^60 bytes \(1 EiB\)$"):
        read_profile(path, batch_size=8)


@pytest.mark.parametrize(
    ("meta", "message"),
    [
        ('{"batch_size": NaN}', "not valid JSON: NaN is not a JSON value"),
        ("[" * 100_000 + "]" * 100_000, "not valid JSON: nested too deeply"),
        ('{"batch_size": 1e9}', "key 'batch_size': expected a batch size in samples (an integer >= 1 and <= 2^24), "
                                "got 1000000000.0"),
    ],
)
def test_profile_meta_json(tmp_path, meta, message):
    """was: NaN accepted (and written back as invalid JSON), RecursionError."""
    path = tmp_path / "p.csv"
    path.write_text(PROFILE_HEADER + "0,a,1,2,3,4\n")
    (tmp_path / "p.meta.json").write_text(meta)
    with pytest.raises(InputFileError) as info:
        read_profile(path)
    assert _message(info) == f"{tmp_path / 'p.meta.json'}: {message}"


# ---- PipeDream -------------------------------------------------------------------


def test_pipedream_list_whose_sum_overflows(tmp_path):
    """was: accepted with activation bytes of inf."""
    path = tmp_path / "m-pbs-8.txt"
    path.write_text(NODE.format(i=1, name="a", act="[1e308; 1e308]") + "\n")
    with pytest.raises(InputFileError) as info:
        read_pipedream(path)
    assert _message(info) == (
        f"{path}:1: key 'activation_size': expected a size in bytes (a number >= 0 and <= 2^60), "
        "got '1e308': above 2^60 bytes (1 EiB)"
    )
    path.write_text(NODE.format(i=1, name="a", act="[1e18; 1e18; 1e18]") + "\n")
    with pytest.raises(InputFileError, match=r"key 'activation_size' \(sum of the list\): .* got 3e\+18: above 2\^60"):
        read_pipedream(path)


def test_pipedream_description_the_profile_csv_could_not_hold(tmp_path, capsys):
    """was: ingest wrote a profile CSV with a 140 KB name that the CSV reader refuses."""
    path = tmp_path / "m-pbs-8.txt"
    path.write_text(NODE.format(i=1, name="x" * 140_000, act="3.0") + "\n")
    assert main(["ingest", "--format", "pipedream", str(path), "-o", str(tmp_path / "m.csv"), "--no-track"]) == 2
    assert capsys.readouterr().err == (
        f"paraplan ingest: error: {path}:1: description: expected a layer name of at most 4096 characters, "
        "got 140000\n"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m-pbs-8.txt"]


def test_what_ingest_writes_fit_reads(data_dir, tmp_path):
    """The two boundaries agree: a bench CSV written by ingest passes fit's reader."""
    out = tmp_path / "a.csv"
    log = data_dir / "nccl-tests" / "08_mi355x_vultr_1x8_rccl_alltoall.txt"
    assert main(["ingest", "--format", "nccl-tests", str(log), "-o", str(out), "--no-track"]) == 0
    assert len(read_sweep_csv(out)) == 21
    assert main(["fit", str(out), "-o", str(tmp_path / "cm.json"), "--no-track"]) == 0
    json.loads((tmp_path / "cm.json").read_text(), parse_constant=lambda name: pytest.fail(f"{name} in JSON"))


@pytest.mark.parametrize("where", ["host", "dtype"])
def test_a_name_the_bench_csv_could_not_hold(tmp_path, where):
    """was: ingest wrote a 140 KB host or type name into the bench CSV, which fit's
    reader refuses (a field over 128 KiB)."""
    long = "h" * 140_000
    head = NCCL_HEAD.replace("on  h device  0", f"on  {long} device  0") if where == "host" else NCCL_HEAD
    row = GOOD_ROW.replace("float", long) if where == "dtype" else GOOD_ROW
    path = tmp_path / "log.txt"
    path.write_text(head + row + "\n")
    with pytest.raises(InputFileError) as info:
        read_nccl_tests(path)
    assert _message(info) == f"{path}:5: {where}: expected a name of at most 256 characters, got 140000"

"""A run table's header errors in one line a user can act on: a misspelt column is named
with the column it most resembles (not the 150 known ones), an empty file says what
header is expected."""

import pytest

from paraplan.core import InputFileError
from paraplan.inputs import read_csv_table
from paraplan.predict.runtable import read_run_table


def _error(path) -> str:
    with pytest.raises(InputFileError) as err:
        read_run_table(path)
    return str(err.value)


def test_a_misspelt_column_is_named_with_the_one_it_resembles(tmp_path):
    path = tmp_path / "runs.csv"
    path.write_text("name,model,tensor_model_parallel_size,pipline_model_parallel_size,data_parallel_size,"
                    "global_batch_size\na,llama3-8b,1,1,8,64\n")
    assert _error(path) == (f"{path}:1: unknown column 'pipline_model_parallel_size' (did you mean "
                            "'pipeline_model_parallel_size'?); expected one of the columns `paraplan predict "
                            "--help` lists")


def test_an_unknown_column_like_none_is_named_alone(tmp_path):
    path = tmp_path / "runs.csv"
    path.write_text("name,model,tensor_model_parallel_size,pipeline_model_parallel_size,data_parallel_size,"
                    "global_batch_size,flavour\na,llama3-8b,1,1,8,64,vanilla\n")
    assert _error(path) == (f"{path}:1: unknown column 'flavour'; expected one of the columns "
                            "`paraplan predict --help` lists")


def test_an_empty_run_table_says_what_header_is_expected(tmp_path):
    path = tmp_path / "runs.csv"
    path.write_text("")
    assert _error(path) == f"{path}: empty file; expected a header row of the columns `paraplan predict --help` lists"


def test_a_short_table_still_lists_its_columns():
    with pytest.raises(InputFileError) as err:
        read_csv_table("sizes,time_us\n1,2\n", "t.csv", ("size",), ("size", "time_us"))
    assert str(err.value) == "t.csv:1: missing column(s) size; expected size"
    with pytest.raises(InputFileError) as err:
        read_csv_table("size,tme_us\n1,2\n", "t.csv", ("size",), ("size", "time_us"))
    assert str(err.value) == ("t.csv:1: unknown column 'tme_us' (did you mean 'time_us'?); expected columns among "
                              "size, time_us")
    with pytest.raises(InputFileError) as err:
        read_csv_table("", "t.csv", (), ("size", "time_us"))
    assert str(err.value) == "t.csv: empty file; expected a header row of column names"

"""Memory bounded by design: `paraplan predict` reads and prices a run table a chunk
at a time (the same numbers as all at once), the LLM planner's estimate does not build
every pipeline stage's op order, and no candidate beyond the simulated-operations
bound reaches the exact engine (docs/limits.md)."""

import csv
import re
import tracemalloc

import numpy as np
import pytest

from paraplan.cli.main import main
from paraplan.clusters import load_cluster
from paraplan.core import InputFileError, StrategyError
from paraplan.core.transformer import TransformerModel
from paraplan.inputs import iter_text_lines, read_text
from paraplan.plan.transformer import search as llm_search
from paraplan.plan.transformer.estimate import estimate
from paraplan.plan.transformer.request import TransformerPlanRequest
from paraplan.plan.transformer.search import search
from paraplan.plan.transformer.space import SCHEDULES, SearchSpace, enumerate_candidates
from paraplan.predict.calibration import load_calibration
from paraplan.predict.predictor import iter_predictions, predict_rows
from paraplan.predict.runtable import iter_run_table, read_run_table
from paraplan.sim import engine, schedules
from paraplan.sim.engine import PipelineCosts, execute
from paraplan.sim.op_cache import CACHE_OPS, OpsBoundedCache
from paraplan.sim.schedules import SCHEDULES as ALL_SCHEDULES
from paraplan.sim.schedules import get_schedule

CAL = load_calibration()
A100 = load_cluster("dgx-a100")
HEADER = ["name", "num_layers", "hidden_size", "num_attention_heads", "seq_length", "vocab_size",
          "tensor_model_parallel_size", "pipeline_model_parallel_size", "data_parallel_size", "global_batch_size",
          "micro_batch_size", "virtual_pipeline_model_parallel_size", "recompute_granularity", "dtype"]
ROWS = [  # fixed, searched micro-batch, searched v, fp16, a row that does not fit
    ["a", 24, 2048, 16, 2048, 50257, 2, 2, 2, 64, 2, 1, "full", "bf16"],
    ["b", 24, 2048, 16, 2048, 50257, 2, 2, 2, 64, "", 1, "selective", "bf16"],
    ["c", 32, 4096, 32, 2048, 32000, 4, 4, 4, 256, 1, "", "none", "bf16"],
    ["d", 40, 5120, 40, 2048, 50257, 8, 2, 4, 512, 2, 1, "full", "fp16"],
    ["e", 96, 12288, 96, 2048, 50257, 1, 1, 8, 64, 8, 1, "none", "bf16"],
]


def write_table(path, rows, header=HEADER):
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def test_chunked_predictions_equal_the_unchunked(tmp_path):
    path = write_table(tmp_path / "runs.csv", ROWS * 3)
    _, rows = read_run_table(path)
    comm = CAL.comm_model(A100)
    whole = predict_rows(rows, A100, comm, CAL.efficiency)
    for chunk in (1, 2, 7):
        pairs = list(iter_predictions(iter_run_table(path)[1], A100, comm, CAL.efficiency, chunk_candidates=chunk))
        assert [row.line for row, _ in pairs] == [row.line for row in rows]
        assert [pred for _, pred in pairs] == whole  # every field, exactly
    assert [p.fits_memory for p in whole[:5]] == [True, True, True, True, False]


def test_predict_output_is_the_same_as_the_in_memory_one(tmp_path):
    """The streamed CLI writes what predicting the whole table at once gives: the
    searched columns the header lacks added once, rows in order."""
    header = [c for c in HEADER if c != "virtual_pipeline_model_parallel_size"]
    rows = [[c for c, h in zip(r, HEADER, strict=True) if h != "virtual_pipeline_model_parallel_size"]
            for r in ROWS]
    path = write_table(tmp_path / "runs.csv", rows, header)
    out = tmp_path / "out.csv"
    assert main(["predict", str(path), "--cluster", "dgx-a100", "-o", str(out), "--no-track"]) == 0
    with out.open() as handle:
        got = list(csv.DictReader(handle))
    expected = predict_rows(read_run_table(path)[1], A100, CAL.comm_model(A100), CAL.efficiency)
    assert [r["name"] for r in got] == ["a", "b", "c", "d", "e"]
    assert [float(r["predicted_iteration_s"]) for r in got] == [float(f"{p.iteration_s:.6g}") for p in expected]
    assert got[1]["micro_batch_size"] == str(expected[1].settings.micro_batch_size)
    assert "virtual_pipeline_model_parallel_size" not in got[0]


UNEVEN = ["u", 30, 4096, 32, 2048, 51200, 2, 4, 2, 64, "", "", "none", "bf16"]  # searched micro-batch and v
EVEN = ["v", 32, 4096, 32, 2048, 51200, 2, 4, 2, 64, 1, "", "none", "bf16"]


def test_uneven_split_columns_only_when_a_prediction_chose_one(tmp_path):
    """The uneven first/last-stage columns, known only once predicted, appear (after
    the input's columns, before the predictions, as the in-memory writer put them)
    when some row's prediction chose such a split, and not otherwise."""
    from paraplan.predict.predictor import UNEVEN_SPLIT_COLUMNS
    from paraplan.predict.runtable import PREDICTED

    got = {}
    for name, rows in (("both", [UNEVEN, EVEN]), ("even", [EVEN])):
        path = write_table(tmp_path / f"{name}.csv", rows)
        out = tmp_path / f"{name}_out.csv"
        assert main(["predict", str(path), "--cluster", "dgx-a100", "-o", str(out), "--no-track"]) == 0
        with out.open() as handle:
            reader = csv.DictReader(handle)
            got[name] = (reader.fieldnames, list(reader))
    expected = predict_rows(read_run_table(tmp_path / "both.csv")[1], A100, CAL.comm_model(A100), CAL.efficiency)
    assert set(UNEVEN_SPLIT_COLUMNS) <= set(expected[0].chosen)  # the 30 layers over 4 stages: uneven
    assert not set(UNEVEN_SPLIT_COLUMNS) & set(expected[1].chosen)
    fields, rows = got["both"]
    assert fields == [*HEADER, *UNEVEN_SPLIT_COLUMNS, *PREDICTED]
    assert [rows[0][c] for c in UNEVEN_SPLIT_COLUMNS] == [
        str(expected[0].settings.decoder_first_pipeline_num_layers),
        str(expected[0].settings.decoder_last_pipeline_num_layers)]
    assert [rows[1][c] for c in UNEVEN_SPLIT_COLUMNS] == ["", ""]
    assert got["even"][0] == [*HEADER, *PREDICTED]
    assert got["even"][1][0]["virtual_pipeline_model_parallel_size"] == rows[1]["virtual_pipeline_model_parallel_size"]


def test_a_bad_row_after_good_ones_writes_nothing(tmp_path, capsys):
    path = write_table(tmp_path / "runs.csv", [ROWS[0], ROWS[1], ["z", 24, 2048, 16, 2048, 50257, 3, 1, 1, 64, 1, 1,
                                                                  "none", "bf16"]])
    _, rows = iter_run_table(path)
    assert next(rows).name == "a"  # read lazily: the bad line 4 is not reached yet
    out = tmp_path / "out.csv"
    assert main(["predict", str(path), "--cluster", "dgx-a100", "-o", str(out), "--no-track"]) == 2
    err = capsys.readouterr().err
    assert "runs.csv:4: impossible run: num_attention_heads 16 is not divisible by tensor_model_parallel_size 3" in err
    assert not out.exists() and list(tmp_path.iterdir()) == [path]


@pytest.mark.parametrize(("data", "message"), [
    (b"a,b\n1,2\n3,\x004\n", "NUL byte at column 3: binary data"),
    (b"a,b\n1,\xff\n", "byte 0xff at column 3 is not UTF-8"),
])
def test_streamed_text_fails_as_the_whole_text_does(tmp_path, data, message):
    path = tmp_path / "t.csv"
    path.write_bytes(data)
    errors = []
    for read in (lambda: read_text(path, "a table"), lambda: list(iter_text_lines(path, "a table"))):
        with pytest.raises(InputFileError) as caught:
            read()
        errors.append(str(caught.value))
    assert errors[0] == errors[1] and message in errors[0]


def test_streamed_lines_split_as_stringio_does(tmp_path):
    path = tmp_path / "t.csv"
    path.write_bytes("\ufeffa,b\r\n1,2\r3,4\n5,6".encode())
    assert list(iter_text_lines(path, "a table")) == ["a,b\r\n", "1,2\r", "3,4\n", "5,6"]


@pytest.mark.parametrize("name", ALL_SCHEDULES)
@pytest.mark.parametrize(("p", "m", "v"), [(1, 3, 1), (4, 8, 1), (4, 8, 2), (3, 9, 3), (8, 5, 1)])
def test_one_stage_order_is_that_stage_of_all_orders(name, p, m, v):
    schedule = get_schedule(name)
    try:
        every = schedule.orders(p, m, 1, v)
    except Exception as exc:  # the request is impossible for this schedule: the same error either way
        with pytest.raises(type(exc), match=re.escape(str(exc))):
            schedule.stage_order(p, m, v, 0)
        return
    for stage in range(p):
        one = schedule.stage_order(p, m, v, stage)
        assert one.labels() == every[stage].labels()


def test_the_estimate_of_a_deep_pipeline_needs_megabytes_not_gigabytes():
    """4,096 layers on 1,024 GPUs: 10,000 candidates, pipelines of up to 1,024 stages.
    Building every stage's op order for the in-flight count took 1.7 GB here."""
    deep = TransformerModel("deep", num_layers=4096, hidden_size=1024, num_attention_heads=16, seq_length=1024,
                            vocab_size=32000)
    request = TransformerPlanRequest(deep, A100, 1024, 1024)
    cand = enumerate_candidates(deep, 1024, 1024, A100.devices_per_node, request.space)
    tracemalloc.start()
    try:
        est = estimate(deep, cand, request.base_settings(), A100, CAL.comm_model(A100), CAL.efficiency)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(est.iteration_s) == len(cand) > 5000
    assert peak < 64e6


def test_reading_a_small_input_file_sets_aside_no_more_than_it_needs(tmp_path):
    """A 4 kB kernel file once took a 256 MiB buffer (read(MAX_FILE_BYTES + 1) allocates it
    first), which made the test above pass only after another test had read the files."""
    path = tmp_path / "small.json"
    path.write_text('{"a": 1}' + " " * 4000)
    tracemalloc.start()
    try:
        assert read_text(path, "a kernel file").startswith('{"a": 1}')
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2 * 2**20


def test_a_file_above_the_bound_is_refused_and_one_at_it_read_whole(tmp_path, monkeypatch):
    import paraplan.inputs

    monkeypatch.setattr(paraplan.inputs, "MAX_FILE_BYTES", 3 * 2**20)  # three reading pieces
    path = tmp_path / "big.csv"
    path.write_bytes(b"x" * (3 * 2**20))
    assert len(read_text(path, "a table")) == 3 * 2**20
    path.write_bytes(b"x" * (3 * 2**20 + 1))
    with pytest.raises(InputFileError) as err:
        read_text(path, "a table")
    assert str(err.value) == f"{path}: larger than 3 MiB; expected a table"


def test_candidates_beyond_the_simulated_operations_are_not_retimed(monkeypatch):
    model = TransformerModel("small", num_layers=8, hidden_size=1024, num_attention_heads=16, seq_length=1024,
                             vocab_size=32000)
    request = TransformerPlanRequest(model, A100, 8, 64, space=SearchSpace(schedules=SCHEDULES))
    bound = 3 * 2 * 16  # two stages of 16 micro-batches, one chunk
    monkeypatch.setattr(llm_search, "MAX_SIMULATED_OPS", bound)
    notes: list[str] = []
    result = search(request, CAL.comm_model(A100), CAL.efficiency, progress=notes.append)
    assert result.not_simulated > 0
    assert any(f"have more than {bound:,} pipeline operations" in n and "not re-timed" in n for n in notes)
    for plan in result.plans:
        s = plan.settings
        assert 3 * s.pipeline_model_parallel_size * s.num_microbatches * s.virtual_pipeline_model_parallel_size \
            <= bound


def test_op_caches_hold_a_bounded_number_of_operations():
    cache: OpsBoundedCache[str] = OpsBoundedCache(budget_ops=100)
    for key, ops in (("a", 10), ("b", 12), ("a", 10), ("big", 13), ("c", 12)):
        cache.get(key, lambda key=key, ops=ops: (key, ops))
    # 'big' (13 > 100 // 8) is never held; nothing is evicted under the budget
    assert len(cache) == 3 and cache.held_ops == 34
    for i in range(20):
        cache.get(i, lambda: ("x", 12))
    assert cache.held_ops <= 100 and len(cache) == 8  # the least recently used went first
    assert cache.get("c", lambda: ("remade", 1)) == "remade"


def test_simulating_many_long_pipelines_keeps_no_orders():
    """Each distinct long pipeline was kept by two 1,024-entry caches: a planner or a
    long run table re-timing hundreds of them held gigabytes."""
    before = schedules._ORDERS.held_ops
    for m in range(4200, 4203):
        orders = schedules.cached_orders("1f1b", 64, m)
        execute(orders, PipelineCosts(np.ones(64), np.ones(64), np.zeros(64), np.zeros(63), np.zeros(63)), m)
    assert schedules._ORDERS.held_ops == before  # 537,600 operations each: over an eighth of the budget
    assert engine._PREPARED.held_ops <= CACHE_OPS


def test_a_plan_with_every_candidate_beyond_the_bound_is_an_error(monkeypatch):
    model = TransformerModel("small", num_layers=8, hidden_size=1024, num_attention_heads=16, seq_length=1024,
                             vocab_size=32000)
    monkeypatch.setattr(llm_search, "MAX_SIMULATED_OPS", 2)
    with pytest.raises(StrategyError) as caught:
        search(TransformerPlanRequest(model, A100, 8, 64), CAL.comm_model(A100), CAL.efficiency)
    assert str(caught.value) == (
        "small on 8 GPUs at global batch 64: every candidate has more than 2 pipeline operations (3 x stages x "
        "micro-batches x model chunks), more than paraplan simulates exactly; a smaller global batch would do")

"""Every file a stage reads, fed as a careless or hostile user would (q4-hostile): empty,
binary, Latin-1, a directory or a broken link where the file should be, a byte-order
mark, an output path that is one of the inputs or empty, and the content holes found
on the way. Each gives exactly one error line naming the file (and line, key or column)
and what was expected, exit status 2, no traceback and no output. "was:" says what
happened before."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from paraplan.cli.main import main

REPO = Path(__file__).resolve().parents[2]
RUNS = REPO / "config" / "runs" / "llm_a100.csv"
VGG = REPO / "data" / "pipedream-profiles" / "vgg-19-pbs-32.txt"
CALIBRATION = REPO / "config" / "calibrations" / "a100-vtrain.json"
NCCL = REPO / "data" / "nccl-tests" / "05_a100_oci_bm_gpu4_1x8_all_reduce.txt"
VTRAIN = REPO / "data" / "published" / "vtrain_a100_single_node_measured.csv"
LOG = "a text benchmark log"


def _error(capsys, args: list[str], out: Path) -> str:
    """The one error line of a command that must fail, with its prefix."""
    code = main([*args, "--no-track"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "Traceback" not in err[0], err
    assert not out.exists()
    return err[0]


# ---- every input file, at the file level ------------------------------------------------

Argv = Callable[[str, Path], list[str]]
KINDS: dict[str, tuple[Argv, str, str]] = {
    # kind: (argv for the input path and an output folder, what the reader expects, its empty-file message)
    "run table": (lambda p, o: ["predict", p, "--cluster", "dgx-a100", "-o", f"{o}/o.csv"],
                  "a run table (CSV with a header of Megatron-LM argument names)",
                  "empty file; expected a header row of the columns `paraplan predict --help` lists"),
    "cluster": (lambda p, o: ["predict", str(RUNS), "--cluster", p, "-o", f"{o}/o.csv"],
                "a cluster file (config/clusters/*.yaml)",
                "empty file (blanks or comments only); expected a mapping"),  # was: "expected a mapping, got None"
    "calibration": (lambda p, o: ["predict", str(RUNS), "--cluster", "dgx-a100", "--calibration", p,
                                  "-o", f"{o}/o.csv"],
                    "a calibration (make one with `paraplan calibrate`)",
                    # was: "not valid JSON: Expecting value (column 1)"
                    "empty file; expected a calibration (make one with `paraplan calibrate`) (a JSON object)"),
    "model": (lambda p, o: ["plan", "--model", p, "--cluster", "dgx-a100", "--gpus", "8", "--global-batch-size",
                            "8", "-o", f"{o}/o.csv"],
              "a model description (a Hugging Face config.json or TransformerModel fields)",
              "empty file; expected a model description (a Hugging Face config.json or TransformerModel fields) "
              "(a JSON object)"),
    "nccl-tests log": (lambda p, o: ["ingest", "--format", "nccl-tests", p, "-o", f"{o}/o.csv"], LOG,
                       "empty file: expected a benchmark log"),
    "PARAM log": (lambda p, o: ["ingest", "--format", "param", p, "-o", f"{o}/o.csv"], LOG,
                  "empty file: expected a benchmark log"),
    "vTrain all-reduce table": (lambda p, o: ["ingest", "--format", "vtrain-allreduce", p, "-o", f"{o}/o.csv"], LOG,
                                "empty file: expected a benchmark log"),
    "PipeDream profile": (lambda p, o: ["ingest", "--format", "pipedream", p, "-o", f"{o}/o.csv"],
                          "a PipeDream TorchGraph text profile", "no node lines"),
    # was: a directory was "cannot use ...: Is a directory", Latin-1 "not UTF-8 text (byte 0)" with no line
    "vTrain measurements": (lambda p, o: ["ingest", "--format", "vtrain", p, "-o", f"{o}/o.csv"],
                            "a vTrain measurement CSV (its data/ground_truth_*.csv)",
                            "empty file; expected a header row with # GPUs, global batch, micro batch, hidden size, "
                            "attention heads, # layers, sequence length, tensor parallelism, data parallelism, "
                            "pipeline parallelism, iteration time (ms)"),
    "mamf-finder log": (lambda p, o: ["ingest", "--format", "mamf", p, "--device", "H100-SXM5-80GB",
                                      "-o", f"{o}/o.csv"],
                        "a mamf-finder.py log (its --output_file)",
                        "no shape lines ('N | x(mean) y(median) z(max) @ MxNxK | ...'): not a mamf-finder log?"),
    "XLA matmul table": (lambda p, o: ["ingest", "--format", "xla-matmul", p, "--device-key", "sm_90", "--device",
                                       "H100-SXM5-80GB", "-o", f"{o}/o.csv"],
                         "XLA's matmul perf table (text protobuf GemmPerfTable)",
                         "no 'bf16xbf16->bf16' measurements of device key 'sm_90' (device keys in the file: none)"),
    "bench CSV": (lambda p, o: ["fit", p, "-o", f"{o}/o.json"], "a bench CSV",
                  "empty file; expected a header row with collective, world_size, nodes, size_bytes, time_us"),
    "profile CSV": (lambda p, o: ["plan", "--profile", p, "--profile-batch-size", "32", "--cluster", "dgx1-v100",
                                  "--shapes", "1x8", "--global-batch-sizes", "32", "-o", f"{o}/o.csv"],
                    "a profile CSV",
                    "empty file; expected a header row with layer, name, fwd_s, bwd_s, activation_bytes, param_bytes"),
    "comm model": (lambda p, o: ["plan", "--profile", str(VGG), "--cluster", "dgx1-v100", "--comm-model", p,
                                 "--shapes", "1x8", "--global-batch-sizes", "32", "-o", f"{o}/o.csv"],
                   "a comm model (paraplan fit's comm_model.json; run `paraplan fit` first)",
                   "empty file; expected a comm model (paraplan fit's comm_model.json; run `paraplan fit` first) "
                   "(a JSON object)"),
    "simulation study": (lambda p, o: ["simulate", "--study", p, "-o", f"{o}/sim", "--no-plots"],
                         "a simulation study (config/studies/simulate/*.yaml)",
                         "empty file (blanks or comments only); expected a mapping"),
    "planning study": (lambda p, o: ["plan", "--study", p, "-o", f"{o}/plans"],
                       "a planning study (config/studies/plan/*.yaml)",
                       "empty file (blanks or comments only); expected a mapping"),  # was: "got NoneType"
    "kernel fit": (lambda p, o: ["calibrate", "--transfer", str(CALIBRATION), "--cluster", "dgx-a100",
                                 "--kernel-ceilings", p, "-o", f"{o}/o.json"],
                   "a kernel fit (make one with `paraplan fit --kind kernels`)",
                   "empty file; expected a kernel fit (make one with `paraplan fit --kind kernels`) (a JSON object)"),
}
SUFFIX = {"cluster": ".yaml", "calibration": ".json", "model": ".json", "comm model": ".json",
          "simulation study": ".yaml", "planning study": ".yaml", "kernel fit": ".json", "bench CSV": ".csv",
          "profile CSV": ".csv", "run table": ".csv", "vTrain measurements": ".csv", "PipeDream profile": "-pbs-8.txt"}
VARIANTS: dict[str, tuple[bytes | None, str]] = {
    # variant: (bytes written, or None for a folder / a broken link; the message after the path)
    "empty": (b"", "{empty}"),
    "blank": (b"\n \n\n", "{empty}"),
    "binary": (b"\x7fELF\x02\x01\x01\x00\xff\xfe", ":1: NUL byte at column 8: binary data; expected {what}"),
    "latin-1": ("\xe9t\xe9\n".encode("latin-1"),
                ":1: byte 0xe9 at column 1 is not UTF-8; expected {what} as UTF-8 text"),
    "folder": (None, ": is a directory; expected {what}"),
    "broken link": (None, ": file not found; expected {what}"),
}
NAMED_BY_OPTION = {"cluster", "model"}  # a missing path there is tried as a preset name


# a folder or missing file given to --cluster/--model is looked up as a name (tested elsewhere)
CASES = [(kind, variant) for kind in KINDS for variant in VARIANTS
         if not (VARIANTS[variant][0] is None and kind in NAMED_BY_OPTION)]


@pytest.mark.parametrize(("kind", "variant"), CASES)
def test_every_input_file_refuses_a_bad_file_in_one_line(tmp_path, capsys, kind, variant):
    argv, what, empty = KINDS[kind]
    data, message = VARIANTS[variant]
    path = tmp_path / f"input{SUFFIX.get(kind, '.txt')}"  # (PipeDream: the batch size is in the name)
    if variant == "folder":
        path.mkdir()
    elif variant == "broken link":
        path.symlink_to(tmp_path / "gone")
    else:
        path.write_bytes(data)
    out = tmp_path / "out"
    line = _error(capsys, argv(str(path), out), out)
    expected = message.format(what=what, empty=empty)
    assert line.split(": error: ", 1)[1] == f"{path}{'' if expected.startswith(':') else ': '}{expected}"


@pytest.mark.parametrize("kind", ["run table", "cluster", "calibration", "nccl-tests log", "vTrain measurements"])
def test_a_byte_order_mark_and_crlf_lines_read_as_the_plain_file(tmp_path, capsys, kind):
    """was (vTrain measurements): "missing column '# GPUs'" for a file saved with a BOM."""
    seed = {"run table": RUNS, "cluster": REPO / "config" / "clusters" / "dgx-a100.yaml", "calibration": CALIBRATION,
            "nccl-tests log": NCCL, "vTrain measurements": VTRAIN}[kind]
    argv = KINDS[kind][0]
    outputs = []
    bom_crlf = b"\xef\xbb\xbf" + seed.read_bytes().replace(b"\n", b"\r\n")
    for name, data in (("plain", seed.read_bytes()), ("bom", bom_crlf)):
        path = tmp_path / name / seed.name
        path.parent.mkdir()
        path.write_bytes(data)
        out = tmp_path / f"out-{name}"
        assert main([*argv(str(path), out), "--no-track"]) == 0, capsys.readouterr().err
        outputs.append(next(out.iterdir()).read_bytes())
    assert outputs[0] == outputs[1]


# ---- vTrain measurements: cells -----------------------------------------------------------

VTRAIN_HEADER = ("# GPUs,global batch,micro batch,hidden size,attention heads,# layers,sequence length,"
                 "tensor parallelism,data parallelism,pipeline parallelism,iteration time (ms)\n")


@pytest.mark.parametrize(("row", "message"), [
    # was: ValueError: invalid literal for int() with base 10: '²' (str.isdigit takes a superscript)
    ("\u00b2,1,1,64,4,2,64,1,1,1,5",
     ":2: column '# GPUs': expected a count (an integer >= 1 and <= 2^40), got '\u00b2'"),
    ("8,1,1,64,4,2,64,1,1,1,nan", ":2: column 'iteration time (ms)': expected a time in ms (a number > 0 and "
     "<= 1e10), got 'nan': not a finite number"),
    ("8,1,1,64,4,2,64,1,1,1", ":2: expected 11 fields (as in the header), got 10"),
])
def test_vtrain_cells(tmp_path, capsys, row, message):
    path = tmp_path / "vtrain.csv"
    path.write_text(VTRAIN_HEADER + row + "\n")
    out = tmp_path / "runs.csv"
    line = _error(capsys, ["ingest", "--format", "vtrain", str(path), "-o", str(out)], out)
    assert line == f"paraplan ingest: error: {path}{message}"


def test_a_pipedream_profile_without_its_batch_size_names_the_option(tmp_path, capsys):
    """was: "give the batch size (--batch-size)", the option's deprecated spelling."""
    path = _copy(tmp_path, VGG).rename(tmp_path / "vgg.txt")
    out = tmp_path / "vgg.csv"
    line = _error(capsys, ["ingest", "--format", "pipedream", str(path), "-o", str(out)], out)
    assert line == (f"paraplan ingest: error: {path}: no '-pbs-N' in the file name; give the batch size "
                    "(--profile-batch-size)")


def test_vtrain_duplicate_column(tmp_path, capsys):
    """was: the second '# GPUs' column silently replaced the first."""
    path = tmp_path / "vtrain.csv"
    path.write_text(VTRAIN_HEADER.replace("\n", ",# GPUs\n") + "8,1,1,64,4,2,64,1,1,1,5,16\n")
    out = tmp_path / "runs.csv"
    line = _error(capsys, ["ingest", "--format", "vtrain", str(path), "-o", str(out)], out)
    assert line == f"paraplan ingest: error: {path}:1: column '# GPUs' appears twice in the header"


# ---- outputs ----------------------------------------------------------------------------


def _copy(tmp_path: Path, source: Path) -> Path:
    path = tmp_path / source.name
    shutil.copy(source, path)
    return path


@pytest.mark.parametrize(("make", "option"), [
    # was: the prediction, the bench CSV, the fit or the calibration replaced the input file
    (lambda p: ["predict", str(p), "--cluster", "dgx-a100", "-o", str(p)], "argument runs"),
    (lambda p: ["ingest", "--format", "nccl-tests", str(p), "-o", str(p)], "argument log"),
    (lambda p: ["calibrate", "--transfer", str(p), "--cluster", "dgx-a100", "-o", str(p)], "--transfer"),
    (lambda p: ["predict", str(RUNS), "--cluster", "dgx-a100", "--calibration", str(p), "-o", str(p)],
     "--calibration"),
])
def test_an_output_that_is_an_input_is_refused_and_the_input_kept(tmp_path, capsys, make, option):
    source = {"argument runs": RUNS, "argument log": NCCL}.get(option, CALIBRATION)
    path = _copy(tmp_path, source)
    code = main([*make(path), "--no-track"])
    err = capsys.readouterr().err.strip().splitlines()
    command = make(path)[0]
    assert code == 2 and err == [
        f"paraplan {command}: error: option --output: '{path}' is also this command's input ({option}); expected "
        "another path, or writing would replace the input"]
    assert path.read_bytes() == source.read_bytes()


def test_fit_refuses_its_input_as_its_output(tmp_path, capsys):
    bench = tmp_path / "bench.csv"
    assert main(["ingest", "--format", "nccl-tests", str(NCCL), "-o", str(bench), "--no-track"]) == 0
    before = bench.read_bytes()
    capsys.readouterr()
    assert main(["fit", str(bench), "-o", str(bench), "--no-track"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"paraplan fit: error: option --output: '{bench}' is also this command's input (argument IN.csv); "
        "expected another path, or writing would replace the input")
    assert bench.read_bytes() == before


@pytest.mark.parametrize("args", [
    # was: ValueError: PosixPath('.') has an empty name (a traceback)
    ["ingest", "--format", "pipedream", str(VGG)],
    # was: "cannot write '.': Device or resource busy"
    ["predict", str(RUNS), "--cluster", "dgx-a100"],
    ["simulate", "--study", "schedules", "--no-plots"],  # was: wrote into the working folder
])
def test_an_empty_output_path_is_an_argument_error(capsys, args):
    with pytest.raises(SystemExit) as exit_:
        main([*args, "-o", "", "--no-track"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and err == [f"paraplan {args[0]}: error: argument -o/--output: empty path; expected a "
                                             f"file or folder to write (see paraplan {args[0]} --help)"]


# ---- comm_model.json: which fit predicts ---------------------------------------------------


def _comm_model(tmp_path: Path) -> tuple[Path, dict]:
    bench, model = tmp_path / "bench.csv", tmp_path / "comm_model.json"
    assert main(["ingest", "--format", "nccl-tests", str(NCCL), "-o", str(bench), "--no-track"]) == 0
    assert main(["fit", str(bench), "-o", str(model), "--no-track"]) == 0
    return model, json.loads(model.read_text())


@pytest.mark.parametrize(("edit", "message"), [
    # was: a plan with the alpha-beta fit's times (the first chosen entry won), no word said
    (lambda fits: fits[0].update(chosen=True), "fits: the all_reduce sweep at 8 ranks on 1 node(s) has 2 chosen models "
     "(fits[0], fits[2]); expected exactly one (the model paraplan fit predicts with)"),
    # was: extrapolated from the link model as if the sweep had never been measured
    (lambda fits: fits[2].update(chosen=False), "fits: the all_reduce sweep at 8 ranks on 1 node(s) has 0 chosen "
     "models (none); expected exactly one (the model paraplan fit predicts with)"),
    (lambda fits: fits.append(dict(fits[1])), "fits[3]: a second sigmoid_bw fit of the all_reduce sweep at 8 ranks "
     "on 1 node(s) (the first is fits[1]); expected each model once per sweep"),
])
def test_a_comm_model_names_its_chosen_fit_once_per_sweep(tmp_path, capsys, edit, message):
    path, document = _comm_model(tmp_path)
    assert [f["model"] for f in document["fits"]] == ["alpha_beta", "sigmoid_bw", "table"]
    edit(document["fits"])
    path.write_text(json.dumps(document))
    capsys.readouterr()
    out = tmp_path / "plan.csv"
    line = _error(capsys, [*KINDS["comm model"][0](str(path), tmp_path)[:-2], "-o", str(out)], out)
    assert line == f"paraplan plan: error: {path}: {message}"


# ---- plan, model files ----------------------------------------------------------------------


def test_plan_model_refuses_the_profile_sweeps_jobs_option(tmp_path, capsys):
    """was: `--model ... --jobs -1` planned as if --jobs were absent."""
    out = tmp_path / "p.csv"
    line = _error(capsys, [*KINDS["model"][0]("llama3-8b", tmp_path)[:-2], "-o", str(out), "--jobs", "-1"], out)
    assert line == ("paraplan plan: error: option --jobs: is for a layer profile (--profile or --study), not --model "
                    "(a transformer's memory comes from the cluster file, its communication from the calibration)")


@pytest.mark.parametrize("topk", ["x", [2], None])
def test_a_dense_model_files_router_topk_of_the_wrong_type(tmp_path, capsys, topk):
    """was: TypeError: unsupported operand type(s) (a traceback from the parameter count)."""
    from paraplan.predict.models import PRESETS

    path = tmp_path / "mine.json"
    fields = {k: v for k, v in vars(PRESETS["gpt3-1.3b"]).items() if k != "name"}
    path.write_text(json.dumps({**fields, "moe_router_topk": topk}))
    out = tmp_path / "p.csv"
    line = _error(capsys, [*KINDS["model"][0](str(path), tmp_path)[:-2], "-o", str(out)], out)
    assert line == f"paraplan plan: error: {path}: model 'mine': moe_router_topk must be an integer, got {topk!r}"


# ---- report: the stages' results read back ---------------------------------------------------


def _report_input(tmp_path: Path, where: str, data: bytes) -> Path:
    path = tmp_path / "results" / where
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


PREDICTED_HEADER = (b"name,tensor_model_parallel_size,pipeline_model_parallel_size,data_parallel_size,fits_memory,"
                    b"predicted_iteration_s,predicted_tflops_per_gpu,predicted_mfu,predicted_peak_memory_bytes\n")


@pytest.mark.parametrize(("where", "data", "message"), [
    # was: UnicodeDecodeError: 'utf-8' codec can't decode byte 0xe9 (a traceback)
    ("collectives/c/all_reduce_n8.csv", "caf\xe9\n".encode("latin-1"),
     ":1: byte 0xe9 at column 4 is not UTF-8; expected a bench CSV (paraplan bench or ingest) as UTF-8 text"),
    # was: a summary with no line for it (a CSV whose header is "42")
    ("collectives/c/all_reduce_n8.csv", b"42\n", ":1: missing column(s) backend, time_us, busbw_GBps, size_bytes; "
     "expected backend, time_us, busbw_GBps, size_bytes"),
    # was: KeyError: 'fwd_s' (a traceback)
    ("profiles/vgg.csv", b"hello\n", ":1: missing column(s) fwd_s, bwd_s, param_bytes; expected fwd_s, bwd_s, "
     "param_bytes"),
    # was: ValueError: could not convert string to float: 'fast' (a traceback)
    ("predict/t/predicted.csv", PREDICTED_HEADER + b"r,1,1,8,true,fast,100,0.5,1e9\n",
     ":2: column 'predicted_iteration_s': expected a finite number, got 'fast'"),
    ("plans/llm/p.csv", b"gbs\n", ":1: missing column(s) tensor_model_parallel_size, pipeline_model_parallel_size, "
     "data_parallel_size, schedule, recompute_granularity, sequence_parallel, use_distributed_optimizer, "
     "predicted_iteration_s, predicted_mfu, predicted_peak_memory_bytes, search_s, micro_batch_size, "
     "virtual_pipeline_model_parallel_size, zero_stage; expected tensor_model_parallel_size, "
     "pipeline_model_parallel_size, data_parallel_size, schedule, recompute_granularity, sequence_parallel, "
     "use_distributed_optimizer, predicted_iteration_s, predicted_mfu, predicted_peak_memory_bytes, search_s, "
     "micro_batch_size, virtual_pipeline_model_parallel_size, zero_stage"),
    ("plans/vgg__dgx1.csv", b"gbs,best_hybrid\n32.5,2\n", ":2: column 'gbs': expected an integer, got '32.5'"),
    ("validation/mlp.csv", b"strategy,measured_s,measured_p10_s,measured_p90_s,predicted_s,rel_err\ndp,1,1,1,1,\n",
     ":2: column 'rel_err': expected a finite number, got ''"),
])
def test_report_checks_result_csvs_before_summarising(tmp_path, capsys, where, data, message):
    path = _report_input(tmp_path, where, data)
    out = tmp_path / "summary.md"
    line = _error(capsys, ["report", str(path), "-o", str(out)], out)
    assert line == f"paraplan report: error: {path}{message}"


def test_report_reads_a_calibration_saved_with_a_byte_order_mark(tmp_path, capsys):
    """was: "cannot read JSON: Unexpected UTF-8 BOM" (predict read the same file)."""
    plain = _report_input(tmp_path, "calibrations/a.json", CALIBRATION.read_bytes())
    assert main(["report", str(plain), "-o", str(tmp_path / "plain.md"), "--no-track"]) == 0
    bom = _report_input(tmp_path / "bom", "calibrations/a.json", b"\xef\xbb\xbf" + CALIBRATION.read_bytes())
    assert main(["report", str(bom), "-o", str(tmp_path / "bom.md"), "--no-track"]) == 0
    assert (tmp_path / "plain.md").read_text() == (tmp_path / "bom.md").read_text()


# ---- the workflow config's values ------------------------------------------------------------


def _config() -> dict:
    import yaml

    return yaml.safe_load((REPO / "config" / "config.yaml").read_text())


@pytest.mark.parametrize(("key", "value", "message"), [
    (("bench", "iters"), "abc", "config key 'bench.iters' in mine.yaml: 'abc' is not of type 'integer'"),
    # (minimums: config_check's own wording, which runs first)
    (("bench", "world_sizes"), [1], "config key 'bench.world_sizes[0]' in mine.yaml: 1 is below 2; expected a number "
     ">= 2"),
    (("plan", "llm", "llama3-8b__8xH100", "gpus"), 0,
     "config key 'plan.llm.llama3-8b__8xH100.gpus' in mine.yaml: 0 is below 1; expected a number >= 1"),
    (("mlflow", "enabled"), "yes", "config key 'mlflow.enabled' in mine.yaml: 'yes' is not of type 'boolean'"),
])
def test_a_wrong_config_value_is_one_line_naming_key_and_file(capsys, key, value, message):
    """was: Snakemake's schema check, 8 to 17 lines quoting the schema, naming neither the
    key's dotted path nor the file that gave it."""
    config = _config()
    node = config
    for part in key[:-1]:
        node = node[part]
    node[key[-1]] = value
    mine = {key[0]: config[key[0]]}
    with pytest.raises(SystemExit) as exit_:
        _check(config, mine)
    assert exit_.value.code == 1
    assert capsys.readouterr().err.strip().splitlines() == [f"paraplan: error: {message}"]


def _check(config: dict, mine: dict) -> None:
    """`check_config_keys` as the Snakefile calls it, with `mine` as the config file 'mine.yaml'."""
    from unittest import mock

    from paraplan import workflow_env

    with mock.patch.object(workflow_env, "_read_configfiles", return_value=([("mine.yaml", mine)], [])):
        workflow_env.check_config_keys(config, ["mine.yaml"], str(REPO / "workflow/schemas/config.schema.yaml"))


def test_every_wrong_value_is_said_not_only_the_first():
    from paraplan.typed.config_values import config_value_problems

    config = _config()
    config["bench"]["iters"], config["validate"]["steps"] = -1, "many"
    assert config_value_problems(config, REPO / "workflow/schemas/config.schema.yaml") == [
        "config key 'bench.iters': -1 is less than the minimum of 1",
        "config key 'validate.steps': 'many' is not of type 'integer'"]


def test_the_shipped_config_has_no_wrong_value():
    from paraplan.typed.config_values import config_value_problems

    assert config_value_problems(_config(), REPO / "workflow/schemas/config.schema.yaml") == []

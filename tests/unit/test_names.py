"""Names that become paths follow one rule (paraplan.core.names) wherever they enter:
the workflow config (schema and Python check), study and series names, run names;
text written back to CSV never starts a spreadsheet formula; a key given twice in a
JSON or YAML input is an error naming both lines (issue 21)."""

from __future__ import annotations

import copy
import json
import re

import pytest
import yaml
from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

from paraplan.cli.main import main
from paraplan.core import InputFileError
from paraplan.core.names import NAME_PATTERN, NAME_RULE, file_stems, formula_problem, name_problem
from paraplan.inputs import read_json_object
from paraplan.predict.models import load_model
from paraplan.predict.runtable import read_run_table
from paraplan.studies.plan import load_plan_study
from paraplan.studies.simulate import load_study
from paraplan.typed.config_check import config_key_problems
from paraplan.typed.files import read_yaml

RUN_HEADER = ("name,num_layers,hidden_size,num_attention_heads,seq_length,vocab_size,tensor_model_parallel_size,"
              "pipeline_model_parallel_size,data_parallel_size,global_batch_size,micro_batch_size\n")
RUN_CELLS = ",24,2048,16,2048,50257,2,4,2,64,2\n"


@pytest.mark.parametrize("name", [".", "..", "../x", "/abs/x", "a/b", "a\\b", "-x", "", "a b", ".hidden"])
def test_names_that_are_no_file_names_are_refused(name):
    assert name_problem(name) == f"'{name}' is not a usable name; expected {NAME_RULE}"


def test_a_name_one_character_too_long_is_refused():
    assert name_problem("x" * 65) == f"'xxxxxxxxxxxxxxxxxxxx...' (65 characters) is longer than 64 characters; " \
                                     f"expected {NAME_RULE}"


@pytest.mark.parametrize("name", ["gpt3-1.3b", "llm_a100", "a100-vtrain", "_x", "x" * 64, "2x8"])
def test_names_in_use_pass(name):
    assert name_problem(name) is None


def test_a_long_name_says_its_length():
    assert name_problem("x" * 256) == f"'xxxxxxxxxxxxxxxxxxxx...' (256 characters) is longer than 64 characters; " \
                                      f"expected {NAME_RULE}"


def test_stems_that_collide_after_cleaning_name_both():
    stems, problem = file_stems(["gpt 1.3B/x", "a/b", "a_b"])
    assert stems == ["gpt_1_3B_x", "a_b"]
    assert problem == "'a/b' and 'a_b': both would be written as 'a_b'; expected names that differ as file names"
    assert file_stems(["x", "x"])[1] == "'x' appears twice: both would be written as 'x'; expected names that " \
                                        "differ as file names"
    assert file_stems(["-1 run", "=cmd"])[0] == ["_1_run", "_cmd"]


@pytest.mark.parametrize("text", ["=HYPERLINK(\"x\")", "+1+1", "-2+3", "@SUM(A1)"])
def test_formula_starts_are_refused(text):
    assert formula_problem(text) is not None and f"starts with '{text[0]}'" in formula_problem(text)


# -- the workflow config: schema and Python check ---------------------------------------------------------


@pytest.fixture(scope="module")
def schema(repo_root):
    return yaml.safe_load((repo_root / "workflow/schemas/config.schema.yaml").read_text())


@pytest.fixture()
def config(repo_root):
    return yaml.safe_load((repo_root / "config/config.yaml").read_text())


def test_every_name_in_the_schema_uses_the_one_pattern(schema):
    patterns = []

    def walk(node):
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "pattern":
                    patterns.append(value)
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema)
    assert len(patterns) >= 10 and set(patterns) == {NAME_PATTERN}


@pytest.mark.parametrize("key", ["..", ".", "x" * 65, "-x"])
def test_the_schema_refuses_a_table_name_that_is_no_file_name(repo_root, config, key):
    config["predict"]["tables"][key] = dict(config["predict"]["tables"]["llm_a100"])
    with pytest.raises(WorkflowError, match="does not match"):
        validate(copy.deepcopy(config), str(repo_root / "workflow/schemas/config.schema.yaml"))


def test_the_python_check_names_the_key_and_the_rule(repo_root, schema, config):
    config["predict"]["tables"][".."] = dict(config["predict"]["tables"]["llm_a100"])
    config["plan"]["llm"]["ok"] = {**next(iter(config["plan"]["llm"].values())), "cluster": "../dgx"}
    assert config_key_problems(config, schema, repo_root / "workflow/schemas") == [
        f"config key 'plan.llm.ok.cluster': '../dgx' is not a usable name; expected {NAME_RULE}",
        f"config key 'predict.tables': '..' is not a usable name; expected {NAME_RULE}",
    ]


def test_unknown_keys_get_the_nearest_known_one_with_their_path(repo_root, schema, config):
    config["clustr"] = "local-cpu"
    config["bench"]["itres"] = 3
    config["profile"]["models"]["mlp"]["settings"]["num_layer"] = 3
    config["fit"]["logs"] = [{"name": "x", "path": "p", "format": "param", "worldsize": 2}]
    files = [("mine.yaml", {"bench": {"itres": 3}}), ("config.yaml", {})]
    assert config_key_problems(config, schema, repo_root / "workflow/schemas", files) == [
        "unknown key 'bench.itres' in mine.yaml; did you mean 'bench.iters'?",
        "unknown key 'fit.logs[0].worldsize' in --config; did you mean 'fit.logs[0].world_size'?",
        "unknown key 'profile.models.mlp.settings.num_layer' in --config; did you mean "
        "'profile.models.mlp.settings.num_layers'?",
        "unknown key 'clustr' in --config; did you mean 'cluster'?",
    ]


def test_the_default_config_has_no_problem(repo_root, schema, config):
    assert config_key_problems(config, schema, repo_root / "workflow/schemas") == []


# -- study, series and run names ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["../x", "/abs/x", "x" * 256])
def test_plan_study_names_that_would_write_outside_the_output_are_refused(repo_root, tmp_path, name):
    study = yaml.safe_load((repo_root / "config/studies/plan/dapple_resnet50.yaml").read_text())
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump({**study, "name": name}))
    with pytest.raises(InputFileError, match=r"study.yaml: key 'name': '.*'.* is (not a usable name|longer than 64)"):
        load_plan_study(path)


def test_simulate_study_and_series_names_are_checked(repo_root, tmp_path):
    study = yaml.safe_load((repo_root / "config/studies/simulate/schedules.yaml").read_text())
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump({**study, "name": "/abs/x"}))
    with pytest.raises(InputFileError, match="key 'name': '/abs/x' is not a usable name"):
        load_study(path)
    series = copy.deepcopy(study["series"])
    series[0]["name"] = "../../x"
    path.write_text(yaml.safe_dump({**study, "series": series}))
    with pytest.raises(InputFileError, match=r"key 'series\[0\]': name: '../../x' is not a usable name"):
        load_study(path)


def test_simulate_runs_with_names_that_share_a_file_stop_before_writing(tmp_path, capsys):
    runs = tmp_path / "runs.csv"
    runs.write_text(RUN_HEADER + "a/b" + RUN_CELLS + "a_b" + RUN_CELLS)
    out = tmp_path / "out"
    assert main(["simulate", "--runs", str(runs), "--cluster", "dgx-a100", "-o", str(out), "--no-track"]) == 2
    assert "runs.csv: column 'name': run names 'a/b' and 'a_b': both would be written as 'a_b'" in \
        capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize(("name", "message"), [
    ("x" * 256, "256 characters; expected at most 64 (a name becomes a file name)"),
    ("=HYPERLINK(\"http://x\")", "'=HYPERLINK(\"http://x\")' starts with '=', which a spreadsheet "
                                 "runs as a formula"),
    ("@SUM(A1)", "starts with '@'"),
    ("-1+2", "starts with '-'"),
])
def test_run_names_too_long_or_formulas_are_refused(tmp_path, name, message):
    runs = tmp_path / "runs.csv"
    runs.write_text(RUN_HEADER + json.dumps(name).replace('\\"', '""') + RUN_CELLS)
    with pytest.raises(InputFileError) as err:
        read_run_table(runs)
    assert "runs.csv:2: column 'name': " in str(err.value) and message in str(err.value)


def test_numbers_stay_numbers_in_a_run_table(tmp_path):
    runs = tmp_path / "runs.csv"
    runs.write_text(RUN_HEADER.replace("name,", "name,measured_iteration_s,") + "ok,1.5" + RUN_CELLS)
    _, rows = read_run_table(runs)
    assert rows[0].measured_iteration_s == 1.5


# -- duplicate keys, types in model files -------------------------------------------------------------------


def test_a_json_key_given_twice_names_both_lines(tmp_path):
    path = tmp_path / "cal.json"
    path.write_text('{\n  "a": {"x": 1, "y": "q\\" \\"x\\": "},\n  "b": [{"a": 1}, {"a": 2}],\n  "a": 3\n}\n')
    with pytest.raises(InputFileError) as err:
        read_json_object(path, "a calibration")
    assert str(err.value) == f"{path}:4: key 'a' appears twice (lines 2 and 4); expected each key once in an object"


def test_a_yaml_key_given_twice_names_both_lines_but_merges_may_override(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("a: 1\nb:\n  x: 1\n  y: 2\n  x: 3\n")
    with pytest.raises(InputFileError) as err:
        read_yaml(path, "a cluster")
    assert str(err.value) == f"{path}:5: key 'x' appears twice (lines 3 and 5); expected each key once in a mapping"
    path.write_text("base: &b {x: 1, y: 2}\nc:\n  <<: *b\n  x: 3\n")
    assert read_yaml(path, "a cluster") == {"base": {"x": 1, "y": 2}, "c": {"x": 3, "y": 2}}


def test_a_cluster_file_with_a_key_twice_is_refused(repo_root, tmp_path):
    from paraplan.clusters import load_cluster

    text = (repo_root / "config/clusters/dgx-a100.yaml").read_text()
    path = tmp_path / "twice.yaml"
    path.write_text(text + "nodes: 3\n")
    with pytest.raises(InputFileError, match=r"twice.yaml:\d+: key 'nodes' appears twice \(lines \d+ and \d+\)"):
        load_cluster(str(path))


@pytest.mark.parametrize("act", [1, ["silu"], {"name": "silu"}, True])
def test_a_hidden_act_that_is_not_text_names_the_key(tmp_path, act):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 1,
                                "vocab_size": 8, "max_position_embeddings": 8, "hidden_act": act}))
    with pytest.raises(InputFileError, match=r"config.json: key 'hidden_act': expected a string, got"):
        load_model(str(path))


def test_a_cluster_name_that_is_no_file_name_is_refused(repo_root, tmp_path):
    from paraplan.clusters import load_cluster

    text = (repo_root / "config/clusters/dgx-a100.yaml").read_text()
    path = tmp_path / "odd.yaml"
    path.write_text(text.replace("name: dgx-a100", "name: ../../etc"))
    with pytest.raises(InputFileError, match=r"odd.yaml: key 'name': '\.\./\.\./etc' is not a usable name"):
        load_cluster(str(path))


def test_a_model_file_whose_name_is_a_formula_is_refused(tmp_path):
    path = tmp_path / "=cmd.yaml"
    path.write_text("num_layers: 2\nhidden_size: 64\nnum_attention_heads: 4\nseq_length: 128\nvocab_size: 1000\n")
    with pytest.raises(InputFileError, match="the model's name \\(from the file or folder name\\): '=cmd' starts "
                                             "with '='"):
        load_model(str(path))


@pytest.mark.parametrize(("args", "line"), [
    (["plan", "--study", "x" * 300, "-o", "OUT"], "paraplan plan: error: option --study: 'xxxxxxxxxxxxxxxxxxxx...' "
                                                   "(300 characters) is longer than 64 characters"),
    (["simulate", "--study", "../x", "-o", "OUT"], "paraplan simulate: error: option --study: '../x' is not a "
                                                   "usable name"),
    (["plan", "--model", "gpt3-125m", "--cluster", "/abs/x", "--gpus", "8", "--global-batch-size", "8", "-o",
      "OUT/p.csv"], "paraplan plan: error: option --cluster: '/abs/x' is not a usable name"),
    (["simulate", "--runs", "RUNS", "--cluster", "dgx-a100", "-o", "OUT/" + "x" * 300],
     "paraplan simulate: error: cannot write 'OUT/xxxx"),
])
def test_names_and_paths_from_the_command_line_fail_in_one_line(repo_root, tmp_path, capsys, args, line):
    """Issue 21: a 256-character name gave a "File name too long" traceback."""
    out = str(tmp_path / "out")
    args = [a.replace("OUT", out).replace("RUNS", str(repo_root / "config/runs/llm_a100.csv")) for a in args]
    assert main([*args, "--no-track"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(line.replace("OUT", out)) and len(err.splitlines()) == 1, err


def test_text_from_logs_and_profiles_written_to_csv_starts_no_formula(data_dir, tmp_path):
    from paraplan.comm.param_log import parse_param
    from paraplan.profile.pipedream import read_pipedream

    log = ("\t collective=all_reduce, src_ranks=None\n"
           "[Rank   0] host =cmd|calc, device: cuda:0 world_size: 2\n"
           "[Rank   1] host nodeB, device: cuda:0 world_size: 2\n"
           "\tCOMMS-RES   1048576   262144   500.0   510.0   520.0   490.0   530.0   2.097   2.097\n")
    with pytest.raises(InputFileError, match=re.escape("up.txt:4: host: '=cmd|calc' starts with '='")):
        parse_param(log, "up.txt")
    text = (data_dir / "pipedream-profiles/vgg-19-pbs-32.txt").read_text()
    path = tmp_path / "vgg-pbs-32.txt"
    path.write_text(text.replace(" -- Conv2d_1_1 -- ", " -- @SUM(A1) -- ", 1))
    with pytest.raises(InputFileError, match=r"vgg-pbs-32.txt:2: description: '@SUM\(A1\)' starts with '@'"):
        read_pipedream(path)


def test_a_nullable_name_may_be_null(repo_root, schema, config):
    config["fit"]["logs"] = [{"name": "a100", "path": "p", "format": "nccl-tests", "cluster": None},
                             {"name": "b", "path": "p", "format": "nccl-tests", "cluster": "../x"}]
    assert config_key_problems(config, schema, repo_root / "workflow/schemas") == [
        f"config key 'fit.logs[1].cluster': '../x' is not a usable name; expected {NAME_RULE}"]

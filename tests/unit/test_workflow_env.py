"""The environment the Snakefile hands to every job."""

from __future__ import annotations

import os

import pytest

from paraplan import workflow_env
from paraplan.track import ENV_CONFIG_DIGEST, ENV_INVOCATION, config_digest
from paraplan.track_spool import ENV_SPOOL
from paraplan.track_tags import ENV_GIT_COMMIT


@pytest.fixture(autouse=True)
def _restore_environment(monkeypatch):
    """prepare_environment writes os.environ; monkeypatch restores these keys after each test."""
    for key in (ENV_INVOCATION, ENV_CONFIG_DIGEST, "MLFLOW_TRACKING_URI", ENV_SPOOL, ENV_GIT_COMMIT):
        monkeypatch.setenv(key, "placeholder")
        monkeypatch.delenv(key)


def test_invocation_id_is_kept_when_inherited(monkeypatch):
    monkeypatch.setenv(ENV_INVOCATION, "from-parent")
    workflow_env.prepare_environment({"mlflow": {"tracking_uri": ""}})
    assert os.environ[ENV_INVOCATION] == "from-parent"


def test_fresh_invocation_id_and_digest(monkeypatch):
    monkeypatch.delenv(ENV_INVOCATION, raising=False)
    config = {"bench": {"iters": 3}, "mlflow": {"tracking_uri": ""}}
    workflow_env.prepare_environment(config)
    assert len(os.environ[ENV_INVOCATION]) == 32
    assert os.environ[ENV_CONFIG_DIGEST] == config_digest(config)
    assert config_digest(config) != config_digest({"bench": {"iters": 4}, "mlflow": {"tracking_uri": ""}})


def test_config_uri_used_only_without_environment(monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    workflow_env.prepare_environment({"mlflow": {"tracking_uri": "http://server:5000"}})
    assert os.environ["MLFLOW_TRACKING_URI"] == "http://server:5000"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///elsewhere.db")
    workflow_env.prepare_environment({"mlflow": {"tracking_uri": "http://server:5000"}})
    assert os.environ["MLFLOW_TRACKING_URI"] == "sqlite:///elsewhere.db"


# ---- config checks before any job runs (issue 15) ---------------------------------------


def _default_config(repo_root) -> dict:
    import yaml

    from paraplan.workflow_env import upgrade_config

    config = yaml.safe_load((repo_root / "config" / "config.yaml").read_text())
    upgrade_config(config, str(repo_root / "workflow" / "schemas" / "config.schema.yaml"))
    return config


@pytest.fixture()
def default_config(repo_root, monkeypatch):
    monkeypatch.chdir(repo_root)
    return _default_config(repo_root)


def test_the_default_config_runs_here(default_config):
    assert workflow_env.config_problems(default_config, cores=2) == []


@pytest.mark.parametrize(("edit", "key", "message"), [
    (lambda c: c.update(cluster="nope"), "cluster", "no cluster file config/clusters/nope.yaml; known clusters: "),
    (lambda c: c["plan"]["llm"]["llama3-8b__8xH100"].update(cluster="dgx-z900"), "plan.llm.llama3-8b__8xH100.cluster",
     "no cluster file config/clusters/dgx-z900.yaml"),
    (lambda c: c["bench"].update(min_bytes=4096, max_bytes=1024), "bench.min_bytes",
     "4096 is above bench.max_bytes (1024); expected min_bytes <= max_bytes"),
    (lambda c: c["bench"].update(world_sizes=[2, 8]), "bench.world_sizes",
     "8 ranks on this machine's 2 cores; expected at most 4 (two gloo ranks per core), or a cluster executor"),
    (lambda c: c["fit"]["logs"].append({"name": "a100", "path": "missing/a100.txt", "format": "nccl-tests"}),
     "fit.logs[0].path", "missing/a100.txt does not exist; expected the nccl-tests log named 'a100'"),
    (lambda c: c["fit"]["logs"].append({"name": "d", "path": "config", "format": "nccl-tests"}),
     "fit.logs[0].path", "config is a folder; expected the nccl-tests log named 'd'"),
    (lambda c: c["fit"]["logs"].append({"name": "h", "path": "data/nccl-tests/10_h100_ndr400_2x8_all_reduce.txt",
                                        "format": "nccl-tests", "cluster": "dgx-z900"}),
     "fit.logs[0].cluster", "no cluster file config/clusters/dgx-z900.yaml"),
    (lambda c: c["predict"]["tables"]["llm_a100"].update(runs="config/runs/none.csv"),
     "predict.tables.llm_a100.runs", "config/runs/none.csv does not exist; expected a run table (CSV)"),
    (lambda c: c["simulate"]["studies"].append("fig9"), "simulate.studies", "no study 'fig9'"),
    (lambda c: c["plan"]["llm"]["llama3-8b__8xH100"].update(fp8_recipe="mxfp8"),
     "plan.llm.llama3-8b__8xH100.fp8_recipe", "applies to dtype fp8 only, got dtype bf16"),
    (lambda c: c["plan"]["llm"]["llama3-8b__8xH100"].update(schedules=["gpipe", "dualpipe"]),
     "plan.llm.llama3-8b__8xH100.schedules", "dualpipe needs 1f1b beside it"),
])
def test_a_config_that_cannot_run_here_names_the_key(default_config, edit, key, message):
    edit(default_config)
    (problem,) = workflow_env.config_problems(default_config, cores=2)
    assert problem[0] == key and message in problem[1]


def test_world_sizes_are_the_executors_business_on_a_cluster(default_config):
    default_config["bench"]["world_sizes"] = [2, 64]
    assert workflow_env.config_problems(default_config, cores=None) == []
    default_config["bench"]["backend"] = "nccl"  # GPUs, not cores, bound NCCL ranks
    assert workflow_env.config_problems(default_config, cores=2) == []


def test_check_config_prints_one_line_per_problem_and_exits(default_config, capsys):
    default_config["bench"].update(min_bytes=4096, max_bytes=1024)
    default_config["cluster"] = "nope"
    with pytest.raises(SystemExit) as stop:
        workflow_env.check_config(default_config, local=True)
    assert stop.value.code == 1
    lines = capsys.readouterr().err.splitlines()
    assert [line.split("'")[1] for line in lines] == ["cluster", "bench.min_bytes"]
    assert all(line.startswith("paraplan: error: config key '") for line in lines)


def test_nested_command_line_config_text_is_read_as_numbers(repo_root):
    """Snakemake 9 passes --config bench='{iters: 50, world_sizes: [2]}' as text values."""
    from paraplan.workflow_env import upgrade_config

    config = {"bench": {"iters": "50", "world_sizes": ["2"], "backend": "gloo", "factor": "2.5"},
              "mlflow": {"enabled": "false", "tracking_uri": ""}, "cluster": "local-cpu",
              "plan": {"global_batch_sizes": ["32", "64"]}}
    upgrade_config(config, str(repo_root / "workflow" / "schemas" / "config.schema.yaml"))
    assert config["bench"] == {"iters": 50, "world_sizes": [2], "backend": "gloo", "factor": 2.5}
    assert config["mlflow"] == {"enabled": False, "tracking_uri": ""}
    assert config["plan"]["global_batch_sizes"] == [32, 64]


def test_missing_configfiles_are_read_as_snakemake_reads_them(tmp_path, monkeypatch):
    from paraplan.workflow_env import missing_configfiles

    monkeypatch.chdir(tmp_path)
    (tmp_path / "a.yaml").write_text("cluster: local-cpu\n")
    (tmp_path / "folder").mkdir()
    argv = ["snakemake", "-n", "--configfile", "a.yaml", "b.yaml", "--cores", "2", "--configfiles=folder"]
    assert missing_configfiles(argv) == ["b.yaml", "folder"]
    # nargs="+": a target after --configfile is read as a config file by Snakemake too
    assert missing_configfiles(["snakemake", "--configfile", "a.yaml", "bench_all"]) == ["bench_all"]
    assert missing_configfiles(["snakemake", "bench_all", "--config", "x=1"]) == []


# ---- plan.llm entries: every `paraplan plan --model` search option ------------------------


def test_a_plan_llm_entry_becomes_the_commands_options():
    entry = {"model": "qwen3-30b-a3b", "cluster": "dgx-h100", "gpus": 64, "global_batch_size": 256,
             "seq_length": 32768, "dtype": "fp8", "top_k": 3, "fp8_recipe": "blockwise",
             "context_parallel_sizes": [1, 2, 4], "schedules": ["1f1b", "dualpipe"], "no_overlap_flags": True}
    assert workflow_env.plan_llm_args(entry) == [
        "--model", "qwen3-30b-a3b", "--cluster", "dgx-h100", "--gpus", "64", "--global-batch-size", "256",
        "--seq-length", "32768", "--dtype", "fp8", "--top-k", "3", "--fp8-recipe", "blockwise",
        "--context-parallel-sizes", "1,2,4", "--schedules", "1f1b,dualpipe", "--no-overlap-flags"]
    least = {"model": "gpt3-13b", "cluster": "dgx-a100", "gpus": 64, "global_batch_size": 512,
             "no_overlap_flags": False}
    assert workflow_env.plan_llm_args(least) == [
        "--model", "gpt3-13b", "--cluster", "dgx-a100", "--gpus", "64", "--global-batch-size", "512",
        "--dtype", "bf16", "--top-k", "5"]


def test_every_plan_llm_option_the_command_parses_is_accepted_by_it():
    from paraplan.cli.main import build_parser

    entry = {"model": "gpt3-13b", "cluster": "dgx-a100", "gpus": 64, "global_batch_size": 512, "dtype": "fp8",
             "fp8_recipe": "mxfp8", "context_parallel_sizes": [1, 2], "schedules": ["zb_h1"],
             "no_overlap_flags": True}
    args = build_parser().parse_args(["plan", *workflow_env.plan_llm_args(entry), "-o", "p.csv"])
    assert (args.fp8_recipe, args.context_parallel_sizes, args.schedules, args.no_overlap_flags) == \
        ("mxfp8", "1,2", "zb_h1", True)


def _schema_entry(repo_root) -> dict:
    import yaml

    schema = yaml.safe_load((repo_root / "workflow/schemas/config.schema.yaml").read_text())
    return schema["properties"]["plan"]["properties"]["llm"]["additionalProperties"]["properties"]


def test_the_schemas_choices_are_the_commands(repo_root):
    from paraplan.core.run_settings import FP8_RECIPES
    from paraplan.plan.transformer.space import POST_PASS_SCHEDULES, SCHEDULES

    properties = _schema_entry(repo_root)
    assert tuple(properties["fp8_recipe"]["enum"]) == FP8_RECIPES
    assert tuple(properties["schedules"]["items"]["enum"]) == (*SCHEDULES, *POST_PASS_SCHEDULES)


@pytest.mark.parametrize(("value", "key", "message"), [
    ({"fp8_recipe": "hybrid"}, "plan.llm.x.fp8_recipe",
     "'hybrid' is not a choice; expected one of delayed, tensorwise, blockwise, mxfp8"),
    ({"schedules": ["1f1b", "zb_v"]}, "plan.llm.x.schedules[1]",
     "'zb_v' is not a choice; expected one of 1f1b, interleaved_1f1b, zb_h1, gpipe, dualpipe"),
    ({"context_parallel_sizes": [0, 2]}, "plan.llm.x.context_parallel_sizes[0]",
     "0 is below 1; expected a number >= 1"),
    ({"context_parallel_sizes": []}, "plan.llm.x.context_parallel_sizes", "[] has 0 items; expected at least 1"),
    ({"dtype": "fp9"}, "plan.llm.x.dtype", "'fp9' is not a choice; expected one of bf16, fp16, fp8, fp32"),
])
def test_a_bad_plan_llm_value_is_one_line_naming_the_key(repo_root, default_config, capsys, value, key, message):
    default_config["plan"]["llm"] = {"x": {"model": "gpt3-13b", "cluster": "dgx-a100", "gpus": 64,
                                           "global_batch_size": 512, **value}}
    with pytest.raises(SystemExit):
        workflow_env.check_config_keys(default_config, (), str(repo_root / "workflow/schemas/config.schema.yaml"))
    assert capsys.readouterr().err == f"paraplan: error: config key '{key}': {message}\n"

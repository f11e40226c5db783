"""What the Snakefile needs from Python, kept out of the rules files: the tracking
environment every job inherits, and the per-invocation summary run.

Nothing here enters a rule's `params:`, so none of it can force a rerun.
"""

from __future__ import annotations

import os
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from paraplan.track import (
    ENV_CONFIG_DIGEST,
    ENV_INVOCATION,
    ENV_INVOCATION_START,
    ENV_TIMEOUT,
    ENV_TRACKING,
    config_digest,
)


def upgrade_config(config: dict, schema_path: str = "workflow/schemas/config.schema.yaml") -> None:
    """Rename the config's paraplan 0.1 keys (`plan.mbs`, `simulate.experiments`, ...) to
    their names in the glossary, with a deprecation line each, and read the text a
    nested `--config key='{...}'` leaves as the numbers and booleans it stands for, before
    Snakemake validates the config against its schema (`paraplan.typed.config_keys`)."""
    from pathlib import Path

    import yaml

    from paraplan.typed.config_keys import coerce_config_text, upgrade_config_keys

    path = Path(schema_path)
    schema = yaml.safe_load(path.read_text())
    upgrade_config_keys(config, schema, path.parent)
    coerce_config_text(config, schema, path.parent)


DEFAULT_CONFIGFILE = "config/config.yaml"


def missing_configfiles(argv: Sequence[str]) -> list[str]:
    """The files a snakemake command line names with --configfile/--configfiles (each
    takes every word up to the next option, as Snakemake's parser does) that are not
    files here."""
    given: list[str] = []
    taking = False
    for word in argv[1:]:
        if taking and not word.startswith("-"):
            given.append(word)
            continue
        taking = word in ("--configfile", "--configfiles")
        if word.startswith(("--configfile=", "--configfiles=")):
            given.append(word.split("=", 1)[1])
    return [path for path in given if not os.path.isfile(path)]


def stop_on_missing_configfiles(argv: Sequence[str] | None = None) -> None:
    """Exit with one line per --configfile that is not a file. Snakemake reads config
    files before the Snakefile (and prints a 27-line traceback for a missing one), so
    the workflow's profiles call this when Snakemake loads them (YTE `__definitions__`)."""
    missing = missing_configfiles(sys.argv if argv is None else argv)
    for path in missing:
        where = "is a folder" if os.path.isdir(path) else "does not exist"
        print(f"paraplan: error: --configfile {path}: {where} (paths are relative to {os.getcwd()}); expected a "
              "YAML file of config keys (config/config.yaml shows them all)", file=sys.stderr)
    if missing:
        raise SystemExit(1)


def check_config_keys(config: Mapping[str, Any], configfiles: Sequence[str | os.PathLike] = (),
                      schema_path: str = "workflow/schemas/config.schema.yaml") -> None:
    """Before Snakemake's schema check: stop with one line per unknown key (and the
    nearest known one) or unusable name (`paraplan.typed.config_check`), and per key
    given twice in one of `configfiles` (the files Snakemake merged, in order)."""
    from pathlib import Path

    import yaml

    from paraplan.typed.config_check import config_key_problems

    files, problems = _read_configfiles(configfiles)
    path = Path(schema_path)
    problems += config_key_problems(config, yaml.safe_load(path.read_text()), path.parent, files)
    if not problems:  # q4-hostile: wrong values one line each too, not Snakemake's schema dump
        from paraplan.typed.config_values import config_value_problems

        problems = config_value_problems(config, path, files)
    for problem in problems:
        print(f"paraplan: error: {problem}", file=sys.stderr)
    if problems:
        raise SystemExit(1)


def _read_configfiles(configfiles: Sequence[str | os.PathLike]) -> tuple[list[tuple[str, object]], list[str]]:
    """(name, data) of each config file Snakemake merged, the one that wins first (the
    last --configfile, ..., the first, the Snakefile's own `configfile:`, which
    Snakemake lists after the command line's), and one line per file that cannot be read."""
    from pathlib import Path

    from paraplan.core import ParaplanError
    from paraplan.typed.files import read_yaml

    default = Path(DEFAULT_CONFIGFILE).resolve()
    ordered = sorted(reversed(list(configfiles)), key=lambda f: Path(f).resolve() == default)
    files: list[tuple[str, object]] = []
    problems: list[str] = []
    for configfile in ordered:
        try:
            files.append((Path(configfile).name, read_yaml(configfile, "the workflow config (YAML)")))
        except ParaplanError as exc:
            problems.append(str(exc))
    return files, problems


def config_problems(config: Mapping[str, Any], cores: int | None) -> list[tuple[str, str]]:
    """What in a schema-valid config cannot run here, as (key, what is wrong), found
    before any job starts: cluster files that do not exist or do not load, input files
    that are not there, `bench.min_bytes > bench.max_bytes`, and gloo world sizes the
    machine's `cores` cannot run (None: jobs run elsewhere, through a cluster executor).

    A gloo rank may share a core (the default config runs 4 ranks on a 2-core machine,
    each told to use cores // ranks threads), but beyond two ranks per core the ranks
    wait on the scheduler more than on each other, so the timings no longer describe
    the collective."""
    from paraplan.clusters import load_cluster
    from paraplan.config_files import find_study
    from paraplan.core import ParaplanError

    problems: list[tuple[str, str]] = []

    def cluster(key: str, name: object) -> None:
        try:
            load_cluster(str(name))
        except ParaplanError as exc:
            problems.append((key, getattr(exc, "reason", str(exc))))

    def file(key: str, path: object, what: str) -> None:
        if not os.path.isfile(str(path)):
            where = "is a folder" if os.path.isdir(str(path)) else "does not exist"
            problems.append((key, f"{path} {where}; expected {what} (paths are relative to {os.getcwd()})"))

    cluster("cluster", config["cluster"])
    plan = config.get("plan", {})
    for name, entry in plan.get("llm", {}).items():
        cluster(f"plan.llm.{name}.cluster", entry["cluster"])
        problems += plan_llm_problems(f"plan.llm.{name}", entry)
    for name, entry in config.get("profile", {}).get("models", {}).items():
        if entry.get("analytic"):
            cluster(f"profile.models.{name}.analytic.cluster", entry["analytic"]["cluster"])
    bench = config.get("bench", {})
    if bench.get("min_bytes", 0) > bench.get("max_bytes", 0):
        problems.append(("bench.min_bytes", f"{bench['min_bytes']} is above bench.max_bytes ({bench['max_bytes']}); "
                         "expected min_bytes <= max_bytes"))
    if cores is not None and bench.get("backend") == "gloo":
        too_many = [w for w in bench.get("world_sizes", []) if w > 2 * cores]
        if too_many:
            problems.append(("bench.world_sizes", f"{too_many[0]} ranks on this machine's {cores} cores; expected at "
                             f"most {2 * cores} (two gloo ranks per core), or a cluster executor "
                             "(--executor slurm) whose nodes have the cores"))
    for i, entry in enumerate(config.get("fit", {}).get("logs", [])):
        file(f"fit.logs[{i}].path", entry["path"], f"the {entry['format']} log named '{entry['name']}'")
        if entry.get("cluster"):
            cluster(f"fit.logs[{i}].cluster", entry["cluster"])
    for study in config.get("simulate", {}).get("studies", []):
        path = find_study("simulate", study)
        if not path.is_file():
            problems.append(("simulate.studies", f"no study '{study}' ({path} does not exist)"))
    predict = config.get("predict", {})
    for name, entry in predict.get("calibrations", {}).items():
        cluster(f"predict.calibrations.{name}.cluster", entry["cluster"])
        if os.path.isfile(str(entry["runs"])) and entry.get("comm_log"):
            file(f"predict.calibrations.{name}.comm_log", entry["comm_log"], "an nccl-tests log of one node")
    for name, entry in predict.get("tables", {}).items():
        file(f"predict.tables.{name}.runs", entry["runs"], "a run table (CSV)")
        cluster(f"predict.tables.{name}.cluster", entry["cluster"])
    return problems


def plan_llm_args(entry: Mapping[str, Any]) -> list[str]:
    """A schema-valid plan.llm entry as `paraplan plan` options, one item per shell word
    (the config keys are the options' names with underscores)."""
    args = ["--model", str(entry["model"]), "--cluster", str(entry["cluster"]), "--gpus", str(entry["gpus"]),
            "--global-batch-size", str(entry["global_batch_size"])]
    if entry.get("seq_length"):
        args += ["--seq-length", str(entry["seq_length"])]
    args += ["--dtype", str(entry.get("dtype", "bf16")), "--top-k", str(entry.get("top_k", 5))]
    if entry.get("fp8_recipe"):
        args += ["--fp8-recipe", str(entry["fp8_recipe"])]
    for key in ("context_parallel_sizes", "schedules"):
        if entry.get(key):
            args += ["--" + key.replace("_", "-"), ",".join(str(value) for value in entry[key])]
    if entry.get("no_overlap_flags"):
        args.append("--no-overlap-flags")
    return args


def plan_llm_problems(key: str, entry: Mapping[str, Any]) -> list[tuple[str, str]]:
    """What `paraplan plan` would refuse in a schema-valid plan.llm entry (`key`, its
    dotted path) across its keys, as (key, what is wrong): the same rules as the
    command's --fp8-recipe and --schedules."""
    problems: list[tuple[str, str]] = []
    dtype = entry.get("dtype", "bf16")
    if entry.get("fp8_recipe") and dtype != "fp8":
        problems.append((f"{key}.fp8_recipe", f"applies to dtype fp8 only, got dtype {dtype}"))
    schedules = entry.get("schedules") or ()
    if "dualpipe" in schedules and "1f1b" not in schedules:
        problems.append((f"{key}.schedules", "dualpipe needs 1f1b beside it (DualPipe is tried on the best "
                         "1F1B candidates); expected e.g. [1f1b, dualpipe]"))
    return problems


def check_config(config: Mapping[str, Any], local: bool, configfiles: Sequence[str | os.PathLike] = ()) -> None:
    """Stop Snakemake before any job starts when `config_problems` finds anything: one
    line per problem, naming the key and the file it was given in (of `configfiles`,
    the files Snakemake merged; `--config` when none holds it), then exit status 1.
    `local`: jobs run on this machine (no cluster executor)."""
    from paraplan.typed.config_check import given_in, key_named

    problems = config_problems(config, (os.cpu_count() or 1) if local else None)
    files = _read_configfiles(configfiles)[0] if problems and configfiles else []
    for key, problem in problems:
        origin = given_in(key, config, files) if files else ""
        print(f"paraplan: error: {key_named(key, origin)}: {problem}", file=sys.stderr)
    if problems:
        raise SystemExit(1)


def prepare_environment(config: Mapping[str, object]) -> None:
    """Set the variables jobs read when they log: one invocation id and start time for
    the whole `snakemake` call (kept when already set, e.g. in a SLURM job that
    inherited them), the config digest, the tracking URI from config unless the
    environment has one, `mlflow.enabled: false` as PARAPLAN_TRACKING=off and
    `mlflow.timeout_s`; and for deferred tracking, the spool folder every job writes its
    run's record to (logged by `log_workflow_runs` at the end) and the commit, read once
    (docs/tracking.md)."""
    from pathlib import Path

    from paraplan.track_spool import DEFAULT_SPOOL, ENV_SPOOL
    from paraplan.track_tags import ENV_GIT_COMMIT, git_commit

    os.environ.setdefault(ENV_INVOCATION, uuid.uuid4().hex)
    os.environ.setdefault(ENV_INVOCATION_START, str(int(time.time() * 1000)))
    os.environ[ENV_CONFIG_DIGEST] = config_digest(config)
    mlflow_config = config.get("mlflow") or {}
    if not isinstance(mlflow_config, Mapping):
        mlflow_config = {}
    uri = mlflow_config.get("tracking_uri", "")
    if uri and not os.environ.get("MLFLOW_TRACKING_URI"):
        os.environ["MLFLOW_TRACKING_URI"] = str(uri)
    if mlflow_config.get("enabled", True) is False:
        os.environ[ENV_TRACKING] = "off"
    if mlflow_config.get("timeout_s") is not None:
        os.environ.setdefault(ENV_TIMEOUT, str(mlflow_config["timeout_s"]))
    os.environ.setdefault(ENV_SPOOL, str(Path.cwd() / DEFAULT_SPOOL))
    os.environ.setdefault(ENV_GIT_COMMIT, git_commit())


def check_store() -> None:
    """Before any job: an unreachable tracking server stops Snakemake here, in seconds
    (a local store is opened, and a SQLite schema created, when the runs are logged)."""
    from paraplan.track import probe, tracking_enabled, tracking_uri

    if not tracking_enabled():
        print("paraplan: MLflow tracking is off (mlflow.enabled: false)", file=sys.stderr)
        return
    probe(tracking_uri())


def log_invocation(failed: bool = False, log: str = "") -> bool:
    """The workflow's end (`onsuccess`, `onerror`): log every job's run from the spool
    in this one process (a job killed mid-way as KILLED), then the run that links this
    invocation's runs (FAILED from `onerror`). A tracking failure is one line naming the
    store (returns False); the results are on disk and the records stay for the next run."""
    from pathlib import Path

    from paraplan.core import TrackingError
    from paraplan.track import http_defaults, log_invocation_summary, tracking_enabled
    from paraplan.track_job import describe, log_workflow_runs
    from paraplan.track_spool import ENV_SPOOL

    if not tracking_enabled():
        return True
    spool = Path(os.environ[ENV_SPOOL])
    invocation = os.environ[ENV_INVOCATION]
    started = time.perf_counter()
    try:
        http_defaults()
        outcome = log_workflow_runs(invocation, spool)
    except TrackingError as exc:
        print(f"paraplan: error: {exc}", file=sys.stderr)
        return False
    for line in describe(outcome, spool):
        print(f"paraplan: {line}", file=sys.stderr)
    print(f"paraplan: MLflow logging at the workflow's end took {time.perf_counter() - started:.1f} s",
          file=sys.stderr)
    if outcome.errors:
        return False
    start = os.environ.get(ENV_INVOCATION_START, "")
    error = f"snakemake stopped on a failed job; its log: {log}" if failed else ""
    try:
        run_id = log_invocation_summary(invocation, failed=failed, error=error,
                                        start_ms=int(start) if start.isdigit() else None)
    except TrackingError as exc:
        print(f"paraplan: could not log the invocation summary: {exc}", file=sys.stderr)
        return False
    if run_id:
        print(f"paraplan: invocation summary logged as MLflow run {run_id}"
              + (" (FAILED)" if failed else ""), file=sys.stderr)
    return True

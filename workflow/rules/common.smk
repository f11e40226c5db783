# Shared settings for every rules file. Tracking environment, wildcard patterns, the
# input functions of every rule, the tracking tail of every shell command and the
# target list.
import os
import sys

from snakemake.exceptions import WorkflowError

from paraplan.config_files import find_study
from paraplan.workflow_env import check_store, log_invocation, prepare_environment

# One invocation id for every job of this `snakemake` call, the config digest and the
# tracking URI, passed to jobs through the environment (never through params:).
prepare_environment(config)

CLUSTER = config["cluster"]
RESULTS = "results"
LOGS = f"{RESULTS}/logs"
BENCHMARKS = f"{RESULTS}/benchmarks"
FIGURES = f"{RESULTS}/figures"
SUMMARY = f"{RESULTS}/summary.md"
# A name in a file path (paraplan.core.names; its length is checked with the config):
# never `.`, `..` or a hidden file
NAME_WILDCARD = "[A-Za-z0-9_][A-Za-z0-9_.-]*"


# Every wildcard of every rule, once; a rule narrows one where it takes only listed
# names (fit_log's {log}, kernels_published's {device}, plan_measured's {cluster}).
wildcard_constraints:
    cluster=NAME_WILDCARD,
    model=NAME_WILDCARD,
    study=NAME_WILDCARD,
    name=NAME_WILDCARD,
    table=NAME_WILDCARD,
    world=r"[1-9][0-9]*",


def tracked(command, rule, *wildcards):
    """A job's `paraplan` command with the tracking tail every job has: the MLflow
    run's `rule` and `wildcards` tags (the job's record carries them, see
    docs/tracking.md), then the job's output into its log file. `wildcards`: the
    wildcard names of the job, in tag order."""
    pairs = ",".join(f"{name}={{wildcards.{name}:q}}" for name in wildcards)
    tags = f"--rule {rule}" + (f" --wildcards {pairs}" if pairs else "")
    return f"{command} {tags} > {{log:q}} 2>&1"

# Each stage's rules file appends the files its aggregate rule (`<stage>_all`) builds.
ALL_TARGETS = []

# Calibrations of the predict stage whose measured runs are on this machine (the
# repository's data/ folder holds the published ones; a calibration whose runs file
# is missing falls back to the shipped one in config/calibrations/). Their intra-node collective logs are
# fitted by the fit stage's own rules, as extra fit.logs entries named <calibration>-comm.
PREDICT = config["predict"]
CALIBRATIONS = {
    name: entry for name, entry in PREDICT["calibrations"].items() if os.path.isfile(entry["runs"])
}
for _name in sorted(set(PREDICT["calibrations"]) - set(CALIBRATIONS)):
    print(
        f"paraplan: calibration '{_name}' skipped: {PREDICT['calibrations'][_name]['runs']} is not here; "
        f"predictions use config/calibrations/{_name}.json",
        file=sys.stderr,
    )

# The calibration each prediction table and transformer plan uses: made by this
# workflow, else the shipped one.
PREDICT_DEFAULT_CALIBRATION = "a100-vtrain"
CALIBRATION_FILES = {
    name: (f"{RESULTS}/calibrations/{name}.json" if name in CALIBRATIONS else f"config/calibrations/{name}.json")
    for name in {
        PREDICT_DEFAULT_CALIBRATION,
        *(table["calibration"] for table in PREDICT["tables"].values()),
        *(entry.get("calibration", PREDICT_DEFAULT_CALIBRATION) for entry in config["plan"]["llm"].values()),
    }
}

CALIBRATION_COMM_LOGS = {
    f"{name}-comm": {"name": f"{name}-comm", "path": entry["comm_log"], "format": "nccl-tests"}
    for name, entry in CALIBRATIONS.items()
    if entry.get("comm_log")
}


# ---- input functions (one per rule input that depends on a wildcard; the tables they
# read are defined in the stage's rules file) ----


def fit_bench_csvs(wildcards):
    """fit: the cluster's bench CSVs (every collective x world size; fit.smk)."""
    return expand(
        f"{RESULTS}/collectives/{wildcards.cluster}/{{collective}}_n{{world}}.csv",
        collective=FIT_INPUT_COLLECTIVES,
        world=config["bench"]["world_sizes"],
    )


def fit_log_file(wildcards):
    """ingest: the fit.logs entry's log file (fit.smk)."""
    return FIT_LOGS[wildcards.log]["path"]


def published_kernel_tables(wildcards):
    """kernels_published: the device's published GEMM/attention tables (kernels.smk)."""
    return KERNELS_PUBLISHED[wildcards.device]["inputs"]


def simulate_study_file(wildcards):
    """simulate: config/studies/simulate/{study}.yaml (0.1's config/experiments/ too)."""
    return str(find_study("simulate", wildcards.study))


def plan_llm_calibration(wildcards):
    """plan_llm: the calibration file of the plan.llm entry (made here, else shipped)."""
    return CALIBRATION_FILES[PLAN_LLM[wildcards.name]["calibration"]]


def measured_runs_source(wildcards):
    """predict_ingest: the calibration's measured runs in their own format."""
    return CALIBRATIONS[wildcards.name]["runs"]


def calibration_runs(wildcards):
    """calibrate: the run table (ingested when the runs come in another format)."""
    entry = CALIBRATIONS[wildcards.name]
    if entry["format"] == "run-table":
        return entry["runs"]
    return f"{RESULTS}/predict/{wildcards.name}/measured_runs.csv"


def calibration_comm_model(wildcards):
    """calibrate: the fit of the calibration's intra-node collectives, when it has a log."""
    name = f"{wildcards.name}-comm"
    return [f"{RESULTS}/fits/{name}/comm_model.json"] if name in CALIBRATION_COMM_LOGS else []


def predict_runs(wildcards):
    """predict: the table's run table."""
    return PREDICT["tables"][wildcards.table]["runs"]


def predict_calibration(wildcards):
    """predict: the table's calibration file (made here, else shipped)."""
    return CALIBRATION_FILES[PREDICT["tables"][wildcards.table]["calibration"]]


def summary_inputs(wildcards):
    """report: every stage's targets (a function, so it sees rules files included later)."""
    return [target for target in ALL_TARGETS if target != SUMMARY]


onstart:
    # An unreachable tracking server stops the workflow now, before any job runs.
    check_store()


onsuccess:
    # Jobs write their runs as records (.paraplan/runs/); this one process logs them
    # all, then the invocation's summary run. Runs only when jobs ran.
    if not log_invocation():
        raise WorkflowError("MLflow logging failed (results written; the next run logs them)")


onerror:
    # The same after a failed job: its run FAILED (KILLED if its process was killed),
    # the summary run FAILED.
    log_invocation(failed=True, log=log)

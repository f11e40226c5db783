# Shared settings for every rule file: tracking environment and the target list.
import os
import sys

from snakemake.exceptions import WorkflowError

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

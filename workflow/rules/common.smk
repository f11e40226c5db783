# Shared settings for every rule file: tracking environment and the target list.
from paraplan.workflow_env import create_store, prepare_environment, summarise_invocation

# One invocation id for every job of this `snakemake` call, the config digest and the
# tracking URI, passed to jobs through the environment (never through params:).
prepare_environment(config)

CLUSTER = config["cluster"]
RESULTS = "results"
LOGS = f"{RESULTS}/logs"
BENCHMARKS = f"{RESULTS}/benchmarks"
FIGURES = f"{RESULTS}/figures"
SUMMARY = f"{RESULTS}/summary.md"

# Each stage's rules file appends the files its aggregate rule (`<stage>_all`) builds.
ALL_TARGETS = []


onstart:
    # Create the MLflow store once, before parallel jobs touch it (concurrent first
    # use of a fresh SQLite store fails in MLflow 3.x). Runs only when jobs run.
    create_store()


onsuccess:
    # Runs only when jobs ran (Snakemake skips hooks when nothing is to be done).
    summarise_invocation()


onerror:
    # A failed invocation gets its run too, FAILED, listing the runs of its jobs
    # (failed jobs have FAILED runs of their own).
    summarise_invocation(failed=True, log=log)

# Shared settings for every rule file: tracking environment and the target list.
import hashlib
import json
import os
import uuid

# One id for every job of this `snakemake` call; jobs inherit it through the
# environment (also on SLURM, whose jobs get the submitting environment), so it
# never enters `params:` and never forces a rerun.
os.environ.setdefault("PARAPLAN_INVOCATION_ID", uuid.uuid4().hex)
os.environ["PARAPLAN_CONFIG_DIGEST"] = hashlib.sha256(
    json.dumps(config, sort_keys=True, default=str).encode()
).hexdigest()[:16]
if config["mlflow"]["tracking_uri"] and not os.environ.get("MLFLOW_TRACKING_URI"):
    os.environ["MLFLOW_TRACKING_URI"] = config["mlflow"]["tracking_uri"]

CLUSTER = config["cluster"]
RESULTS = "results"
LOGS = f"{RESULTS}/logs"
BENCHMARKS = f"{RESULTS}/benchmarks"
FIGURES = f"{RESULTS}/figures"

# Each stage's rules file appends the files its aggregate rule (`<stage>_all`) builds.
ALL_TARGETS = []


onstart:
    # Create the MLflow store once, before parallel jobs touch it (concurrent first
    # use of a fresh SQLite store fails in MLflow 3.x). Runs only when jobs run.
    from paraplan.track import ensure_store

    ensure_store()


onsuccess:
    # Runs only when jobs ran (Snakemake skips hooks when nothing is to be done):
    # one MLflow run that links every run of this invocation.
    from paraplan.core import TrackingError
    from paraplan.track import log_invocation_summary

    try:
        run_id = log_invocation_summary(os.environ["PARAPLAN_INVOCATION_ID"])
    except TrackingError as exc:
        print(f"paraplan: could not log the invocation summary: {exc}")
    else:
        if run_id:
            print(f"paraplan: invocation summary logged as MLflow run {run_id}")

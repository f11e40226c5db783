# paraplan: bench -> fit -> profile -> simulate -> plan, every job tracked in MLflow.
# Thin on purpose: config, its schema, and one rules file per stage. Stage code lives
# in src/paraplan and runs as `paraplan <stage>`; nothing heavy is imported here
# (cluster jobs re-parse this file).
from snakemake.utils import min_version, validate

from paraplan.workflow_env import check_config, check_config_keys, upgrade_config

min_version("9.0")


configfile: "config/config.yaml"


# paraplan 0.1's key names still work (with a warning) until 0.2; a nested
# --config bench='{iters: 50}' arrives as text and is read as numbers here
upgrade_config(config)
# unknown keys ("did you mean ...?"), unusable names, keys given twice and values of
# the wrong type or range: one line each, before Snakemake's schema check would print
# the whole schema around them
check_config_keys(config, workflow.configfiles)
validate(config, "workflow/schemas/config.schema.yaml")
# what the schema cannot see (missing files, min_bytes > max_bytes, more ranks than
# this machine runs): one line naming the key, before any job starts
check_config(config, local=workflow.local_exec and not workflow.remote_exec, configfiles=workflow.configfiles)


include: "workflow/rules/common.smk"
include: "workflow/rules/bench.smk"
include: "workflow/rules/fit.smk"
include: "workflow/rules/kernels.smk"
include: "workflow/rules/profile.smk"
include: "workflow/rules/simulate.smk"
include: "workflow/rules/plan.smk"
include: "workflow/rules/validate.smk"
include: "workflow/rules/predict.smk"
include: "workflow/rules/report.smk"


rule all:
    default_target: True
    input:
        ALL_TARGETS,

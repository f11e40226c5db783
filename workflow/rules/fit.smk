# Fit stage: one `paraplan fit` per cluster over the bench CSVs of
# results/collectives/{cluster}/ (config["bench"]: collectives x world sizes), and
# for every log listed in config["fit"]["logs"] an `ingest` job (the log as a bench
# CSV) followed by its own fit. Fits are pure computation: no measure resource.
import re

FIT = config["fit"]
FIT_LOGS = {entry["name"]: entry for entry in FIT["logs"]}
FIT_LOGS.update(CALIBRATION_COMM_LOGS)  # common.smk: the predict stage's intra-node collectives
FIT_BENCH_COLLECTIVES = [c for c in config["bench"]["collectives"] if c != "all_to_allv"]
FIT_A2AV = "all_to_allv" in config["bench"]["collectives"]
if CLUSTER in FIT_LOGS:
    raise ValueError(
        f"config fit.logs: log name '{CLUSTER}' equals the cluster name; "
        "both would write results/fits/<name>/"
    )
# {log} matches only the listed names; for those, fit_log (not fit) makes the fit.
_FIT_LOG_NAMES = "|".join(re.escape(name) for name in sorted(FIT_LOGS)) or "(?!)"


ruleorder: fit_log > fit


# The bench CSVs the cluster's fit reads (all_to_allv samples included).
FIT_INPUT_COLLECTIVES = [*FIT_BENCH_COLLECTIVES, *(["all_to_allv"] if FIT_A2AV else [])]


# Each fit.logs entry's overrides as `paraplan ingest` options, one list item per
# shell word (the rule quotes each: a path or collective may hold any character).
FIT_INGEST_ARGS = {
    name: [
        "--format", str(entry["format"]),
        *(["--in-place"] if entry.get("in_place") else []),
        *(
            token
            for key in ("world_size", "nodes", "collective")
            if entry.get(key) is not None
            for token in (f"--{key.replace('_', '-')}", str(entry[key]))
        ),
    ]
    for name, entry in FIT_LOGS.items()
}


# Entries that name the cluster their log ran on also fit the per-NIC rail curve of
# its sweeps across nodes (`paraplan fit --cluster`, docs/clusters.md).
FIT_LOG_ARGS = {
    name: (["--cluster", str(entry["cluster"])] if entry.get("cluster") else []) for name, entry in FIT_LOGS.items()
}


_FIT_OUTPUTS = {
    "json": f"{RESULTS}/fits/{{cluster}}/comm_model.json",
    "figures": report(
        directory(f"{FIGURES}/fit/{{cluster}}"),
        patterns=["{name}.png"],
        caption="../report/fit.rst",
        category="fit",
    ),
}
if FIT_A2AV:
    _FIT_OUTPUTS["a2av"] = f"{RESULTS}/fits/{{cluster}}/all_to_allv_errors.csv"


rule fit:
    input:
        fit_bench_csvs,
    output:
        **_FIT_OUTPUTS,
    log:
        f"{LOGS}/fit/{{cluster}}.log",
    benchmark:
        f"{BENCHMARKS}/fit/{{cluster}}.tsv"
    params:
        a2av=lambda wildcards, output: ["--a2av-output", output.a2av] if FIT_A2AV else [],
    # first of the computing jobs: validate and plan_measured wait for it
    priority: 1
    conda:
        "../../environment.yml"
    shell:
        tracked(
            "paraplan fit {input:q} -o {output.json:q} --plots {output.figures:q} {params.a2av:q}",
            "fit", "cluster",
        )


rule ingest:
    input:
        fit_log_file,
    output:
        f"{RESULTS}/collectives/{{log}}/ingested.csv",
    log:
        f"{LOGS}/ingest/{{log}}.log",
    benchmark:
        f"{BENCHMARKS}/ingest/{{log}}.tsv"
    wildcard_constraints:
        log=_FIT_LOG_NAMES,
    params:
        args=lambda wildcards: FIT_INGEST_ARGS[wildcards.log],
    conda:
        "../../environment.yml"
    shell:
        tracked(
            "paraplan ingest {input:q} {params.args:q} -o {output:q}",
            "ingest", "log",
        )


rule fit_log:
    input:
        f"{RESULTS}/collectives/{{log}}/ingested.csv",
    output:
        json=f"{RESULTS}/fits/{{log}}/comm_model.json",
        figures=report(
            directory(f"{FIGURES}/fit/{{log}}"),
            patterns=["{name}.png"],
            caption="../report/fit.rst",
            category="fit",
        ),
    log:
        f"{LOGS}/fit/{{log}}.log",
    benchmark:
        f"{BENCHMARKS}/fit/{{log}}.tsv"
    wildcard_constraints:
        log=_FIT_LOG_NAMES,
    params:
        args=lambda wildcards: FIT_LOG_ARGS[wildcards.log],
    conda:
        "../../environment.yml"
    shell:
        tracked(
            "paraplan fit {input:q} {params.args:q} -o {output.json:q} --plots {output.figures:q}",
            "fit_log", "log",
        )


rule fit_all:
    input:
        f"{RESULTS}/fits/{CLUSTER}/comm_model.json",
        expand(f"{RESULTS}/fits/{{log}}/comm_model.json", log=sorted(FIT_LOGS)),


ALL_TARGETS.extend(rules.fit_all.input)

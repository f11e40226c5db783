# Predict stage: calibrate the device model on measured LLM iteration times (one
# `paraplan calibrate` per entry of predict.calibrations whose data is here, with
# leave-one-model-shape-out cross-validation and its predicted-vs-measured figure),
# then predict each run table of predict.tables (`paraplan predict`). A table's
# calibration is the one made here when there is one, else the shipped
# config/calibrations/<name>.json.


# A measured table in another tool's format becomes a run table (paraplan ingest).
rule predict_ingest:
    input:
        measured_runs_source,
    output:
        f"{RESULTS}/predict/{{name}}/measured_runs.csv",
    log:
        f"{LOGS}/predict_ingest/{{name}}.log",
    params:
        format=lookup(dpath="predict/calibrations/{name}/format", within=config),
    conda:
        "../../environment.yml"
    shell:
        tracked(
            "paraplan ingest {input:q} --format {params.format:q} -o {output:q}",
            "predict_ingest", "name",
        )


rule calibrate:
    input:
        runs=calibration_runs,
        comm=calibration_comm_model,
    output:
        calibration=f"{RESULTS}/calibrations/{{name}}.json",
        predictions=f"{RESULTS}/predict/{{name}}/cross_validated.csv",
        figures=report(
            directory(f"{FIGURES}/calibrate/{{name}}"),
            patterns=["{file}.png"],
            caption="../report/calibrate.rst",
            category="predict",
        ),
    log:
        f"{LOGS}/calibrate/{{name}}.log",
    benchmark:
        f"{BENCHMARKS}/calibrate/{{name}}.tsv"
    params:
        cluster=lookup(dpath="predict/calibrations/{name}/cluster", within=config),
        comm=lambda wildcards, input: ["--comm-model", *input.comm] if input.comm else [],
        cv=lambda wildcards: [] if CALIBRATIONS[wildcards.name].get("cross_validate", True) else ["--no-cross-validation"],
        factors=lambda wildcards: [] if CALIBRATIONS[wildcards.name].get("layer_factors", False) else ["--no-layer-factors"],
        kernels=lambda wildcards: (
            []
            if CALIBRATIONS[wildcards.name].get("kernel_ceilings", "device") == "none"
            else ["--kernel-ceilings", CALIBRATIONS[wildcards.name].get("kernel_ceilings", "device")]
        ),
    # the fit's evaluations on every core (--jobs: worker processes, the same results
    # as one); it runs between measuring jobs, never beside one
    threads: workflow.cores
    conda:
        "../../environment.yml"
    shell:
        tracked(
            "paraplan calibrate {input.runs:q} --cluster {params.cluster:q} {params.comm:q} {params.cv:q} {params.kernels:q}"
            " {params.factors:q}"
            " --jobs {threads} --name {wildcards.name:q} -o {output.calibration:q} --predictions {output.predictions:q}"
            " --plots {output.figures:q}",
            "calibrate", "name",
        )


rule predict:
    input:
        runs=predict_runs,
        calibration=predict_calibration,
    output:
        predicted=f"{RESULTS}/predict/{{table}}/predicted.csv",
        figures=report(
            directory(f"{FIGURES}/predict/{{table}}"),
            patterns=["{file}.png"],
            caption="../report/predict.rst",
            category="predict",
        ),
    log:
        f"{LOGS}/predict/{{table}}.log",
    benchmark:
        f"{BENCHMARKS}/predict/{{table}}.tsv"
    params:
        cluster=lookup(dpath="predict/tables/{table}/cluster", within=config),
    conda:
        "../../environment.yml"
    shell:
        tracked(
            "paraplan predict {input.runs:q} --cluster {params.cluster:q}"
            " --calibration {input.calibration:q} -o {output.predicted:q} --plots {output.figures:q}",
            "predict", "table",
        )


rule predict_all:
    input:
        expand(f"{RESULTS}/calibrations/{{name}}.json", name=sorted(CALIBRATIONS)),
        expand(f"{RESULTS}/predict/{{table}}/predicted.csv", table=sorted(PREDICT["tables"])),


ALL_TARGETS.extend(rules.predict_all.input)

# Validate stage: one job per entry of config["validate"]["models"] (wildcard {model} is
# a profile name), each a single `paraplan validate` call that trains the profiled model
# for real on 2 ranks and compares with the simulator. It measures, so it takes the
# measure=1 resource (never beside bench, profile or another validate job).

import os

VALIDATE = config["validate"]
VALIDATE_MODELS = sorted(VALIDATE["models"])
_UNPROFILED = [name for name in VALIDATE_MODELS if name not in config["profile"]["models"]]
if _UNPROFILED:
    raise ValueError(
        f"config validate.models.{_UNPROFILED[0]}: no such profile; validate.models takes "
        f"names from profile.models ({', '.join(sorted(config['profile']['models']))})"
    )


rule validate:
    input:
        profile=f"{RESULTS}/profiles/{{model}}.csv",
        meta=f"{RESULTS}/profiles/{{model}}.meta.json",
        comm=f"{RESULTS}/fits/{CLUSTER}/comm_model.json",
    output:
        csv=f"{RESULTS}/validation/{{model}}.csv",
        figure=report(
            f"{FIGURES}/validate/{{model}}.png",
            caption="../report/validate.rst",
            category="validate",
        ),
        figure_pdf=f"{FIGURES}/validate/{{model}}.pdf",
    log:
        f"{LOGS}/validate/{{model}}.log",
    benchmark:
        f"{BENCHMARKS}/validate/{{model}}.tsv"
    wildcard_constraints:
        model=NAME_WILDCARD,
    params:
        model=lambda wildcards: config["profile"]["models"][wildcards.model]["model"],
        global_batch_size=lambda wildcards: VALIDATE["models"][wildcards.model]["global_batch_size"],
        num_microbatches=lambda wildcards: VALIDATE["models"][wildcards.model].get("num_microbatches", 4),
        strategies=",".join(VALIDATE["strategies"]),
        steps=VALIDATE["steps"],
        warmup=VALIDATE["warmup"],
        threads=VALIDATE["threads"],
        backend=VALIDATE["backend"],
        timeout_s=VALIDATE["timeout_s"],
        cluster=CLUSTER,
        figures=lambda wildcards, output: os.path.dirname(output.figure),
    # a measuring job has the machine to itself: it takes every core, so no other
    # job runs beside it (measure=1 keeps measuring jobs apart from each other)
    threads: workflow.cores
    resources:
        measure=1,
        gpu=2 if VALIDATE["backend"] == "nccl" else 0,  # one per rank with NCCL
    conda:
        "../../environment.yml"
    shell:
        "paraplan validate --profile {input.profile:q} --comm-model {input.comm:q}"
        " --model {params.model:q} --cluster {params.cluster:q} --strategies {params.strategies:q}"
        " --global-batch-size {params.global_batch_size:q} --num-microbatches {params.num_microbatches:q}"
        " --steps {params.steps:q} --warmup {params.warmup:q} --threads {params.threads:q}"
        " --backend {params.backend:q} --timeout-s {params.timeout_s:q}"
        " -o {output.csv:q} --plots {params.figures:q}"
        " --rule validate --wildcards model={wildcards.model:q} > {log:q} 2>&1"


rule validate_all:
    input:
        expand(f"{RESULTS}/validation/{{model}}.csv", model=VALIDATE_MODELS),


ALL_TARGETS.extend(rules.validate_all.input)

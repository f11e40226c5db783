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
    params:
        model=lookup(dpath="profile/models/{model}/model", within=config),
        global_batch_size=lookup(dpath="validate/models/{model}/global_batch_size", within=config),
        num_microbatches=lookup(dpath="validate/models/{model}/num_microbatches", within=config, default=4),
        strategies=",".join(VALIDATE["strategies"]),
        steps=lookup(dpath="validate/steps", within=config),
        warmup=lookup(dpath="validate/warmup", within=config),
        threads=lookup(dpath="validate/threads", within=config),
        backend=lookup(dpath="validate/backend", within=config),
        timeout_s=lookup(dpath="validate/timeout_s", within=config),
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
        tracked(
            "paraplan validate --profile {input.profile:q} --comm-model {input.comm:q}"
            " --model {params.model:q} --cluster {params.cluster:q} --strategies {params.strategies:q}"
            " --global-batch-size {params.global_batch_size:q} --num-microbatches {params.num_microbatches:q}"
            " --steps {params.steps:q} --warmup {params.warmup:q} --threads {params.threads:q}"
            " --backend {params.backend:q} --timeout-s {params.timeout_s:q}"
            " -o {output.csv:q} --plots {params.figures:q}",
            "validate", "model",
        )


rule validate_all:
    input:
        expand(f"{RESULTS}/validation/{{model}}.csv", model=VALIDATE_MODELS),


ALL_TARGETS.extend(rules.validate_all.input)

# Profile stage: one job per entry of config["profile"]["models"] (wildcard {model} is
# the entry's key), each a single `paraplan profile` call. Measuring jobs take the
# measure=1 resource so they never run beside bench or validate jobs.

import os

from paraplan.profile.specs import profile_cli_args

PROFILE = config["profile"]
PROFILE_MODELS = sorted(PROFILE["models"])


# `paraplan profile` options of each entry (model, settings, profile_batch_sizes,
# analytic), by name, one item per shell word (quoted one by one in the rule); an
# entry is checked here, so a bad setting stops the workflow before any job runs
PROFILE_ARGS = {
    name: profile_cli_args(entry, f"profile.models.{name}") for name, entry in PROFILE["models"].items()
}


rule profile:
    output:
        csv=f"{RESULTS}/profiles/{{model}}.csv",
        meta=f"{RESULTS}/profiles/{{model}}.meta.json",
        figure=report(
            f"{FIGURES}/profile/{{model}}.png",
            caption="../report/profile.rst",
            category="profile",
        ),
        figure_pdf=f"{FIGURES}/profile/{{model}}.pdf",
    log:
        f"{LOGS}/profile/{{model}}.log",
    benchmark:
        f"{BENCHMARKS}/profile/{{model}}.tsv"
    params:
        model_args=lambda wildcards: PROFILE_ARGS[wildcards.model],
        threads=lookup(dpath="profile/threads", within=config),
        repeats=lookup(dpath="profile/repeats", within=config),
        warmup=lookup(dpath="profile/warmup", within=config),
        device=lookup(dpath="profile/device", within=config),
        dtype=lookup(dpath="profile/dtype", within=config),
        figures=lambda wildcards, output: os.path.dirname(output.figure),
    # a measuring job has the machine to itself: it takes every core, so no other
    # job runs beside it (measure=1 keeps measuring jobs apart from each other)
    threads: workflow.cores
    resources:
        measure=1,
        gpu=1 if PROFILE["device"] == "cuda" else 0,
    # measuring jobs that need nothing run first, while nothing else can wait on them;
    # the computing jobs then fill both cores (docs/measurements.md, the default workflow)
    priority: 2
    conda:
        "../../environment.yml"
    shell:
        tracked(
            "paraplan profile {params.model_args:q} --threads {params.threads:q}"
            " --repeats {params.repeats:q} --warmup {params.warmup:q}"
            " --device {params.device:q} --dtype {params.dtype:q}"
            " -o {output.csv:q} --plots {params.figures:q}",
            "profile", "model",
        )


rule profile_all:
    input:
        expand(f"{RESULTS}/profiles/{{model}}.csv", model=PROFILE_MODELS),


ALL_TARGETS.extend(rules.profile_all.input)

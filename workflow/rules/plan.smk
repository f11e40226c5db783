# Plan stage: DAPPLE-style hybrid planning (`paraplan plan`) of the models the profile
# stage measured, on this machine (config["cluster"]) with its fitted comm model, and of
# analytic profiles of the same models on the GPU clusters of config["plan"]["gpu_clusters"]
# with DAPPLE's formulas at each cluster file's link bandwidths. Pure computation (no
# measure resource). The DAPPLE ResNet-50 study is a planning study of its own:
#   paraplan plan --study dapple_resnet50 -o results/plans/dapple_resnet50

import os
import re

from paraplan.profile.specs import profile_cli_args

PLAN = config["plan"]
PLAN_MODELS = sorted(config["profile"]["models"])
PLAN_GPU_CLUSTERS = list(PLAN["gpu_clusters"])
if CLUSTER in PLAN_GPU_CLUSTERS:
    raise ValueError(f"config plan.gpu_clusters: '{CLUSTER}' is the measured cluster; list GPU clusters only")
_PLAN_GPU_RE = "|".join(re.escape(c) for c in PLAN_GPU_CLUSTERS) or "(?!)"


# `paraplan plan` options shared by both planning rules, one item per shell word
PLAN_ARGS = [
    "--model-state-factor", str(PLAN["model_state_factor"]),
    "--candidates", str(PLAN["candidates"]),
    *(["--min-micro-batch-size", str(PLAN["min_micro_batch_size"])] if PLAN["min_micro_batch_size"] else []),
    *(["--max-pipeline-devices", str(PLAN["max_pipeline_devices"])] if PLAN["max_pipeline_devices"] else []),
]


rule plan_measured:
    input:
        profile=f"{RESULTS}/profiles/{{model}}.csv",
        comm=f"{RESULTS}/fits/{{cluster}}/comm_model.json",
    output:
        csv=f"{RESULTS}/plans/{{model}}__{{cluster}}.csv",
        figure=report(
            f"{FIGURES}/plan/{{model}}__{{cluster}}.png",
            caption="../report/plan.rst",
            category="plan",
        ),
        figure_pdf=f"{FIGURES}/plan/{{model}}__{{cluster}}.pdf",
    log:
        f"{LOGS}/plan/{{model}}__{{cluster}}.log",
    benchmark:
        f"{BENCHMARKS}/plan/{{model}}__{{cluster}}.tsv"
    wildcard_constraints:
        model="[A-Za-z0-9_.-]+",
        cluster=re.escape(CLUSTER),
    threads: 2
    params:
        global_batch_sizes=",".join(str(g) for g in PLAN["global_batch_sizes"]),
        args=PLAN_ARGS,
        figures=lambda wildcards, output: os.path.dirname(output.figure),
    conda:
        "../../environment.yml"
    shell:
        "paraplan plan --profile {input.profile:q} --cluster {wildcards.cluster:q}"
        " --comm-model {input.comm:q} --global-batch-sizes {params.global_batch_sizes:q} {params.args:q}"
        " --jobs {threads}"
        " -o {output.csv:q} --plots {params.figures:q}"
        " --rule plan_measured --wildcards model={wildcards.model:q},cluster={wildcards.cluster:q}"
        " > {log:q} 2>&1"


rule plan_analytic_profile:
    output:
        csv=f"{RESULTS}/plans/profiles/{{model}}__{{cluster}}.csv",
        meta=f"{RESULTS}/plans/profiles/{{model}}__{{cluster}}.meta.json",
    log:
        f"{LOGS}/plan/profile_{{model}}__{{cluster}}.log",
    benchmark:
        f"{BENCHMARKS}/plan/profile_{{model}}__{{cluster}}.tsv"
    wildcard_constraints:
        model="[A-Za-z0-9_.-]+",
        cluster=_PLAN_GPU_RE,
    params:
        model_args=lambda wildcards: profile_cli_args(
            dict(config["profile"]["models"][wildcards.model], analytic={"cluster": wildcards.cluster}),
            f"profile.models.{wildcards.model}",
        ),
    conda:
        "../../environment.yml"
    shell:
        "paraplan profile {params.model_args:q} -o {output.csv:q}"
        " --rule plan_analytic_profile --wildcards model={wildcards.model:q},cluster={wildcards.cluster:q}"
        " > {log:q} 2>&1"


rule plan_analytic:
    input:
        profile=f"{RESULTS}/plans/profiles/{{model}}__{{cluster}}.csv",
    output:
        csv=f"{RESULTS}/plans/{{model}}__{{cluster}}.csv",
        figure=report(
            f"{FIGURES}/plan/{{model}}__{{cluster}}.png",
            caption="../report/plan.rst",
            category="plan",
        ),
        figure_pdf=f"{FIGURES}/plan/{{model}}__{{cluster}}.pdf",
    log:
        f"{LOGS}/plan/{{model}}__{{cluster}}.log",
    benchmark:
        f"{BENCHMARKS}/plan/{{model}}__{{cluster}}.tsv"
    wildcard_constraints:
        model="[A-Za-z0-9_.-]+",
        cluster=_PLAN_GPU_RE,
    threads: 2
    params:
        global_batch_sizes=",".join(str(g) for g in PLAN["gpu_global_batch_sizes"]),
        args=PLAN_ARGS,
        figures=lambda wildcards, output: os.path.dirname(output.figure),
    conda:
        "../../environment.yml"
    shell:
        "paraplan plan --profile {input.profile:q} --cluster {wildcards.cluster:q}"
        " --global-batch-sizes {params.global_batch_sizes:q} {params.args:q} --jobs {threads}"
        " -o {output.csv:q} --plots {params.figures:q}"
        " --rule plan_analytic --wildcards model={wildcards.model:q},cluster={wildcards.cluster:q}"
        " > {log:q} 2>&1"


rule plan_all:
    input:
        expand(f"{RESULTS}/plans/{{model}}__{{cluster}}.csv", model=PLAN_MODELS,
               cluster=[CLUSTER, *PLAN_GPU_CLUSTERS]),


ALL_TARGETS.extend(rules.plan_all.input)

# Plan stage: DAPPLE-style hybrid planning (`paraplan plan --profile`) of the models the
# profile stage measured, on this machine (config["cluster"]) with its fitted comm model,
# and transformer plans (`paraplan plan --model`) of the config's plan.llm entries on GPU
# clusters. Pure computation (no measure resource). The DAPPLE ResNet-50 study is a
# planning study of its own:
#   paraplan plan --study dapple_resnet50 -o results/plans/dapple_resnet50

import os
import re

from paraplan.workflow_env import plan_llm_args

PLAN = config["plan"]
PLAN_MODELS = sorted(config["profile"]["models"])
PLAN_LLM = {
    name: {"calibration": PREDICT_DEFAULT_CALIBRATION, **entry} for name, entry in PLAN["llm"].items()
}
# each plan.llm entry as `paraplan plan` options, one item per shell word
PLAN_LLM_ARGS = {name: plan_llm_args(entry) for name, entry in PLAN_LLM.items()}


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
        cluster=re.escape(CLUSTER),
    threads: 2
    params:
        global_batch_sizes=",".join(str(g) for g in PLAN["global_batch_sizes"]),
        args=PLAN_ARGS,
        figures=lambda wildcards, output: os.path.dirname(output.figure),
    conda:
        "../../environment.yml"
    shell:
        tracked(
            "paraplan plan --profile {input.profile:q} --cluster {wildcards.cluster:q}"
            " --comm-model {input.comm:q} --global-batch-sizes {params.global_batch_sizes:q} {params.args:q}"
            " --jobs {threads}"
            " -o {output.csv:q} --plots {params.figures:q}",
            "plan_measured", "model", "cluster",
        )


# A transformer on a GPU cluster (`paraplan plan --model`): the best plans over TP,
# PP, DP, micro-batch, interleaving, schedule, recomputation, SP and ZeRO, with the
# calibration the predict stage uses.
rule plan_llm:
    input:
        calibration=plan_llm_calibration,
    output:
        csv=f"{RESULTS}/plans/llm/{{name}}.csv",
    log:
        f"{LOGS}/plan/llm_{{name}}.log",
    benchmark:
        f"{BENCHMARKS}/plan/llm_{{name}}.tsv"
    params:
        args=lambda wildcards: PLAN_LLM_ARGS[wildcards.name],
    conda:
        "../../environment.yml"
    shell:
        tracked(
            "paraplan plan {params.args:q} --calibration {input.calibration:q} -o {output.csv:q}",
            "plan_llm", "name",
        )


rule plan_all:
    input:
        expand(f"{RESULTS}/plans/{{model}}__{{cluster}}.csv", model=PLAN_MODELS, cluster=[CLUSTER]),
        expand(f"{RESULTS}/plans/llm/{{name}}.csv", name=sorted(PLAN_LLM)),


ALL_TARGETS.extend(rules.plan_all.input)

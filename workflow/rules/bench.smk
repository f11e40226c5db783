# Bench stage: one `paraplan bench` job per collective x world size of config["bench"]
# on the machine named by config["cluster"]. Jobs take measure=1 (never beside another
# measuring job) and every core (never beside any other job).
# all_to_allv, when listed, measures bench.a2a_samples random DLRM-style exchanges
# instead of the size sweep. Config values reach the shell only quoted ({params.x:q};
# a list is quoted item by item).
import os

BENCH = config["bench"]
BENCH_COLLECTIVES = list(BENCH["collectives"])
_BENCH_KNOWN = (
    "all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce",
    "all_to_allv",
)
_BENCH_SWEEP_ARGS = [
    "--min-bytes", str(BENCH["min_bytes"]), "--max-bytes", str(BENCH["max_bytes"]),
    "--factor", str(BENCH["factor"]), "--dtype", str(BENCH["dtype"]),
]
_BENCH_A2AV_ARGS = ["--a2a-samples", str(BENCH["a2a_samples"]), "--seed", str(BENCH["a2a_seed"])]


rule bench:
    output:
        csv=f"{RESULTS}/collectives/{{cluster}}/{{collective}}_n{{world}}.csv",
        figure=report(
            f"{FIGURES}/bench/{{cluster}}/{{collective}}_n{{world}}.png",
            caption="../report/bench.rst",
            category="bench",
        ),
        figure_pdf=f"{FIGURES}/bench/{{cluster}}/{{collective}}_n{{world}}.pdf",
    log:
        f"{LOGS}/bench/{{cluster}}/{{collective}}_n{{world}}.log",
    benchmark:
        f"{BENCHMARKS}/bench/{{cluster}}/{{collective}}_n{{world}}.tsv"
    wildcard_constraints:
        cluster=NAME_WILDCARD,
        collective="|".join(_BENCH_KNOWN),
        world=r"[1-9][0-9]*",
    params:
        backend=BENCH["backend"],
        # the sweep options, or the sample options for all_to_allv: a job reruns only
        # when a setting it uses changes
        points=lambda wildcards: (
            _BENCH_A2AV_ARGS if wildcards.collective == "all_to_allv" else _BENCH_SWEEP_ARGS
        ),
        warmup=BENCH["warmup"],
        iters=BENCH["iters"],
        timeout_s=BENCH["timeout_s"],
        out_dir=lambda wildcards, output: os.path.dirname(output.csv),
        figures=lambda wildcards, output: os.path.dirname(output.figure),
    # a measuring job has the machine to itself: it takes every core, so no other
    # job runs beside it (measure=1 keeps measuring jobs apart from each other)
    threads: workflow.cores
    resources:
        measure=1,
        # one GPU per rank with NCCL, none with gloo (a cluster executor turns this
        # into --gpus; a CPU config never asks for a GPU partition)
        gpu=lambda wildcards: int(wildcards.world) if BENCH["backend"] == "nccl" else 0,
    conda:
        "../../environment.yml"
    shell:
        "paraplan bench --backend {params.backend:q} --world-size {wildcards.world:q}"
        " --collectives {wildcards.collective:q} {params.points:q}"
        " --warmup {params.warmup:q} --iters {params.iters:q} --timeout-s {params.timeout_s:q}"
        " -o {params.out_dir:q} --plots {params.figures:q}"
        " --rule bench --wildcards"
        " cluster={wildcards.cluster:q},collective={wildcards.collective:q},world={wildcards.world:q}"
        " > {log:q} 2>&1"


rule bench_all:
    input:
        expand(
            f"{RESULTS}/collectives/{CLUSTER}/{{collective}}_n{{world}}.csv",
            collective=BENCH_COLLECTIVES,
            world=BENCH["world_sizes"],
        ),


ALL_TARGETS.extend(rules.bench_all.input)

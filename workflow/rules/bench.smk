# Bench stage: one `paraplan bench` job per world size of config["bench"] on the machine
# named by config["cluster"], measuring every listed collective one after another in
# the same ranks (one start-up of torch, the ranks and gloo per world size, not per
# collective; the sizes and repeats are those of a job per collective). Jobs take
# measure=1 (never beside another measuring job) and every core (never beside any
# other job). all_to_allv, when listed, measures bench.a2a_samples random DLRM-style
# exchanges instead of the size sweep. The figures are drawn from the CSVs afterwards by
# a bench_figures job (one core, no measure resource). Config values reach the shell only quoted
# ({params.x:q}; a list is quoted item by item).
import os

BENCH = config["bench"]
BENCH_COLLECTIVES = list(BENCH["collectives"])
_BENCH_SWEEPS = [c for c in BENCH_COLLECTIVES if c != "all_to_allv"]
# the sweep options when a collective is swept, the sample options when all_to_allv
# is listed: a job reruns only when a setting it uses changes
BENCH_POINT_ARGS = [
    *(
        [
            "--min-bytes", str(BENCH["min_bytes"]), "--max-bytes", str(BENCH["max_bytes"]),
            "--factor", str(BENCH["factor"]), "--dtype", str(BENCH["dtype"]),
        ]
        if _BENCH_SWEEPS
        else []
    ),
    *(
        ["--a2a-samples", str(BENCH["a2a_samples"]), "--seed", str(BENCH["a2a_seed"])]
        if "all_to_allv" in BENCH_COLLECTIVES
        else []
    ),
]


rule bench:
    output:
        csv=[f"{RESULTS}/collectives/{{cluster}}/{c}_n{{world}}.csv" for c in BENCH_COLLECTIVES],
    log:
        f"{LOGS}/bench/{{cluster}}/n{{world}}.log",
    benchmark:
        f"{BENCHMARKS}/bench/{{cluster}}/n{{world}}.tsv"
    params:
        backend=lookup(dpath="bench/backend", within=config),
        collectives=",".join(BENCH_COLLECTIVES),
        points=BENCH_POINT_ARGS,
        warmup=lookup(dpath="bench/warmup", within=config),
        iters=lookup(dpath="bench/iters", within=config),
        timeout_s=lookup(dpath="bench/timeout_s", within=config),
        out_dir=lambda wildcards, output: os.path.dirname(output.csv[0]),
    # a measuring job has the machine to itself: it takes every core, so no other
    # job runs beside it (measure=1 keeps measuring jobs apart from each other)
    threads: workflow.cores
    resources:
        measure=1,
        # one GPU per rank with NCCL, none with gloo (a cluster executor turns this
        # into --gpus; a CPU config never asks for a GPU partition)
        gpu=lambda wildcards: int(wildcards.world) if BENCH["backend"] == "nccl" else 0,
    # measuring jobs that need nothing run first, while nothing else can wait on them;
    # the computing jobs then fill both cores (docs/measurements.md, the default workflow)
    priority: 2
    conda:
        "../../environment.yml"
    shell:
        tracked(
            "paraplan bench --backend {params.backend:q} --world-size {wildcards.world:q}"
            " --collectives {params.collectives:q} {params.points:q}"
            " --warmup {params.warmup:q} --iters {params.iters:q} --timeout-s {params.timeout_s:q}"
            " -o {params.out_dir:q} --no-plots",
            "bench", "cluster", "world",
        )


# The bench figures, drawn from the CSVs in a job of their own: one core and no
# `measure` resource, so the measuring job (both cores, alone on the machine) spends
# no time on them and they are drawn beside other computing jobs.
rule bench_figures:
    input:
        csv=[f"{RESULTS}/collectives/{{cluster}}/{c}_n{{world}}.csv" for c in BENCH_COLLECTIVES],
    output:
        figure=[
            report(
                f"{FIGURES}/bench/{{cluster}}/{c}_n{{world}}.png",
                caption="../report/bench.rst",
                category="bench",
            )
            for c in BENCH_COLLECTIVES
        ],
        figure_pdf=[f"{FIGURES}/bench/{{cluster}}/{c}_n{{world}}.pdf" for c in BENCH_COLLECTIVES],
    log:
        f"{LOGS}/bench_figures/{{cluster}}/n{{world}}.log",
    benchmark:
        f"{BENCHMARKS}/bench_figures/{{cluster}}/n{{world}}.tsv"
    params:
        figures=lambda wildcards, output: os.path.dirname(output.figure[0]),
    conda:
        "../../environment.yml"
    shell:
        tracked(
            "paraplan bench-figures {input.csv:q} --plots {params.figures:q}",
            "bench_figures", "cluster", "world",
        )


rule bench_all:
    input:
        expand(
            f"{RESULTS}/collectives/{CLUSTER}/{{collective}}_n{{world}}.csv",
            collective=BENCH_COLLECTIVES,
            world=BENCH["world_sizes"],
        ),
        expand(
            f"{FIGURES}/bench/{CLUSTER}/{{collective}}_n{{world}}.png",
            collective=BENCH_COLLECTIVES,
            world=BENCH["world_sizes"],
        ),


ALL_TARGETS.extend(rules.bench_all.input)

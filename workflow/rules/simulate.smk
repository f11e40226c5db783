# Simulate stage: one job per named experiment (config/experiments/{experiment}.yaml),
# each a single `paraplan simulate` call. Results under results/simulations/{experiment}/,
# figures under results/figures/simulate/{experiment}/ (Gantt experiments also write
# Chrome traces to results/simulations/{experiment}/traces/).

SIMULATE = config["simulate"]


rule simulate:
    input:
        experiment="config/experiments/{experiment}.yaml",
    output:
        results=f"{RESULTS}/simulations/{{experiment}}/results.csv",
        timing=f"{RESULTS}/simulations/{{experiment}}/timing.json",
        figures=report(
            directory(f"{FIGURES}/simulate/{{experiment}}"),
            patterns=["{name}.png"],
            caption="../report/simulate.rst",
            category="simulate",
            subcategory="{experiment}",
        ),
    log:
        f"{LOGS}/simulate/{{experiment}}.log",
    benchmark:
        f"{BENCHMARKS}/simulate/{{experiment}}.tsv"
    wildcard_constraints:
        experiment="[A-Za-z0-9_.-]+",
    params:
        outdir=lambda wildcards, output: os.path.dirname(output.results),
        repeats=SIMULATE["repeats"],
    conda:
        "../../environment.yml"
    shell:
        "paraplan simulate --experiment {input.experiment:q} -o {params.outdir:q}"
        " --plots {output.figures:q} --repeats {params.repeats:q}"
        " --rule simulate --wildcards experiment={wildcards.experiment:q} > {log:q} 2>&1"


rule simulate_all:
    input:
        expand(f"{RESULTS}/simulations/{{experiment}}/results.csv", experiment=SIMULATE["experiments"]),


ALL_TARGETS.extend(rules.simulate_all.input)

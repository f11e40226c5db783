# Simulate stage: one job per named study (config/studies/simulate/{study}.yaml), each a
# single `paraplan simulate` call. Results under results/simulations/{study}/, figures
# under results/figures/simulate/{study}/ (Gantt studies also write Chrome traces to
# results/simulations/{study}/traces/).

SIMULATE = config["simulate"]


rule simulate:
    input:
        study=simulate_study_file,
    output:
        results=f"{RESULTS}/simulations/{{study}}/results.csv",
        timing=f"{RESULTS}/simulations/{{study}}/timing.json",
        figures=report(
            directory(f"{FIGURES}/simulate/{{study}}"),
            patterns=["{name}.png"],
            caption="../report/simulate.rst",
            category="simulate",
            subcategory="{study}",
        ),
    log:
        f"{LOGS}/simulate/{{study}}.log",
    benchmark:
        f"{BENCHMARKS}/simulate/{{study}}.tsv"
    params:
        outdir=lambda wildcards, output: os.path.dirname(output.results),
        repeats=lookup(dpath="simulate/repeats", within=config),
    conda:
        "../../environment.yml"
    shell:
        tracked(
            "paraplan simulate --study {input.study:q} -o {params.outdir:q}"
            " --plots {output.figures:q} --repeats {params.repeats:q}",
            "simulate", "study",
        )


rule simulate_all:
    input:
        expand(f"{RESULTS}/simulations/{{study}}/results.csv", study=SIMULATE["studies"]),


ALL_TARGETS.extend(rules.simulate_all.input)

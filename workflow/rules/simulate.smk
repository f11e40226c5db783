# Simulate stage: one job per named study (config/studies/simulate/{study}.yaml), each a
# single `paraplan simulate` call. Results under results/simulations/{study}/, figures
# under results/figures/simulate/{study}/ (Gantt studies also write Chrome traces to
# results/simulations/{study}/traces/).

from paraplan.config_files import find_study

SIMULATE = config["simulate"]


rule simulate:
    input:
        # config/studies/simulate/{study}.yaml (0.1's config/experiments/ too, with a warning)
        study=lambda wildcards: str(find_study("simulate", wildcards.study)),
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
    wildcard_constraints:
        study=NAME_WILDCARD,
    params:
        outdir=lambda wildcards, output: os.path.dirname(output.results),
        repeats=SIMULATE["repeats"],
    conda:
        "../../environment.yml"
    shell:
        "paraplan simulate --study {input.study:q} -o {params.outdir:q}"
        " --plots {output.figures:q} --repeats {params.repeats:q}"
        " --rule simulate --wildcards study={wildcards.study:q} > {log:q} 2>&1"


rule simulate_all:
    input:
        expand(f"{RESULTS}/simulations/{{study}}/results.csv", study=SIMULATE["studies"]),


ALL_TARGETS.extend(rules.simulate_all.input)

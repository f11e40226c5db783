# Report stage: results/summary.md with the headline numbers of every stage (and
# `snakemake --report results/report.html` for the figures with their captions).


rule report:
    input:
        # every stage's targets; a function, so it sees rules files included later
        lambda wildcards: [target for target in ALL_TARGETS if target != SUMMARY],
    output:
        summary=report(SUMMARY, caption="../report/summary.rst", category="summary"),
    log:
        f"{LOGS}/report/summary.log",
    benchmark:
        f"{BENCHMARKS}/report/summary.tsv"
    conda:
        "../../environment.yml"
    shell:
        "paraplan report {input:q} -o {output.summary:q} --rule report > {log:q} 2>&1"


ALL_TARGETS.append(rules.report.output.summary)

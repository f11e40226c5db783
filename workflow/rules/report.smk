# Report stage: results/summary.md with the headline numbers of every stage (and
# `snakemake --report results/report.html` for the figures with their captions).


rule report:
    input:
        summary_inputs,
    output:
        summary=report(SUMMARY, caption="../report/summary.rst", category="summary"),
    log:
        f"{LOGS}/report/summary.log",
    benchmark:
        f"{BENCHMARKS}/report/summary.tsv"
    conda:
        "../../environment.yml"
    shell:
        tracked(
            "paraplan report {input:q} -o {output.summary:q}",
            "report",
        )


ALL_TARGETS.append(rules.report.output.summary)

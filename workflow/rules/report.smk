# Report stage: results/summary.md with the headline numbers of every stage (and
# `snakemake --report results/report.html` for the figures with their captions).


SUMMARY = f"{RESULTS}/summary.md"


def report_inputs(wildcards):
    """Every stage's targets; a function, so rules files included after this one count too."""
    return [target for target in ALL_TARGETS if target != SUMMARY]


rule report:
    input:
        report_inputs,
    output:
        summary=report(SUMMARY, caption="../report/summary.rst", category="summary"),
    log:
        f"{LOGS}/report/summary.log",
    benchmark:
        f"{BENCHMARKS}/report/summary.tsv"
    shell:
        "paraplan report {input} -o {output.summary} --rule report > {log} 2>&1"


ALL_TARGETS.append(rules.report.output.summary)

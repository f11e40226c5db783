# Kernels stage: the device model's compute ceilings from kernel micro-benchmarks.
# kernels_bench times torch.matmul over config["kernels"]["bench"]'s grid on this
# machine (measure=1, every core: never beside another job); kernels_fit fits the
# GEMM curve to it with its held-out error; kernels_published fits the published
# GEMM/attention tables of each config["kernels"]["published"] device, the recipe of
# config/kernels/<device>.json. Config values reach the shell only quoted.
import re
import shlex

from paraplan.clusters import load_cluster

KERNELS = config["kernels"]
KERNELS_BENCH = KERNELS["bench"]
# a device whose tables are not here (a copy of the workflow without data/) is skipped:
# config/kernels/<device>.json still ships its fit
KERNELS_PUBLISHED = {
    device: entry
    for device, entry in KERNELS["published"].items()
    if all(os.path.isfile(path) for path in entry["inputs"])
}
for _device in sorted(set(KERNELS["published"]) - set(KERNELS_PUBLISHED)):
    print(
        f"paraplan: kernel fit of '{_device}' skipped: an input of kernels.published is not here; "
        f"predictions use config/kernels/{_device}.json",
        file=sys.stderr,
    )
# the grid as comma lists, one shell word each
KERNELS_GRID = {key: ",".join(str(v) for v in KERNELS_BENCH[key]) for key in ("m", "n", "k", "gemm_batch")}


rule kernels_bench:
    output:
        csv=f"{RESULTS}/kernels/{{cluster}}/gemm.csv",
    log:
        f"{LOGS}/kernels/{{cluster}}_bench.log",
    benchmark:
        f"{BENCHMARKS}/kernels/{{cluster}}_bench.tsv"
    params:
        device=lookup(dpath="kernels/bench/device", within=config),
        # the cluster file's device name: what kernels_fit looks the rows up by
        device_name=lambda wildcards: load_cluster(wildcards.cluster).device.name,
        dtype=lookup(dpath="kernels/bench/dtype", within=config),
        m=KERNELS_GRID["m"],
        n=KERNELS_GRID["n"],
        k=KERNELS_GRID["k"],
        gemm_batch=KERNELS_GRID["gemm_batch"],
        warmup=lookup(dpath="kernels/bench/warmup", within=config),
        iters=lookup(dpath="kernels/bench/iters", within=config),
        out_dir=lambda wildcards, output: os.path.dirname(output.csv),
    threads: workflow.cores
    resources:
        measure=1,
        gpu=1 if KERNELS_BENCH["device"] == "cuda" else 0,
    # measuring jobs that need nothing run first, while nothing else can wait on them;
    # the computing jobs then fill both cores (docs/measurements.md, the default workflow)
    priority: 2
    conda:
        "../../environment.yml"
    shell:
        tracked(
            "paraplan bench --kind gemm --device {params.device:q} --device-name {params.device_name:q}"
            " --dtype {params.dtype:q} --m {params.m:q} --n {params.n:q} --k {params.k:q}"
            " --gemm-batch {params.gemm_batch:q}"
            " --warmup {params.warmup:q} --iters {params.iters:q} -o {params.out_dir:q}",
            "kernels_bench", "cluster",
        )


rule kernels_fit:
    input:
        f"{RESULTS}/kernels/{{cluster}}/gemm.csv",
    output:
        f"{RESULTS}/kernels/{{cluster}}/fit.json",
    log:
        f"{LOGS}/kernels/{{cluster}}_fit.log",
    benchmark:
        f"{BENCHMARKS}/kernels/{{cluster}}_fit.tsv"
    params:
        dtype=lookup(dpath="kernels/bench/dtype", within=config),
        min_flops=lookup(dpath="kernels/bench/min_gemm_flops", within=config),
    conda:
        "../../environment.yml"
    shell:
        tracked(
            "paraplan fit --kind kernels {input:q} --cluster {wildcards.cluster:q} --gemm-dtype {params.dtype:q}"
            " --min-gemm-flops {params.min_flops:q} -o {output:q}",
            "kernels_fit", "cluster",
        )


rule kernels_published:
    input:
        published_kernel_tables,
    output:
        f"{RESULTS}/kernels/{{device}}.json",
    log:
        f"{LOGS}/kernels/{{device}}_published.log",
    benchmark:
        f"{BENCHMARKS}/kernels/{{device}}_published.tsv"
    wildcard_constraints:
        device="|".join(re.escape(d) for d in sorted(KERNELS_PUBLISHED)) or "(?!)",
    params:
        cluster=lookup(dpath="kernels/published/{device}/cluster", within=config),
        attention_kernel=lambda wildcards: KERNELS["published"][wildcards.device].get(
            "attention_kernel", "flash-attention-2"
        ),
        attention_head_dim=lambda wildcards: str(KERNELS["published"][wildcards.device].get(
            "attention_head_dim", "128"
        )),
        min_flops=lambda wildcards: (
            f"--min-gemm-flops {shlex.quote(str(KERNELS['published'][wildcards.device]['min_gemm_flops']))}"
            if KERNELS["published"][wildcards.device].get("min_gemm_flops") is not None
            else ""
        ),
        gemm_latency=lambda wildcards: (
            f"--gemm-latency-s {shlex.quote(str(KERNELS['published'][wildcards.device]['gemm_latency_s']))}"
            if KERNELS["published"][wildcards.device].get("gemm_latency_s") is not None
            else ""
        ),
        # sustained-GEMM rows of another device of the same die and power limit (or none)
        sustained_from=lambda wildcards: (
            f"--sustained-from {shlex.quote(KERNELS['published'][wildcards.device]['sustained_from'])}"
            if KERNELS["published"][wildcards.device].get("sustained_from")
            else ""
        ),
    conda:
        "../../environment.yml"
    shell:
        tracked(
            "paraplan fit --kind kernels {input:q} --cluster {params.cluster:q} --device {wildcards.device:q}"
            " --attention-kernel {params.attention_kernel:q} --attention-head-dim {params.attention_head_dim:q}"
            " {params.sustained_from} {params.min_flops} {params.gemm_latency} -o {output:q}",
            "kernels_published", "device",
        )


rule kernels_all:
    input:
        f"{RESULTS}/kernels/{CLUSTER}/fit.json",
        expand(f"{RESULTS}/kernels/{{device}}.json", device=sorted(KERNELS_PUBLISHED)),


ALL_TARGETS.extend(rules.kernels_all.input)

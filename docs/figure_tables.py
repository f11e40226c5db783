"""The tables of figures the documentation shows, written from what the commands print now.

Each is a committed Markdown file that pages include (`<!-- include: PATH -->`, see
docs/gen_pages.py), so a change that moves a prediction moves the docs with it:

- `benchmarks/results/plans.md`: the best plan `paraplan plan --model` finds for the models
  of benchmarks/bench_plan_llm.py, from the summary line the command prints (less the search
  time, which varies from run to run: bench_plan_llm.py measures it);
- `benchmarks/results/dapple-plans.md`: `paraplan plan --profile` (the DAPPLE planner) on the
  PipeDream profiles of data/pipedream-profiles/ at global batch 128 on 2 x 8 V100;
- `benchmarks/results/calibrations.md`: the errors each shipped calibration records
  (config/calibrations/*.json, as `paraplan calibrate` wrote them);
- `benchmarks/results/published-summary.md`: written by `benchmarks/bench_published.py
  --markdown` (its own format), run here so that one command rewrites every table.

`python docs/gen_pages.py` rewrites them all, `python docs/gen_pages.py --check` exits 1
naming each one that is stale; tests/unit/test_docs.py checks the same.
"""

from __future__ import annotations

import contextlib
import io
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS = REPO_ROOT / "benchmarks" / "results"
NOTE = "<!-- Written by `python docs/gen_pages.py` ({source}); do not edit. -->"

PLAN_COMMANDS: tuple[tuple[str, str], ...] = (
    ("GPT-3 175B, 1,024 A100, global batch 1,536",
     "--model gpt3-175b --cluster dgx-a100 --gpus 1024 --global-batch-size 1536"),
    ("Llama 3 70B, 1,024 H100, global batch 1,024",
     "--model llama3-70b --cluster dgx-h100 --gpus 1024 --global-batch-size 1024"),
    ("Llama 3 405B, 16,384 H100, global batch 2,048",
     "--model llama3-405b --cluster dgx-h100 --gpus 16384 --global-batch-size 2048"),
    ("Mixtral 8x7B, 64 H100, global batch 256 x 4,096",
     "--model mixtral-8x7b --seq-length 4096 --cluster dgx-h100 --gpus 64 --global-batch-size 256"),
    ("Qwen3-235B-A22B, 256 H100, global batch 512 x 4,096",
     "--model qwen3-235b-a22b --seq-length 4096 --cluster dgx-h100 --gpus 256 --global-batch-size 512"),
    ("DeepSeek-V3, 2,048 H100, global batch 4,096 x 4,096",
     "--model deepseek-v3 --seq-length 4096 --cluster dgx-h100 --gpus 2048 --global-batch-size 4096"),
)
"""The runs of benchmarks/bench_plan_llm.py (its CASES), as `paraplan plan` arguments."""

_BEST = re.compile(r"paraplan plan: best: (?P<plan>.+): (?P<s>\S+) s per iteration, (?P<tflops>\d+) TFLOP/s per "
                   r"GPU, MFU (?P<mfu>[^,]+), (?P<gb>[\d.]+) GB per GPU \((?P<candidates>\d+) candidates, "
                   r"(?P<retimed>\d+) re-timed, [\d.]+ s\)$", flags=re.M)
_SPEEDUP = re.compile(r"^paraplan plan: (?:speedup over the fastest data-parallel baseline \((?P<name>\S+), "
                      r"(?P<s>\S+) s\): (?P<x>\S+)|(?P<none>no data-parallel baseline fits memory).*)$", flags=re.M)


def plan_summary(arguments: str) -> dict[str, str]:
    """What `paraplan plan ARGUMENTS` prints of its best plan, parsed from its summary line."""
    from paraplan.cli.main import main

    with tempfile.TemporaryDirectory() as tmp, contextlib.redirect_stderr(io.StringIO()) as err:
        code = main(["plan", *arguments.split(), "--no-track", "-o", str(Path(tmp) / "plan.csv")])
    text = err.getvalue()
    if code != 0:
        raise RuntimeError(f"`paraplan plan {arguments}` ended with status {code}:\n{text}")
    return parse_plan_summary(text)


def parse_plan_summary(text: str) -> dict[str, str]:
    """The best plan's figures from what `paraplan plan` printed to stderr."""
    best, speedup = _BEST.search(text), _SPEEDUP.search(text)
    if best is None or speedup is None:
        raise RuntimeError("`paraplan plan` printed no summary line this generator reads (docs/figure_tables.py, "
                           f"_BEST and _SPEEDUP):\n{text}")
    baseline = "none fits memory" if speedup["none"] else f"{speedup['x']} ({speedup['name']}, {speedup['s']} s)"
    return {**best.groupdict(), "baseline": baseline}


def plans_table() -> str:
    lines = [NOTE.format(source="`paraplan plan --no-track -o plan.csv` and the arguments of each row"), "",
             "| run | `paraplan plan` | best plan | per iteration | TFLOP/s per GPU | MFU | memory per GPU "
             "| candidates (re-timed) | speedup over the fastest data-parallel baseline |",
             "|---|---|---|---|---|---|---|---|---|"]
    for run, arguments in PLAN_COMMANDS:
        p = plan_summary(arguments)
        lines.append(f"| {run} | `{arguments}` | {p['plan']} | {p['s']} s | {p['tflops']} | {p['mfu']} | "
                     f"{p['gb']} GB | {int(p['candidates']):,} ({p['retimed']}) | {p['baseline']} |")
    return "\n".join(lines) + "\n"


DAPPLE_PROFILES = ("amoeba-18", "bert-24", "gnmt-16", "gnmt-32", "resnet50", "vgg-19", "xlnet-36")
"""The PipeDream profiles of data/pipedream-profiles/ (one file each, `<name>-pbs-<batch>.txt`)."""


def dapple_table() -> str:
    """`paraplan plan --profile` at global batch 128 on 2 x 8 V100 for each profile."""
    import csv

    from paraplan.cli.main import main

    lines = [NOTE.format(source="`paraplan plan --profile data/pipedream-profiles/<name>-pbs-*.txt --cluster "
                                "dgx1-v100 --shapes 2x8 --global-batch-sizes 128 --no-track`"), "",
             "| profile | best plan | best | DP | DP + overlap | DP + P3 |", "|---|---|---|---|---|---|"]
    for name in DAPPLE_PROFILES:
        (profile,) = sorted((REPO_ROOT / "data" / "pipedream-profiles").glob(f"{name}-pbs-*.txt"))
        with tempfile.TemporaryDirectory() as tmp, contextlib.redirect_stderr(io.StringIO()) as err:
            out = Path(tmp) / "plan.csv"
            code = main(["plan", "--profile", str(profile), "--cluster", "dgx1-v100", "--shapes", "2x8",
                         "--global-batch-sizes", "128", "--no-track", "-o", str(out)])
            if code != 0:
                raise RuntimeError(f"`paraplan plan --profile {profile}` ended with status {code}:\n{err.getvalue()}")
            with out.open() as handle:
                (row,) = csv.DictReader(handle)
        stages = row["stages"].replace("|", "\\|")
        lines.append(f"| {name} | `{stages}` | " + " | ".join(
            f"{float(row[k]):.2f}" for k in ("best_hybrid", "dp_no_overlap", "dp_overlap", "dp_p3")) + " |")
    return "\n".join(lines) + "\n"


def _percent(value: float) -> str:
    return f"{value:.2%}"


def calibrations_table() -> str:
    from paraplan.predict.calibration import load_calibration

    lines = [NOTE.format(source="the `errors` of config/calibrations/*.json"), "",
             "| calibration | device | fitted on | in-sample MAPE | cross-validated MAPE (median, max) "
             "| measured-fastest in predicted top 3 | predicted-fastest within 5% |",
             "|---|---|---|---|---|---|---|"]
    schemes: set[str] = set()
    questions = 0
    for path in sorted((REPO_ROOT / "config" / "calibrations").glob("*.json")):
        calibration = load_calibration(path)
        errors = dict(calibration.errors)
        if "source_errors" in errors:  # a transferred calibration: no run of its own device was fitted
            source = calibration.data["source_data"]
            fitted_on = (f"no run of its device: transferred from `{calibration.data['transferred_from']}` "
                         f"({source['measurements']:,} runs of {calibration.data['source_device']}), whose "
                         "errors these are")
            errors = errors["source_errors"]
        else:
            fitted_on = f"{calibration.data['measurements']:,} runs of {calibration.device}"
        ins, cv, rank = errors["in_sample"], errors["cross_validated"], errors["ranking"]
        questions = rank["questions"]
        top = round(rank["measured_fastest_in_top_k"] * questions)
        within = round(rank["predicted_fastest_within_5pct"] * questions)
        schemes.add(f"{cv['scheme']} ({cv['groups']} groups)")
        lines.append(
            f"| `{calibration.label}` | {calibration.device} | {fitted_on} | {_percent(ins['mape'])} | "
            f"{_percent(cv['mape'])} ({_percent(cv['median_ape'])}, {cv['max_ape']:.0%}) | "
            f"{top}/{questions} ({top / questions:.0%}) | {within}/{questions} ({within / questions:.0%}) |")
    lines += ["", f"Cross-validated: {'; '.join(sorted(schemes))}; top 3 and within 5%: of the {questions} "
              "questions (model shape, GPU count, global batch) with two or more measured configurations."]
    return "\n".join(lines) + "\n"


def published_summary() -> str:
    """bench_published.py's summary table, as its `--markdown` writes it (its test's options)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "summary.md"
        subprocess.run([sys.executable, str(REPO_ROOT / "benchmarks" / "bench_published.py"), "--no-plan",
                        "--no-layers", "--markdown", str(out)], check=True, capture_output=True, cwd=REPO_ROOT)
        return out.read_text()


TABLES: dict[Path, Callable[[], str]] = {
    RESULTS / "plans.md": plans_table,
    RESULTS / "dapple-plans.md": dapple_table,
    RESULTS / "calibrations.md": calibrations_table,
    RESULTS / "published-summary.md": published_summary,
}
"""Each committed table of figures and the function that writes it."""

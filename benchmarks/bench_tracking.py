"""What MLflow tracking costs (a script, not a test; docs/tracking.md).

Each command runs as a user types it, in a subprocess (start-up included): untracked
(`--no-track`), tracked into a fresh SQLite store, and tracked again into that store
(what every workflow job after the first sees), interleaved, `--repeats` times each;
printed: the median wall time of the command, the median CPU time of the command's own
process (user + system), its peak RSS, and then, untimed in the command's figure, how
long `paraplan track` waits until the run is in the store (the background logging
that the command started and did not wait for: its cost falls on the machine, not on
the command). Target (issue 21): tracked `plan` within 0.5 s of untracked.

    paraplan plan --model gpt3-13b --cluster dgx-a100 --gpus 64 --global-batch-size 512
    paraplan plan --study dapple_resnet50
    paraplan simulate --study distir_fig4

Then, unless --no-snakemake, the default workflow (`snakemake -c2`: on the 2-core
machine what plain `snakemake` does, whose default profile says `cores: all`) in a
temporary clone of this checkout's HEAD, tracked, timed once (target < 4 minutes on 2
cores), with the machine's load average sampled every 10 s while it runs (other
processes' load makes it slower: the figure is only comparable at a low load), and
where the time went: each job's wall time (Snakemake's `benchmark:` files) summed per
rule.

    PYTHONPATH=src python benchmarks/bench_tracking.py [--repeats 3] [--no-snakemake | --no-commands]

Timings on a machine other jobs share are noisy: compare figures from one run.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

COMMANDS = {
    "plan --model (gpt3-13b, 64 x A100)": ["plan", "--model", "gpt3-13b", "--cluster", "dgx-a100", "--gpus", "64",
                                           "--global-batch-size", "512", "--calibration",
                                           str(REPO / "config/calibrations/a100-vtrain.json"), "-o", "{out}.csv"],
    "plan --study dapple_resnet50": ["plan", "--study", "dapple_resnet50", "--profile",
                                     str(REPO / "data/pipedream-profiles/resnet50-pbs-32.txt"), "-o", "{out}"],
    "simulate --study distir_fig4": ["simulate", "--study", "distir_fig4", "-o", "{out}"],
}


def _env(uri: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PARAPLAN_TRACKING", "PARAPLAN_INVOCATION_ID")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "src"), os.environ.get("PYTHONPATH")]))
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    if uri is not None:
        env["MLFLOW_TRACKING_URI"] = uri
    return env


def timed(args: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, float, float]:
    """Wall seconds, CPU seconds (user + system, all its processes) and the peak RSS
    (MB) of the largest process of one command."""
    start = time.perf_counter()
    proc = subprocess.Popen(args, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    took = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise SystemExit(f"{' '.join(args)} failed ({proc.returncode}):\n{err.decode()[-2000:]}")
    return took, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def commands(repeats: int) -> dict[str, float]:
    """Per command, untracked / tracked (fresh store) / tracked again; returns the
    tracked-minus-untracked medians (fresh store)."""
    print(f"{'command':<38} {'untracked':>10} {'tracked':>10} {'again':>10} {'delta':>8}   CPU s (untracked / "
          "tracked / again)   peak RSS MB (untracked / tracked)   logged after (fresh / again)")
    deltas = {}
    for label, template in COMMANDS.items():
        times: dict[str, list[float]] = {"untracked": [], "tracked": [], "again": []}
        cpu: dict[str, list[float]] = {"untracked": [], "tracked": [], "again": []}
        after: dict[str, list[float]] = {"tracked": [], "again": []}
        rss: dict[str, float] = {}
        for _ in range(repeats):
            with tempfile.TemporaryDirectory(prefix="bench_tracking_") as tmp:
                work = Path(tmp)
                uri = f"sqlite:///{work / 'mlflow.db'}"
                for kind, env, out, extra in (("untracked", _env(None), "u", ["--no-track"]),
                                              ("tracked", _env(uri), "t", []), ("again", _env(uri), "a", [])):
                    args = [sys.executable, "-m", "paraplan",
                            *(a.replace("{out}", str(work / out)) for a in template), *extra]
                    took, cpu_s, peak = timed(args, work, env)
                    times[kind].append(took)
                    cpu[kind].append(cpu_s)
                    rss[kind] = max(rss.get(kind, 0.0), peak)
                    if kind in after:  # the run in the store; the next command starts on a quiet machine
                        after[kind].append(timed([sys.executable, "-m", "paraplan", "track"], work, env)[0])
        med = {k: statistics.median(v) for k, v in times.items()}
        med_cpu = {k: statistics.median(v) for k, v in cpu.items()}
        med_after = {k: statistics.median(v) for k, v in after.items()}
        deltas[label] = med["tracked"] - med["untracked"]
        print(f"{label:<38} {med['untracked']:>9.2f}s {med['tracked']:>9.2f}s {med['again']:>9.2f}s "
              f"{deltas[label]:>+7.2f}s   {med_cpu['untracked']:.2f} / {med_cpu['tracked']:.2f} / "
              f"{med_cpu['again']:.2f}   {rss['untracked']:.0f} / {rss['tracked']:.0f}   "
              f"{med_after['tracked']:.2f}s / {med_after['again']:.2f}s")
    return deltas


def workflow(cores: int) -> None:
    """The default workflow in a temporary clone of HEAD, tracked, timed once."""
    exe = shutil.which("snakemake", path=_env(None)["PATH"])
    if exe is None:
        print("snakemake: not installed; skipped")
        return
    with tempfile.TemporaryDirectory(prefix="bench_tracking_wf_") as tmp:
        clone = Path(tmp) / "paraplan"
        subprocess.run(["git", "clone", "--quiet", str(REPO), str(clone)], check=True)
        env = _env(None)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(clone / "src"), os.environ.get("PYTHONPATH")]))
        env.pop("MLFLOW_TRACKING_URI", None)
        loads: list[float] = []
        running = threading.Event()
        running.set()

        def sample() -> None:
            while running.is_set():
                loads.append(os.getloadavg()[0])
                time.sleep(10)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        start = time.perf_counter()
        done = subprocess.run([exe, "-c", str(cores)], cwd=clone, env=env, capture_output=True, text=True)
        took = time.perf_counter() - start
        running.clear()
        if done.returncode:
            print(done.stderr[-3000:])
            raise SystemExit(f"snakemake -c{cores} failed ({done.returncode})")
        jobs = sum(1 for line in done.stderr.splitlines() if line.startswith("Finished job") or
                   line.strip().startswith("Finished jobid"))
        print(f"default workflow, snakemake -c{cores}, tracked, fresh clone of HEAD: {took:.0f} s "
              f"({took / 60:.1f} min; {jobs} jobs; target < 4 min on 2 cores); load average while it ran: "
              f"mean {statistics.mean(loads):.1f}, max {max(loads):.1f} (its own jobs included)")
        logging = [line for line in done.stderr.splitlines()
                   if line.startswith("paraplan: ") and ("logged" in line or "took" in line)]
        print("  logging at the end: " + (" | ".join(logging) if logging else "no line"))
        # where it went: each job's wall time (Snakemake's benchmark: files), per job and summed per stage
        # and the CPU seconds of its processes (steadier than wall times on a busy machine):
        # the measuring jobs run alone, one after another; the others share the cores
        per_stage: dict[str, list[float]] = {}
        cpu = {"measuring": 0.0, "computing": 0.0}
        for tsv in sorted((clone / "results" / "benchmarks").rglob("*.tsv")):
            name = str(tsv.relative_to(clone / "results" / "benchmarks").with_suffix(""))
            header, values = (line.split("\t") for line in tsv.read_text().splitlines()[:2])
            seconds, cpu_s = float(values[0]), float(values[header.index("cpu_time")])
            per_stage.setdefault(name.split("/")[0], []).append(seconds)
            cpu["measuring" if _measuring(name) else "computing"] += cpu_s
            print(f"    {name:<40} {seconds:6.1f} s  ({cpu_s:6.1f} CPU s)")
        for stage, times in sorted(per_stage.items(), key=lambda kv: -sum(kv[1])):
            print(f"  {stage:<10} {len(times):>3} jobs, {sum(times):7.1f} s of job time (longest {max(times):.1f} s)")
        print(f"  CPU seconds: measuring jobs {cpu['measuring']:.0f}, computing jobs {cpu['computing']:.0f} "
              f"(on {cores} cores at best {cpu['computing'] / cores:.0f} s of wall time)")


def _measuring(job: str) -> bool:
    """A job of a rule that takes the `measure` resource (workflow/rules)."""
    stage = job.split("/")[0]
    return stage in ("bench", "profile", "validate") or (stage == "kernels" and job.endswith("_bench"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3, help="runs of each command and mode (median)")
    parser.add_argument("--no-snakemake", action="store_true", help="skip the default workflow (minutes)")
    parser.add_argument("--no-commands", action="store_true", help="only the default workflow")
    parser.add_argument("--cores", type=int, default=2, help="snakemake -c")
    args = parser.parse_args()
    print(f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at start")
    if not args.no_commands:
        deltas = commands(args.repeats)
        plan = [d for label, d in deltas.items() if label.startswith("plan")]
        print(f"tracked plan - untracked: {', '.join(f'{d:+.2f} s' for d in plan)} (target <= +0.5 s)")
    if not args.no_snakemake:
        workflow(args.cores)
    print(f"load average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()

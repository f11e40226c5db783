"""How long `paraplan` takes as a user types it: the whole process, start-up included
(a script, not a test; docs/measurements.md, "Start-up and whole-process latency").

Each command runs in a subprocess, `--repeats` times (best of them is printed, with the
median): wall seconds, CPU seconds of the process (user + system) and, for `plan`, the
search time the command reports itself, so the start-up, file reading, writing and
tracking around the search show as the difference. Printed first: how long importing
`paraplan.cli.main` takes (`python -c "import paraplan.cli.main"` minus `python -c
pass`) and which heavy packages a bare `paraplan --help` imports (none should).

    paraplan --help
    paraplan plan --model gpt3-175b --cluster dgx-a100 --gpus 1024 --global-batch-size 1536 --top-k 5
        --no-track, and tracked into a fresh SQLite store in a temporary folder (the
        command's own time: it records the run and leaves the logging to a background
        process, docs/tracking.md; `bench_tracking.py` times that logging)
    paraplan predict <Megatron-LM SC21 Table 1 as a run table> --cluster dgx-a100 --no-track
    paraplan simulate --study distir_fig4 --no-track

    PYTHONPATH=src python benchmarks/bench_cli_latency.py [--repeats 3] [--only NAME]

Python compiles a module on every import when it may not write its bytecode cache
(`PYTHONDONTWRITEBYTECODE=1` on a source checkout): the script says whether that is
so, since it adds a few tenths of a second to every command. Timings on a machine other
jobs share are noisy: compare figures from one run, or runs at the same load (the
load average is printed).
"""

from __future__ import annotations

import argparse
import csv
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HEAVY = ("numpy", "pandas", "scipy", "yaml", "matplotlib", "mlflow", "torch", "sqlalchemy")
SC21 = REPO / "benchmarks/data/megatron_sc21_table1.csv"
SC21_NOT_INPUT = ("published_value", "published_unit", "flops_convention", "source", "note", "not_expressible")
PLAN = ["plan", "--model", "gpt3-175b", "--cluster", "dgx-a100", "--gpus", "1024", "--global-batch-size", "1536",
        "--top-k", "5"]
SEARCH_S = re.compile(r"re-timed, ([0-9.]+) s\)")


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PARAPLAN_TRACKING", "MLFLOW_TRACKING_URI")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "src"), os.environ.get("PYTHONPATH")]))
    return {**env, **(extra or {})}


def timed(args: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, float, str]:
    """Wall seconds and CPU seconds (user + system) of one command, and its stderr."""
    start = time.perf_counter()
    proc = subprocess.Popen(args, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    err = proc.stderr.read().decode()
    _, status, usage = os.wait4(proc.pid, 0)
    took = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status):
        raise SystemExit(f"{' '.join(args)} failed:\n{err[-2000:]}")
    return took, usage.ru_utime + usage.ru_stime, err


def run_table(folder: Path) -> Path:
    """SC21 Table 1 as `paraplan predict` reads it: the published-figure columns dropped."""
    with SC21.open(encoding="utf-8", newline="") as handle:
        rows = list(csv.DictReader(handle))
    columns = [c for c in rows[0] if c not in SC21_NOT_INPUT]
    path = folder / "sc21_table1.csv"
    with path.open("w", encoding="utf-8", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    return path


def commands(folder: Path) -> dict[str, tuple[list[str], dict[str, str]]]:
    paraplan = [sys.executable, "-m", "paraplan"]
    tracked = {"MLFLOW_TRACKING_URI": f"sqlite:///{folder / 'mlflow.db'}"}
    return {
        "paraplan --help": ([*paraplan, "--help"], {}),
        "plan gpt3-175b, 1024 A100 (--no-track)": ([*paraplan, *PLAN, "--no-track", "-o", str(folder / "p.csv")], {}),
        "plan gpt3-175b, 1024 A100 (tracked, SQLite)": ([*paraplan, *PLAN, "-o", str(folder / "pt.csv")], tracked),
        "predict SC21 Table 1, 10 runs (--no-track)": (
            [*paraplan, "predict", str(run_table(folder)), "--cluster", "dgx-a100", "--no-track",
             "-o", str(folder / "o.csv")], {}),
        "simulate --study distir_fig4 (--no-track)": (
            [*paraplan, "simulate", "--study", "distir_fig4", "--no-track", "-o", str(folder / "sim")], {}),
    }


def import_time(repeats: int) -> tuple[float, list[str]]:
    """Best seconds to import paraplan.cli.main over a bare interpreter, and the heavy
    packages `paraplan --help` leaves imported."""
    env = _env()
    bare = min(timed([sys.executable, "-c", "pass"], REPO, env)[0] for _ in range(repeats))
    cli = min(timed([sys.executable, "-c", "import paraplan.cli.main"], REPO, env)[0] for _ in range(repeats))
    probe = ("import sys\nfrom paraplan.cli.main import main\n"
             "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
             f"print(' '.join(m for m in {HEAVY!r} if m in sys.modules), file=sys.stderr)")
    heavy = timed([sys.executable, "-c", probe], REPO, env)[2].split()
    return cli - bare, heavy


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3, help="runs of each command (best and median printed)")
    parser.add_argument("--only", default="", help="only the commands whose label contains this text")
    args = parser.parse_args()
    no_cache = bool(os.environ.get("PYTHONDONTWRITEBYTECODE")) and not (REPO / "src/paraplan/__pycache__").is_dir()
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; bytecode cache: "
          + ("none (PYTHONDONTWRITEBYTECODE=1, no __pycache__: every import compiles)" if no_cache else "used"))
    seconds, heavy = import_time(args.repeats)
    print(f"import paraplan.cli.main: {seconds:.3f} s (best of {args.repeats}, over `python -c pass`); "
          f"`paraplan --help` imports: {', '.join(heavy) or 'none of ' + ', '.join(HEAVY)}")
    print(f"{'command':<46} {'wall s best':>11} {'median':>7} {'CPU s best':>10} {'search s':>9}")
    with tempfile.TemporaryDirectory(prefix="paraplan-latency-") as tmp:
        folder = Path(tmp)
        for label, (argv, extra) in commands(folder).items():
            if args.only not in label:
                continue
            runs = [timed(argv, folder, _env(extra)) for _ in range(args.repeats)]
            if extra:  # untimed: wait for the background logging before the folder goes
                timed([sys.executable, "-m", "paraplan", "track"], folder, _env(extra))
            walls = [r[0] for r in runs]
            searched = [float(m.group(1)) for r in runs for m in [SEARCH_S.search(r[2])] if m]
            print(f"{label:<46} {min(walls):11.2f} {statistics.median(walls):7.2f} {min(r[1] for r in runs):10.2f} "
                  + (f"{min(searched):9.2f}" if searched else f"{'':>9}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())

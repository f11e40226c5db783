"""A bigger fuzz of the input readers than the test suite's budget, with figures.

Runs every target of tests/fuzz_harness.py (`paraplan ingest` of nccl-tests, PARAM
and PipeDream files, the profile CSV reader, `paraplan fit` on bench CSVs, `paraplan
predict` on run tables and calibrations, model files) on mutated real files from
the repository's data/ and config/, in two modes: blind mutations (numbers,
lines, bytes, huge fields) and targeted ones (one parsed number replaced by a value
its format forbids); and `fit_sweep` on any valid sweep (numbers drawn within the
bench-CSV reader's ranges). Prints, per target and mode, the inputs tried and how many
ended in a result, a named error, a crash or a silent acceptance, then the first
details of any crash or silent acceptance. Exit status 1 when there is any.

    python benchmarks/fuzz_inputs.py                    # 2000 examples per target and mode
    python benchmarks/fuzz_inputs.py --examples 300 --seed 7
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from hypothesis import given, seed, settings  # noqa: E402

from fuzz_harness import (  # noqa: E402
    OUTCOMES,
    classify,
    classify_sweep,
    mutated,
    targets,
    valid_sweeps,
    with_forbidden_value,
)


def _recorder(target, key: tuple[str, str], folder: Path, counts: Counter, details: dict):
    """A test function for @given that classifies each input and counts the outcome."""

    def record(data) -> None:
        if target is None:  # a valid sweep for fit_sweep
            outcome = classify_sweep(data)
        else:
            outcome = classify(target, data, folder, forbidden=key[1] == "forbidden")
        counts[(*key, outcome.kind)] += 1
        if outcome.kind in ("crash", "silent") and len(details[(*key, outcome.kind)]) < 3:
            details[(*key, outcome.kind)].append(outcome.detail)

    return record


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=2000, help="examples per target and mode")
    parser.add_argument("--seed", type=int, default=None, help="random seed (default: derandomized, as in CI)")
    parser.add_argument("--targets", default="",
                        help="comma list of target names, e.g. 'ingest param,fit_sweep' (default: all)")
    args = parser.parse_args()

    wanted = set(args.targets.split(",")) if args.targets else None
    counts: Counter[tuple[str, str, str]] = Counter()
    details: dict[tuple[str, str, str], list[str]] = defaultdict(list)
    profile = settings(settings.get_profile("paraplan-fuzz"), max_examples=args.examples,
                       derandomize=args.seed is None)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        runs = [((name, "blind"), target, mutated(target.seeds)) for name, target in targets().items()]
        runs += [((name, "forbidden"), target, with_forbidden_value(target)) for name, target in targets().items()]
        runs.append((("fit_sweep", "valid"), None, valid_sweeps()))
        for key, target, strategy in sorted(runs, key=lambda run: run[0][0]):
            if wanted is not None and key[0] not in wanted:
                continue
            run = profile(given(strategy)(_recorder(target, key, Path(folder), counts, details)))
            if args.seed is not None:
                run = seed(args.seed)(run)
            run()

    print(f"{'target':<20} {'mode':<10} {'tried':>7} {'ok':>7} {'errors':>7} {'crashes':>8} {'silent':>7}")
    totals: Counter[str] = Counter()
    for name, mode in sorted({(name, mode) for name, mode, _ in counts}):
        row = {kind: counts[(name, mode, kind)] for kind in OUTCOMES}
        totals.update(row)
        print(f"{name:<20} {mode:<10} {sum(row.values()):>7} {row['ok']:>7} {row['error']:>7} "
              f"{row['crash']:>8} {row['silent']:>7}")
    print(f"{'all':<20} {'':<10} {sum(totals.values()):>7} {totals['ok']:>7} {totals['error']:>7} "
          f"{totals['crash']:>8} {totals['silent']:>7}   ({time.perf_counter() - start:.0f} s)")
    for (name, mode, kind), items in sorted(details.items()):
        for item in items:
            print(f"\n{kind}: {name} ({mode}): {item}")
    return 1 if totals["crash"] or totals["silent"] else 0


if __name__ == "__main__":
    sys.exit(main())

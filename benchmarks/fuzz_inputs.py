"""A bigger fuzz of the input readers than the test suite's budget, with figures.

Runs every target of tests/fuzz_harness.py (`paraplan ingest` of nccl-tests, PARAM
and PipeDream files, the profile CSV reader, `paraplan fit` on bench CSVs) on
mutated real files from ../shared/data, in two modes: blind mutations (numbers,
lines, bytes, huge fields) and targeted ones (one parsed number replaced by a value
its format forbids). Prints, per target and mode, the inputs tried and how many
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

from fuzz_harness import OUTCOMES, classify, mutated, targets, with_forbidden_value  # noqa: E402


def _recorder(target, key: tuple[str, str], folder: Path, counts: Counter, details: dict):
    """A test function for @given that classifies each input and counts the outcome."""

    def record(data: bytes) -> None:
        outcome = classify(target, data, folder, forbidden=key[1] == "forbidden")
        counts[(*key, outcome.kind)] += 1
        if outcome.kind in ("crash", "silent") and len(details[(*key, outcome.kind)]) < 3:
            details[(*key, outcome.kind)].append(outcome.detail)

    return record


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=2000, help="examples per target and mode")
    parser.add_argument("--seed", type=int, default=None, help="random seed (default: derandomized, as in CI)")
    parser.add_argument("--targets", default="", help="comma list of target names (default: all)")
    args = parser.parse_args()

    chosen = targets()
    if args.targets:
        chosen = {name: chosen[name] for name in args.targets.split(",")}
    counts: Counter[tuple[str, str, str]] = Counter()
    details: dict[tuple[str, str, str], list[str]] = defaultdict(list)
    profile = settings(settings.get_profile("paraplan-fuzz"), max_examples=args.examples,
                       derandomize=args.seed is None)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        for name, target in chosen.items():
            for mode, strategy in (("blind", mutated(target.seeds)), ("forbidden", with_forbidden_value(target))):

                run = profile(given(strategy)(_recorder(target, (name, mode), Path(folder), counts, details)))
                if args.seed is not None:
                    run = seed(args.seed)(run)
                run()

    print(f"{'target':<20} {'mode':<10} {'tried':>7} {'ok':>7} {'errors':>7} {'crashes':>8} {'silent':>7}")
    totals: Counter[str] = Counter()
    for name in chosen:
        for mode in ("blind", "forbidden"):
            row = {kind: counts[(name, mode, kind)] for kind in OUTCOMES}
            tried = sum(row.values())
            totals.update(row)
            print(f"{name:<20} {mode:<10} {tried:>7} {row['ok']:>7} {row['error']:>7} {row['crash']:>8} "
                  f"{row['silent']:>7}")
    print(f"{'all':<20} {'':<10} {sum(totals.values()):>7} {totals['ok']:>7} {totals['error']:>7} "
          f"{totals['crash']:>8} {totals['silent']:>7}   ({time.perf_counter() - start:.0f} s)")
    for (name, mode, kind), items in sorted(details.items()):
        for item in items:
            print(f"\n{kind}: {name} ({mode}): {item}")
    return 1 if totals["crash"] or totals["silent"] else 0


if __name__ == "__main__":
    sys.exit(main())

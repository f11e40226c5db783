"""Simulation speed of the DistIR reproductions (issue 5's targets).

Best of 5 wall times of the simulation alone (no start-up, files or plots) for the
Figure 3 sweep (40 configurations) and the Figure 4 grid (111 configurations) in the
DistIR-compatible mode, against DistIR's own 29-45 s and 134 s on a 2-core machine,
and, for information, the same sweeps in the corrected mode (the physical engine).

    python benchmarks/bench_simulate.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from paraplan.studies import simulate as st

REPO_ROOT = Path(__file__).resolve().parent.parent
DISTIR_S = {"distir_fig3": (29.0, 45.0), "distir_fig4": (134.0, 134.0)}
TARGET_S = {"distir_fig3": 0.1, "distir_fig4": 0.3}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    failed = False
    for name in ("distir_fig3", "distir_fig4"):
        study = st.load_study(REPO_ROOT / "config/studies/simulate" / f"{name}.yaml")
        for mode in study.modes.names:
            result = st.run_study(study, (mode,), repeats=args.repeats)
            seconds = result.simulate_s
            configs = len(result.simulated)
            line = (f"{name:12s} {mode:12s} {configs:4d} configurations  best of {result.repeats}: "
                    f"{seconds * 1e3:8.1f} ms")
            if mode == "distir-v0.1":
                low, high = DISTIR_S[name]
                span = f"{low / seconds:,.0f}x" if low == high else f"{low / seconds:,.0f}-{high / seconds:,.0f}x"
                ok = seconds < TARGET_S[name]
                failed |= not ok
                line += (f"  ({span} faster than DistIR's {low:g}"
                         f"{'' if low == high else f'-{high:g}'} s; target < {TARGET_S[name]} s: "
                         f"{'met' if ok else 'MISSED'})")
            print(line)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

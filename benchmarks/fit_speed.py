"""Speed of the fit stage: fitting one sweep (three models, leave-one-out) and one
`FittedCommModel.time_s` call, the function the simulator and planner call in loops.

    python benchmarks/fit_speed.py

Prints CPU times; on a shared machine compare ratios, not absolute numbers.
"""

from __future__ import annotations

import time

import numpy as np

from paraplan.comm.fit_sweep import fit_sweep
from paraplan.comm.model import FittedCommModel, fits_document
from paraplan.core import Group


def main() -> None:
    sizes = 2.0 ** np.arange(3, 31)
    rng = np.random.default_rng(0)
    times = (20e-6 + sizes * 1.75 / 100e9) * rng.lognormal(0.0, 0.03, sizes.size)
    start = time.process_time()
    repeats = 5
    for _ in range(repeats):
        entries = fit_sweep("all_reduce", 8, 1, sizes, times)
    fit_s = (time.process_time() - start) / repeats
    print(f"fit one {sizes.size}-size sweep (3 models + leave-one-out): {fit_s * 1e3:.1f} ms CPU")

    model = FittedCommModel.from_dict(fits_document(entries))
    queries = np.geomspace(8, 2**30, 100_000)
    for label, group in (("measured (table/chosen)", Group(8, 1)), ("extrapolated world size", Group(16, 1))):
        model.time_s("all_reduce", 1e6, group)  # resolve and cache
        start = time.process_time()
        for q in queries:
            model.time_s("all_reduce", float(q), group)
        per_call = (time.process_time() - start) / queries.size
        print(f"time_s, {label}: {per_call * 1e6:.2f} us per call")


if __name__ == "__main__":
    main()

"""A calibration's evaluations spread over worker processes.

A fit evaluates every training run's iteration time at each trial of the
parameters (hundreds of trials, each run through the pipeline engine in Python),
and the runs are independent of each other: `PooledIterationTimes` deals the runs
asked for out to the workers (every n-th run to one, so shares of like cost) and puts
the answers back in order. Each run is
priced by the same code on the same numbers as in one process (kernel pricing is
element by element), so the fit, its cross-validation and every prediction are
byte-identical to the serial ones (`--jobs 1`); only the wall time changes.

The workers are forked once (they inherit the run structures; only the
parameters and the run indices travel) and stop when the pool is closed. Where
fork is unavailable the pool runs serially.
"""

from __future__ import annotations

import multiprocessing as mp
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from paraplan.predict.calibrate import IterationTimes
from paraplan.predict.device_model import DeviceEfficiency


def _serve(data: IterationTimes, conn: Any) -> None:
    """A worker: answer (parameters, run indices) with their predictions until None."""
    while True:
        request = conn.recv()
        if request is None:
            conn.close()
            return
        eff, idx = request
        try:
            conn.send(("ok", data.predict(eff, idx)))
        except Exception as exc:  # the parent re-raises it
            conn.send(("error", exc))


@dataclass(frozen=True, eq=False)
class PooledIterationTimes(IterationTimes):
    """`IterationTimes` whose `predict` runs on `len(connections)` worker processes."""

    connections: tuple[Any, ...] = field(default=(), repr=False)

    def predict(self, eff: DeviceEfficiency, idx: np.ndarray) -> np.ndarray:
        idx = np.asarray(idx, dtype=np.int64)
        if len(self.connections) < 2 or idx.size < 2 * len(self.connections):
            return super().predict(eff, idx)
        n = len(self.connections)
        for w, conn in enumerate(self.connections):
            conn.send((eff, idx[w::n]))  # every n-th run: shares of like cost
        out = np.empty(idx.size)
        for w, conn in enumerate(self.connections):
            status, value = conn.recv()
            if status == "error":
                raise value
            out[w::n] = value
        return out


@contextmanager
def pooled(data: IterationTimes, jobs: int) -> Iterator[IterationTimes]:
    """`data` evaluated on `jobs` worker processes while the context is open (`data`
    itself for one job, or where processes cannot be forked)."""
    if jobs < 2 or "fork" not in mp.get_all_start_methods():
        yield data
        return
    ctx = mp.get_context("fork")
    connections, processes = [], []
    try:
        for _ in range(jobs):
            parent, child = ctx.Pipe()
            process = ctx.Process(target=_serve, args=(data, child), daemon=True)
            process.start()
            child.close()
            connections.append(parent)
            processes.append(process)
        yield PooledIterationTimes(data.structures, connections=tuple(connections))
    finally:
        for conn in connections:
            with suppress(OSError):
                conn.send(None)
        for process in processes:
            process.join(timeout=5)
            if process.is_alive():
                process.terminate()

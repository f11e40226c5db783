"""Fit the inter-node rail curve of `paraplan.comm.topology` to multi-node sweeps.

One NIC moves m bytes in a + m / (eta x line rate). Given measured sweeps (nccl-tests
rows read by `paraplan ingest`) and the cluster each ran on, `fit_rail` finds the
latency a and the efficiency eta that minimise the squared log error of the topology
model's time (fastest algorithm, the cluster's intra-node model for the NVLink stages)
over every measured size: a relative-error fit like `fit_alpha_beta`'s. Sweeps of
different fabrics share eta (a fraction of each one's line rate), so logs of one
cluster test a fit made on the others (`leave_one_out`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from paraplan.comm.topology import Rail, TopologyCommModel
from paraplan.core import Cluster, CommModel, ConstantBandwidthModel, Group, InputFileError, RailFit


@dataclass(frozen=True)
class MeasuredSweep:
    """One measured multi-node sweep and the hardware it ran on."""

    name: str
    cluster: Cluster
    intra: CommModel
    collective: str
    world_size: int
    nodes: int
    size_bytes: tuple[float, ...]
    time_s: tuple[float, ...]


@dataclass(frozen=True)
class RailEfficiencyFit:
    latency_s: float
    efficiency: float  # effective / line-rate bandwidth of one NIC
    gmae: float  # geometric-mean absolute relative error of time over the fitted points
    n_points: int

    def rail(self, cluster: Cluster) -> Rail:
        assert cluster.network is not None
        return Rail(self.latency_s, self.efficiency * cluster.network.nic_bandwidth_Bps)


def intra_link_model(cluster: Cluster) -> ConstantBandwidthModel:
    """The cluster file's intra-node link as a comm model (ring formulas)."""
    link = cluster.intra
    return ConstantBandwidthModel(link.bandwidth_Bps, link.bandwidth_Bps, link.latency_s, link.latency_s)


def model_for(sweep: MeasuredSweep, rail: Rail) -> TopologyCommModel:
    assert sweep.cluster.network is not None
    return TopologyCommModel(sweep.intra, sweep.cluster.network, sweep.cluster.devices_per_node, rail)


def predict_sweep(sweep: MeasuredSweep, latency_s: float, efficiency: float) -> np.ndarray:
    assert sweep.cluster.network is not None
    model = model_for(sweep, Rail(latency_s, efficiency * sweep.cluster.network.nic_bandwidth_Bps))
    group = Group(sweep.world_size, sweep.nodes)
    return np.array([model.time_s(sweep.collective, s, group) for s in sweep.size_bytes])


FIT_MIN_SIZE_BYTES = 2**20
"""Smaller sizes are left out of the fit: their time is the intra-node model's latency
and the launch overheads (LL protocols) this model does not price, which would pull the
NIC efficiency down to absorb them."""


def fitted_points(sweep: MeasuredSweep, min_size_bytes: float = FIT_MIN_SIZE_BYTES) -> MeasuredSweep:
    keep = [i for i, s in enumerate(sweep.size_bytes) if s >= min_size_bytes]
    return replace(sweep, size_bytes=tuple(sweep.size_bytes[i] for i in keep),
                   time_s=tuple(sweep.time_s[i] for i in keep))


def _log_errors(sweeps: Sequence[MeasuredSweep], latency_s: float, efficiency: float) -> np.ndarray:
    parts = [np.log(predict_sweep(s, latency_s, efficiency) / np.array(s.time_s)) for s in sweeps]
    return np.concatenate(parts) if parts else np.zeros(0)


def fit_rail(sweeps: Sequence[MeasuredSweep], min_size_bytes: float = FIT_MIN_SIZE_BYTES) -> RailEfficiencyFit:
    """Latency and efficiency of one NIC from `sweeps`' sizes >= `min_size_bytes` (see
    the module docstring)."""
    from scipy.optimize import least_squares

    if not sweeps:
        raise ValueError("fit_rail needs at least one multi-node sweep")
    for s in sweeps:
        if s.cluster.network is None:
            raise InputFileError(s.name, f"cluster '{s.cluster.name}' has no network section (nics_per_node, nic_Gbps)")
        if s.nodes < 2:
            raise InputFileError(s.name, "a rail fit needs sweeps across nodes; this one ran on one node")
    sweeps = [fitted_points(s, min_size_bytes) for s in sweeps]
    if sum(len(s.size_bytes) for s in sweeps) < 2:
        raise InputFileError(sweeps[0].name, f"fewer than 2 sizes >= {min_size_bytes:g} bytes to fit a rail curve on")

    def residuals(x: np.ndarray) -> np.ndarray:
        return _log_errors(sweeps, math.exp(x[0]), math.exp(x[1]))

    # start: 10 us, 70% of line rate; efficiency may exceed 1 only if the model is wrong
    result = least_squares(residuals, x0=np.log([10e-6, 0.7]), bounds=(np.log([1e-7, 0.05]), np.log([1e-3, 1.5])),
                           method="trf", loss="linear")
    latency, efficiency = (float(v) for v in np.exp(result.x))
    errors = np.abs(np.expm1(residuals(result.x)))
    gmae = float(np.exp(np.mean(np.log(np.maximum(errors, 1e-12))))) if errors.size else 0.0
    return RailEfficiencyFit(latency, efficiency, gmae, int(errors.size))


def rail_fits(sweeps: Sequence[MeasuredSweep]) -> tuple[RailFit, ...]:
    """Per node count, an absolute per-NIC curve (for one cluster's `network.rail_fits`)."""
    out = []
    for nodes in sorted({s.nodes for s in sweeps}):
        same = [s for s in sweeps if s.nodes == nodes]
        fit = fit_rail(same)
        network = same[0].cluster.network
        assert network is not None
        out.append(RailFit(nodes, fit.latency_s, fit.efficiency * network.nic_bandwidth_Bps))
    return tuple(out)


def leave_one_out(sweeps: Sequence[MeasuredSweep]) -> list[tuple[MeasuredSweep, RailEfficiencyFit, np.ndarray]]:
    """For each sweep: the fit on all the others and its predicted times for this one."""
    out = []
    for i, held in enumerate(sweeps):
        rest = [s for j, s in enumerate(sweeps) if j != i]
        fit = fit_rail(rest)
        out.append((held, fit, predict_sweep(held, fit.latency_s, fit.efficiency)))
    return out

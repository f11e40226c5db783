"""One whole `paraplan fit` of collective sweeps as a pure call: `fit_sweeps(frame)`
fits every sweep (`paraplan.comm.fit_sweep`), predicts the all_to_allv samples from
the all_to_all fits (`paraplan.comm.fit_a2av`) and, on a cluster with a `network`,
fits the per-NIC rail curve of the sweeps across nodes (`paraplan.comm.fit_rail`).
The `FitReport` it returns holds comm_model.json's document and each sweep's errors
as the metrics and table rows the CLI logs."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from paraplan.comm.fit_a2av import A2AVResult, predict_a2av, sample_rows
from paraplan.comm.fit_sweep import FitEntry, fit_frame
from paraplan.comm.model import FittedCommModel, fits_document
from paraplan.core import Cluster, ConfigError, InputFileError

SweepKey = tuple[str, int, int]
"""A sweep: collective, world size, nodes."""


@dataclass(frozen=True)
class RailCurve:
    """The rail curve fitted on the sweeps across `nodes` nodes: a row of `rail_fits`."""

    nodes: int
    latency_us: float
    bandwidth_GBps: float
    efficiency: float
    """Of the NIC's line rate."""
    gmae: float
    n_points: int
    sweeps: tuple[str, ...]

    def as_dict(self) -> dict[str, object]:
        return {"nodes": self.nodes, "latency_us": self.latency_us, "bandwidth_GBps": self.bandwidth_GBps,
                "efficiency": self.efficiency, "gmae": self.gmae, "n_points": self.n_points,
                "sweeps": list(self.sweeps)}


@dataclass(frozen=True, eq=False)
class FitReport:
    document: dict
    """comm_model.json (with `rail_fits` when rail curves were fitted)."""
    entries: tuple[FitEntry, ...]
    names: Mapping[SweepKey, str]
    """Each fitted sweep's name (`sweep_names`)."""
    a2av: tuple[A2AVResult, ...]
    rails: tuple[RailCurve, ...]

    def sweep_metrics(self) -> tuple[dict[str, dict[str, float]], dict[str, SweepKey], dict[str, dict[str, object]]]:
        """Per sweep name: its error metrics, its key, and (fitted sweeps) its chosen model with parameters."""
        per_sweep: dict[str, dict[str, float]] = {name: {} for name in self.names.values()}
        keys = {name: key for key, name in self.names.items()}
        chosen: dict[str, dict[str, object]] = {}
        for entry in self.entries:
            name = self.names[(entry.collective, entry.world_size, entry.nodes)]
            sweep = per_sweep[name]
            sweep[f"gmae__{entry.model}"] = entry.gmae
            sweep[f"heldout_gmae__{entry.model}"] = entry.heldout_gmae
            sweep[f"mean_abs_rel_err__{entry.model}"] = entry.mean_abs_rel_err
            sweep["n_points"] = float(entry.n_points)
            if entry.chosen:
                chosen[name] = {"model": entry.model, **_loggable(entry.params)}
                sweep.update(chosen_gmae=entry.gmae, chosen_heldout_gmae=entry.heldout_gmae,
                             chosen_mean_abs_rel_err=entry.mean_abs_rel_err)
        for result in self.a2av:
            name = _a2av_name(result)
            sweep = per_sweep.setdefault(name, {})
            keys[name] = ("all_to_allv", result.world_size, result.nodes)
            sweep[f"gmae__{result.variant}"] = result.gmae
            sweep[f"mean_abs_rel_err__{result.variant}"] = result.mean_abs_rel_err
            sweep[f"std_abs_rel_err__{result.variant}"] = result.std_abs_rel_err
            sweep["n_points"] = float(result.n_points)
        return per_sweep, keys, chosen

    def summary(self) -> dict[str, float]:
        """The run's metrics: sweeps, rail curves, and the chosen models' held-out errors."""
        per_sweep, _, _ = self.sweep_metrics()
        chosen_errors = [m["chosen_heldout_gmae"] for m in per_sweep.values() if "chosen_heldout_gmae" in m]
        out = {"sweeps": float(len(self.names))}
        for row in self.rails:
            out.update({f"rail_bandwidth_GBps__nodes{row.nodes}": row.bandwidth_GBps,
                        f"rail_latency_us__nodes{row.nodes}": row.latency_us,
                        f"rail_gmae__nodes{row.nodes}": row.gmae})
        if chosen_errors:
            out.update(max_chosen_heldout_gmae=max(chosen_errors),
                       median_chosen_heldout_gmae=float(np.median(chosen_errors)))
        return out

    def table_lines(self) -> list[str]:
        """The error table: a line per fitted model and per all_to_allv variant."""
        lines = [f"{'sweep':<28} {'model':<11} {'GMAE':>7} {'held-out':>9} {'mean':>7} {'std':>7}  points"]
        for entry in self.entries:
            name = self.names[(entry.collective, entry.world_size, entry.nodes)]
            lines.append(f"{name:<28} {entry.model + ('*' if entry.chosen else ''):<11} {entry.gmae:>7.2%} "
                         f"{entry.heldout_gmae:>9.2%} {entry.mean_abs_rel_err:>7.2%} {entry.std_abs_rel_err:>7.2%}  "
                         f"{entry.n_points}")
        for result in self.a2av:
            lines.append(f"{_a2av_name(result):<28} {result.variant:<11} {result.gmae:>7.2%} {'':>9} "
                         f"{result.mean_abs_rel_err:>7.2%} {result.std_abs_rel_err:>7.2%}  {result.n_points}")
        return lines

    def rail_lines(self) -> list[str]:
        """The rail curves as lines to paste under a cluster file's `network:`."""
        return [f"    - {{nodes: {row.nodes}, latency_us: {row.latency_us:.3g}, "
                f"bandwidth_GBps: {row.bandwidth_GBps:.3g}}}  # {row.efficiency:.0%} of line rate, "
                f"GMAE {row.gmae:.1%} over {row.n_points} sizes" for row in self.rails]


def fit_sweeps(frame: pd.DataFrame, cluster: Cluster | None, first_input: Path, source: str,
               warn: Callable[[str], None] | None = None) -> FitReport:
    """Fit every sweep of `frame` (bench rows, `paraplan.comm.fit_input.read_sweeps`);
    with a `cluster`, its rail curve too. `source` names comm_model.json in errors,
    `first_input` the inputs; `warn` hears each all_to_allv variant predicted outside
    the measured range."""
    entries = fit_frame(frame)
    document = fits_document(entries)
    rails: tuple[RailCurve, ...] = ()
    if cluster is not None:
        rails = rail_curves(frame, cluster, first_input)
        document["rail_fits"] = [row.as_dict() for row in rails]
    a2av: list[A2AVResult] = []
    if sample_rows(frame).any():
        a2av = predict_a2av(frame, FittedCommModel.from_dict(document, source))
        for result in a2av:
            if result.flagged and warn is not None:
                warn(f"all_to_allv n={result.world_size}: {result.flagged} of {result.n_points} '{result.variant}' "
                     "predictions lie outside the measured all_to_all range or world size (extrapolated)")
    return FitReport(document, tuple(entries), sweep_names(entries), tuple(a2av), rails)


def sweep_names(entries: list[FitEntry]) -> dict[SweepKey, str]:
    """`<collective>_n<world>`, plus `_nodes<k>` where one world size was measured on
    several node counts."""
    keys = sorted({(e.collective, e.world_size, e.nodes) for e in entries})
    names = {}
    for collective, world, nodes in keys:
        clash = sum(1 for c, w, _ in keys if (c, w) == (collective, world)) > 1
        names[(collective, world, nodes)] = f"{collective}_n{world}" + (f"_nodes{nodes}" if clash else "")
    return names


def rail_curves(frame: pd.DataFrame, cluster: Cluster, first_input: Path) -> tuple[RailCurve, ...]:
    """Per node count, the rail curve fitted on the sweeps across nodes."""
    from paraplan.comm.fit_input import fitted_sweeps
    from paraplan.comm.fit_rail import MeasuredSweep, fit_rail, intra_link_model

    if cluster.network is None:
        raise ConfigError("--cluster", f"cluster '{cluster.name}' has no `network` section (nics_per_node, nic_Gbps); "
                          "a rail fit needs it (docs/clusters.md)")
    intra = intra_link_model(cluster)
    sweeps = [MeasuredSweep(f"{c}_n{w}_nodes{n}", cluster, intra, c, w, n, tuple(rows["size_bytes"].astype(float)),
                            tuple(rows["time_us"].astype(float) * 1e-6))
              for (c, w, n), rows in fitted_sweeps(frame) if n >= 2 and c != "all_to_allv"]
    if not sweeps:
        raise InputFileError(first_input, "--cluster given but no sweep ran across nodes (nodes >= 2) to fit a rail "
                             "curve on")
    out = []
    for nodes in sorted({s.nodes for s in sweeps}):
        same = [s for s in sweeps if s.nodes == nodes]
        fit = fit_rail(same)
        bandwidth = fit.efficiency * cluster.network.nic_bandwidth_Bps
        out.append(RailCurve(nodes, fit.latency_s * 1e6, bandwidth / 1e9, fit.efficiency, fit.gmae, fit.n_points,
                             tuple(s.name for s in same)))
    return tuple(out)


def _a2av_name(result: A2AVResult) -> str:
    return f"all_to_allv_n{result.world_size}" + (f"_nodes{result.nodes}" if result.nodes > 1 else "")


def _loggable(params: dict) -> dict:
    """A model's parameters as MLflow params (table knots summarised by their count)."""
    if "log2_size_bytes" in params:
        return {"knots": len(params["log2_size_bytes"])}
    return {k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in params.items()}

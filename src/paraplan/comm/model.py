"""`FittedCommModel`: the `CommModel` the simulator and planner use, read from
`comm_model.json` (written by `paraplan fit`).

    model = FittedCommModel.from_json("results/fits/local-cpu/comm_model.json")
    model.time_s("all_reduce", 64 * 2**20, Group(size=8, nodes=1))   # seconds
    model.predict("all_reduce", 1e12, Group(8, 2))  # Prediction(time_s, flags)

How a prediction is made for (collective, nbytes, group):
1. The group's size and tier (`intra`: one node, `inter`: several, `Group.tier`)
   select the fit entries of that collective, world size and tier. `all_to_allv`
   without fits of its own (e.g. a PARAM all_to_allv sweep) uses the even
   `all_to_all` fits (nbytes is then an effective size, see `paraplan.comm.fit_a2av`).
2. Measured world size, nbytes inside the measured size range: the chosen model.
3. Measured world size, nbytes outside the range: flag `outside_range`; alpha-beta,
   anchored to the chosen model at the nearest edge (t_edge x ab(nbytes) / ab(edge)),
   so the curve stays continuous and grows with the fitted bus bandwidth.
4. World size never measured: flag `extrapolated`; the alpha-beta fit of the same
   collective and tier at the nearest measured world size is turned into a per-link
   (latency, bandwidth) pair and priced with the ring formulas of
   `paraplan.core.ring_time_s`. No fit of that collective in the tier: the same
   from another collective (prefer all_reduce), flag `other_collective`; nothing
   measured in the tier: the other tier, flag `other_tier`.
5. `send_recv` (point to point): per-link alpha-beta as in 4, flag `derived`,
   from a broadcast fit at 2 ranks if there is one, else as in 4.
6. A group of one rank costs 0.

Speed: everything but the final arithmetic is resolved once per (collective, world
size, tier) and cached; a call is a dict lookup, a range check and a few float
operations (PCHIP tables are evaluated from their stored cubic coefficients).
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from paraplan.comm.fit_sweep import MODEL_NAMES, predict
from paraplan.core import COLLECTIVES, InputFileError, ParaplanError, ring_time_s
from paraplan.core.limits import MAX_DEVICES
from paraplan.inputs import read_json_object, shown

SCHEMA_VERSION = 1
FLAG_OUTSIDE_RANGE = "outside_range"
FLAG_EXTRAPOLATED = "extrapolated"
FLAG_OTHER_COLLECTIVE = "other_collective"
FLAG_OTHER_TIER = "other_tier"
FLAG_DERIVED = "derived"
_ALIASES = {"all_to_allv": "all_to_all"}
_MAX_SIZE_LOG2 = 50
_MAX_SIZE_BYTES = 2.0**_MAX_SIZE_LOG2
_FITTABLE = (*COLLECTIVES, "all_to_allv", "send_recv")
_REQUIRED_KEYS = ("collective", "world_size", "nodes", "tier", "model", "chosen", "params", "size_range_bytes")


@dataclass(frozen=True)
class Prediction:
    time_s: float
    flags: tuple[str, ...] = ()


@dataclass(frozen=True)
class _Entry:
    collective: str
    world_size: int
    tier: str
    model: str
    chosen: bool
    params: dict
    lo_bytes: float
    hi_bytes: float


def _scalar_predictor(model: str, params: dict) -> Callable[[float], float]:
    """A fast float -> float version of `fit_sweep.predict` for one fitted model."""
    if model == "alpha_beta":
        alpha, slope = params["alpha_s"], params["busbw_factor"] / params["beta_Bps"]
        return lambda s: alpha + s * slope
    if model == "table":
        xs = [float(v) for v in params["log2_size_bytes"]]
        ys = [float(v) for v in params["log2_time_s"]]
        if len(xs) == 1:
            return lambda s: 2.0 ** ys[0]
        from paraplan.comm.pchip import coefficients  # scipy's PCHIP numbers without importing scipy.interpolate

        coeffs = coefficients(xs, ys)
        last = len(xs) - 2

        def table(s: float) -> float:
            x = math.log2(s)
            i = min(max(bisect.bisect_right(xs, x) - 1, 0), last)
            d = x - xs[i]
            c3, c2, c1, c0 = coeffs[i]
            return 2.0 ** (((c3 * d + c2) * d + c1) * d + c0)

        return table
    return lambda s: float(predict(model, params, np.array([s]))[0])


def _ring_coefficients(collective: str, world_size: int) -> tuple[float, float]:
    """(a, b) with ring_time_s(coll, m, p, lat, bw) = a lat + b m / bw."""
    return (
        ring_time_s(collective, 0.0, world_size, 1.0, 1.0),
        ring_time_s(collective, 1.0, world_size, 0.0, 1.0),
    )


def _per_link(entry: _Entry) -> tuple[float, float]:
    """Per-link (latency_s, bandwidth_Bps) that reproduce an alpha-beta fit through
    the ring formula of its collective at its world size."""
    p = entry.params
    a, b = _ring_coefficients(entry.collective, entry.world_size)
    latency = p["alpha_s"] / a if a > 0 else 0.0
    # fitted slope = factor / beta per byte; ring slope = b / bw
    bandwidth = b * p["beta_Bps"] / p["busbw_factor"]
    return latency, bandwidth


def _value(value: object) -> str:
    """A JSON value for a message: a string quoted, anything else as Python writes it, both shortened."""
    if isinstance(value, str):
        return shown(value)
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:20]}... ({len(text)} characters)"


def _check_table(params: Mapping, where: str, source: str) -> None:
    """A table's knots: increasing log2 sizes within [0, 50] and log2 times within
    [-60, 40] (1e-18 s to 3e4 years), as many of each. PCHIP never overshoots its knots,
    so every time it gives in between is in that range too."""
    xs, ys = params.get("log2_size_bytes"), params.get("log2_time_s")

    def numbers(values: object, low: float, high: float) -> list[float]:
        if not isinstance(values, list) or not all(
                isinstance(v, int | float) and not isinstance(v, bool) and low <= v <= high for v in values):
            return []
        return [float(v) for v in values]

    sizes, times = numbers(xs, 0, _MAX_SIZE_LOG2), numbers(ys, -60, 40)
    if not sizes or len(sizes) != len(times) or any(a >= b for a, b in itertools.pairwise(sizes)):
        raise InputFileError(source, "expected log2_size_bytes increasing within [0, 50] and as many log2_time_s "
                             "within [-60, 40]", field=f"{where}.params")


def _check_one_chosen(entries: list[_Entry], nodes: list[int], source: str) -> None:
    """Each sweep (collective, ranks, nodes) has each model once and exactly one of them
    chosen, as `paraplan fit` writes it: with two chosen, which one predicts would
    depend on the order of the entries (q4-hostile: a second `chosen: true` moved a
    plan's times without a word)."""
    models: dict[tuple, int] = {}
    chosen: dict[tuple, list[int]] = {}
    for i, (e, n) in enumerate(zip(entries, nodes, strict=True)):
        sweep = (e.collective, e.world_size, n, e.tier)
        if (*sweep, e.model) in models:
            raise InputFileError(source, f"a second {e.model} fit of the {e.collective} sweep at {e.world_size} ranks "
                                 f"on {n} node(s) (the first is fits[{models[(*sweep, e.model)]}]); expected each "
                                 "model once per sweep", field=f"fits[{i}]")
        models[(*sweep, e.model)] = i
        chosen.setdefault(sweep, [])
        if e.chosen:
            chosen[sweep].append(i)
    for (collective, world, n, _tier), indices in chosen.items():
        if len(indices) != 1:
            which = ", ".join(f"fits[{i}]" for i in indices) or "none"
            raise InputFileError(source, f"the {collective} sweep at {world} ranks on {n} node(s) has {len(indices)} "
                                 f"chosen models ({which}); expected exactly one (the model paraplan fit predicts "
                                 "with)", field="fits")


def _entry(fit: object, where: str, source: str) -> _Entry:
    """One checked entry of a comm_model.json's `fits`."""
    def bad(key: str, expected: str, value: object) -> InputFileError:
        return InputFileError(source, f"expected {expected}, got {_value(value)}", field=f"{where}.{key}")

    if not isinstance(fit, Mapping):
        raise InputFileError(source, f"expected a JSON object, got {_value(fit)}", field=where)
    missing = [k for k in _REQUIRED_KEYS if k not in fit]
    if missing:
        raise InputFileError(source, f"missing key(s) {', '.join(missing)}", field=where)
    if not isinstance(fit["collective"], str) or fit["collective"] not in _FITTABLE:
        raise bad("collective", f"one of {', '.join(_FITTABLE)}", fit["collective"])
    for key, high in (("world_size", MAX_DEVICES), ("nodes", MAX_DEVICES)):
        value = fit[key]
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= high:
            raise bad(key, f"an integer from 1 to {high:,}", value)
    if fit["tier"] not in ("intra", "inter") or not isinstance(fit["tier"], str):
        raise bad("tier", "intra or inter", fit["tier"])
    if not isinstance(fit["model"], str) or fit["model"] not in MODEL_NAMES:
        raise bad("model", f"one of {', '.join(MODEL_NAMES)}", fit["model"])
    if not isinstance(fit["chosen"], bool):
        raise bad("chosen", "true or false", fit["chosen"])
    if not isinstance(fit["params"], Mapping):
        raise bad("params", "a JSON object", fit["params"])
    span = fit["size_range_bytes"]
    numbers = isinstance(span, list) and len(span) == 2 and all(
        isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in span)
    if not numbers or not 0 < span[0] <= span[1] <= _MAX_SIZE_BYTES:
        raise bad("size_range_bytes", f"[smallest, largest] sizes, 0 < smallest <= largest <= 2^{_MAX_SIZE_LOG2}",
                  span)
    if fit["model"] == "table":
        _check_table(fit["params"], where, source)
    entry = _Entry(collective=fit["collective"], world_size=fit["world_size"], tier=fit["tier"], model=fit["model"],
                   chosen=fit["chosen"], params=dict(fit["params"]), lo_bytes=float(span[0]), hi_bytes=float(span[1]))
    lo, hi = entry.lo_bytes, entry.hi_bytes
    try:
        with np.errstate(all="ignore"):
            predictor = _scalar_predictor(entry.model, entry.params)
            times = [(n, predictor(n)) for n in (lo, math.sqrt(lo * hi), hi)]
    except (KeyError, TypeError, ValueError, IndexError, ZeroDivisionError, OverflowError) as exc:
        raise InputFileError(source, f"do not describe a {entry.model} fit ({type(exc).__name__}: {shown(str(exc))})",
                             field=f"{where}.params") from None
    for nbytes, time_s in times:
        if not (isinstance(time_s, float) and math.isfinite(time_s) and time_s >= 0):
            raise InputFileError(source, f"predict {time_s!r} s for {nbytes:g} bytes; expected a finite time "
                                 ">= 0", field=f"{where}.params")
    if entry.model == "alpha_beta" and not (entry.params["beta_Bps"] > 0 and entry.params["busbw_factor"] > 0):
        raise bad("params", "beta_Bps > 0 and busbw_factor > 0", entry.params)
    return entry


class FittedCommModel:
    """`paraplan.core.CommModel` from fitted entries (see the module docstring)."""

    def __init__(self, entries: list[_Entry], source: str = "<dict>"):
        if not entries:
            raise InputFileError(source, "no fits: a comm model needs at least one fitted sweep")
        self.source = source
        self._entries = entries
        self._cache: dict[tuple[str, int, str], Callable[[float], Prediction]] = {}

    # ---- construction -------------------------------------------------------------
    @classmethod
    def from_dict(cls, document: Mapping, source: str = "<dict>") -> FittedCommModel:
        """The model of a comm_model.json document; every fit is checked here (types,
        ranges, and a finite non-negative time at its range's ends and middle), so a
        bad file is an error naming it, never a NaN or a crash later."""
        fits = document.get("fits") if isinstance(document, Mapping) else None
        if not isinstance(fits, list):
            raise InputFileError(source, "expected an object with a 'fits' list (paraplan fit's comm_model.json)")
        entries = [_entry(fit, f"fits[{i}]", source) for i, fit in enumerate(fits)]
        _check_one_chosen(entries, [fit["nodes"] for fit in fits], source)
        sweeps = {(e.collective, e.world_size, e.tier) for e in entries}
        with_ab = {(e.collective, e.world_size, e.tier) for e in entries if e.model == "alpha_beta"}
        for collective, world, tier in sorted(sweeps - with_ab):
            raise InputFileError(source, f"the {collective} sweep at {world} ranks ({tier}) has no alpha_beta fit; "
                                 "paraplan fit writes one per sweep (extrapolation needs it)", field="fits")
        return cls(entries, source)

    @classmethod
    def from_json(cls, path: str | Path) -> FittedCommModel:
        document = read_json_object(path, "a comm model (paraplan fit's comm_model.json; run `paraplan fit` first)")
        return cls.from_dict(document, str(path))

    # ---- prediction ---------------------------------------------------------------
    def time_s(self, collective: str, nbytes: float, group) -> float:
        return self.predict(collective, nbytes, group).time_s

    def predict(self, collective: str, nbytes: float, group) -> Prediction:
        if group.size <= 1:
            return Prediction(0.0)
        key = (collective, int(group.size), group.tier)
        predictor = self._cache.get(key)
        if predictor is None:
            predictor = self._cache[key] = self._resolve(*key)
        return predictor(float(nbytes))

    def measured(self) -> list[tuple[str, int, str]]:
        """(collective, world size, tier) of every fitted sweep."""
        return sorted({(e.collective, e.world_size, e.tier) for e in self._entries})

    def _find(self, collective: str, world: int, tier: str, model: str | None = None) -> _Entry | None:
        for e in self._entries:
            same_sweep = e.collective == collective and e.world_size == world and e.tier == tier
            if same_sweep and ((model is None and e.chosen) or e.model == model):
                return e
        return None

    def _resolve(self, collective: str, world: int, tier: str) -> Callable[[float], Prediction]:
        if collective == "send_recv":
            return self._link_predictor("send_recv", world, tier, (FLAG_DERIVED,), prefer="send_recv")
        fitted = collective
        if self._find(collective, world, tier) is None and not any(e.collective == collective for e in self._entries):
            fitted = _ALIASES.get(collective, collective)
        chosen = self._find(fitted, world, tier)
        ab = self._find(fitted, world, tier, "alpha_beta")
        if chosen is None or ab is None:
            return self._link_predictor(collective, world, tier, (FLAG_EXTRAPOLATED,), prefer=fitted)
        inside = _scalar_predictor(chosen.model, chosen.params)
        ab_time = _scalar_predictor("alpha_beta", ab.params)
        lo, hi = chosen.lo_bytes, chosen.hi_bytes
        at_lo, at_hi = inside(lo), inside(hi)
        ab_lo, ab_hi = ab_time(lo), ab_time(hi)
        outside = (FLAG_OUTSIDE_RANGE,)

        def one(nbytes: float) -> Prediction:
            if lo <= nbytes <= hi:
                return Prediction(inside(nbytes))
            if nbytes < lo:
                return Prediction(at_lo * ab_time(max(nbytes, 0.0)) / ab_lo, outside)
            return Prediction(at_hi * ab_time(nbytes) / ab_hi, outside)

        return one

    def _link_predictor(
        self, collective: str, world: int, tier: str, flags: tuple[str, ...], prefer: str
    ) -> Callable[[float], Prediction]:
        source, extra = self._link_source(prefer, world, tier)
        latency, bandwidth = _per_link(source)
        all_flags = flags + extra
        if collective == "all_to_allv":
            collective = "all_to_all"
        try:
            ring_time_s(collective, 1.0, world, latency, bandwidth)
        except ValueError as exc:
            raise ParaplanError(f"comm model {self.source}: {exc}") from None
        return lambda nbytes: Prediction(ring_time_s(collective, nbytes, world, latency, bandwidth), all_flags)

    def _link_source(self, prefer: str, world: int, tier: str) -> tuple[_Entry, tuple[str, ...]]:
        """The alpha-beta entry to derive per-link constants from, and extra flags."""
        fits = [e for e in self._entries if e.model == "alpha_beta"]
        point_to_point = prefer == "send_recv"
        if point_to_point:
            exact = [e for e in fits if e.collective == "broadcast" and e.world_size == 2 and e.tier == tier]
            if exact:
                return exact[0], ()
        order = {prefer: 0, "all_reduce": 1}
        tiers = (tier, "inter" if tier == "intra" else "intra")

        def distance(e: _Entry) -> tuple:
            return (
                tiers.index(e.tier),
                order.get(e.collective, 2),
                abs(math.log2(e.world_size) - math.log2(max(world, 1))),
                -e.world_size,
                e.collective,
            )

        best = min((e for e in fits if e.tier in tiers), key=distance)
        extra = []
        if best.collective != prefer and not point_to_point:
            extra.append(FLAG_OTHER_COLLECTIVE)
        if best.tier != tier:
            extra.append(FLAG_OTHER_TIER)
        return best, tuple(extra)


def fits_document(entries: list) -> dict:
    """comm_model.json's content from `fit_sweep.FitEntry` objects."""
    return {"schema_version": SCHEMA_VERSION, "fits": [e.to_dict() for e in entries]}

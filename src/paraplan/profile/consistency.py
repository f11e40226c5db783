"""Is a measured profile consistent with itself? The simulator adds up the layers'
times, so a profile whose layers sum to far more or less than the whole model's
measured step (timed in the same run, without per-layer breaks) predicts every
strategy off by about that much. Pure: reads the profile's meta (`sum_vs_whole_rel_err`,
`whole_step_s`, `min_layer_step_s`, written by `paraplan profile`).
"""

from __future__ import annotations

from collections.abc import Mapping

SUM_VS_WHOLE_TOLERANCE = 0.15
"""|sum of layers / whole step - 1| above which a profile is flagged inconsistent."""
SHORT_LAYER_S = 1e-3
"""Layers shorter than this (forward + backward) carry a timer's and a launch's
overhead each: a reason for the gap, not a cure for it."""


def profile_inconsistency(meta: Mapping[str, object]) -> str | None:
    """One sentence when the profile's layers do not add up to its whole step; None
    when they do or the profile is not measured (analytic profiles have no whole step)."""
    err = meta.get("sum_vs_whole_rel_err")
    if not isinstance(err, int | float) or abs(float(err)) <= SUM_VS_WHOLE_TOLERANCE:
        return None
    whole = meta.get("whole_step_s")
    shortest = meta.get("min_layer_step_s")
    why = (f"its shortest layer takes {float(shortest) * 1e3:.2g} ms, where per-layer timing overhead counts; "
           "or the machine's load changed while profiling"
           if isinstance(shortest, int | float) and shortest < SHORT_LAYER_S
           else "the machine's load probably changed while profiling")
    step = f" ({float(whole) * 1e3:.3g} ms)" if isinstance(whole, int | float) else ""
    return (f"the layers sum to {float(err):+.0%} of the whole step{step}, beyond +-{SUM_VS_WHOLE_TOLERANCE:.0%} "
            f"({why}): predictions from this profile are off by about as much; re-profile on an idle machine")

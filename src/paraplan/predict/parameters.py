"""How a calibrated device parameter is declared: once, as a field of
`paraplan.predict.device_model.DeviceEfficiency` (its type, default and docstring)
made with `parameter(...)` (its unit and three ranges). Everything else reads the
declaration: the constructor's check, the calibration and kernel-file readers'
rules (`paraplan.predict.calibration.EFFICIENCY_RULES`), the fitter's bounds
(`paraplan.predict.calibrate.FIT_BOUNDS`) and which parameters a layer profile
fits by default.

The three ranges, widest first:
- the domain: what the model can compute with (a fraction in (0, 1], a time >= 0);
  `DeviceEfficiency` refuses anything else;
- the valid range: what a calibration or kernel file may hold, the domain cut at
  a plausibility bound (more than a second to issue one kernel is a wrong unit);
- the fit range: what `paraplan calibrate` searches, well inside the valid range
  (no GEMM beats 95% of the datasheet peak, a kernel's fixed cost is 1-10 us).
"""

from __future__ import annotations

import math
from dataclasses import Field, dataclass, field, fields
from typing import Any

from paraplan.inputs import NumberRule


@dataclass(frozen=True)
class FitRange:
    """The range `paraplan calibrate` searches, and the optimiser's unit (its variable
    is the value divided by `scale`, so every variable moves on a scale of 1)."""

    low: float
    high: float
    scale: float = 1.0


@dataclass(frozen=True)
class Parameter:
    """One calibrated parameter's unit and ranges (see the module doc)."""

    what: str
    """The quantity with its unit, as an error names it ("seconds", "a fraction of the peak")."""
    low: float
    """Lower end of the domain and of the valid range."""
    high: float = math.inf
    """Upper end of the domain (inf: none)."""
    low_inclusive: bool = True
    plausible_high: float = math.inf
    """Upper end of the valid range where it is below `high`; `why` explains it."""
    why: str = ""
    fit: FitRange | None = None
    """None: `paraplan calibrate` never fits it (it comes from kernel fits or elsewhere)."""
    from_profile: bool = False
    """Fitted by default when calibrating on a layer profile (which determines it)."""

    @property
    def valid(self) -> NumberRule:
        """What a calibration or kernel file may hold."""
        return NumberRule(self.what, self.low, min(self.high, self.plausible_high),
                          low_inclusive=self.low_inclusive, why=self.why)

    @property
    def domain(self) -> str:
        """The domain as a constructor's error states it."""
        if math.isinf(self.high):
            return f">= {self.low:g}"
        return f"in {'[' if self.low_inclusive else '('}{self.low:g}, {self.high:g}]"

    def outside_domain(self, value: float) -> bool:
        too_low = value < self.low if self.low_inclusive else value <= self.low
        return too_low or value > self.high


def parameter(default: float, declared: Parameter) -> Any:
    """A `DeviceEfficiency` field holding a calibrated parameter."""
    return field(default=default, metadata={"parameter": declared})


def declared_parameters(cls: type) -> dict[str, Parameter]:
    """The calibrated parameters of a dataclass, in field order."""
    found: tuple[Field, ...] = fields(cls)
    return {f.name: f.metadata["parameter"] for f in found if "parameter" in f.metadata}

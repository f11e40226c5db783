"""Progress lines on stderr (rate, ETA) for the long loops of bench, plan, simulate
and validate, through tqdm. Quiet when stderr is not a terminal (Snakemake logs, CI),
so logs keep only the stages' own output.
"""

from __future__ import annotations

import sys

from tqdm import tqdm


def bar(total: int | None, desc: str, unit: str) -> tqdm:
    """A progress bar on stderr; disabled (every call a no-op) off a terminal."""
    return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, disable=None, leave=False,
                dynamic_ncols=True, mininterval=0.5)

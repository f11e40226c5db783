"""The shipped calibrations carry the contention share fitted on Korthikanti et al. 2022
Table 4 (`COMM_OVERLAP_CONTENTION`): a refit of the share that is not carried into the
calibration files would leave `predict` pricing tensor-parallel overlaps with the old one."""

from __future__ import annotations

import pytest

from paraplan.predict.calibration import load_calibration
from paraplan.predict.device_model import COMM_OVERLAP_CONTENTION


@pytest.mark.parametrize("name", ["a100-vtrain", "h100-transfer"])
def test_shipped_calibration_carries_the_fitted_share(name):
    assert load_calibration(name).efficiency.comm_overlap_contention == pytest.approx(COMM_OVERLAP_CONTENTION,
                                                                                       abs=5e-4)

"""A calibration evaluated on worker processes gives the same bytes as one process."""

import numpy as np
from test_calibrate import TRUE, structures

from paraplan.predict.calibrate import IterationTimes, cross_validate, predict_iteration_s
from paraplan.predict.calibrate_pool import PooledIterationTimes, pooled


def test_pooled_cross_validation_is_byte_identical_to_one_process():
    runs, groups = structures()
    measured = predict_iteration_s(runs, TRUE) * np.where(np.array(groups) == "h2048-L4", 1.1, 1.0)
    fitted = ("gemm_efficiency", "memory_efficiency")
    serial = cross_validate(IterationTimes(tuple(runs)), measured, groups, fitted, TRUE)
    with pooled(IterationTimes(tuple(runs)), 2) as data:
        assert isinstance(data, PooledIterationTimes)
        parallel = cross_validate(data, measured, groups, fitted, TRUE)
    assert parallel.predicted_s.tobytes() == serial.predicted_s.tobytes()
    assert parallel.fits == serial.fits


def test_one_job_is_the_data_itself():
    data = IterationTimes(tuple(structures()[0]))
    with pooled(data, 1) as same:
        assert same is data

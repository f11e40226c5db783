"""The transformer planner's estimate of the gradient reduction exposed after the last
backward (`paraplan.plan.transformer.grad_sync`): Megatron-Core's buckets
as the engine cuts them and, interleaved, each model chunk reduced once its last backward
ends. Before, the first rank's whole reduction in 40M-parameter buckets against half its
last backward priced Llama 3 405B's PP8 DP256 plans 34-36% over the engine."""

import numpy as np
import pytest

from paraplan.clusters import load_cluster
from paraplan.core.run_settings import RunSettings
from paraplan.plan.transformer.estimate import estimate
from paraplan.plan.transformer.grad_sync import _chunks_exposed_s
from paraplan.plan.transformer.space import SCHEDULES, SearchSpace, enumerate_candidates
from paraplan.predict.calibration import load_calibration
from paraplan.predict.megatron_ddp import bucket_params_for, megatron_bucket_params
from paraplan.predict.models import PRESETS
from paraplan.predict.predictor import predict_settings

CAL = load_calibration()


def test_chunks_queue_closed_form():
    """v chunks, the first (reduced last) F s, each other E s, ready G s apart: the queue
    from the n-th last chunk ends n (E - G) + F past the backward: F + (v - 1)(E - G) where
    the chunks outrun the backward, F + E - G where they hide; one chunk: no queue."""
    assert _chunks_exposed_s(0.1, 0.3, 5, 0.2) == pytest.approx(0.1 + 4 * (0.3 - 0.2), rel=1e-12)
    assert _chunks_exposed_s(0.1, 0.05, 5, 0.2) == pytest.approx(0.1 + 0.05 - 0.2, rel=1e-12)
    assert _chunks_exposed_s(0.1, 0.3, 1, 0.2) == 0.0


def test_megatron_bucket_grows_with_data_parallelism():
    """Megatron-Core's default bucket: max(40M, 1M x DP x CP) parameters, as the engine's."""
    assert bucket_params_for(32) == 40e6 and bucket_params_for(256) == 256e6
    s = RunSettings(global_batch_size=2048, data_parallel_size=128, context_parallel_size=2)
    assert bucket_params_for(256) == megatron_bucket_params(s)


def test_wide_data_parallel_estimate_tracks_the_engine():
    """Llama 3 405B on 16,384 H100 (TP 8, micro-batch 1, no recomputation, sequence
    parallel, interleaved, the embedding and loss counted as layers), PP 4 to 16 at DP 512
    to 128 with the distributed optimizer and ZeRO-3 under pipelines: the estimate was
    within 5% of the engine's iteration (-3.0% to +0.4%; before +134% at PP 4 v 32 DP 512,
    +34% to +36% at PP 8 DP 256, +8% at PP 16 DP 128). The estimate then sat 5-11% below
    the engine (0.891-0.955): it charged its buckets' contention but not `overlap_param_gather`'s
    or the pipeline transfers'. With those priced as the engine prices them
    (`overlap_terms.py`), the 2 (p v - 1) transfers on the interleaved critical path and the end
    chunks' own layers where the embedding and loss count as layers, it is +1.3% to +2.1% of
    the engine (y3; the remainder: the first rank's buckets); within 3% here, so a lost term
    (each 1-6%) fails."""
    cluster = load_cluster("dgx-h100")
    comm = CAL.comm_model(cluster)
    model = PRESETS["llama3-405b"]
    cand = enumerate_candidates(model, 16384, 2048, 8, SearchSpace(tensor_sizes=(8,)))
    pick = [int(np.flatnonzero((cand.p == p) & (cand.v == v) & (cand.zero == z) & (cand.b == 1) & (cand.acc == 3)
                               & (cand.recompute == 0) & (cand.sp == 1)
                               & (cand.schedule == SCHEDULES.index("interleaved_1f1b")))[0])
            for p, v, z in ((4, 32, 1), (8, 16, 1), (8, 16, 3), (8, 8, 3), (16, 8, 3))]
    cand = cand.take(np.array(pick))
    base = RunSettings(global_batch_size=2048)
    est = estimate(model, cand, base, cluster, comm, CAL.efficiency).iteration_s
    exact = predict_settings(model, [cand.settings(i, base) for i in range(len(cand))], cluster, comm, CAL.efficiency)
    ratio = est / np.array([r.iteration_s for r, _ in exact])
    assert np.all(np.abs(ratio - 1.0) < 0.03), ratio

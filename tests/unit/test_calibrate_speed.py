"""A calibration's fast evaluation (kernel sums, plain runs priced as rows of arrays,
pipelines of one shape run together) gives byte-identical times to pricing and
executing each run alone."""

from itertools import product

import numpy as np
import pytest

from paraplan.clusters import load_cluster
from paraplan.core.errors import StrategyError
from paraplan.core.run_settings import RunSettings
from paraplan.core.transformer import TransformerModel
from paraplan.predict.build import KernelBatch, kernel_times_by_pass, price, run_structure
from paraplan.predict.calibrate import IterationTimes
from paraplan.predict.calibration import Calibration
from paraplan.predict.device_model import DeviceEfficiency
from paraplan.predict.layer_factors import LayerTimeFactors
from paraplan.predict.price_batch import PlainRuns, is_plain
from paraplan.sim.engine import PipelineCosts, execute
from paraplan.sim.engine_batch import execute_batch
from paraplan.sim.execution import BATCH_MIN_RUNS, iteration_time_s, iteration_times_s
from paraplan.sim.schedules import BWD, FWD, OpOrder, cached_orders

EFF = DeviceEfficiency(gemm_efficiency=0.7, gemm_k_half=150.0, memory_efficiency=0.6, kernel_latency_s=3e-6,
                       host_kernel_s=20e-6, host_collective_s=40e-6, host_microbatch_s=5e-4)


def structures():
    cluster = load_cluster("dgx-a100")
    comm = Calibration("x", "none", DeviceEfficiency()).comm_model(cluster)
    out = []
    for h, layers in ((1024, 8), (2048, 8)):
        model = TransformerModel(f"h{h}", num_layers=layers, hidden_size=h, num_attention_heads=16, seq_length=512,
                                 vocab_size=8192)
        for (schedule, v), t, p, b, overlap in product(
                (("1f1b", 1), ("gpipe", 1), ("zb_h1", 1), ("interleaved_1f1b", 2)), (1, 2), (2, 4), (1, 2),
                (False, True)):
            settings = RunSettings(tensor_model_parallel_size=t, pipeline_model_parallel_size=p, micro_batch_size=b,
                                   global_batch_size=16, data_parallel_size=2, recompute_granularity="full",
                                   dtype="fp16", use_flash_attn=True, schedule=schedule,
                                   virtual_pipeline_model_parallel_size=v, overlap_grad_reduce=overlap,
                                   async_tensor_model_parallel_allreduce=t > 1 and b == 1)
            out.append(run_structure(model, settings, cluster, comm))
    return out


def reference_s(runs, eff):
    """Each run priced and executed alone (`paraplan predict`'s path)."""
    kernel_s = kernel_times_by_pass(runs, eff)
    return np.array([iteration_time_s(price(s, k, eff)) for s, k in zip(runs, kernel_s, strict=True)])


def test_a_calibrations_evaluation_is_byte_identical_to_each_run_alone():
    runs = structures()
    data = IterationTimes(tuple(runs))
    idx = np.arange(len(runs))
    for eff in (EFF, DeviceEfficiency()):
        fast = data.predict(eff, idx)
        assert fast.tobytes() == reference_s(runs, eff).tobytes()
    shapes = {(s.settings.pipeline_schedule, s.settings.pipeline_model_parallel_size, s.settings.num_microbatches)
              for s in runs}
    assert len(runs) >= BATCH_MIN_RUNS * len(shapes)  # every shape ran batched
    plain = PlainRuns.of(runs)
    assert sum(len(d.members) for d in plain.depths) == 24  # 1F1B, GPipe: no overlapped collective
    assert len(plain.others) == len(runs) - 24


def test_is_plain_names_the_runs_priced_as_rows():
    runs = structures()
    plain = [st for st in runs if is_plain(st)]
    assert {st.settings.pipeline_schedule for st in plain} == {"1f1b", "gpipe"}
    assert not any(st.settings.overlap_grad_reduce for st in plain)


def test_an_evaluation_with_layer_factors_prices_run_by_run():
    runs = structures()
    key = runs[0].layer_key
    eff = DeviceEfficiency(layer_time_factors=LayerTimeFactors((key,), (1.25,), (3,)))
    fast = IterationTimes(tuple(runs)).predict(eff, np.arange(len(runs)))
    assert fast.tobytes() == reference_s(runs, eff).tobytes()
    assert fast[0] != reference_s(runs[:1], DeviceEfficiency())[0]


def test_pass_sums_equal_each_pass_summed_alone():
    runs = structures()
    times, sums = KernelBatch.of(runs).priced(EFF)
    for st, ks, s in zip(runs, times, sums, strict=True):
        assert s.kernel_s == [float(k.sum()) for k in ks]
        assert s.weight_grad_s == [c.weight_grad_s(k) for c, k in zip(st.passes, ks, strict=True)]


@pytest.mark.parametrize("schedule,p,m,v", [("1f1b", 4, 8, 1), ("gpipe", 3, 5, 1), ("zb_h1", 4, 6, 1),
                                            ("interleaved_1f1b", 2, 4, 2), ("1f1b", 1, 3, 1),
                                            ("interleaved_1f1b", 4, 8, 3), ("eager_1f1b", 3, 6, 1),
                                            ("2bw", 3, 5, 1), ("distir_greedy", 3, 4, 1)])
def test_execute_batch_runs_each_pipeline_as_execute_does(schedule, p, m, v):
    """Byte for byte, with random op times, and with free ops and transfers (the order
    the batch runs its ops in comes from a run with unit op times, whatever the costs)."""
    rng = np.random.default_rng(7)
    nv = p * v
    costs = [PipelineCosts(*(rng.lognormal(-5, 1, size) for size in (nv, nv, nv, nv - 1, nv - 1)))
             for _ in range(6)]
    costs.append(PipelineCosts(np.zeros(nv), rng.lognormal(-5, 1, nv), np.zeros(nv), np.zeros(nv - 1),
                               rng.lognormal(-5, 1, nv - 1)))
    orders = cached_orders(schedule, p, m, 1, v)
    for run, c in zip(execute_batch(orders, costs, m), costs, strict=True):
        alone = execute(orders, c, m)
        assert run.start_s.tobytes() == alone.start_s.tobytes()
        assert run.end_s.tobytes() == alone.end_s.tobytes()
        assert (run.device == alone.device).all() and (run.vstage == alone.vstage).all()


def test_execute_batch_names_a_deadlocking_order_as_execute_does():
    bad = (OpOrder(np.array([BWD, FWD], dtype=np.int8), np.array([0, 0]), np.array([0, 0])),
           OpOrder(np.array([FWD, BWD], dtype=np.int8), np.array([0, 0]), np.array([0, 0])))
    costs = PipelineCosts.uniform(2, 1.0, 2.0)
    with pytest.raises(StrategyError, match=r"deadlocks: device 0 waits forever at op 0, B\(stage 0, micro-batch 0\)"):
        execute_batch(bad, [costs, costs], 1)


def test_iteration_times_s_of_models_equals_iteration_time_s():
    runs = structures()
    kernel_s = kernel_times_by_pass(runs, EFF)
    models = [price(s, k, EFF) for s, k in zip(runs, kernel_s, strict=True)]
    assert iteration_times_s(models).tolist() == [iteration_time_s(mo) for mo in models]

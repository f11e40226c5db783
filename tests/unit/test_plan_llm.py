"""The LLM planner: its answer equals exhaustive exact evaluation on small instances,
fits memory, is never slower than a data-parallel baseline; a model that fits
nowhere is an error with the smallest memory it would need."""

from dataclasses import replace

import numpy as np
import pytest

from paraplan.clusters import load_cluster
from paraplan.core import StrategyError
from paraplan.core.transformer import TransformerModel
from paraplan.plan.transformer.estimate import estimate
from paraplan.plan.transformer.request import TransformerPlanRequest
from paraplan.plan.transformer.search import search
from paraplan.plan.transformer.space import SCHEDULES, SearchSpace, enumerate_candidates
from paraplan.predict.calibration import load_calibration
from paraplan.predict.predictor import predict_settings, summarize

CAL = load_calibration()
SMALL = TransformerModel("small", num_layers=8, hidden_size=1024, num_attention_heads=16, seq_length=1024,
                         vocab_size=32000)


def exhaustive_best(request):
    cluster = request.cluster
    comm = CAL.comm_model(cluster)
    base = request.base_settings()
    cand = enumerate_candidates(request.model, request.num_gpus, request.global_batch_size,
                                cluster.devices_per_node, request.space)
    settings = [cand.settings(i, base) for i in range(len(cand))]
    results = predict_settings(request.model, settings, cluster, comm, CAL.efficiency)
    preds = [summarize(request.model, s, r, cluster) for r, s in results]
    fitting = [p for p in preds if p.fits_memory]
    return min(fitting, key=lambda p: p.iteration_s), len(cand)


@pytest.mark.parametrize(("gpus", "batch", "memory_gb"), [(8, 32, 80), (8, 64, 12), (4, 16, 80)])
def test_search_equals_exhaustive_exact_evaluation(gpus, batch, memory_gb):
    cluster = load_cluster("dgx-a100")
    cluster = replace(cluster, device=replace(cluster.device, memory_bytes=memory_gb * 1e9))
    request = TransformerPlanRequest(SMALL, cluster, gpus, batch)
    best, count = exhaustive_best(request)
    result = search(request, CAL.comm_model(cluster), CAL.efficiency)
    assert result.candidates == count
    assert result.plans[0].iteration_s == pytest.approx(best.iteration_s, rel=1e-12)


def test_every_dimension_is_searched():
    cand = enumerate_candidates(SMALL, 8, 32, 8, SearchSpace())
    assert set(np.unique(cand.t)) == {1, 2, 4, 8}
    assert set(np.unique(cand.p)) == {1, 2, 4, 8}
    assert {SCHEDULES[i] for i in np.unique(cand.schedule)} == set(SCHEDULES)
    assert set(np.unique(cand.v)) >= {1, 2, 4}
    assert set(np.unique(cand.recompute)) == {0, 1, 2}
    assert set(np.unique(cand.zero)) == {0, 1, 2, 3}
    assert set(np.unique(cand.sp)) == {0, 1}
    assert set(np.unique(cand.b)) == {1, 2, 4, 8, 16, 32}
    # ZeRO-2 and ZeRO-3 with and without pipelining (`space.ZERO3_PIPELINED`); sequence
    # parallelism only with TP
    assert np.any((cand.zero == 2) & (cand.p > 1))
    assert np.any((cand.zero == 3) & (cand.p > 1)) and np.any((cand.zero == 3) & (cand.p == 1))
    assert not np.any((cand.sp == 1) & (cand.t == 1))


def test_estimates_are_close_to_the_engine_for_memory():
    cluster = load_cluster("dgx-a100")
    request = TransformerPlanRequest(SMALL, cluster, 8, 32)
    base = request.base_settings()
    cand = enumerate_candidates(SMALL, 8, 32, 8, SearchSpace())
    est = estimate(SMALL, cand, base, cluster, CAL.comm_model(cluster), CAL.efficiency)
    idx = np.arange(0, len(cand), 7)
    results = predict_settings(SMALL, [cand.settings(int(i), base) for i in idx], cluster,
                               CAL.comm_model(cluster), CAL.efficiency)
    exact = np.array([r.peak_memory_bytes.max() for r, _ in results])
    assert np.abs(est.peak_memory_bytes[idx] / exact - 1).max() < 0.05


def test_plans_fit_and_no_baseline_is_faster():
    cluster = load_cluster("dgx-a100")
    request = TransformerPlanRequest(SMALL, cluster, 8, 64, top_k=4)
    result = search(request, CAL.comm_model(cluster), CAL.efficiency)
    assert 1 <= len(result.plans) <= 4
    times = [p.iteration_s for p in result.plans]
    assert times == sorted(times)
    for plan in result.plans:
        assert plan.fits_memory and plan.peak_memory_bytes <= cluster.device.memory_bytes
        assert plan.settings.num_gpus == 8
    ran = [b for b in result.baselines.values() if b is not None and b.fits_memory]
    assert ran, "pure data parallelism fits this small model"
    assert all(result.plans[0].iteration_s <= b.iteration_s for b in ran)


def test_a_model_that_fits_nowhere_says_how_much_memory_it_needs():
    cluster = load_cluster("dgx-a100")
    cluster = replace(cluster, device=replace(cluster.device, memory_bytes=0.2e9, reserved_bytes=0.0))
    # 2.4 GB of model state over 8 devices of 0.2 GB: the model state alone says it, and how many would do
    with pytest.raises(StrategyError, match=r"^small fits nowhere on 8 x A100-SXM4-80GB at global batch 32: its "
                                            r"weights, gradients and optimizer state alone are 2.4 GB \(0.1B "
                                            r"parameters x 18 bytes, bf16\), 0.3 GB per GPU even sharded over all 8, "
                                            r"against 0.2 GB each; the smallest plan needs 0.3 GB per device \(.*\)\. "
                                            r"It takes at least 13 GPUs \(the model state alone, before "
                                            r"activations\), a smaller model or a device with more memory$"):
        search(TransformerPlanRequest(SMALL, cluster, 8, 32), CAL.comm_model(cluster), CAL.efficiency)


def test_plan_command_writes_ranked_plans_in_predict_columns(tmp_path, capsys):
    from paraplan.cli.main import main
    from paraplan.plan.transformer.output import PLAN_COLUMNS

    model = tmp_path / "small.yaml"
    model.write_text("num_layers: 8\nhidden_size: 1024\nnum_attention_heads: 16\nseq_length: 1024\n"
                     "vocab_size: 32000\n")
    out = tmp_path / "plans.csv"
    code = main(["plan", "--model", str(model), "--cluster", "dgx-a100", "--gpus", "8", "--global-batch-size", "64",
                 "--top-k", "3", "-o", str(out), "--no-track"])
    assert code == 0
    import csv

    with out.open() as handle:
        rows = list(csv.DictReader(handle))
    assert tuple(rows[0]) == PLAN_COLUMNS and [r["rank"] for r in rows] == ["1", "2", "3"]
    times = [float(r["predicted_iteration_s"]) for r in rows]
    assert times == sorted(times)
    for r in rows:
        tp, pp, dp = (int(r[k]) for k in ("tensor_model_parallel_size", "pipeline_model_parallel_size",
                                          "data_parallel_size"))
        # the model file, relative to the CSV's folder, as `paraplan predict` reads it
        assert tp * pp * dp == 8 and r["fits_memory"] == "true" and r["model"] == "small.yaml"
        # 8 x 12 h^2 + 13 h per layer, embedding V h + s h, final LayerNorm 2h (tied head)
        assert r["num_parameters"] == r["active_parameters"] == str(
            8 * (12 * 1024**2 + 13 * 1024) + 32000 * 1024 + 1024 * 1024 + 2 * 1024)
        assert r["plausibility"] == ""  # a small model's MFU stays below its GEMMs' and the published
    baselines = [float(rows[0][k]) for k in ("dp_no_overlap_s", "dp_overlap_s", "dp_zero1_s", "dp_zero2_s",
                                             "dp_zero3_s") if rows[0][k]]
    assert baselines and times[0] <= min(baselines)
    assert "best: TP" in capsys.readouterr().err


def test_plan_command_errors(tmp_path, capsys):
    from paraplan.cli.main import main

    out = tmp_path / "p.csv"
    assert main(["plan", "--model", "gpt3-175b", "--cluster", "dgx-a100", "--gpus", "8",
                 "--global-batch-size", "8", "-o", str(out), "--no-track"]) == 2
    err = capsys.readouterr().err
    # one message, the model-state bound (the more specific reason) first
    assert err.splitlines()[-1] == (
        "paraplan plan: error: gpt3-175b fits nowhere on 8 x A100-SXM4-80GB at global batch 8: its weights, "
        "gradients and optimizer state alone are 3.14 TB (174.6B parameters x 18 bytes, bf16), 392.9 GB per GPU even "
        "sharded over all 8, against 84.7 GB usable of 85.1 GB each; the smallest plan needs 394.1 GB per device "
        "(pipeline rank 0: 393.3 GB of weights, gradients and optimizer state, 0.1 GB of working buffers, 0.7 GB of "
        "activations; TP 8, PP 1, DP 1, micro-batch 1, recompute full, ZeRO 0). It takes at least 38 GPUs (the "
        "model state alone, before activations), a smaller model or a device with more memory")
    assert not out.exists() and "Traceback" not in err
    assert main(["plan", "--model", "gpt3-175b", "--cluster", "dgx-a100", "-o", str(out), "--no-track"]) == 2
    assert "--gpus" in capsys.readouterr().err
    assert main(["plan", "--model", "no-such-model", "--cluster", "dgx-a100", "--gpus", "8",
                 "--global-batch-size", "8", "-o", str(out), "--no-track"]) == 2
    assert "neither a preset" in capsys.readouterr().err

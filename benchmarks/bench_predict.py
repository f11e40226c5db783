"""LLM prediction: accuracy on vTrain's single-node A100 measurements (data/published/) and speed
(issue targets, 2-core machine):

1. accuracy: MAPE of predicted_iteration_s on the 1,440 measured runs, in-sample with
   the shipped calibration and (with --cv) leave-one-model-shape-out cross-validated
   (target <= 8%); for the questions (model, GPU count, global batch) the share whose
   measured-fastest configuration is in the predicted top 3 (target >= 90%) and whose
   predicted-fastest is within 5% of the measured-fastest (target >= 90%). With --cv,
   twice: with the measured layer-time factors (each fold fits its own: every held-out
   run's layer shape was measured in other models) and with the device parameters
   alone (what a layer shape never measured gets);
2. speed: the 1,440 predictions (target < 5 s) and single predictions at 1,024 and
   3,072 GPUs (target < 50 ms each).

    python benchmarks/bench_predict.py [--cv] [--data data/published/vtrain_a100_single_node_measured.csv]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from paraplan.clusters import load_cluster
from paraplan.core.run_settings import RunSettings
from paraplan.core.transformer import TransformerModel
from paraplan.predict import calibrate as cal
from paraplan.predict.build import run_structure
from paraplan.predict.calibration import load_calibration
from paraplan.predict.models import PRESETS
from paraplan.predict.predictor import predict_rows, predict_settings
from paraplan.predict.ranking import ranking_summary
from paraplan.predict.runtable import question_label, read_run_table

DEFAULT_DATA = Path(__file__).resolve().parents[1] / "data/published/vtrain_a100_single_node_measured.csv"


def _run_table(data: Path) -> Path:
    import csv

    from paraplan.predict.vtrain import RUN_TABLE_COLUMNS, read_vtrain

    out = Path(tempfile.mkdtemp()) / "runs.csv"
    with out.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(RUN_TABLE_COLUMNS))
        writer.writeheader()
        writer.writerows(read_vtrain(data))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--cv", action="store_true", help="refit and cross-validate (a few minutes)")
    args = parser.parse_args()
    calibration = load_calibration()
    cluster = load_cluster("dgx-a100")
    comm = calibration.comm_model(cluster)
    eff = calibration.efficiency

    _, rows = read_run_table(_run_table(args.data))
    measured = np.array([r.measured_iteration_s for r in rows])
    questions = [question_label(r) for r in rows]
    best = np.inf
    for _ in range(3):
        started = time.perf_counter()
        preds = predict_rows(rows, cluster, comm, eff)
        best = min(best, time.perf_counter() - started)
    predicted = np.array([p.iteration_s for p in preds])
    e = cal.ErrorSummary.of(predicted, measured)
    r = ranking_summary(questions, predicted, measured)
    print(f"{len(rows)} predictions in {best:.2f} s (best of 3; target < 5 s)")
    print(f"in-sample with {calibration.label}: MAPE {e.mape:.2%}, median {e.median_ape:.2%}, max {e.max_ape:.1%}, "
          f"Spearman {e.spearman:.3f}; measured-fastest in predicted top 3: {r.hits}/{r.groups} ({r.hit_fraction:.0%})"
          f"; predicted-fastest within 5%: {r.picked_within_5pct}/{r.groups} ({r.pick_fraction:.0%})")
    recorded = calibration.errors.get("cross_validated")
    if recorded:
        print(f"cross-validated (recorded in the calibration file): MAPE {recorded['mape']:.2%}, median "
              f"{recorded['median_ape']:.2%}, max {recorded['max_ape']:.1%} over {recorded['groups']} model shapes")
    if args.cv:
        structures = [run_structure(x.model, x.settings, cluster, comm) for x in rows]
        labels = [f"h{x.model.hidden_size}-L{x.model.num_layers}" for x in rows]
        fit = cal.fit_efficiency(structures, measured)
        for factors, what in ((True, "with measured layer-time factors"), (False, "device parameters alone")):
            started = time.perf_counter()
            cv = cal.cross_validate(structures, measured, labels, start=fit.efficiency, layer_factors=factors,
                                    progress=lambda m: print("  " + m, flush=True))
            ec = cal.ErrorSummary.of(cv.predicted_s, measured)
            rc = ranking_summary(questions, cv.predicted_s, measured)
            print(f"cross-validated, {what} (refitted, {time.perf_counter() - started:.0f} s): MAPE {ec.mape:.2%} "
                  f"(target <= 8%), median {ec.median_ape:.2%}, max {ec.max_ape:.1%}; measured-fastest in predicted "
                  f"top 3: {rc.hits}/{rc.groups} ({rc.hit_fraction:.1%}, target >= 90%); predicted-fastest within 5%: "
                  f"{rc.picked_within_5pct}/{rc.groups} ({rc.pick_fraction:.1%}, target >= 90%)")

    gpt3 = PRESETS["gpt3-175b"]
    one_t = TransformerModel("gpt-1t", num_layers=128, hidden_size=25600, num_attention_heads=160, seq_length=2048,
                             vocab_size=51200)
    cases = [
        ("GPT-3 175B, 1,024 GPUs (8/16/8, M=192)", gpt3,
         RunSettings(tensor_model_parallel_size=8, pipeline_model_parallel_size=16, data_parallel_size=8,
                     global_batch_size=1536, micro_batch_size=1, recompute_granularity="full", dtype="fp16",
                     use_flash_attn=False)),
        ("GPT 1T, 3,072 GPUs (8/64/6, M=512)", one_t,
         RunSettings(tensor_model_parallel_size=8, pipeline_model_parallel_size=64, data_parallel_size=6,
                     global_batch_size=3072, micro_batch_size=1, recompute_granularity="full", dtype="fp16",
                     use_flash_attn=False)),
    ]
    for label, model, settings in cases:
        times = []
        for _ in range(5):
            started = time.perf_counter()
            (result, _s), = predict_settings(model, [settings], cluster, comm, eff)
            times.append(time.perf_counter() - started)
        print(f"{label}: {1e3 * min(times):.1f} ms (best of 5; target < 50 ms); iteration {result.iteration_s:.2f} s")


if __name__ == "__main__":
    main()

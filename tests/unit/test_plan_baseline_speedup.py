"""`paraplan plan` answers 'what speedup will it get?' in words: the best plan against the
fastest data-parallel baseline that fits memory (the CSV's dp_*_s columns), or that none
fits."""

import csv

from paraplan.cli.main import main
from paraplan.cli.plan import baseline_text


def test_the_summary_gives_the_speedup_over_the_fastest_baseline(tmp_path, capsys):
    out = tmp_path / "plans.csv"
    assert main(["plan", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8", "--global-batch-size", "64",
                 "--top-k", "1", "-o", str(out), "--no-track"]) == 0
    with out.open() as handle:
        (row,) = list(csv.DictReader(handle))
    times = {c.removesuffix("_s"): float(row[c]) for c in row if c.startswith("dp_") and row[c]}
    name = min(times, key=lambda n: times[n])
    speedup = times[name] / float(row["predicted_iteration_s"])
    assert speedup > 1
    assert (f"paraplan plan: speedup over the fastest data-parallel baseline ({name}, {times[name]:.3g} s): "
            f"{speedup:.2f}x\n") in capsys.readouterr().err


def test_no_fitting_baseline_is_said():
    text = baseline_text(5.0, {"dp_overlap": None})
    assert text == "no data-parallel baseline fits memory: the model needs the split"

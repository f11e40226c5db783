"""Write results/summary.md: the headline numbers of every stage (fit errors,
reproduced DistIR figures vs published, best plans per batch size, validation
errors), each with the command that reproduces it.

Give it the result files of the other stages, in any order; each is told by where it
lies: results/collectives/<cluster>/*.csv, results/fits/<cluster>/comm_model.json,
results/profiles/<model>.csv (+ .meta.json), results/simulations/<exp>/results.csv
(+ timing.json, published_comparison.csv), results/plans/*.csv, results/plans/llm/*.csv,
results/validation/*.csv, results/calibrations/*.json,
results/predict/<table>/predicted.csv, results/kernels/**/*.json. Other files are left
out (a CSV or JSON among them named in a note); none of these at all is an error.

Example:
  paraplan report results/*/*.csv results/fits/*/comm_model.json -o results/summary.md
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from paraplan.cli.common import add_output_argument, add_tracking_arguments, track
from paraplan.core import InputFileError

NAME = "report"
HELP = "summarise every stage's results in one Markdown file"
ORDER = 70


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("inputs", nargs="+", type=Path, metavar="FILE", help="result files of the stages")
    add_output_argument(parser, "output summary.md", old=["--out"])
    add_tracking_arguments(parser)


def _read_csv(path: Path, kind: str):
    """A result CSV of `kind` (a `paraplan.report.read` name), checked before pandas reads it."""
    from paraplan.report import read

    return read.read_result_csv(path, getattr(read, kind))


def _read_json(path: Path, what: str) -> dict:
    from paraplan.inputs import read_json_object

    return read_json_object(path, what)


# the numbers the summary's tables print beyond the loaders' checks (dotted keys)
_KERNEL_SUMMARY_NUMBERS = ("gemm.n_points", "gemm.mape", "gemm.heldout_mape", "gemm.params.gemm_k_half",
                           "attention.heldout_mape")
_CALIBRATION_SUMMARY_NUMBERS = ("data.measurements", "data.rows", "errors.in_sample.mape",
                                "errors.cross_validated.mape", "errors.cross_validated.median_ape",
                                "errors.cross_validated.max_ape", "errors.cross_validated.spearman",
                                "errors.ranking.measured_fastest_in_top_k",
                                "errors.ranking.predicted_fastest_within_5pct")


def _check_numbers(path: Path, data: dict, keys: tuple[str, ...]) -> None:
    """Each dotted key, where present, a number inside JSON objects: else one error
    naming the file and the key."""
    for dotted in keys:
        value: object = data
        parts = dotted.split(".")
        for i, part in enumerate(parts):
            if value is None:
                break
            if not isinstance(value, dict):
                raise InputFileError(path, f"expected a JSON object, got {value!r}", field=".".join(parts[:i]))
            value = value.get(part)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise InputFileError(path, f"expected a number, got {value!r}", field=dotted)


def _read_kernel_fit(path: Path) -> dict:
    """A kernel fit through `load_kernel_ceilings` (every check `predict` and `calibrate`
    make), then the numbers the summary prints."""
    from paraplan.kernels.ceilings import load_kernel_ceilings

    data = load_kernel_ceilings(path).to_dict()
    _check_numbers(path, data, _KERNEL_SUMMARY_NUMBERS)
    return data


def _read_calibration(path: Path) -> dict:
    """A calibration through `load_calibration`'s checks, then the numbers the summary prints."""
    from paraplan.predict.calibration import load_calibration

    load_calibration(path)
    data = _read_json(path, "a calibration (make one with `paraplan calibrate`)")
    _check_numbers(path, data, _CALIBRATION_SUMMARY_NUMBERS)
    if not isinstance(data.get("layer_time_factors", []), list):
        raise InputFileError(path, f"expected a list, got {data['layer_time_factors']!r}", field="layer_time_factors")
    return data


def _read_comm_model(path: Path) -> dict:
    """comm_model.json as the summary reads it: a `fits` list of objects, each with the
    keys its table prints (the fitted parameters are `FittedCommModel`'s to check)."""
    data = _read_json(path, "a comm model (paraplan fit's comm_model.json)")
    fits = data.get("fits", []) if isinstance(data, dict) else None
    if not isinstance(fits, list):
        raise InputFileError(path, "expected an object with a 'fits' list (paraplan fit's comm_model.json)")
    for i, entry in enumerate(fits):
        where = f"fits[{i}]"
        if not isinstance(entry, dict):
            raise InputFileError(path, f"expected a JSON object, got {entry!r}", field=where)
        for key, kind, expected in (("collective", str, "a collective's name"), ("model", str, "a model's name"),
                                    ("world_size", int, "an integer"), ("nodes", int, "an integer")):
            value = entry.get(key, 1 if key == "nodes" else None)
            if isinstance(value, bool) or not isinstance(value, kind):
                raise InputFileError(path, f"expected {expected}, got {value!r}", field=f"{where}.{key}")
        _check_numbers(path, {where: entry}, (f"{where}.heldout_gmae",))
    return data


def collect(paths: list[Path], ignored: list[Path] | None = None):
    """The stages' result files among `paths`, each told by where it lies
    (results/<stage>/...); the others are appended to `ignored`."""
    from paraplan.report.summary import StageFiles

    collectives, fits, profiles, simulations, plans, validations = {}, {}, {}, {}, {}, {}
    calibrations, predictions, llm_plans, kernels = {}, {}, {}, {}
    for path in paths:
        parts = path.parts
        if path.suffix == ".csv" and len(parts) >= 3 and parts[-3] == "collectives":
            collectives[f"{parts[-2]}/{path.stem}"] = _read_csv(path, "COLLECTIVES")
        elif path.name == "comm_model.json" and len(parts) >= 3 and parts[-3] == "fits":
            fits[parts[-2]] = _read_comm_model(path)
        elif path.suffix == ".csv" and len(parts) >= 2 and parts[-2] == "profiles":
            meta_path = path.with_name(path.stem + ".meta.json")
            profiles[path.stem] = (_read_csv(path, "PROFILE"),
                                   _read_json(meta_path, "a profile's meta JSON") if meta_path.exists() else {})
        elif path.name == "results.csv" and len(parts) >= 3 and parts[-3] == "simulations":
            timing = path.with_name("timing.json")
            comparison = path.with_name("published_comparison.csv")
            simulations[parts[-2]] = (
                _read_csv(path, "SIMULATION"),
                _read_json(timing, "a simulation's timing.json") if timing.exists() else {},
                _read_csv(comparison, "COMPARISON") if comparison.exists() else None,
            )
        elif path.suffix == ".csv" and len(parts) >= 3 and parts[-2] == "llm" and parts[-3] == "plans":
            llm_plans[path.stem] = _read_csv(path, "LLM_PLAN")
        elif path.suffix == ".csv" and len(parts) >= 2 and parts[-2] == "plans":
            plans[path.stem] = _read_csv(path, "PLAN")
        elif path.suffix == ".csv" and len(parts) >= 2 and parts[-2] == "validation":
            validations[path.stem] = _read_csv(path, "VALIDATION")
        elif path.suffix == ".json" and len(parts) >= 2 and parts[-2] == "calibrations":
            calibrations[path.stem] = _read_calibration(path)
        elif path.name == "predicted.csv" and len(parts) >= 3 and parts[-3] == "predict":
            predictions[parts[-2]] = _read_csv(path, "PREDICTION")
        elif path.suffix == ".json" and "kernels" in parts[-3:-1]:
            kernels[str(Path(*parts[parts.index("kernels") + 1:]).with_suffix(""))] = _read_kernel_fit(path)
        elif ignored is not None:
            ignored.append(path)
    return StageFiles(collectives, fits, profiles, simulations, plans, validations, calibrations, predictions,
                      llm_plans, kernels)


def run(args: argparse.Namespace) -> int:
    from paraplan.files import write_text
    from paraplan.report.summary import render
    from paraplan.track import RunLog

    missing = [p for p in args.inputs if not p.exists()]
    if missing:
        raise InputFileError(missing[0], "no such file")
    ignored: list[Path] = []
    files = collect(list(args.inputs), ignored)
    if len(ignored) == len(args.inputs):
        others = f", nor are the other {len(ignored) - 1} file(s)" if len(ignored) > 1 else ""
        raise InputFileError(ignored[0], f"no stage's result by its path{others}; expected files where the workflow "
                             "writes them, e.g. results/fits/<cluster>/comm_model.json, results/plans/*.csv, "
                             "results/predict/<table>/predicted.csv")
    tables = [p for p in ignored if p.suffix in (".csv", ".json")]  # not figures or folders the workflow passes
    if tables:
        named = ", ".join(str(p) for p in tables[:5]) + (", ..." if len(tables) > 5 else "")
        print(f"paraplan report: note: {len(tables)} file(s) are no stage's result by their path, left out: {named}",
              file=sys.stderr)
    write_text(args.output, render(files))
    print(f"paraplan report: wrote {args.output} from {len(args.inputs) - len(ignored)} result file(s)",
          file=sys.stderr)
    counts = {
        "collective_sweeps": len(files.collectives), "fits": len(files.fits),
        "profiles": len(files.profiles), "simulations": len(files.simulations),
        "plans": len(files.plans), "validations": len(files.validations),
        "calibrations": len(files.calibrations), "predictions": len(files.predictions),
        "kernel_fits": len(files.kernels),
    }
    track(args, RunLog(stage="report", run_name=args.output.stem, params=counts, artifacts=[args.output]))
    return 0

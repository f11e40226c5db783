"""Mutated real inputs, and what counts as a right answer to them.

Shared by the property-based suite (tests/test_fuzz_inputs.py, a fixed CI budget)
and the bigger fuzz run that prints figures (benchmarks/fuzz_inputs.py).

A `Target` is one kind of input file read the way a command reads it: `paraplan
ingest --format nccl-tests|param|pipedream`, `paraplan fit` on a bench CSV, the
profile CSV reader, `paraplan predict` on a run table and with a calibration file,
and a model file (`--model CONFIG.json`). Seeds are the real files in the repository's data/
(bench and profile CSVs are made from them) and the shipped config/runs and
config/calibrations files; model seeds are preset models written as files.
`classify` runs a target on some bytes and names the outcome:
- "ok": exit 0, and every number in the output is finite, non-negative and in range
  (and what ingest wrote, fit reads);
- "error": a `ParaplanError` (exit 2, one line on stderr) whose message names the file;
- "crash": any other exception or exit status, a traceback, or an error that does not
  name the file;
- "silent": an output with NaN, infinity, a negative or out-of-range number, or any
  output at all for an input that carried a value its format forbids (a targeted
  mutation).
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
import re
import tempfile
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from paraplan.cli.main import main
from paraplan.comm.fit_input import FITTED_COLLECTIVES, read_sweep_csv
from paraplan.comm.log_common import rows_frame
from paraplan.comm.nccl_tests import read_nccl_tests
from paraplan.comm.param_log import read_param
from paraplan.comm.results import MAX_ALGBW_GBPS, MAX_SIZE_BYTES, SWEEP_RULES, bench_frame
from paraplan.core import ParaplanError
from paraplan.core.moe_router_settings import LOAD_BALANCING_TYPES, ROUTER_COLUMNS, ROUTER_DTYPES, SCORE_FUNCTIONS
from paraplan.core.precision_settings import LOW_PRECISION_COLUMNS, MAIN_GRADS_DTYPES, MAIN_PARAMS_DTYPES, STATE_DTYPES
from paraplan.core.run_settings import (
    CP_COMM_TYPES,
    CROSS_ENTROPY_IMPLS,
    DTYPES,
    ELEMENTWISE_KERNELS,
    FP8_RECIPE_CHOICES,
    OPTIMIZER_IMPLS,
    PIPELINE_SCHEDULES,
    RECOMPUTE_GRANULARITIES,
)
from paraplan.inputs import NumberRule
from paraplan.predict.calibration import EFFICIENCY_RULES
from paraplan.predict.models import PRESETS, load_model
from paraplan.predict.peak_memory import PEAK_MEMORY_COLUMNS
from paraplan.predict.runtable import _PARSERS as RUNTABLE_PARSERS
from paraplan.predict.runtable import COUNT_RULE, REQUIRED, SECONDS_RULE
from paraplan.profile.io import BATCH_SIZE_RULE, LAYER_RULES, profile_to_csv_text, read_profile
from paraplan.profile.pipedream import read_pipedream

DATA = Path(__file__).resolve().parent.parent / "data"
CONFIG = Path(__file__).resolve().parent.parent / "config"

# Budgets. "paraplan-ci" is what `pytest` runs: derandomized (the same examples on
# every run), no example database, bounded per test so the suite stays under a minute
# on two cores. "paraplan-fuzz" is the bigger run of benchmarks/fuzz_inputs.py.
settings.register_profile(
    "paraplan-ci", max_examples=100, derandomize=True, database=None, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "paraplan-fuzz", max_examples=2000, derandomize=True, database=None, deadline=None,
    suppress_health_check=list(HealthCheck),
)

OUTCOMES = ("ok", "error", "crash", "silent")


@dataclass(frozen=True)
class Outcome:
    kind: str  # one of OUTCOMES
    detail: str = ""


@dataclass(frozen=True)
class Field:
    """A span of a seed's text that a reader parses with `rule` (a targeted mutation
    replaces it)."""

    line: int  # 0-based index into the seed's lines
    start: int
    end: int
    rule: NumberRule


@dataclass(frozen=True)
class Target:
    name: str
    file_name: str  # what the mutated bytes are saved as (pipedream needs -pbs-N)
    seeds: tuple[str, ...]
    run: Callable[[Path, Path], list[str]]  # (input, folder) -> problems with the output
    fields: Callable[[str], list[Field]]  # the numbers a targeted mutation may break


# ---- reading outputs ------------------------------------------------------------------


def _out_of_range(values: np.ndarray, rule: NumberRule, name: str) -> list[str]:
    values = np.asarray(values, dtype=float)
    bad = [v for v in values if rule.problem(float(v)) is not None]
    return [f"{name} = {bad[0]!r}: {rule.problem(float(bad[0]))}"] if bad else []


def _check_bench_csv(path: Path) -> list[str]:
    """A bench CSV written by ingest: plausible values, and fit's reader accepts it."""
    frame = pd.read_csv(path)
    problems = []
    for column in ("world_size", "nodes", "size_bytes", "count", "time_us"):
        problems += _out_of_range(frame[column].to_numpy(), SWEEP_RULES[column], column)
    for column in ("algbw_GBps", "busbw_GBps"):
        values = frame[column].to_numpy(float)
        if not np.all(np.isfinite(values) & (values >= 0)):
            problems.append(f"{column} not finite and >= 0")
    if (frame["size_bytes"] <= 0).any():
        problems.append("a zero-size row was kept")
    if not problems and (frame["world_size"] >= 2).all():
        try:
            read_sweep_csv(path)
        except ParaplanError as exc:
            problems.append(f"ingest wrote a CSV that fit refuses: {exc}")
    return problems


def _check_profile(profile) -> list[str]:
    problems = []
    for column, rule in LAYER_RULES.items():
        if column == "flops":
            continue
        problems += _out_of_range(getattr(profile, column), rule, column)
    if BATCH_SIZE_RULE.problem(profile.batch_size):
        problems.append(f"batch_size {profile.batch_size}")
    totals = [profile.fwd_s.sum(), profile.bwd_s.sum(), profile.activation_bytes.sum(), profile.param_bytes.sum()]
    if not all(math.isfinite(t) for t in totals):
        problems.append("a sum over layers is not finite")
    return problems


def _finite_numbers(obj: object, where: str = "") -> list[str]:
    """Every number in a JSON document is finite (json.loads took NaN if it was there)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return [f"{where or 'value'} = {obj}"]
    if isinstance(obj, dict):
        return [p for k, v in obj.items() for p in _finite_numbers(v, f"{where}.{k}")]
    if isinstance(obj, list):
        return [p for i, v in enumerate(obj) for p in _finite_numbers(v, f"{where}[{i}]")]
    return []


# ---- running a command --------------------------------------------------------------


class CommandFailed(Exception):
    """The command ended with a status other than 0 or 2, or printed a traceback."""


def _command(args: Sequence[str]) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main([*args, "--no-track"])
    text = err.getvalue()
    if code not in (0, 2) or "Traceback" in text:
        raise CommandFailed(f"exit {code}: {text[-500:]}")
    if code == 2:
        errors = [line for line in text.splitlines() if ": error: " in line]
        raise ParaplanError(errors[-1] if errors else text)
    return code, text


def _run_ingest(fmt: str) -> Callable[[Path, Path], list[str]]:
    def run(path: Path, folder: Path) -> list[str]:
        out = folder / "out.csv"
        _command(["ingest", "--format", fmt, str(path), "-o", str(out)])
        if fmt != "pipedream":
            return _check_bench_csv(out)
        profile = read_profile(out)  # what ingest wrote must read back
        return _check_profile(profile)

    return run


def _run_profile(path: Path, folder: Path) -> list[str]:
    del folder
    return _check_profile(read_profile(path, batch_size=8))


def _run_fit(path: Path, folder: Path) -> list[str]:
    from paraplan.comm.model import FittedCommModel
    from paraplan.core import Group

    out = folder / "comm_model.json"
    _command(["fit", str(path), "-o", str(out), "--a2av-out", str(folder / "a2av.csv")]
             if "global_batch" in path.read_text(errors="replace").split("\n", 1)[0]
             else ["fit", str(path), "-o", str(out)])
    document = json.loads(out.read_text())  # strict JSON: NaN would not parse as a number here
    problems = _finite_numbers(document)
    model = FittedCommModel.from_dict(document, str(out))
    for collective, world, tier in model.measured():
        group = Group(world, 1 if tier == "intra" else 2)
        for nbytes in (1.0, 1e3, 1e6, 1e9, 2.0**50):
            time_s = model.time_s(collective, nbytes, group)
            if not (math.isfinite(time_s) and time_s >= 0):
                problems.append(f"{collective} n={world}: time_s({nbytes:g}) = {time_s}")
    return problems


_PREDICTED_RULES = {
    "predicted_iteration_s": NumberRule("s", 0, 1e12, low_inclusive=False),
    "predicted_tflops_per_gpu": NumberRule("TFLOP/s", 0, 1e6),
    "predicted_mfu": NumberRule("a fraction", 0, 2),  # 6 x params x tokens counts an untied input embedding
    "predicted_peak_memory_bytes": NumberRule("bytes", 0, 1e30),
    **{part: NumberRule("bytes", 0, 1e30) for part in PEAK_MEMORY_COLUMNS[1:]},
    "bubble_fraction": NumberRule("a fraction", 0, 1, ),
}


_A100_TFLOPS = NumberRule("TFLOP/s", 0, 2 * 312.0)  # Megatron's count: full s^2 attention, causal kernels do half


def _run_predict(runs: Path, folder: Path, calibration: Path | None = None) -> list[str]:
    """`paraplan predict` on a run table; every prediction finite and in range."""
    out = folder / "predicted.csv"
    args = ["predict", str(runs), "--cluster", "dgx-a100", "-o", str(out)]
    _command(args + (["--calibration", str(calibration)] if calibration else []))
    frame = pd.read_csv(out)
    problems = _out_of_range(frame["predicted_tflops_per_gpu"].to_numpy(float), _A100_TFLOPS,
                             "predicted_tflops_per_gpu")
    for column, rule in _PREDICTED_RULES.items():
        problems += _out_of_range(frame[column].to_numpy(float), rule, column)
    parts = frame[list(PEAK_MEMORY_COLUMNS[1:])].to_numpy(float).sum(axis=1)
    peak = frame["predicted_peak_memory_bytes"].to_numpy(float)
    problems += [f"memory parts add up to {a:.0f}, not predicted_peak_memory_bytes {b:.0f}"
                 for a, b in zip(parts, peak, strict=True) if not np.isclose(a, b, rtol=1e-12, atol=2)]
    return problems


def _run_calibration(runs: Path) -> Callable[[Path, Path], list[str]]:
    def run(path: Path, folder: Path) -> list[str]:
        return _run_predict(runs, folder, calibration=path)

    return run


def _run_model(path: Path, folder: Path) -> list[str]:
    del folder
    model = load_model(str(path))
    numbers = {"num_parameters": float(model.num_parameters),
               "model_flops_per_iteration": model.model_flops_per_iteration(8, 0.0)}
    return [f"{k} = {v}" for k, v in numbers.items() if not (math.isfinite(v) and v > 0)]


# ---- seeds and their fields ---------------------------------------------------------


def _read(path: Path) -> str:
    return path.read_text()


def _thinned_bench_csv(frame: pd.DataFrame, keep: int) -> str:
    step = max(1, len(frame) // keep)
    return frame.iloc[::step].to_csv(index=False, lineterminator="\n")


def _a2av_csv() -> str:
    """An all_to_all sweep and three uneven all_to_allv samples at 2 ranks, one file."""
    sizes = 2 ** np.arange(10, 17)
    sweep = bench_frame("all_to_all", "gloo", 2, 1, sizes, sizes // 8, "float32", 30 + sizes / 2e3)
    samples = bench_frame(
        "all_to_allv", "gloo", 2, 1, [8192, 65536, 24576], [2048, 16384, 6144], "float32", [40.0, 70.0, 50.0],
        extra={"sample": [0, 1, 2], "global_batch": [256, 1024, 512], "tables_per_rank": ["1-2", "4-1", "3-3"],
               "dim": [32, 64, 32]},
    )
    return pd.concat([sweep, samples], ignore_index=True).to_csv(index=False, lineterminator="\n")


def _token_fields(text: str, select: Callable[[list[str]], dict[int, NumberRule]]) -> list[Field]:
    """Whitespace-separated tokens chosen by `select(tokens)` on each line."""
    fields = []
    for index, line in enumerate(text.splitlines()):
        spans = [(m.start(), m.end()) for m in re.finditer(r"\S+", line)]
        for position, rule in select([line[a:b] for a, b in spans]).items():
            fields.append(Field(index, *spans[position], rule))
    return fields


def _nccl_fields(text: str) -> list[Field]:
    def select(tokens: list[str]) -> dict[int, NumberRule]:
        if len(tokens) == 13 and tokens[0].isdigit() and tokens[1].isdigit() and int(tokens[0]) > 0:
            return {0: SWEEP_RULES["size_bytes"], 1: SWEEP_RULES["count"], 5: SWEEP_RULES["time_us"]}
        return {}

    return _token_fields(text, select)


def _param_fields(text: str) -> list[Field]:
    def select(tokens: list[str]) -> dict[int, NumberRule]:
        if len(tokens) >= 10 and tokens[0].startswith("COMMS-RES-") and tokens[1].isdigit() and int(tokens[1]) > 0:
            return {1: SWEEP_RULES["size_bytes"], 2: SWEEP_RULES["count"], 3: SWEEP_RULES["time_us"]}
        return {}

    return _token_fields(text, select)


_MS_RULE = NumberRule("ms", 0, LAYER_RULES["fwd_s"].high * 1e3)
_PIPEDREAM_KEYS = {
    "forward_compute_time": _MS_RULE,
    "backward_compute_time": _MS_RULE,
    "activation_size": LAYER_RULES["activation_bytes"],
    "parameter_size": LAYER_RULES["param_bytes"],
}


def _pipedream_fields(text: str) -> list[Field]:
    fields = []
    for index, line in enumerate(text.splitlines()):
        for key, rule in _PIPEDREAM_KEYS.items():
            found = re.search(rf"\b{key}=([0-9.eE+-]+)(?=,|$)", line)
            if found and not line[:1].isspace():
                fields.append(Field(index, found.start(1), found.end(1), rule))
    return fields


def _csv_fields(text: str, rules: dict[str, NumberRule], data_line: Callable[[list[str]], bool]) -> list[Field]:
    """Cells of the named columns in a CSV whose cells hold no commas or quotes."""
    lines = text.splitlines()
    header = lines[0].split(",")
    fields = []
    for index, line in enumerate(lines[1:], start=1):
        cells = line.split(",")
        if len(cells) != len(header) or '"' in line or not data_line(dict(zip(header, cells, strict=True))):
            continue
        starts = np.cumsum([0] + [len(c) + 1 for c in cells])
        for column, rule in rules.items():
            if column in header:
                i = header.index(column)
                fields.append(Field(index, int(starts[i]), int(starts[i]) + len(cells[i]), rule))
    return fields


def _profile_fields(text: str) -> list[Field]:
    """The four numbers that end each row (names may hold quoted commas)."""
    rules = [LAYER_RULES[c] for c in ("fwd_s", "bwd_s", "activation_bytes", "param_bytes")]
    fields = []
    for index, line in enumerate(text.splitlines()[1:], start=1):
        cells = line.rsplit(",", 4)[1:]
        start = len(line) - sum(len(c) + 1 for c in cells) + 1
        for cell, rule in zip(cells, rules, strict=True):
            fields.append(Field(index, start, start + len(cell), rule))
            start += len(cell) + 1
    return fields


_BENCH_RULES = {c: SWEEP_RULES[c] for c in ("world_size", "nodes", "size_bytes", "count", "time_us")}


def _bench_fields(text: str) -> list[Field]:
    return _csv_fields(text, _BENCH_RULES, lambda cells: cells.get("global_batch", "") == "")


_RUN_RULES = {**{c: COUNT_RULE for c in (*REQUIRED, "micro_batch_size", "num_gpus")},
              "measured_iteration_s": SECONDS_RULE}


def _run_table_fields(text: str) -> list[Field]:
    return _csv_fields(text, _RUN_RULES, lambda cells: True)


def _json_fields(rules: dict[str, NumberRule]) -> Callable[[str], list[Field]]:
    """The first `"key": number` span of each key with a rule in a JSON text (later
    ones are records, e.g. a calibration's assumptions, not values read)."""
    def fields(text: str) -> list[Field]:
        found: dict[str, Field] = {}
        for index, line in enumerate(text.splitlines()):
            for match in re.finditer(r'"(\w+)": (-?[0-9][0-9.eE+-]*)', line):
                if match.group(1) in rules and match.group(1) not in found:
                    found[match.group(1)] = Field(index, match.start(2), match.end(2), rules[match.group(1)])
        return list(found.values())

    return fields


_MODEL_RULES = {key: COUNT_RULE for key in (
    "num_layers", "hidden_size", "num_attention_heads", "seq_length", "vocab_size", "num_hidden_layers",
    "max_position_embeddings", "intermediate_size")}


def _model_seeds() -> tuple[str, ...]:
    """Own-field files of two presets and a Hugging Face config.json of Llama 3 8B."""
    own = [{k: v for k, v in vars(PRESETS[name]).items() if k != "name"} for name in ("gpt3-1.3b", "llama3-8b")]
    llama = PRESETS["llama3-8b"]
    hf = {"model_type": "llama", "num_hidden_layers": llama.num_layers, "hidden_size": llama.hidden_size,
          "num_attention_heads": llama.num_attention_heads, "num_key_value_heads": llama.num_query_groups,
          "intermediate_size": llama.ffn_hidden_size, "vocab_size": llama.vocab_size,
          "max_position_embeddings": llama.seq_length, "hidden_act": "silu", "rms_norm_eps": 1e-05,
          "rope_theta": 500000.0, "tie_word_embeddings": False, "attention_bias": False}
    return tuple(json.dumps(seed, indent=2) for seed in (*own, hf))


def targets(data: Path = DATA, config: Path = CONFIG) -> dict[str, Target]:
    """The targets, seeded from `data` (the repository's data/)."""
    # logs that name their collective (a '*_perf' line): the fuzzed ingest passes no --collective
    logs = [p for p in sorted((data / "nccl-tests").glob("*.txt")) if "_perf" in _read(p)]
    param = data / "param" / "param_gloo_cpu_2ranks_blocking.txt"
    graphs = sorted((data / "pipedream-profiles").glob("*.txt"))
    profiles = [profile_to_csv_text(read_pipedream(g)) for g in graphs[:4]]
    sweeps = [rows_frame(read_nccl_tests(log).rows) for log in logs] + [rows_frame(read_param(param).rows)]
    bench_csvs = [_thinned_bench_csv(frame, 8) for frame in sweeps] + [_a2av_csv()]
    run_tables = tuple(_read(p) for p in sorted((config / "runs").glob("*.csv")))
    fixed_runs = Path(tempfile.mkdtemp(prefix="paraplan-fuzz-")) / "runs.csv"  # what a calibration predicts
    fixed_runs.write_text(run_tables[0])
    return {
        "ingest nccl-tests": Target("ingest nccl-tests", "log.txt", tuple(_read(p) for p in logs),
                                    _run_ingest("nccl-tests"), _nccl_fields),
        "ingest param": Target("ingest param", "param.txt", (_read(param),), _run_ingest("param"), _param_fields),
        "ingest pipedream": Target("ingest pipedream", "graph-pbs-8.txt", tuple(_read(g) for g in graphs),
                                   _run_ingest("pipedream"), _pipedream_fields),
        "profile csv": Target("profile csv", "profile.csv", tuple(profiles), _run_profile, _profile_fields),
        "fit": Target("fit", "sweep.csv", tuple(bench_csvs), _run_fit, _bench_fields),
        "predict runs": Target("predict runs", "runs.csv", run_tables, _run_predict, _run_table_fields),
        "calibration": Target("calibration", "calibration.json", ((config / "calibrations" / "a100-vtrain.json")
                              .read_text(),), _run_calibration(fixed_runs), _json_fields(EFFICIENCY_RULES)),
        "model file": Target("model file", "model.json", _model_seeds(), _run_model, _json_fields(_MODEL_RULES)),
    }


# ---- classifying --------------------------------------------------------------------


def classify(target: Target, data: bytes, folder: Path, forbidden: bool = False) -> Outcome:
    """Run `target` on `data` (saved in `folder`); `forbidden` says the input carries a
    value its format does not allow, so any output is a silent acceptance."""
    with tempfile.TemporaryDirectory(dir=folder) as own:
        return _classify(target, data, Path(own), forbidden)


def _classify(target: Target, data: bytes, folder: Path, forbidden: bool) -> Outcome:
    path = folder / target.file_name
    path.write_bytes(data)
    try:
        problems = target.run(path, folder)
    except ParaplanError as exc:
        if str(path) not in str(exc):
            return Outcome("crash", f"error without the file name: {exc}")
        if "\n" in str(exc).strip():
            return Outcome("crash", f"error of several lines: {exc}")
        left = sorted(p.name for p in folder.iterdir() if p != path)
        if left:
            return Outcome("crash", f"an error left {left} behind: {exc}")
        return Outcome("error", str(exc))
    except Exception as exc:
        where = traceback.extract_tb(exc.__traceback__)[-1]
        return Outcome("crash", f"{type(exc).__name__} at {where.filename}:{where.lineno}: {exc}"[:500])
    if problems:
        return Outcome("silent", "; ".join(problems)[:500])
    if forbidden:
        return Outcome("silent", "a forbidden value was accepted")
    return Outcome("ok")


# ---- mutations ----------------------------------------------------------------------

NASTY_NUMBERS = (
    "nan", "NaN", "inf", "-inf", "Infinity", "-1", "-0", "0", "0.0", "1e308", "1e309", "1e-300", "1e300",
    "-1e-300", str(2**63), str(2**64), str(-(2**63)), "9" * 400, "1_000", "\u0661\u0662", "0x10", "1e",
    "+5", "5.", ".5", "1,5", "", "-", "N/A", "1e-324", "4.9e-324",
)
_BAD_BYTES = (b"\x00", b"\xff", b"\xc3", b"\xe2\x82", b"\r", b"\t", b",", b";", b'"', b"[", b"]", b"#", b"\xef\xbb\xbf")


def nasty_number() -> st.SearchStrategy[str]:
    return st.one_of(
        st.sampled_from(NASTY_NUMBERS),
        st.floats(allow_nan=True, allow_infinity=True).map(repr),
        st.integers(min_value=-(2**70), max_value=2**70).map(str),
    )


def forbidden_value(rule: NumberRule) -> st.SearchStrategy[str]:
    """Text that `rule` must refuse: not finite, negative, out of range, not an
    integer where one is expected, or not a number at all (no separators, so the
    line keeps its columns)."""
    options = [
        st.sampled_from(["nan", "NaN", "inf", "-inf", "Infinity", "1e309", "-1e309"]),
        st.floats(max_value=-1e-9, allow_nan=False, allow_infinity=False).map(repr),
        st.floats(min_value=rule.high * 1.001 + 1, allow_nan=False, allow_infinity=False).map(repr),
        st.integers(min_value=int(rule.high) + 1, max_value=2**80).map(str),
        st.from_regex(r"[A-DF-MO-Za-df-mo-z_]{1,6}", fullmatch=True),
    ]
    if rule.low > 0:
        options.append(st.floats(min_value=0, max_value=rule.low, exclude_max=rule.low_inclusive).map(repr))
    if rule.integer:
        options.append(st.integers(min_value=1, max_value=2**40).map(lambda n: f"{n}.5"))
    return st.one_of(*options)


@st.composite
def mutated(draw, seeds: Sequence[str]) -> bytes:
    """A seed with one to three blind mutations (numbers, lines, bytes, huge fields)."""
    lines = draw(st.sampled_from(seeds)).encode().split(b"\n")
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        kind = draw(st.sampled_from(("number", "number", "number", "delete", "duplicate", "swap", "truncate",
                                     "bytes", "long field", "token text", "repeat")))
        i = draw(st.integers(min_value=0, max_value=len(lines) - 1))
        if kind == "number":
            parts = re.split(rb"([\s,=;\[\]]+)", lines[i])
            numbers = [j for j, p in enumerate(parts) if re.fullmatch(rb"[-+]?[0-9.]+(?:[eE][-+]?[0-9]+)?", p)]
            if numbers:
                parts[draw(st.sampled_from(numbers))] = draw(nasty_number()).encode()
                lines[i] = b"".join(parts)
        elif kind == "delete" and len(lines) > 1:
            del lines[i]
        elif kind == "duplicate":
            lines.insert(i, lines[i])
        elif kind == "swap":
            j = draw(st.integers(min_value=0, max_value=len(lines) - 1))
            lines[i], lines[j] = lines[j], lines[i]
        elif kind == "truncate":
            data = b"\n".join(lines)
            lines = data[: draw(st.integers(min_value=0, max_value=len(data)))].split(b"\n")
        elif kind == "bytes":
            at = draw(st.integers(min_value=0, max_value=len(lines[i])))
            extra = draw(st.one_of(st.sampled_from(_BAD_BYTES), st.binary(min_size=1, max_size=6)))
            lines[i] = lines[i][:at] + extra + lines[i][at:]
        elif kind == "long field":
            at = draw(st.integers(min_value=0, max_value=len(lines[i])))
            lines[i] = lines[i][:at] + b"7" * draw(st.integers(min_value=131_000, max_value=140_000)) + lines[i][at:]
        elif kind == "token text":
            parts = lines[i].split(b" ")
            j = draw(st.integers(min_value=0, max_value=len(parts) - 1))
            parts[j] = draw(st.text(max_size=8)).encode("utf-8", "surrogatepass")
            lines[i] = b" ".join(parts)
        elif kind == "repeat":
            lines = lines + lines
    return b"\n".join(lines)


@st.composite
def with_forbidden_value(draw, target: Target) -> bytes:
    """A seed with one number the reader parses replaced by a value its rule forbids."""
    seeds = [s for s in target.seeds if target.fields(s)]
    text = draw(st.sampled_from(seeds))
    field = draw(st.sampled_from(target.fields(text)))
    lines = text.split("\n")
    line = lines[field.line]
    lines[field.line] = line[: field.start] + draw(forbidden_value(field.rule)) + line[field.end :]
    return "\n".join(lines).encode()


# ---- fitting any valid sweep --------------------------------------------------------


@st.composite
def valid_sweeps(draw):
    """(collective, world size, sizes in bytes, times in s) of any sweep the bench-CSV
    reader lets through: 2 to 12 distinct sizes up to 2^50 bytes, times from 1 ns to
    1000 s, no bandwidth above 100 TB/s."""
    sizes = sorted(draw(st.sets(st.integers(min_value=1, max_value=MAX_SIZE_BYTES), min_size=2, max_size=12)))
    times_us = [draw(st.floats(min_value=max(1e-3, size / (MAX_ALGBW_GBPS * 1e3)), max_value=1e9)) for size in sizes]
    collective = draw(st.sampled_from(FITTED_COLLECTIVES))
    world = draw(st.integers(min_value=2, max_value=2**20))
    return collective, world, np.array(sizes, dtype=float), np.array(times_us) * 1e-6


def classify_sweep(sweep) -> Outcome:
    """"ok" when fit_sweep gives exactly one chosen model, finite parameters and
    in-sample errors, strict JSON, and a comm model with finite non-negative times;
    "silent" when a number is not; "crash" on any exception."""
    from paraplan.comm.fit_sweep import fit_sweep
    from paraplan.comm.model import FittedCommModel, fits_document
    from paraplan.core import Group

    collective, world, sizes, times_s = sweep
    try:
        entries = fit_sweep(collective, world, 1, sizes, times_s)
        document = json.loads(json.dumps(fits_document(entries), allow_nan=False))
        model = FittedCommModel.from_dict(document)
        times = [model.time_s(collective, nbytes, Group(world))
                 for nbytes in (1.0, sizes[0], math.sqrt(sizes[0] * sizes[-1]), sizes[-1], 2.0**50)]
    except Exception as exc:
        return Outcome("crash", f"{type(exc).__name__}: {exc}"[:500])
    problems = [] if sum(e.chosen for e in entries) == 1 else ["not exactly one chosen model"]
    problems += [f"gmae {f['gmae']}" for f in document["fits"] if f["gmae"] is None or f["gmae"] < 0]
    problems += _finite_numbers([f["params"] for f in document["fits"]], "params")
    problems += [f"time_s {t}" for t in times if not (math.isfinite(t) and t >= 0)]
    return Outcome("silent", "; ".join(problems)[:500]) if problems else Outcome("ok")


# ---- run tables: round 5's settings columns, mutated on real rows (y1-hostile) ---------------

_ANNOTATIONS = ("published_value", "published_unit", "published_peak_memory_GiB", "flops_convention", "source",
                "note", "not_expressible", "measured_iteration_s")


def _benchmark_row(file_name: str, index: int) -> dict[str, str]:
    path = Path(__file__).resolve().parent.parent / "benchmarks" / "data" / file_name
    with path.open(encoding="utf-8-sig", newline="") as handle:
        row = list(csv.DictReader(handle))[index]
    return {k: v for k, v in row.items() if k not in _ANNOTATIONS}


RUN_TABLE_BASES: dict[str, dict[str, str]] = {
    "dense": _benchmark_row("megatron_bridge_h100_llama3_fp8.csv", 1),  # llama3-70b, fp8 tensorwise
    "moe": _benchmark_row("megatron_bridge_h100_moe.csv", 3),  # qwen3-30b-a3b
    "titan": _benchmark_row("torchtitan_llama31_h100.csv", 0),  # llama3-8b, FSDP2, foreach, eager
    "auto": _benchmark_row("automodel_h100_moe.csv", 2),  # qwen3-30b-a3b, FSDP2, fake_balanced_gate
    "dsv3": _benchmark_row("deepseek_v3_report.csv", 0),  # deepseek-v3, DualPipe, precision-aware optimizer
}
"""Valid rows (published test-set rows without their annotations) the mutations start from."""
NEW_COLUMNS: tuple[str, ...] = (
    *ROUTER_COLUMNS, *LOW_PRECISION_COLUMNS, "fp8_recipe", "enable_fsdp_float8_all_gather",
    "precompute_float8_dynamic_scale_for_fsdp", "cp_comm_type", "context_parallel_size", "use_torch_fsdp2",
    "optimizer_impl", "cross_entropy_impl", "schedule", "chunked_attention", "zero_stage", "dtype",
    "use_distributed_optimizer", "expert_model_parallel_size", "recompute_granularity", "selective_ac_option",
    "elementwise_kernels",
)
_ODD_CELLS: tuple[str, ...] = ("", " 1 ", "0", "-1", "1e30", "nan", "inf", "-inf", "1.5", "0x10", "1_000", "TRUE",
                               "é", "fp8_e4m3", "torch_allgather", "dualpipe", "torchao_tensorwise", "foreach")
_TRY_CELLS: tuple[str, ...] = (*_ODD_CELLS, "1", "2", "4", "8", "64", "0.5", "1e6", "true", "false", "bf16", "fp16",
                               "fp32", "fp8", "fp64", "op", "full", "selective", "none")


_CHOICES: tuple[str, ...] = (
    *LOAD_BALANCING_TYPES, *SCORE_FUNCTIONS, *ROUTER_DTYPES, *MAIN_GRADS_DTYPES, *MAIN_PARAMS_DTYPES, *STATE_DTYPES,
    *CP_COMM_TYPES, *CROSS_ENTROPY_IMPLS, *DTYPES, *ELEMENTWISE_KERNELS, *FP8_RECIPE_CHOICES, *OPTIMIZER_IMPLS,
    *PIPELINE_SCHEDULES, *RECOMPUTE_GRANULARITIES,
)


def _valid_cells(column: str) -> tuple[str, ...]:
    """Every cell of `_TRY_CELLS` and of the column's choices that its parser accepts."""
    parse = RUNTABLE_PARSERS[column]
    options = (*_TRY_CELLS, *_CHOICES)
    accepted = []
    for text in options:
        with contextlib.suppress(ValueError):
            parse(text)
            accepted.append(text)
    return tuple(dict.fromkeys(accepted))


def run_table_mutations(seed: int, count: int) -> list[dict[str, str]]:
    """`count` rows: a base row with one to three of `NEW_COLUMNS` set, most to a value
    its parser accepts (valid values in invalid combinations), some to `_ODD_CELLS`."""
    rng = np.random.default_rng(seed)
    valid = {column: _valid_cells(column) for column in NEW_COLUMNS}
    rows = []
    for _ in range(count):
        cells = dict(RUN_TABLE_BASES[str(rng.choice(list(RUN_TABLE_BASES)))])
        for _ in range(int(rng.integers(1, 4))):
            column = str(rng.choice(NEW_COLUMNS))
            cells[column] = str(rng.choice(valid[column] if rng.random() < 0.85 else _ODD_CELLS))
        rows.append(cells)
    return rows


def classify_run_row(cells: dict[str, str], folder: Path) -> Outcome:
    """`paraplan predict` on a one-row table: "ok" with finite, positive time, memory,
    TFLOP/s and MFU; "error" with one line naming the file and line 2; else "crash" or
    "silent"."""
    runs, out = folder / "runs.csv", folder / "out.csv"
    out.unlink(missing_ok=True)
    with runs.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(cells))
        writer.writeheader()
        writer.writerow(cells)
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
            code = main(["predict", str(runs), "--cluster", "dgx-h100", "-o", str(out), "--no-track"])
    except Exception:
        return Outcome("crash", traceback.format_exc()[-800:])
    err = stderr.getvalue()
    if code == 0:
        row = pd.read_csv(out).iloc[0]
        bad = [f"{k} = {row[k]!r}" for k in ("predicted_iteration_s", "predicted_peak_memory_bytes",
                                             "predicted_tflops_per_gpu", "predicted_mfu")
               if not (isinstance(row[k], (int, float, np.number)) and math.isfinite(row[k]) and row[k] > 0)]
        return Outcome("silent", "; ".join(bad)) if bad else Outcome("ok")
    lines = err.strip().splitlines()
    if (code == 2 and len(lines) == 1 and lines[0].startswith("paraplan predict: error: ")
            and f"{runs}:2:" in lines[0] and not out.exists()):
        return Outcome("error", lines[0])
    return Outcome("crash", f"exit {code}: {err[-800:]}")

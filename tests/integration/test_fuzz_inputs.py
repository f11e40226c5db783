"""Property-based suite over the input readers: mutated real files (data/)
through `paraplan ingest` (nccl-tests, PARAM, PipeDream), the profile CSV reader and
`paraplan fit`, run tables and calibrations through `paraplan predict`, model files
through `load_model`, and any valid sweep through `fit_sweep`. The property: a valid result
with every number finite, non-negative and in range, or a `ParaplanError` naming the
file (one line, nothing written); never another exception, never a forbidden value
accepted.

Budget: the "paraplan-ci" Hypothesis profile (tests/fuzz_harness.py): derandomized,
a fixed number of examples per test, under a minute on two cores. A bigger run that
prints figures: `python benchmarks/fuzz_inputs.py`. Failing examples found so far are
kept as plain tests in tests/test_input_regressions.py.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings

from fuzz_harness import (
    classify,
    classify_sweep,
    mutated,
    targets,
    valid_sweeps,
    with_forbidden_value,
)

TARGETS = ("ingest nccl-tests", "ingest param", "ingest pipedream", "profile csv", "fit", "predict runs", "calibration",
           "model file")


@pytest.fixture(scope="module")
def seeded(data_dir):
    return targets(data_dir)


@pytest.mark.parametrize("name", TARGETS)
def test_mutated_input_gives_a_result_or_an_error_naming_the_file(seeded, name, tmp_path):
    target = seeded[name]

    @settings(settings.get_profile("paraplan-ci"))
    @given(mutated(target.seeds))
    def check(data: bytes) -> None:
        outcome = classify(target, data, tmp_path)
        assert outcome.kind in ("ok", "error"), outcome.detail

    check()


@pytest.mark.parametrize("name", TARGETS)
def test_a_forbidden_number_is_always_an_error(seeded, name, tmp_path):
    target = seeded[name]

    @settings(settings.get_profile("paraplan-ci"))
    @given(with_forbidden_value(target))
    def check(data: bytes) -> None:
        outcome = classify(target, data, tmp_path, forbidden=True)
        assert outcome.kind == "error", outcome.detail

    check()


@pytest.mark.parametrize("name", TARGETS)
def test_every_seed_is_read_without_complaint(seeded, name, tmp_path):
    """The unmutated seeds are valid: the properties above start from good input."""
    target = seeded[name]
    for seed in target.seeds:
        outcome = classify(target, seed.encode(), tmp_path)
        assert outcome.kind == "ok", outcome.detail



def test_fitting_any_valid_sweep_gives_finite_models():
    """fit_sweep on anything the bench-CSV reader admits: exactly one chosen model,
    finite parameters and errors, strict JSON, and finite non-negative predictions
    from the comm model built on it (`fuzz_harness.classify_sweep`)."""

    @settings(settings.get_profile("paraplan-ci"))
    @given(valid_sweeps())
    def check(sweep) -> None:
        outcome = classify_sweep(sweep)
        assert outcome.kind == "ok", outcome.detail

    check()

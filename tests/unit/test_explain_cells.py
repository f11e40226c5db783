"""`predict --explain`'s columns: a part within rounding of zero (the bubble of a run
without pipelines, a difference of sums) is written 0, not -1.24345e-14."""

from paraplan.cli.predict import explain_cells


def test_rounding_residue_is_written_zero():
    cells = explain_cells({"gemm": 9.40661, "bubble": -1.24345e-14, "host": 0.00137677}, 14.1611)
    assert cells == {"explain_gemm_s": "9.40661", "explain_bubble_s": "0", "explain_host_s": "0.00137677"}


def test_a_small_real_part_is_kept():
    assert explain_cells({"optimizer": 2e-6}, 0.5) == {"explain_optimizer_s": "2e-06"}

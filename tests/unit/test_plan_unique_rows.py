import numpy as np

from paraplan.plan.transformer.unique_rows import unique_rows


def test_unique_rows_is_numpys_rowwise_unique():
    rng = np.random.default_rng(0)
    rows = np.stack([rng.integers(-3, 4, 500), rng.integers(0, 9, 500), rng.integers(1, 3, 500)], axis=1)
    unique, inverse = unique_rows(rows)
    expected, expected_inverse = np.unique(rows, axis=0, return_inverse=True)
    assert np.array_equal(unique, expected)
    assert np.array_equal(inverse, expected_inverse.ravel())
    assert np.array_equal(unique[inverse], rows)


def test_unique_rows_too_wide_to_pack_falls_back():
    rows = np.array([[2**40, 0, 2**40], [0, 2**40, 0], [2**40, 0, 2**40]], dtype=np.int64)
    unique, inverse = unique_rows(rows)
    assert unique.tolist() == [[0, 2**40, 0], [2**40, 0, 2**40]]
    assert inverse.tolist() == [1, 0, 1]

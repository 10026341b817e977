"""sinusoidal_table against independent float64 formulas, and its algebraic properties."""

import math

import numpy as np
import pytest

from keras_posenc import sinusoidal_table
from keras_posenc.tables import column_frequencies, inverse_frequencies

SHAPES = [(1, 1), (7, 3), (50, 11), (512, 512), (2048, 768)]


def paper_table(length, depth, start=0):
    """Vaswani et al. 3.5, column by column: PE(p, 2i) = sin(p / 10000^(2i/d)), PE(p, 2i+1) = cos(...)."""
    positions = np.arange(start, start + length, dtype=np.float64)
    table = np.empty((length, depth), np.float64)
    for column in range(depth):
        i = column // 2
        angle = positions / 10000.0 ** (2.0 * i / depth)
        table[:, column] = np.sin(angle) if column % 2 == 0 else np.cos(angle)
    return table


def tutorial_table(length, depth, start=0):
    """The TensorFlow text tutorial's `positional_encoding`, written again (even depth only)."""
    half = depth / 2
    positions = np.arange(start, start + length)[:, np.newaxis]
    depths = np.arange(half)[np.newaxis, :] / half
    angle_rads = positions * (1 / (10000 ** depths))
    return np.concatenate([np.sin(angle_rads), np.cos(angle_rads)], axis=-1)


def concat_table(length, depth, start=0):
    """Any depth: ceil(d/2) sines then floor(d/2) cosines of the frequencies 10000^(-2i/d)."""
    positions = np.arange(start, start + length, dtype=np.float64)[:, None]
    sines = [np.sin(positions[:, 0] / 10000.0 ** (2.0 * i / depth)) for i in range((depth + 1) // 2)]
    cosines = [np.cos(positions[:, 0] / 10000.0 ** (2.0 * i / depth)) for i in range(depth // 2)]
    return np.stack(sines + cosines, axis=1)


@pytest.mark.parametrize("length, depth", SHAPES)
@pytest.mark.parametrize("start", [0, 37])
def test_interleave_matches_the_paper_formula(length, depth, start):
    expected = paper_table(length, depth, start)
    for dtype in (np.float64, np.float32):
        table = sinusoidal_table(length, depth, start=start, dtype=dtype)
        assert table.dtype == dtype and table.shape == (length, depth)
        assert np.max(np.abs(table - expected)) <= 1e-6


@pytest.mark.parametrize("length, depth", SHAPES)
@pytest.mark.parametrize("start", [0, 37])
def test_concat_matches_sines_then_cosines(length, depth, start):
    table = sinusoidal_table(length, depth, layout="concat", start=start, dtype=np.float64)
    assert np.max(np.abs(table - concat_table(length, depth, start))) <= 1e-6
    if depth % 2 == 0:  # the tutorial's formula only makes sense for an even depth
        assert np.max(np.abs(table - tutorial_table(length, depth, start))) <= 1e-6


def test_start_is_a_window_of_the_longer_table():
    long = sinusoidal_table(100, 16, dtype=np.float64)
    np.testing.assert_array_equal(sinusoidal_table(60, 16, start=40, dtype=np.float64), long[40:])


@pytest.mark.parametrize("depth", [1, 2, 3, 8, 11])
def test_row_zero_of_interleave_is_zero_one(depth):
    row = sinusoidal_table(1, depth)[0]
    assert row.tolist() == [float(j % 2) for j in range(depth)]


def test_row_zero_of_concat_is_zeros_then_ones():
    assert sinusoidal_table(1, 5, layout="concat")[0].tolist() == [0, 0, 0, 1, 1]


@pytest.mark.parametrize("layout", ["interleave", "concat"])
def test_shift_by_k_is_one_fixed_rotation_per_frequency_pair(layout):
    """002 §2.2 stated correctly.

    The article claims PE[p+k] = PE[p] W1 + PE[p] W2 (a sum of two matrices
    is one matrix, and no structure is given). What holds: for every
    frequency w_i, the pair (sin pw_i, cos pw_i) moves to
    (sin (p+k)w_i, cos (p+k)w_i) by the 2x2 rotation
    [[cos kw_i, sin kw_i], [-sin kw_i, cos kw_i]], the same for every p.
    """
    depth, length = 64, 300
    table = sinusoidal_table(length, depth, layout=layout, dtype=np.float64)
    inv = inverse_frequencies(depth)
    sin_cols = np.arange(depth // 2) * 2 if layout == "interleave" else np.arange(depth // 2)
    cos_cols = sin_cols + 1 if layout == "interleave" else sin_cols + depth // 2
    for k in (1, 7, 100):
        for i, (s, c) in enumerate(zip(sin_cols, cos_cols)):
            theta = k * inv[i]
            rotation = np.array([[math.cos(theta), math.sin(theta)], [-math.sin(theta), math.cos(theta)]])
            pairs = table[:, [s, c]]  # [length, 2]: (sin, cos) of every position
            shifted = pairs[:-k] @ rotation.T
            assert np.max(np.abs(shifted - pairs[k:])) <= 1e-9
            # A rotation: orthogonal with determinant +1, so it keeps the pair on the unit circle.
            np.testing.assert_allclose(rotation @ rotation.T, np.eye(2), atol=1e-12)
            assert abs(np.linalg.det(rotation) - 1) <= 1e-12


def test_the_rotation_is_fitted_back_from_the_table():
    """The 2x2 map found by least squares from the data is the rotation by k*w (not assumed)."""
    table = sinusoidal_table(200, 8, dtype=np.float64)
    k, i = 5, 1
    pairs = table[:, [2 * i, 2 * i + 1]]
    fitted, *_ = np.linalg.lstsq(pairs[:-k], pairs[k:], rcond=None)
    theta = k * 10000.0 ** (-2 * i / 8)
    expected = np.array([[math.cos(theta), math.sin(theta)], [-math.sin(theta), math.cos(theta)]])
    np.testing.assert_allclose(fitted.T, expected, atol=1e-9)


def test_odd_depth_has_one_more_sine_column():
    freq, is_sin = column_frequencies(5)
    assert is_sin.tolist() == [True, False, True, False, True]
    np.testing.assert_allclose(freq, [1, 1, 10000 ** -0.4, 10000 ** -0.4, 10000 ** -0.8], rtol=1e-15)
    freq, is_sin = column_frequencies(5, layout="concat")
    assert is_sin.tolist() == [True, True, True, False, False]


def test_base_changes_the_frequencies():
    table = sinusoidal_table(10, 4, base=100.0, dtype=np.float64)
    np.testing.assert_allclose(table[3, 2], math.sin(3 / 100.0 ** 0.5), atol=1e-15)


def test_fault_3_integer_pow_would_give_a_wrong_table():
    """002 §3.1 casts 2i/d to int32: every exponent becomes 0, every frequency 1."""
    depth = 8
    truncated = np.power(10000, (2 * np.arange(depth // 2) // depth).astype(np.int32))
    assert truncated.tolist() == [1, 1, 1, 1]
    assert not np.allclose(1.0 / truncated, inverse_frequencies(depth))


@pytest.mark.parametrize("kwargs, error, match", [
    ({"length": -1, "depth": 4}, ValueError, "length.*-1"),
    ({"length": 3, "depth": 0}, ValueError, "depth.*0"),
    ({"length": 3, "depth": 2.5}, TypeError, "depth.*2.5"),
    ({"length": 3, "depth": 4, "start": -2}, ValueError, "start.*-2"),
    ({"length": 3, "depth": 4, "layout": "stacked"}, ValueError, "layout.*'stacked'"),
    ({"length": 3, "depth": 4, "base": 1.0}, ValueError, "base.*1.0"),
    ({"length": 3, "depth": 4, "base": "big"}, TypeError, "base.*'big'"),
])
def test_bad_arguments_name_themselves(kwargs, error, match):
    with pytest.raises(error, match=match):
        sinusoidal_table(**kwargs)


def test_zero_length_table():
    assert sinusoidal_table(0, 6).shape == (0, 6)

"""The constants an export freezes: a position layer's table and scales, the `[T, T]` attention structure.

References are written out position by position in numpy, independently of the vectorized code.
No TensorFlow op runs at import (mutmut forks the test process).
"""

import numpy as np
import pytest

from keras_posenc.export.constants import Frozen, exclusive_count_matrix, static_structure


def _reference(length, segments=None, mask=None, causal=False):
    allowed = np.ones([length, length], bool)
    runs = np.ones([length, length], bool)
    run_of = list(range(length))
    if segments is not None:
        run = 0
        for t in range(1, length):
            run += segments[t] != segments[t - 1]
            run_of[t] = run
        run_of[0] = 0
    for q in range(length):
        for k in range(length):
            allowed[q, k] = ((not causal or k <= q)
                             and (segments is None or segments[q] == segments[k])
                             and (mask is None or bool(mask[q][k])))
            runs[q, k] = segments is None or run_of[q] == run_of[k]
    return allowed, runs


def _equal(actual, expected):
    assert actual[0].dtype == bool and actual[1].dtype == bool
    assert actual[0].shape == expected[0].shape and actual[1].shape == expected[1].shape
    np.testing.assert_array_equal(actual[0], expected[0])
    np.testing.assert_array_equal(actual[1], expected[1])


def test_nothing_given_allows_every_pair():
    _equal(static_structure(5), _reference(5))


def test_the_causal_mask():
    _equal(static_structure(6, use_causal_mask=True), _reference(6, causal=True))
    _equal(static_structure(6, use_causal_mask=False), _reference(6))


def test_constant_segments_that_come_back_are_one_segment_but_two_runs():
    import tensorflow as tf

    segments = [0, 0, 1, 1, 1, 0, 0, 2]
    expected = _reference(8, segments=segments, causal=True)
    assert expected[0][6, 0] and not expected[1][6, 0]  # same segment id, another run
    _equal(static_structure(8, segment_ids=tf.constant([segments] * 3), use_causal_mask=True), expected)
    _equal(static_structure(8, segment_ids=np.array([segments])), _reference(8, segments=segments))


def test_a_constant_mask_and_segments_together():
    import tensorflow as tf

    rng = np.random.default_rng(2)
    mask = rng.integers(0, 2, size=[7, 7])
    segments = [1, 1, 1, 3, 3, 4, 4]
    _equal(static_structure(7, segment_ids=np.array(segments), attention_mask=tf.constant(mask[None]),
                            use_causal_mask=True),
           _reference(7, segments=segments, mask=mask, causal=True))
    _equal(static_structure(7, attention_mask=mask.astype(np.float32)), _reference(7, mask=mask))


def test_what_cannot_be_frozen_is_named():
    import tensorflow as tf

    with pytest.raises(ValueError, match="^segment_ids differ between rows$"):
        static_structure(3, segment_ids=np.array([[0, 0, 1], [0, 1, 1]]))
    with pytest.raises(ValueError, match="^attention_mask differs between rows$"):
        static_structure(2, attention_mask=np.ones([2, 2, 2]))
    seen = []

    @tf.function(input_signature=[tf.TensorSpec([1, 4], tf.int32), tf.TensorSpec([1, 4, 4], tf.bool)])
    def trace(segments, mask):
        for given in (dict(segment_ids=segments), dict(attention_mask=mask)):
            with pytest.raises(ValueError) as error:
                static_structure(4, **given)
            seen.append(str(error.value))
        return segments

    trace.get_concrete_function()
    assert seen == ["segment_ids are not constant", "attention_mask is not constant"]


def test_exclusive_count_matrix_counts_earlier_positions_of_the_same_run():
    segments = [0, 0, 0, 1, 1, 0, 2, 2]
    _, runs = static_structure(8, segment_ids=np.array(segments))
    matrix = exclusive_count_matrix(runs)
    assert matrix.dtype == np.float32
    expected = np.zeros([8, 8], np.float32)
    for j in range(8):
        for i in range(8):
            expected[j, i] = float(j < i and runs[i, j])
    np.testing.assert_array_equal(matrix, expected)
    # real @ M: each position's count of real tokens before it in its run (position ids restarting per run)
    real = np.array([1, 1, 0, 1, 1, 1, 1, 0], np.float32)
    np.testing.assert_array_equal(real @ matrix, [0, 1, 2, 0, 1, 0, 0, 1])
    # M reads runs transposed: runs[0, 1] and runs[1, 0] differ here
    uneven = np.array([[True, True, True], [False, True, True], [True, True, True]])
    assert exclusive_count_matrix(uneven).tolist() == [[0, 0, 1], [0, 0, 1], [0, 0, 0]]


def test_frozen_reads_the_table_in_float64_then_float32_and_the_scales():
    from keras_posenc.layers import SinusoidalPositionEmbedding

    layer = SinusoidalPositionEmbedding(max_length=9, layout="interleave", num_languages=3)
    layer.build((None, 9, 6))
    layer.language_scale.assign([0.5, 1.25, 3.0])
    frozen = Frozen(layer)
    positions = np.arange(9, dtype=np.float64)[:, None]
    angles = positions / 10000.0 ** (np.arange(0, 6, 2, dtype=np.float64) / 6)
    expected = np.empty([9, 6])
    expected[:, 0::2], expected[:, 1::2] = np.sin(angles), np.cos(angles)
    assert frozen.table.dtype == np.float32 and frozen.table.shape == (9, 6)
    np.testing.assert_allclose(frozen.table, expected.astype(np.float32), rtol=0, atol=2e-7)
    assert frozen.scales.dtype == np.float32 and frozen.scales.tolist() == [0.5, 1.25, 3.0]
    plain = SinusoidalPositionEmbedding(max_length=4)
    plain.build((None, 4, 6))
    assert Frozen(plain).scales is None and Frozen(plain).table.shape == (4, 6)

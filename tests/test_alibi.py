"""ALiBi slopes against Press et al.'s values, and the bias against its formula."""

import numpy as np
import pytest

import keras_posenc
from keras_posenc.backend import ops
from keras_posenc.layers.alibi import MASKED_BIAS, alibi_bias, alibi_slopes
from keras_posenc.layers.encoder_layer import merge_attention_masks
from keras_posenc.positions import position_ids

# Press et al.'s `get_slopes` values, written out: a power of two n gives 2^(-8/n), 2^(-16/n), ...;
# 12 heads take the 8-head slopes, then the 1st, 3rd, 5th and 7th of the 16-head slopes.
PRESS_SLOPES = {
    8: [2.0 ** -k for k in range(1, 9)],
    12: [2.0 ** -k for k in range(1, 9)] + [2.0 ** -0.5, 2.0 ** -1.5, 2.0 ** -2.5, 2.0 ** -3.5],
    16: [2.0 ** (-k / 2) for k in range(1, 17)],
}


@pytest.mark.parametrize("heads", sorted(PRESS_SLOPES))
def test_slopes_equal_press_et_al(heads):
    slopes = keras_posenc.alibi_slopes(heads)
    assert slopes.dtype == np.float64 and slopes.shape == (heads,)
    np.testing.assert_allclose(slopes, PRESS_SLOPES[heads], rtol=1e-15)


def test_slopes_of_other_head_counts():
    assert alibi_slopes(1).tolist() == [2.0 ** -8]
    assert np.log2(alibi_slopes(3)).tolist() == [-4.0, -8.0, -2.0]
    with pytest.raises(ValueError, match="num_heads"):
        alibi_slopes(0)
    with pytest.raises(TypeError, match="num_heads"):
        alibi_slopes(4.0)


def test_causal_bias_of_row_i_is_slope_times_j_minus_i_on_allowed_keys():
    heads, length = 4, 6
    ids = ops.convert_to_tensor(np.tile(np.arange(length, dtype=np.int32), [2, 1]))
    allowed = merge_attention_masks(length, use_causal_mask=True)
    bias = ops.convert_to_numpy(alibi_bias(alibi_slopes(heads), ids, allowed))
    assert bias.shape == (2, heads, length, length)
    slopes = alibi_slopes(heads)
    for h in range(heads):
        for i in range(length):
            for j in range(length):
                expected = slopes[h] * (j - i) if j <= i else MASKED_BIAS
                assert bias[1, h, i, j] == pytest.approx(expected, rel=1e-6, abs=1e-7)


def test_left_padding_gives_the_unpadded_bias_on_real_tokens():
    real = 5
    padded_mask = np.array([[False, False] + [True] * real])
    ids = position_ids(padded_mask)
    allowed = merge_attention_masks(real + 2, mask=padded_mask, use_causal_mask=True)
    padded = ops.convert_to_numpy(alibi_bias(alibi_slopes(2), ids, allowed))[0, :, 2:, 2:]
    plain_ids = ops.convert_to_tensor(np.arange(real, dtype=np.int32)[None])
    plain = ops.convert_to_numpy(alibi_bias(alibi_slopes(2), plain_ids,
                                            merge_attention_masks(real, use_causal_mask=True)))[0]
    np.testing.assert_array_equal(padded, plain)
    # Keys that are padding are masked for every query.
    assert np.all(ops.convert_to_numpy(alibi_bias(alibi_slopes(2), ids, allowed))[0, :, :, :2] == MASKED_BIAS)


def test_packed_segments_restart_distances_and_mask_other_segments():
    segments = np.array([[1, 1, 1, 2, 2]])
    ids = position_ids(np.ones([1, 5], bool), segment_ids=segments)
    bias = ops.convert_to_numpy(alibi_bias([1.0], ids, merge_attention_masks(5, segment_ids=segments)))[0, 0]
    np.testing.assert_array_equal(bias[3:, 3:], [[0.0, -1.0], [-1.0, 0.0]])
    np.testing.assert_array_equal(bias[:3, 3:], np.full([3, 2], MASKED_BIAS))

"""The ablation's control variants: "integer" and "none" position embeddings."""

import numpy as np
import pytest
import tensorflow as tf
from layer_test_helper import requires_tf, run_layer_test

from keras_posenc import Encoder
from keras_posenc.backend import keras
from keras_posenc.layers import IntegerPositionEmbedding, TokenAndPositionEmbedding, ZeroPositionEmbedding
from keras_posenc.layers.token_and_position_embedding import POSITION_LAYERS

# Written against TensorFlow tensors and graphs; the JAX backend runs tests/test_keras3_backends.py.
pytestmark = requires_tf


def left_padded():
    """A right- and a left-padded mask (a tensor made per test: no TF op at import)."""
    return tf.constant([[True, True, True, True, False], [False, False, True, True, True]])


def _integer_reference(mask, scale, depth):
    """PE[b, t] = scale * (number of real tokens before t in row b), 0 at padding, float64."""
    mask = np.asarray(mask, bool)
    ids = np.cumsum(mask, axis=1) - 1
    values = np.where(mask, ids * np.float64(scale), 0.0)
    return np.repeat(values[..., None], depth, axis=-1)


# --- IntegerPositionEmbedding ----------------------------------------------------------------

def test_integer_layer_contract(tmp_path):
    x = tf.random.stateless_normal([2, 5, 6], seed=[1, 2])
    run_layer_test(IntegerPositionEmbedding, {"max_length": 8, "num_languages": 2},
                   {"inputs": x, "language_ids": tf.constant([0, 1])}, tmp_dir=tmp_path,
                   expected_output_shape=(2, 5, 6), expected_num_trainable_weights=1)
    run_layer_test(IntegerPositionEmbedding, {"max_length": 8, "scale": 1.0},
                   {"inputs": x, "mask": left_padded()}, tmp_dir=tmp_path,
                   expected_num_trainable_weights=0)


@pytest.mark.parametrize("scale, expected_scale", [(None, 1 / 8), (1.0, 1.0), (0.3, 0.3)])
def test_integer_values_match_formula_with_left_padding(scale, expected_scale):
    layer = IntegerPositionEmbedding(max_length=8, scale=scale)
    y = layer(tf.zeros([2, 5, 3]), mask=left_padded())
    expected = _integer_reference(left_padded(), expected_scale, 3).astype(np.float32)
    np.testing.assert_array_equal(y.numpy(), expected)


def test_integer_extend_computes_rows_past_the_table():
    layer = IntegerPositionEmbedding(max_length=4, scale=0.1, overflow="extend")
    y = layer(tf.zeros([1, 10, 2]))
    expected = (np.arange(10, dtype=np.float64) * 0.1).astype(np.float32)
    np.testing.assert_array_equal(y.numpy()[0], np.repeat(expected[:, None], 2, axis=1))
    # Inside the table the gathered rows are the same numbers.
    np.testing.assert_array_equal(layer(tf.zeros([1, 3, 2])).numpy()[0], y.numpy()[0, :3])
    ids = tf.constant([[0, 7, 12]])
    z = layer(tf.zeros([1, 3, 2]), position_ids=ids)
    np.testing.assert_array_equal(z.numpy()[0, :, 0], np.float32([0.0, 0.7, 1.2]))


def test_integer_overflow_error_names_both_numbers():
    layer = IntegerPositionEmbedding(max_length=4)
    with pytest.raises(ValueError, match=r"Sequence length 6 exceeds max_length=4"):
        layer(tf.zeros([1, 6, 2]))


@pytest.mark.parametrize("scale, error, match", [
    ("big", TypeError, r"`scale` must be a number or None, got scale='big'"),
    (True, TypeError, r"`scale` must be a number or None, got scale=True"),
    (float("nan"), ValueError, r"`scale` must be finite, got scale=nan"),
    (float("inf"), ValueError, r"`scale` must be finite, got scale=inf"),
])
def test_integer_rejects_bad_scale(scale, error, match):
    with pytest.raises(error, match=match):
        IntegerPositionEmbedding(max_length=4, scale=scale)


def test_integer_config_keeps_the_scale_as_given():
    assert IntegerPositionEmbedding(max_length=4).get_config()["scale"] is None
    assert IntegerPositionEmbedding(max_length=4, scale=2).get_config()["scale"] == 2.0


# --- ZeroPositionEmbedding ---------------------------------------------------------------------

def test_zero_layer_contract(tmp_path):
    x = tf.random.stateless_normal([2, 5, 6], seed=[3, 4])
    out = run_layer_test(ZeroPositionEmbedding, {"max_length": 8}, x, tmp_dir=tmp_path,
                         expected_num_trainable_weights=0)
    np.testing.assert_array_equal(out.numpy(), x.numpy())
    run_layer_test(ZeroPositionEmbedding, {"max_length": 8}, {"inputs": x, "mask": left_padded()},
                   tmp_dir=tmp_path)


def test_zero_output_is_the_input_and_mask_passes_through():
    layer = ZeroPositionEmbedding(max_length=8)
    x = tf.random.stateless_normal([2, 5, 3], seed=[5, 6])
    np.testing.assert_array_equal(layer(x, mask=left_padded()).numpy(), x.numpy())
    np.testing.assert_array_equal(layer.compute_mask(x, left_padded()).numpy(), left_padded().numpy())


def test_zero_keeps_the_interface_checks():
    with pytest.raises(ValueError, match=r"Sequence length 9 exceeds max_length=8"):
        ZeroPositionEmbedding(max_length=8)(tf.zeros([1, 9, 2]))
    assert ZeroPositionEmbedding(max_length=8, overflow="extend")(tf.zeros([1, 9, 2])).shape == (1, 9, 2)
    with pytest.raises(ValueError, match=r"`num_languages` has no effect on ZeroPositionEmbedding"):
        ZeroPositionEmbedding(max_length=8, num_languages=2)
    with pytest.raises(ValueError, match=r"`language_ids` was given but ZeroPositionEmbedding"):
        ZeroPositionEmbedding(max_length=8)(tf.zeros([1, 2, 2]), language_ids=tf.constant([0]))


# --- By name, and equal by construction --------------------------------------------------------

def test_variants_are_registered_by_name(tmp_path):
    assert POSITION_LAYERS["integer"] is IntegerPositionEmbedding
    assert POSITION_LAYERS["none"] is ZeroPositionEmbedding
    ids = tf.constant([[3, 4, 5, 0], [0, 6, 7, 8]])
    for position in ("integer", "none"):
        run_layer_test(TokenAndPositionEmbedding,
                       {"vocab_size": 10, "d_model": 4, "max_length": 8, "position": position,
                        "dropout": 0.0}, ids, tmp_dir=tmp_path)


def _embedding_outputs(position, ids, **kwargs):
    keras.utils.set_random_seed(7)
    layer = TokenAndPositionEmbedding(12, 4, 8, position=position, dropout=0.0, **kwargs)
    return layer(ids).numpy()


def test_integer_at_scale_zero_equals_none():
    ids = tf.constant([[3, 4, 5, 0], [0, 6, 7, 8]])
    np.testing.assert_array_equal(_embedding_outputs("integer", ids, scale=0.0),
                                  _embedding_outputs("none", ids))


def test_integer_embedding_adds_the_formula_to_the_tokens():
    ids = tf.constant([[3, 4, 5, 0], [0, 6, 7, 8]])
    mask = ids.numpy() != 0
    diff = _embedding_outputs("integer", ids, scale=0.5) - _embedding_outputs("none", ids)
    np.testing.assert_allclose(diff, _integer_reference(mask, 0.5, 4), atol=1e-6)


def _encoder(position):
    keras.utils.set_random_seed(11)
    return Encoder(2, 8, 2, 16, vocab_size=20, max_length=8, dropout=0.0, position=position)


def test_none_encoder_is_permutation_equivariant_without_causal_mask():
    ids = tf.constant([[3, 9, 4, 17, 5, 2]])
    perm = np.array([4, 0, 5, 2, 1, 3])
    encoder = _encoder("none")
    y = encoder(ids).numpy()
    y_perm = encoder(tf.gather(ids, perm, axis=1)).numpy()
    np.testing.assert_allclose(y_perm, y[:, perm], atol=1e-5)


@pytest.mark.parametrize("position", ["sinusoidal", "learned", "integer"])
def test_position_variants_break_permutation_equivariance(position):
    # The control for the test above: with any real position signal, the same
    # permutation does not commute with the encoder.
    ids = tf.constant([[3, 9, 4, 17, 5, 2]])
    perm = np.array([4, 0, 5, 2, 1, 3])
    encoder = _encoder(position)
    encoder(ids)
    if position == "learned":
        table = encoder.embedding.position_embedding.position_table
        table.assign(tf.random.stateless_normal(table.shape, seed=[1, 1]))
    y = encoder(ids).numpy()
    y_perm = encoder(tf.gather(ids, perm, axis=1)).numpy()
    assert np.max(np.abs(y_perm - y[:, perm])) > 1e-3


@pytest.mark.parametrize("position, kwargs", [("integer", {"scale": 0.25}), ("none", {})])
def test_variants_export_to_gpu_ready_tflite(position, kwargs):
    from keras_posenc import export

    keras.utils.set_random_seed(5)
    ids = keras.Input(shape=(None,), dtype="int32")
    model = keras.Model(ids, TokenAndPositionEmbedding(20, 4, 8, position=position, dropout=0.0,
                                                          **kwargs)(ids))
    flat = export.to_tflite(model, sequence_length=6)
    assert export.gpu_incompatible_ops(flat) == []
    batch = np.array([[5, 6, 7, 8, 9, 3], [0, 0, 4, 5, 6, 7]], np.int32)
    assert export.check_parity(model, flat, batch) < 1e-5

"""Our TokenAndPositionEmbedding feeding keras-hub's TransformerEncoder (Keras 3, TF and JAX)."""

import os

import numpy as np
import pytest
from layer_test_helper import to_numpy

from keras_posenc.backend import is_keras3, keras
from keras_posenc.layers import TokenAndPositionEmbedding

pytestmark = pytest.mark.skipif(not is_keras3(), reason="keras-hub is Keras 3 only")

VOCAB, D_MODEL, LENGTH = 40, 16, 8


@pytest.fixture(scope="module")
def keras_hub():
    return pytest.importorskip("keras_hub", reason="keras-hub is in requirements/tf221.txt")


def build(keras_hub, position="sinusoidal"):
    keras.utils.set_random_seed(3)
    tokens = keras.Input((None,), dtype="int32")
    x = TokenAndPositionEmbedding(VOCAB, D_MODEL, LENGTH, position=position, dropout=0.0)(tokens)
    x = keras_hub.layers.TransformerEncoder(intermediate_dim=32, num_heads=2)(x)  # Keras mask flows in
    return keras.Model(tokens, keras.layers.Dense(VOCAB)(x))


RIGHT = np.array([[5, 6, 7, 8, 0, 0, 0, 0], [9, 10, 11, 12, 13, 14, 0, 0]], np.int32)
LEFT = np.array([[0, 0, 0, 0, 5, 6, 7, 8], [0, 0, 9, 10, 11, 12, 13, 14]], np.int32)


@pytest.mark.parametrize("position", ["sinusoidal", "learned"])
def test_left_padding_equals_right_padding_on_real_tokens(keras_hub, position):
    model = build(keras_hub, position)
    right, left = to_numpy(model(RIGHT)), to_numpy(model(LEFT))
    np.testing.assert_allclose(left[0, 4:], right[0, :4], atol=1e-5)
    np.testing.assert_allclose(left[1, 2:], right[1, :6], atol=1e-5)
    # Not vacuous: the same prefix made of real (unmasked) tokens does change the outputs.
    unmasked = to_numpy(model(np.where(LEFT == 0, 1, LEFT)))
    assert np.abs(unmasked[1, 2:] - right[1, :6]).max() > 1e-3


def test_fit_then_save_and_load_give_equal_outputs(keras_hub, tmp_path):
    model = build(keras_hub)
    model.compile(keras.optimizers.Adam(1e-2),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    inputs = np.concatenate([RIGHT, LEFT] * 4)
    targets = np.roll(inputs, -1, axis=1)
    before = model.evaluate(inputs, targets, verbose=0)
    history = model.fit(inputs, targets, epochs=20, batch_size=8, verbose=0)
    assert np.isfinite(history.history["loss"]).all()
    assert history.history["loss"][-1] < before
    path = os.path.join(str(tmp_path), "hub.keras")
    model.save(path)
    restored = keras.models.load_model(path)
    np.testing.assert_array_equal(to_numpy(restored(LEFT)), to_numpy(model(LEFT)))
    np.testing.assert_array_equal(to_numpy(restored.predict(RIGHT, verbose=0)),
                                  to_numpy(model.predict(RIGHT, verbose=0)))

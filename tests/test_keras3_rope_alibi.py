"""RoPE, ALiBi and the 2-D table on every backend: Keras 2 (TF 2.12) and Keras 3 with TensorFlow or JAX.

Only numpy inputs and `keras_posenc.backend` here, so the file also runs under `KERAS_BACKEND=jax`
(`make test-keras3`). References are the independent float64 formulas of the per-feature tests.
"""

import os

import numpy as np
import pytest
from layer_test_helper import to_numpy
from test_rotary_embedding import reference_rope
from test_sinusoidal_position_embedding_2d import mae_table

import keras_posenc
from keras_posenc import Encoder, EncoderLayer
from keras_posenc.backend import keras
from keras_posenc.layers import RotaryEmbedding, SinusoidalPositionEmbedding2D


@pytest.mark.parametrize("config", [{}, {"layout": "interleave", "scaling": "yarn", "scaling_factor": 4.0,
                                         "original_length": 64, "max_length": 8192}])
def test_rotary_equals_numpy_float64(config):
    x = np.random.default_rng(0).uniform(-1, 1, [2, 3, 2, 16]).astype(np.float32)
    positions = np.array([[0, 5, 8191], [3, 2, 1]])
    got = to_numpy(RotaryEmbedding(**config)(x, position_ids=positions))
    scaling = {k: v for k, v in config.items() if k not in ("layout", "max_length")}
    assert np.max(np.abs(got - reference_rope(x, positions, config.get("layout", "half"), **scaling))) <= 1e-6


def test_sinusoidal_2d_layer_adds_mae_table():
    x = np.zeros([1, 1 + 14 * 14, 768], np.float32)
    y = to_numpy(SinusoidalPositionEmbedding2D(14, 14, cls_token=True)(x))[0]
    assert np.max(np.abs(y - mae_table(14, 768, cls_token=True))) <= 1e-6


@pytest.mark.parametrize("position", ["rope", "alibi"])
def test_left_padded_row_equals_unpadded_row(position):
    keras.utils.set_random_seed(0)
    encoder = Encoder(num_layers=2, d_model=16, num_heads=2, dff=32, vocab_size=30, max_length=12,
                      position=position, dropout=0.0)
    alone = to_numpy(encoder(np.array([[5, 6, 7, 8]]), use_causal_mask=True))[0]
    padded = to_numpy(encoder(np.array([[0, 0, 0, 5, 6, 7, 8]]), use_causal_mask=True))[0, 3:]
    np.testing.assert_allclose(padded, alone, atol=1e-5)


@pytest.mark.parametrize("position", ["rope", "alibi"])
def test_encoder_layer_saves_and_loads(position, tmp_path):
    x = np.random.default_rng(1).normal(size=[2, 5, 16]).astype(np.float32)
    inputs = keras.Input(shape=(5, 16))
    layer = EncoderLayer(16, 2, 32, position=position, position_config={"layout": "interleave"}
                         if position == "rope" else None)
    model = keras.Model(inputs, layer(inputs))
    path = os.path.join(str(tmp_path), "layer.keras")
    model.save(path)
    restored = keras.models.load_model(path)
    np.testing.assert_array_equal(to_numpy(restored(x)), to_numpy(model(x)))


def test_alibi_slopes_are_numpy():
    assert keras_posenc.alibi_slopes(12).dtype == np.float64

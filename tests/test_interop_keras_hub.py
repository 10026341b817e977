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


# keras-hub's own layer harness on every public layer. Its module imports grain (for preprocessing
# tests only, not in the lock): an empty stand-in module lets it import when grain is absent.
def _keras_hub_test_case(keras_hub):
    import importlib.machinery
    import importlib.util
    import sys
    import types

    if "grain" not in sys.modules and importlib.util.find_spec("grain") is None:
        stand_in = types.ModuleType("grain")
        stand_in.__spec__ = importlib.machinery.ModuleSpec("grain", None)
        sys.modules["grain"] = stand_in
    from keras_hub.src.tests.test_case import TestCase

    return TestCase("run_layer_test")


def _features(*shape):
    return np.random.default_rng(0).standard_normal(shape).astype(np.float32)


HUB_CASES = {
    # name: (class name, init kwargs, input data, expected output shape, trainable weights)
    "sinusoidal_languages": ("SinusoidalPositionEmbedding", {"max_length": 8, "num_languages": 2},
                             {"inputs": _features(2, 5, 4), "language_ids": np.array([1, 0], np.int32)},
                             (2, 5, 4), 1),
    "learned": ("LearnedPositionEmbedding", {"max_length": 8}, _features(2, 5, 4), (2, 5, 4), 1),
    "learned_position_ids": ("LearnedPositionEmbedding", {"max_length": 8},
                             {"inputs": _features(2, 3, 4),
                              "position_ids": np.array([[0, 1, 2], [5, 6, 7]], np.int32)}, (2, 3, 4), 1),
    "integer": ("IntegerPositionEmbedding", {"max_length": 8}, _features(2, 5, 4), (2, 5, 4), 0),
    "zero": ("ZeroPositionEmbedding", {"max_length": 8}, _features(2, 5, 4), (2, 5, 4), 0),
    "sinusoidal_2d": ("SinusoidalPositionEmbedding2D", {"height": 2, "width": 3}, _features(2, 6, 4),
                      (2, 6, 4), 0),
    "rotary": ("RotaryEmbedding", {}, _features(2, 5, 2, 8), (2, 5, 2, 8), 0),
    "token_and_position": ("TokenAndPositionEmbedding", {"vocab_size": 20, "d_model": 8, "max_length": 8,
                                                         "dropout": 0.0},
                           np.array([[0, 0, 3, 4, 5], [6, 7, 8, 9, 1]], np.int32), (2, 5, 8), 1),
    "attention_rope": ("PositionalAttention", {"num_heads": 2, "key_dim": 4, "position": "rope"},
                       {"query": _features(2, 5, 8), "value": _features(2, 5, 8)}, (2, 5, 8), 8),
    "attention_alibi": ("PositionalAttention", {"num_heads": 2, "key_dim": 4, "position": "alibi"},
                        {"query": _features(2, 5, 8), "value": _features(2, 5, 8)}, (2, 5, 8), 8),
    "decoder": ("DecoderLayer", {"d_model": 8, "num_heads": 2, "dff": 16, "dropout": 0.0},
                {"x": _features(2, 5, 8), "encoder_outputs": _features(2, 6, 8)}, (2, 5, 8), 26),
    "decoder_rope": ("DecoderLayer", {"d_model": 8, "num_heads": 2, "dff": 16, "dropout": 0.0,
                                      "position": "rope"},
                     {"x": _features(2, 5, 8), "encoder_outputs": _features(2, 6, 8)}, (2, 5, 8), 26),
}


def test_the_hub_cases_cover_every_public_layer():
    import keras_posenc.layers

    assert {case[0] for case in HUB_CASES.values()} == set(keras_posenc.layers.__all__)


@pytest.mark.parametrize("name", sorted(HUB_CASES))
def test_keras_hub_run_layer_test_passes(keras_hub, name):
    import keras_posenc.layers

    class_name, init_kwargs, input_data, output_shape, trainable = HUB_CASES[name]
    case = _keras_hub_test_case(keras_hub)
    # Backend tensors, as keras-hub's tests pass them (its `compute_output_spec` check sees only those).
    input_data = keras.tree.map_structure(keras.ops.convert_to_tensor, input_data)
    case.run_layer_test(cls=getattr(keras_posenc.layers, class_name), init_kwargs=dict(init_kwargs),
                        input_data=input_data, expected_output_shape=output_shape,
                        expected_num_trainable_weights=trainable)

"""`.keras` files saved before the positional attention layer and the export rework still load.

The files under tests/data/legacy/ were saved by keras_posenc before `PositionalAttention`
replaced the plain `MultiHeadAttention` of `EncoderLayer` (Keras 2 files under keras2/, Keras 3
files under keras3/, TensorFlow backend), together with their inputs and outputs. Loading one must
give the same weights at the same paths, hence the same outputs (bit for bit on TensorFlow).
"""

import pathlib

import numpy as np
import pytest

from keras_posenc.backend import is_keras3, is_tensorflow, keras, ops
from keras_posenc.export import load_model
from keras_posenc.layers.positional_attention import PositionalAttention

FOLDER = pathlib.Path(__file__).parent / "data" / "legacy" / ("keras3" if is_keras3() else "keras2")
NAMES = sorted(path.name[:-len(".keras")] for path in FOLDER.glob("*.keras"))


def test_every_legacy_file_is_present():
    assert NAMES == ["functional_rope", "lm_alibi", "lm_learned_languages", "lm_rope_yarn", "lm_sinusoidal"]


# lm_learned_languages gives `num_languages` inside `position_config`: such a CausalLM did not load
# before (its dummy build call passed no language ids); CausalLM now reads it from the encoder.
@pytest.mark.parametrize("name", NAMES)
def test_legacy_file_loads_with_identical_outputs(name):
    model = load_model(str(FOLDER / f"{name}.keras"))
    ids = np.load(FOLDER / f"{name}.ids.npy")
    expected = np.load(FOLDER / f"{name}.out.npy")
    if name.startswith("lm_"):
        inputs = {"token_ids": ops.convert_to_tensor(ids)}
        if "languages" in name:
            inputs["language_ids"] = ops.convert_to_tensor(np.array([1, 2], np.int32))
        got = model(inputs)
    else:
        got = model(ops.convert_to_tensor(ids))
    if is_tensorflow():  # the backend that saved them: bit for bit
        np.testing.assert_array_equal(ops.convert_to_numpy(got), expected)
    else:  # same weights, other kernels: float32 rounding
        np.testing.assert_allclose(ops.convert_to_numpy(got), expected, rtol=0, atol=1e-5)
    attention = [layer for layer in _layers(model) if isinstance(layer, keras.layers.MultiHeadAttention)]
    assert attention and all(isinstance(layer, PositionalAttention) for layer in attention)


def _layers(model):
    found, stack = [], [model]
    while stack:
        layer = stack.pop()
        found.append(layer)
        stack.extend(getattr(layer, "layers", []) or [])
        stack.extend(getattr(layer, "encoder_layers", []) or [])
        for name in ("encoder", "attention"):
            child = getattr(layer, name, None)
            if isinstance(child, keras.layers.Layer):
                stack.append(child)
    return found

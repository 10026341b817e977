"""`.keras` files saved before the positional attention layer and the export rework still load.

The files under tests/data/legacy/ were saved by keras_posenc before `PositionalAttention`
replaced the plain `MultiHeadAttention` of `EncoderLayer` (Keras 2 files under keras2/, Keras 3
files under keras3/, TensorFlow backend), together with their inputs and outputs. Loading one must
give the same weights at the same paths, hence the same outputs.

The saved outputs were computed on another machine, so they are compared with a tolerance, not bit
for bit: float32 kernels differ between CPUs (oneDNN/Eigen take AVX-512 or AVX2 paths, FMA or not).
Measured: 3.6e-7 to 8.2e-7 max |difference| on an AVX-512 machine (TF 2.12, TF 2.21, JAX, oneDNN
held to AVX2) and 4.4e-7 on an AVX2 one. A weight at a wrong path moves the outputs far more:
swapping the query and key kernels of one attention layer, the smallest such mix-up (same shapes, an
untrained model's near-uniform attention), moves them by 1.2e-3 to 4.4e-2. `ATOL` (1e-5 of the
largest |output|, about 2e-5 here) sits between the two, about 25x above the first and 45x below the
second; `test_a_weight_at_a_wrong_path_is_caught` checks the upper one.
"""

import pathlib

import numpy as np
import pytest

from keras_posenc.backend import is_keras3, keras, ops
from keras_posenc.export import load_model
from keras_posenc.layers.positional_attention import PositionalAttention

# Relative to the largest |output| of a file (1.8 to 2.7 here).
ATOL = 1e-5
FOLDER = pathlib.Path(__file__).parent / "data" / "legacy" / ("keras3" if is_keras3() else "keras2")
NAMES = sorted(path.name[:-len(".keras")] for path in FOLDER.glob("*.keras"))


def test_every_legacy_file_is_present():
    assert NAMES == ["functional_rope", "lm_alibi", "lm_learned_languages", "lm_rope_yarn", "lm_sinusoidal"]


# lm_learned_languages gives `num_languages` inside `position_config`: such a CausalLM did not load
# before (its dummy build call passed no language ids); CausalLM now reads it from the encoder.
@pytest.mark.parametrize("name", NAMES)
def test_legacy_file_loads_with_the_saved_outputs(name):
    model, run, expected = _load(name)
    error = np.max(np.abs(run() - expected))
    assert error <= ATOL * np.max(np.abs(expected)), f"{name}: max |difference| {error:.3g}"
    attention = [layer for layer in _layers(model) if isinstance(layer, keras.layers.MultiHeadAttention)]
    assert attention and all(isinstance(layer, PositionalAttention) for layer in attention)


@pytest.mark.parametrize("name", NAMES)
def test_a_weight_at_a_wrong_path_is_caught(name):
    """The tolerance is far below what a weight loaded at the wrong path does to the outputs."""
    model, run, expected = _load(name)
    paths = [getattr(weight, "path", weight.name) for weight in model.weights]
    query = next(i for i, path in enumerate(paths) if "query/kernel" in path)
    key = paths.index(paths[query].replace("query/kernel", "key/kernel"))
    weights = model.get_weights()
    weights[query], weights[key] = weights[key], weights[query]
    model.set_weights(weights)
    error = np.max(np.abs(run() - expected))
    assert error > 10 * ATOL * np.max(np.abs(expected)), f"{name}: swapped kernels: {error:.3g}"


def _load(name):
    """The loaded model, a function giving its outputs on the saved inputs, and the saved outputs."""
    model = load_model(str(FOLDER / f"{name}.keras"))
    ids = np.load(FOLDER / f"{name}.ids.npy")
    inputs = ops.convert_to_tensor(ids)
    if name.startswith("lm_"):
        inputs = {"token_ids": inputs}
        if "languages" in name:
            inputs["language_ids"] = ops.convert_to_tensor(np.array([1, 2], np.int32))
    return model, lambda: ops.convert_to_numpy(model(inputs)), np.load(FOLDER / f"{name}.out.npy")


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

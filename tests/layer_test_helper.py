"""The one shared test of the Keras contract, used by every layer's tests.

`run_layer_test` checks, for one layer class and one set of inputs:
  - get_config/from_config round trip (same config, same outputs);
  - eager and symbolic (functional) calls agree;
  - a `.keras` save/load and a SavedModel save/load give identical outputs;
  - one `fit` step towards a random target runs, with a finite loss, and moves
    every trainable weight (except the ones declared to get no gradient);
  - under the `mixed_float16` policy the output is float16 and close to float32.
"""

import os

import numpy as np
import tensorflow as tf
from tensorflow import keras


def _as_dict(inputs):
    return inputs if isinstance(inputs, dict) else {"inputs": inputs}


def _call(layer, inputs, training=None):
    inputs = dict(_as_dict(inputs))
    main = inputs.pop("inputs")
    return layer(main, training=training, **inputs)


def _functional_model(layer, inputs):
    symbolic = {
        name: keras.Input(shape=value.shape[1:], dtype=value.dtype, name=name)
        for name, value in _as_dict(inputs).items()
    }
    outputs = _call(layer, symbolic)
    return keras.Model(symbolic, outputs)


def _max_diff(a, b):
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    return float(np.max(np.abs(a - b))) if a.size else 0.0


def run_layer_test(layer_cls, init_kwargs, inputs, *, expected_output_shape=None,
                   expected_num_trainable_weights=None, mixed_precision_atol=5e-2,
                   weights_without_gradient=(), tmp_dir=None):
    """Runs the shared Keras-contract checks; returns the eager output.

    Args:
        layer_cls: the layer class.
        init_kwargs: dict of constructor arguments.
        inputs: a tensor (the first call argument) or a dict with key
            "inputs" for the first argument plus other tensor call arguments
            (for example "position_ids", "language_ids").
        expected_output_shape: optional tuple.
        expected_num_trainable_weights: optional int.
        mixed_precision_atol: max abs difference allowed between the
            float32 and mixed_float16 outputs.
        weights_without_gradient: substrings of the names of trainable
            weights that provably get no gradient (for example an attention
            key bias, which softmax cancels, up to rounding); every other one
            must move in the fit step.
        tmp_dir: a directory for saved models (pytest's tmp_path).
    """
    assert tmp_dir is not None, "pass tmp_dir=tmp_path"
    tf.keras.utils.set_random_seed(0)
    data = {k: tf.convert_to_tensor(v) for k, v in _as_dict(inputs).items()}

    layer = layer_cls(**init_kwargs)
    eager = _call(layer, data)
    if expected_output_shape is not None:
        assert tuple(eager.shape) == tuple(expected_output_shape), eager.shape
    if expected_num_trainable_weights is not None:
        assert len(layer.trainable_weights) == expected_num_trainable_weights, layer.trainable_weights

    # get_config / from_config.
    config = layer.get_config()
    clone = layer_cls.from_config(config)
    _call(clone, data)
    clone.set_weights(layer.get_weights())
    assert clone.get_config() == config
    assert _max_diff(_call(clone, data), eager) == 0.0

    # Symbolic call and the functional model.
    model = _functional_model(layer, data)
    assert _max_diff(model(data), eager) == 0.0

    # .keras and SavedModel round trips.
    keras_path = os.path.join(str(tmp_dir), f"{layer_cls.__name__}.keras")
    model.save(keras_path)
    restored = keras.models.load_model(keras_path)
    assert _max_diff(restored(data), eager) == 0.0
    saved_path = os.path.join(str(tmp_dir), f"{layer_cls.__name__}_savedmodel")
    model.save(saved_path, save_format="tf")
    restored = keras.models.load_model(saved_path)
    assert _max_diff(restored(data), eager) == 0.0

    _check_fit_step(layer_cls, init_kwargs, data, weights_without_gradient)
    _check_mixed_precision(layer_cls, init_kwargs, data, mixed_precision_atol)
    return eager


def _check_fit_step(layer_cls, init_kwargs, data, weights_without_gradient):
    layer = layer_cls(**init_kwargs)
    model = _functional_model(layer, data)
    output = model(data)
    if not model.trainable_weights:
        # Nothing to train: a training-mode call must still run and stay finite.
        assert np.all(np.isfinite(model(data, training=True).numpy()))
        return
    # A random target: regressing onto zeros would be degenerate after a LayerNormalization.
    target = tf.random.stateless_normal(output.shape, seed=[7, 7], dtype=output.dtype)
    before = {w.name: w.numpy().copy() for w in model.trainable_weights}
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    history = model.fit(data, target, epochs=1, batch_size=int(target.shape[0]), verbose=0)
    assert np.isfinite(history.history["loss"][0])
    for weight in model.trainable_weights:
        if not any(part in weight.name for part in weights_without_gradient):
            assert not np.array_equal(before[weight.name], weight.numpy()), \
                f"{weight.name} did not move in one fit step"


def _check_mixed_precision(layer_cls, init_kwargs, data, atol):
    layer = layer_cls(**{**init_kwargs, "dtype": "mixed_float16"})
    output = _call(layer, data)
    assert output.dtype == tf.float16, output.dtype
    float_layer = layer_cls(**init_kwargs)
    _call(float_layer, data)
    float_layer.set_weights(layer.get_weights())
    assert _max_diff(output, _call(float_layer, data)) <= atol

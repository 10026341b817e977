"""The one shared test of the Keras contract, used by every layer's tests.

`run_layer_test` checks, for one layer class and one set of inputs:
  - get_config/from_config round trip (same config, same outputs);
  - eager and symbolic (functional) calls agree;
  - a `.keras` save/load gives identical outputs, and so does a SavedModel
    (TensorFlow backend: `model.save(save_format="tf")` on Keras 2,
    `model.export` on Keras 3);
  - one `fit` step towards a random target runs, with a finite loss, and moves
    every trainable weight (except the ones declared to get no gradient);
  - under the `mixed_float16` policy the output is float16 and close to float32;
  - keras-hub's checks (`keras_hub.src.tests.test_case.TestCase.run_layer_test`):
    under `mixed_float16`, `mixed_bfloat16` and `bfloat16` every float output
    (and, on Keras 3, `compute_output_spec` on backend tensors) is in the
    policy's compute dtype, every float variable in its variable dtype, every
    sublayer on the policy; `build(**{name + "_shape": ...})` and a symbolic
    call with keyword tensors (`layer(inputs=x, language_ids=l)`) work.

It runs on Keras 2 and on Keras 3 with the TensorFlow or JAX backend, as do
the small helpers below (`to_numpy`, `requires_tf`, `error_message`).
"""

import os
import re

import numpy as np
import pytest

from keras_posenc.backend import backend_name, dtype_name, is_keras3, is_tensorflow, keras, ops

requires_tf = pytest.mark.skipif(
    not is_tensorflow(),
    reason=f"TensorFlow graphs (tf.function, InvalidArgumentError, SavedModel, GradientTape); "
           f"the {backend_name()} backend runs the backend-agnostic tests")


def error_message(call, error=(ValueError, TypeError)):
    """The message of the `error` that `call` raises, without the ANSI bold Keras 3 may add (Keras may
    also add lines naming the layer and its arguments)."""
    with pytest.raises(error) as raised:
        call()
    return re.sub(r"\x1b\[[0-9;]*m", "", str(raised.value))


def to_numpy(x):
    """A backend tensor (or anything array-like) as a numpy array."""
    return np.asarray(ops.convert_to_numpy(x)) if ops.is_tensor(x) else np.asarray(x)


def randomized(layer, *inputs, **call):
    """`layer` built by a call on `inputs` with every weight random (biases, gammas and betas included:
    the `[16]` ones drawn around 1), so a reference computed from its weights checks each of them."""
    layer(*inputs, **call)
    rng = np.random.default_rng(3)
    layer.set_weights([rng.normal(scale=0.3, size=w.shape).astype(np.float32) + (w.shape == (16,))
                       for w in layer.get_weights()])
    return layer


def _as_dict(inputs):
    return inputs if isinstance(inputs, dict) else {"inputs": inputs}


def _call(layer, inputs, training=None):
    inputs = dict(_as_dict(inputs))
    main = inputs.pop("inputs")
    return layer(main, training=training, **inputs)


def _functional_model(layer, inputs):
    symbolic = {
        name: keras.Input(shape=tuple(value.shape[1:]), dtype=dtype_name(value), name=name)
        for name, value in _as_dict(inputs).items()
    }
    outputs = _call(layer, symbolic)
    return keras.Model(symbolic, outputs)


def _max_diff(a, b):
    a = to_numpy(a).astype(np.float64)
    b = to_numpy(b).astype(np.float64)
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
    keras.utils.set_random_seed(0)
    data = {k: ops.convert_to_tensor(to_numpy(v)) for k, v in _as_dict(inputs).items()}

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
    if is_tensorflow():
        saved_path = os.path.join(str(tmp_dir), f"{layer_cls.__name__}_savedmodel")
        assert _max_diff(saved_model_output(model, data, saved_path), eager) == 0.0

    _check_fit_step(layer_cls, init_kwargs, data, weights_without_gradient)
    _check_mixed_precision(layer_cls, init_kwargs, data, mixed_precision_atol)
    _check_policies(layer_cls, init_kwargs, data)
    _check_keyword_calls(layer_cls, init_kwargs, data, eager)
    return eager


def saved_model_output(model, data, path):
    """Saves `model` as a TensorFlow SavedModel at `path`, reloads it and returns its output on `data`."""
    if not is_keras3():
        model.save(path, save_format="tf")
        return keras.models.load_model(path)(data)
    import tensorflow as tf

    model.export(path, verbose=False)
    loaded = tf.saved_model.load(path)  # keep a reference: its variables die with it
    return loaded.serve(data)


def _check_fit_step(layer_cls, init_kwargs, data, weights_without_gradient):
    layer = layer_cls(**init_kwargs)
    model = _functional_model(layer, data)
    output = model(data)
    if not model.trainable_weights:
        # Nothing to train: a training-mode call must still run and stay finite.
        assert np.all(np.isfinite(to_numpy(model(data, training=True))))
        return
    # A random target: regressing onto zeros would be degenerate after a LayerNormalization.
    target = np.random.default_rng(7).standard_normal(tuple(output.shape)).astype(dtype_name(output))
    before = [to_numpy(w).copy() for w in model.trainable_weights]
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    history = model.fit(data, target, epochs=1, batch_size=int(target.shape[0]), verbose=0)
    assert np.isfinite(history.history["loss"][0])
    for weight, old in zip(model.trainable_weights, before):
        name = getattr(weight, "path", weight.name)
        if not any(part in name for part in weights_without_gradient):
            assert not np.array_equal(old, to_numpy(weight)), f"{name} did not move in one fit step"


def _check_mixed_precision(layer_cls, init_kwargs, data, atol):
    layer = layer_cls(**{**init_kwargs, "dtype": "mixed_float16"})
    output = _call(layer, data)
    assert dtype_name(output) == "float16", output.dtype
    float_layer = layer_cls(**init_kwargs)
    _call(float_layer, data)
    float_layer.set_weights(layer.get_weights())
    assert _max_diff(output, _call(float_layer, data)) <= atol


POLICIES = ("mixed_float16", "mixed_bfloat16", "bfloat16")


def _dtype(x):
    """The dtype name of a tensor, variable or KerasTensor ("float32", "bfloat16", ...)."""
    dtype = x.dtype
    return dtype if isinstance(dtype, str) else getattr(dtype, "name", str(dtype))


def _is_float(x):
    return "float" in _dtype(x)


def _keyword_data(layer, data):
    """`data` keyed by the names of `layer.call`'s arguments (the first one under its own name)."""
    import inspect

    first = next(iter(inspect.signature(layer.call).parameters))
    data = dict(data)
    return {first: data.pop("inputs"), **data}


def _check_policies(layer_cls, init_kwargs, data):
    for name in POLICIES:
        policy = keras.mixed_precision.Policy(name)
        layer = layer_cls(**{**init_kwargs, "dtype": policy})
        output = _call(layer, data)
        for tensor in _flat(output):
            if _is_float(tensor):
                assert _dtype(tensor) == policy.compute_dtype, (name, tensor.dtype)
        if is_keras3():
            for spec in _flat(layer.compute_output_spec(**_keyword_data(layer, data))):
                if _is_float(spec):
                    assert _dtype(spec) == policy.compute_dtype, (name, spec.dtype)
        # Keras 2: the layer's own variables (its MultiHeadAttention's projections follow the global
        # policy, see below).
        own = layer.weights if is_keras3() else layer._trainable_weights + layer._non_trainable_weights
        for weight in own:
            if _is_float(weight):
                path = getattr(weight, "path", weight.name)
                assert _dtype(weight) == policy.variable_dtype, (name, path, weight.dtype)
        # Keras 2.12's MultiHeadAttention builds its projections on the global policy: the sublayer
        # check is Keras 3's (keras-hub's harness is Keras 3 only).
        for sublayer in layer._flatten_layers() if is_keras3() else []:
            if isinstance(sublayer, (keras.layers.Softmax, keras.layers.InputLayer)):
                continue
            assert sublayer.compute_dtype == policy.compute_dtype, (name, sublayer.name)
            assert sublayer.variable_dtype == policy.variable_dtype, (name, sublayer.name)


def _flat(output):
    return list(output) if isinstance(output, (list, tuple)) else [output]


def _check_keyword_calls(layer_cls, init_kwargs, data, eager):
    """keras-hub's build and symbolic-call checks: shapes and tensors passed by keyword."""
    layer = layer_cls(**init_kwargs)
    keyword = _keyword_data(layer, data)
    layer.build(**{f"{key}_shape": tuple(value.shape) for key, value in keyword.items()})
    assert layer.built
    assert tuple(_flat(layer(**keyword))[0].shape) == tuple(_flat(eager)[0].shape)
    layer = layer_cls(**init_kwargs)
    if is_keras3():
        symbolic = {key: keras.KerasTensor(tuple(value.shape), dtype_name(value))
                    for key, value in keyword.items()}
    else:
        symbolic = {key: keras.Input(batch_shape=tuple(value.shape), dtype=dtype_name(value))
                    for key, value in keyword.items()}
    output = layer(**symbolic)
    assert tuple(_flat(output)[0].shape) == tuple(_flat(eager)[0].shape)

"""WarmupSchedule: exact values, validation, serialization inside Adam."""

import os

import numpy as np
import pytest
import tensorflow as tf
from layer_test_helper import requires_tf

from keras_posenc import WarmupSchedule
from keras_posenc.backend import is_keras3, keras

# Written against TensorFlow tensors and graphs; the JAX backend runs tests/test_keras3_backends.py.
pytestmark = requires_tf


def reference_lr(step, d_model, warmup, scale=1.0):
    """The paper's formula in float64, with the paper's 1-based step n = step + 1."""
    n = np.float64(step) + 1.0
    return scale * d_model ** -0.5 * min(n ** -0.5, n * warmup ** -1.5)


@pytest.mark.parametrize("d_model, warmup, scale", [(512, 4000, 1.0), (16, 10, 2.5), (1, 1, 0.5)])
@pytest.mark.parametrize("dtype", ["int64", "int32", "float32", "float64"])
def test_values_match_formula(d_model, warmup, scale, dtype):
    schedule = WarmupSchedule(d_model, warmup, scale=scale)
    for step in (0, 1, warmup, 10 * warmup):
        got = schedule(tf.constant(step, dtype))
        assert got.dtype == tf.float32
        expected = reference_lr(step, d_model, warmup, scale)
        np.testing.assert_allclose(float(got), expected, rtol=1e-7, atol=0)


def test_python_int_step_and_graph_mode():
    schedule = WarmupSchedule(64, 100)
    graph_fn = tf.function(lambda s: schedule(s))
    for step in (0, 99, 5000):
        expected = reference_lr(step, 64, 100)
        np.testing.assert_allclose(float(schedule(step)), expected, rtol=1e-7)
        np.testing.assert_allclose(float(graph_fn(tf.constant(step, tf.int64))), expected, rtol=1e-7)


def test_finite_positive_everywhere_and_peak_at_warmup():
    schedule = WarmupSchedule(128, 50)
    lrs = np.array([float(schedule(s)) for s in range(500)])
    assert np.all(np.isfinite(lrs)) and np.all(lrs > 0)
    assert int(np.argmax(lrs)) == 49  # the paper's step n = warmup_steps
    assert np.all(np.diff(lrs[:50]) > 0) and np.all(np.diff(lrs[50:]) < 0)


def test_article_formula_is_degenerate_at_step_zero():
    """The article's schedule: rsqrt(step) is inf at step 0 and rejects integer steps."""
    def article_lr(step, d_model=512, warmup=4000):
        return tf.math.rsqrt(tf.cast(d_model, tf.float32)) * tf.minimum(
            tf.math.rsqrt(step), step * warmup ** -1.5)

    assert np.isinf(float(tf.math.rsqrt(tf.constant(0.0))))
    assert float(article_lr(tf.constant(0.0))) == 0.0  # the first update is wasted
    with pytest.raises((TypeError, tf.errors.InvalidArgumentError, tf.errors.NotFoundError)):
        article_lr(tf.constant(0, tf.int64))
    assert float(WarmupSchedule(512, 4000)(tf.constant(0, tf.int64))) > 0


@pytest.mark.parametrize("kwargs, error, match", [
    ({"d_model": 0}, ValueError, r"`d_model` must be >= 1, got d_model=0"),
    ({"d_model": 8.0}, TypeError, r"`d_model` must be an int, got d_model=8.0"),
    ({"d_model": 8, "warmup_steps": 0}, ValueError, r"`warmup_steps` must be >= 1, got warmup_steps=0"),
    ({"d_model": 8, "scale": 0.0}, ValueError, r"`scale` must be a finite float > 0, got scale=0.0"),
    ({"d_model": 8, "scale": -1.0}, ValueError, r"got scale=-1.0"),
    ({"d_model": 8, "scale": float("nan")}, ValueError, r"got scale=nan"),
])
def test_invalid_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        WarmupSchedule(**kwargs)


def test_negative_step_is_an_error_in_eager_and_graph():
    schedule = WarmupSchedule(8, 10)
    with pytest.raises(ValueError, match=r"`step` must be >= 0, got step=-1"):
        schedule(-1)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"`step` must be >= 0, got step=-3"):
        tf.function(lambda s: schedule(s))(tf.constant(-3))
    with pytest.raises(TypeError, match=r"`step` must be an int or float scalar, got dtype string"):
        schedule(tf.constant("1"))


def test_config_round_trip():
    schedule = WarmupSchedule(32, 7, scale=0.3)
    config = keras.optimizers.schedules.serialize(schedule)
    clone = keras.optimizers.schedules.deserialize(config)
    assert isinstance(clone, WarmupSchedule)
    assert clone.get_config() == {"d_model": 32, "warmup_steps": 7, "scale": 0.3}
    assert [float(clone(s)) for s in range(20)] == [float(schedule(s)) for s in range(20)]


def _compiled_model(schedule):
    inputs = keras.Input((4,))
    outputs = keras.layers.Dense(3)(keras.layers.Dense(8, activation="relu")(inputs))
    model = keras.Model(inputs, outputs)
    model.compile(optimizer=keras.optimizers.Adam(schedule, beta_1=0.9, beta_2=0.98, epsilon=1e-9),
                  loss="mse")
    return model


def test_save_load_inside_adam_and_continue_training(tmp_path):
    keras.utils.set_random_seed(0)
    x = np.random.RandomState(0).normal(size=(16, 4)).astype("float32")
    y = np.random.RandomState(1).normal(size=(16, 3)).astype("float32")
    model = _compiled_model(WarmupSchedule(16, 5, scale=2.0))
    model.fit(x, y, batch_size=4, epochs=1, verbose=0, shuffle=False)
    path = os.path.join(str(tmp_path), "model.keras")
    model.save(path)
    restored = keras.models.load_model(path)

    optimizer = restored.optimizer
    # Keras 2.12 exposes the current value as `optimizer.learning_rate`; the schedule is in the config.
    schedule = keras.optimizers.schedules.deserialize(optimizer.get_config()["learning_rate"])
    original = keras.optimizers.schedules.deserialize(model.optimizer.get_config()["learning_rate"])
    assert isinstance(schedule, WarmupSchedule)
    assert schedule.get_config() == {"d_model": 16, "warmup_steps": 5, "scale": 2.0}
    assert (optimizer.beta_1, optimizer.beta_2, optimizer.epsilon) == (0.9, 0.98, 1e-9)
    assert int(optimizer.iterations) == int(model.optimizer.iterations) == 4
    for step in range(12):
        assert float(schedule(step)) == float(original(step))

    for m in (model, restored):
        m.fit(x, y, batch_size=4, epochs=1, verbose=0, shuffle=False)
    assert int(restored.optimizer.iterations) == 8
    # The learning rate is the same, and is the formula's: Keras 2 reports the one of the last
    # update (step 7), Keras 3 the schedule at the current iteration (step 8).
    assert float(restored.optimizer.learning_rate) == float(model.optimizer.learning_rate)
    last_lr = float(restored.optimizer.learning_rate)
    np.testing.assert_allclose(last_lr, reference_lr(8 if is_keras3() else 7, 16, 5, 2.0), rtol=1e-7)
    for a, b in zip(model.get_weights(), restored.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)

"""CausalLM and the optimizer recipe: masking, the loss, the schedule, saving and loading."""

import json
import zipfile

import numpy as np
import pytest
import tensorflow as tf

from keras_posenc.backend import keras
from keras_posenc.models import CausalLM, transformer_adam

CONFIG = dict(num_layers=1, d_model=16, num_heads=2, dff=32, vocab_size=30, max_length=16, dropout=0.0)


def _model(causal=True, **overrides):
    keras.utils.set_random_seed(3)
    model = CausalLM({**CONFIG, **overrides}, causal=causal, name="lm")
    model.build_on_dummy()
    return model


def test_transformer_adam_is_the_paper_recipe():
    optimizer = transformer_adam(64, warmup_steps=10, scale=2.0)
    assert (float(optimizer.beta_1), float(optimizer.beta_2), float(optimizer.epsilon)) == (0.9, 0.98, 1e-9)
    schedule = optimizer.learning_rate if callable(optimizer.learning_rate) else optimizer._learning_rate
    for step in (0, 4, 9, 10, 100):
        n = step + 1.0
        expected = 2.0 * 64 ** -0.5 * min(n ** -0.5, n * 10 ** -1.5)
        np.testing.assert_allclose(float(schedule(tf.constant(step))), expected, rtol=1e-6)


@pytest.mark.parametrize("causal", [True, False])
def test_causal_option_decides_whether_a_later_token_changes_earlier_logits(causal):
    model = _model(causal)
    ids = tf.constant([[5, 6, 7, 8, 9]])
    changed = tf.constant([[5, 6, 7, 8, 12]])
    delta = np.abs(model(ids).numpy()[0, :4] - model(changed).numpy()[0, :4]).max()
    assert (delta == 0.0) if causal else (delta > 1e-4)


def test_evaluate_loss_is_the_mean_cross_entropy_over_labels_that_are_not_padding():
    model = _model(pad_id=0)
    model.compile(optimizer=transformer_adam(16, 4))
    features = np.array([[2, 5, 6, 7], [2, 9, 0, 0]], np.int32)
    labels = np.array([[5, 6, 7, 3], [9, 3, 0, 0]], np.int32)
    logits = model(tf.constant(features)).numpy().astype(np.float64)
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    picked = np.take_along_axis(log_probs, labels[..., None], -1)[..., 0]
    expected = -picked[labels != 0].mean()
    loss = model.evaluate(tf.data.Dataset.from_tensors((features, labels)), verbose=0)
    np.testing.assert_allclose(loss, expected, rtol=1e-5)


def test_a_fit_step_lowers_the_loss_on_its_batch():
    model = _model()
    model.compile(optimizer=transformer_adam(16, 1, scale=0.05))
    features = np.array([[2, 5, 6, 7]] * 4, np.int32)
    labels = np.array([[5, 6, 7, 3]] * 4, np.int32)
    data = tf.data.Dataset.from_tensors((features, labels)).repeat()
    before = model.evaluate(data.take(1), verbose=0)
    model.fit(data, steps_per_epoch=5, epochs=1, verbose=0)
    assert model.evaluate(data.take(1), verbose=0) < before


def test_a_train_step_is_adam_on_the_summed_gradient_of_a_repeated_token():
    # The embedding's gradient has one slice per looked-up token (7 appears three times). Adam's second
    # moment must see the square of their sum; squaring slice by slice (Keras 3's Adam on IndexedSlices)
    # moves the row of token 7 by a different amount.
    model = _model()
    lr, beta_1, beta_2, epsilon = 0.01, 0.9, 0.98, 1e-9
    model.compile(optimizer=keras.optimizers.Adam(lr, beta_1=beta_1, beta_2=beta_2, epsilon=epsilon))
    batch = (tf.constant([[2, 7, 7, 9, 7]]), tf.constant([[7, 7, 9, 7, 3]]))
    embedding = next(v for v in model.trainable_variables if tuple(v.shape) == (CONFIG["vocab_size"], 16))
    with tf.GradientTape() as tape:
        total, count = model.token_loss_sums(batch, training=True)
        loss = total / count
    slices = tape.gradient(loss, embedding)
    assert isinstance(slices, tf.IndexedSlices) and np.bincount(slices.indices.numpy())[7] == 3
    gradient = np.zeros(embedding.shape, np.float64)
    np.add.at(gradient, slices.indices.numpy(), slices.values.numpy().astype(np.float64))
    m, v = (1 - beta_1) * gradient, (1 - beta_2) * gradient**2
    alpha = lr * np.sqrt(1 - beta_2) / (1 - beta_1)
    expected = embedding.numpy().astype(np.float64) - alpha * m / (np.sqrt(v) + epsilon)
    model.train_step(batch)
    np.testing.assert_allclose(embedding.numpy(), expected, rtol=0, atol=1e-7)


@pytest.mark.parametrize("causal", [True, False])
def test_save_and_load_keep_outputs_and_the_causal_option(tmp_path, causal):
    model = _model(causal)
    path = str(tmp_path / "lm.keras")
    model.save(path, save_format="keras_v3")
    loaded = keras.models.load_model(path, compile=False)
    ids = tf.constant([[4, 5, 6, 0]])
    assert loaded.causal is causal
    np.testing.assert_array_equal(loaded(ids).numpy(), model(ids).numpy())


def test_a_file_saved_when_the_model_lived_in_train_still_loads(tmp_path):
    model = _model()
    new, old = str(tmp_path / "new.keras"), str(tmp_path / "old.keras")
    model.save(new, save_format="keras_v3")
    with zipfile.ZipFile(new) as src, zipfile.ZipFile(old, "w") as dst:
        for item in src.infolist():
            content = src.read(item.filename)
            if item.filename == "config.json":
                config = json.loads(content)
                config["module"] = "keras_posenc.app.train"
                del config["config"]["causal"]  # files written before the option existed
                content = json.dumps(config).encode()
            dst.writestr(item, content)
    loaded = keras.models.load_model(old, compile=False)
    ids = tf.constant([[4, 5, 6, 0]])
    assert isinstance(loaded, CausalLM) and loaded.causal
    np.testing.assert_array_equal(loaded(ids).numpy(), model(ids).numpy())
